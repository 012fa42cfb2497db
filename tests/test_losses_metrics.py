"""Losses and metrics count valid pixels only: padding (the ignore index) never does."""

import torch

from srforge import AlignedCollate, Entry
from srforge.models.class_map import class_map
from srforge.train.losses import dice_loss, segmentation_loss
from srforge.train.metrics import confusion_matrix, scores


def test_confusion_matrix_counts_only_labelled_pixels():
    target = torch.tensor([[0, 1, 1, 255]])
    pred = torch.tensor([[0, 1, 0, 1]])
    assert confusion_matrix(pred, target, 2).tolist() == [[1, 0], [1, 1]]


def test_padding_is_left_out_even_when_the_ignore_index_is_a_class_id():
    target = torch.tensor([[1, 1, 0, 0]])  # the last two are padding, marked with ignore_index=0
    pred = torch.tensor([[1, 0, 0, 0]])
    assert confusion_matrix(pred, target, 2, ignore_index=0).tolist() == [[0, 0], [1, 1]]


def test_scores_per_class_and_means():
    s = scores(torch.tensor([[3, 1], [2, 4]]))
    assert s["iou"] == [3 / 6, 4 / 7]
    assert s["dice"] == [6 / 9, 8 / 11]
    assert s["pixel_accuracy"] == 7 / 10
    absent = scores(torch.tensor([[5, 0, 0], [0, 5, 0], [0, 0, 0]]))
    assert absent["mean_iou"] == 1.0  # class 2 never appears: NaN, left out of the mean


def test_loss_and_metrics_of_a_padded_batch_equal_those_of_the_scans_alone():
    g = torch.Generator().manual_seed(0)
    scans = [
        Entry(image=torch.zeros(1, h, w), mask=torch.randint(0, 3, (h, w), generator=g)) for h, w in ((5, 7), (9, 4))
    ]
    batch = AlignedCollate(divisor=8)(scans)
    logits = torch.randn(2, 3, 16, 8, generator=g)
    padded = segmentation_loss(logits, batch.mask, dice_weight=1.0)
    # The same pixels, unpadded: cross-entropy and Dice over the concatenated valid pixels.
    flat_logits = torch.cat([logits[i, :, :h, :w].reshape(3, -1) for i, (h, w) in enumerate(batch.sizes.tolist())], 1)
    flat_target = torch.cat([s.mask.reshape(-1) for s in scans])
    expected = torch.nn.functional.cross_entropy(flat_logits.T, flat_target) + dice_loss(
        flat_logits[None, :, :, None], flat_target[None, :, None]
    )
    assert torch.allclose(padded, expected, atol=1e-6)
    alone = sum(
        confusion_matrix(logits[i, :, :h, :w].argmax(0), s.mask, 3)
        for i, ((h, w), s) in enumerate(zip(batch.sizes.tolist(), scans))
    )
    assert torch.equal(confusion_matrix(logits.argmax(1), batch.mask, 3), alone)


def test_a_batch_with_no_labelled_pixel_gives_a_finite_zero_loss_with_gradients():
    logits = torch.randn(1, 2, 4, 4, requires_grad=True)
    loss = segmentation_loss(logits, torch.full((1, 4, 4), 255), dice_weight=1.0)
    loss.backward()
    assert loss.item() == 0.0 and logits.grad is not None and not logits.grad.any()


def test_class_map_equals_argmax_ties_included():
    g = torch.Generator().manual_seed(0)
    scores = torch.randint(0, 3, (2, 4, 5, 6), generator=g).float()  # many ties
    assert torch.equal(class_map(scores), scores.argmax(1))
    assert torch.equal(class_map(scores[0], dim=0), scores[0].argmax(0))
    assert class_map(torch.randn(1, 1, 2, 2)).eq(0).all()
