"""The thin-structure loss (train.skeleton_weight): skeleton tubes worked out by hand, the recall loss per scan and
class on each scan's true extent (never padding, never pooled across a batch), tubes moving with their masks, and a
run that trains with it."""

import json

import numpy as np
import torch
from test_train import TinyStrips, tiny_config  # noqa: F401 (TinyStrips: imported by the config)

from srforge.data.cache import DecodedCache
from srforge.data.field_view import FieldView
from srforge.data.skeleton import skeleton_tube, thin, widen
from srforge.train import train
from srforge.train.losses import segmentation_loss, skeleton_recall_loss

FIELDS = {"image": "scan", "mask": "labels", "name": "id"}


def test_a_one_pixel_curve_is_its_own_tube():
    mask = torch.zeros(9, 14, dtype=torch.uint8)
    mask[4, 2:12] = 1
    mask[5, 12] = 1  # a step down: still one 8-connected pixel wide
    assert torch.equal(skeleton_tube(mask, 255), mask)


def test_a_two_pixel_diagonal_line_keeps_its_tube_and_a_2x2_speck_has_none():
    """A 45-degree line 2 px wide (Zhang and Suen's rule erases it to 2 px; Lü and Wang's keeps it): its tube is the
    whole line. A 2 x 2 speck is no curve: it thins away and has no tube."""
    mask = torch.zeros(20, 20, dtype=torch.uint8)
    for i in range(15):
        mask[i + 2, i + 2] = mask[i + 2, i + 3] = 1
    assert torch.equal(skeleton_tube(mask, 255), mask)
    speck = torch.zeros(6, 6, dtype=torch.uint8)
    speck[2:4, 2:4] = 1
    assert skeleton_tube(speck, 255).eq(0).all()


def test_a_three_pixel_band_is_covered_but_for_its_far_corners():
    """Zhang-Suen thins the 3 x 10 band (rows 3-5, columns 2-11) to its middle row, columns 2-9; the diamond of radius
    2 around it covers the band but for (3, 11) and (5, 11), at L1 distance 3 from (4, 9)."""
    band = torch.zeros(9, 14, dtype=torch.uint8)
    band[3:6, 2:12] = 1
    skeleton = np.zeros((9, 14), bool)
    skeleton[4, 2:10] = True
    assert torch.equal(thin(band > 0), torch.from_numpy(skeleton))
    expected = band.clone()
    expected[3, 11] = expected[5, 11] = 0
    assert torch.equal(skeleton_tube(band, 255), expected)


def test_a_thick_blob_keeps_a_band_around_its_medial_line_and_ignore_is_no_class():
    """A 9 x 14 blob of class 2 keeps the 5 rows around its skeleton (row 6, columns 4-9), as a diamond; the ignore
    index and background have no tube."""
    mask = torch.zeros(13, 16, dtype=torch.uint8)
    mask[2:11, 1:15] = 2
    mask[0, :] = 255
    tube = skeleton_tube(mask, 255)
    skeleton = np.zeros((13, 16), bool)
    skeleton[6, 4:10] = True
    assert torch.equal(thin(mask == 2), torch.from_numpy(skeleton))
    assert torch.equal(tube, widen(torch.from_numpy(skeleton), 2).to(torch.uint8) * 2)
    assert set(tube.unique().tolist()) == {0, 2} and tube[0].eq(0).all()


def _certain(classes: torch.Tensor, k: int = 2) -> torch.Tensor:
    """logits [B, K, H, W] that predict ``classes`` [B, H, W] with probability 1 - 2e-9 (logit 20 against 0)."""
    return torch.nn.functional.one_hot(classes.long(), k).permute(0, 3, 1, 2).float() * 20


def test_the_recall_loss_counts_each_scan_on_its_own_extent_and_never_padding():
    """Two scans in one batch padded to 8 x 8. Scan 0 (4 x 6 at the top-left corner) has a tube of 4 px of which the
    prediction covers 3: recall 0.75. Scan 1 (the whole 8 x 8) has a tube of 12 px, all covered: recall 1. The loss
    is 1 - (0.75 + 1) / 2 = 0.125: per scan, not pooled ((3 + 12) / 16 would give 0.0625). Scan 0's padding is
    predicted as class 1 everywhere and its tube there is 0 (the collate's pad value): it changes nothing."""
    tube = torch.zeros(2, 8, 8, dtype=torch.uint8)
    tube[0, 3, 2:6] = 1  # touches the scan's right edge, where padding begins
    tube[1, 2:5, 0:4] = 1
    predicted = torch.zeros(2, 8, 8, dtype=torch.long)
    predicted[0, 3, 2:5] = 1
    predicted[0, 4:, :] = predicted[0, :, 6:] = 1  # padding of scan 0
    predicted[1] = 1
    loss = skeleton_recall_loss(_certain(predicted), tube)
    assert abs(loss.item() - 0.125) < 1e-6
    # No tube in any scan: 0, with a graph to backpropagate through.
    logits = _certain(predicted).requires_grad_()
    empty = skeleton_recall_loss(logits, torch.zeros(2, 8, 8, dtype=torch.uint8))
    assert empty.item() == 0 and empty.requires_grad


def test_the_recall_loss_averages_over_classes_present_and_adds_to_cross_entropy_by_its_weight():
    """Class 1's tube wholly missed (recall 0), class 2's wholly found (1), class 3 absent: loss 0.5."""
    tube = torch.zeros(1, 4, 6, dtype=torch.uint8)
    tube[0, 1, :3], tube[0, 2, 3:] = 1, 2
    predicted = torch.zeros(1, 4, 6, dtype=torch.long)
    predicted[0, 2, 3:] = 2
    logits = _certain(predicted, k=4)
    assert abs(skeleton_recall_loss(logits, tube).item() - 0.5) < 1e-6
    mask = predicted.clone()
    plain = segmentation_loss(logits, mask)
    both = segmentation_loss(logits, mask, skeleton_weight=0.3, tube=tube)
    assert abs((both - plain).item() - 0.15) < 1e-6


def test_a_view_gives_each_scan_its_tube_cached_and_moved_with_the_mask(tmp_path):
    cache = DecodedCache(tmp_path / "cache")
    plain = FieldView(TinyStrips(n=3), FIELDS, num_classes=2)
    view = FieldView(TinyStrips(n=3), FIELDS, num_classes=2, cache=cache)
    view.tubes = True
    sample = view[1]
    assert torch.equal(sample["tube"], skeleton_tube(plain[1]["mask"], 255))
    assert torch.equal(view[1]["tube"], sample["tube"])  # again, from the cache
    assert any((tmp_path / "cache").rglob("*"))
    from srforge.data.augment import build_augmentation

    flipped = FieldView(TinyStrips(n=3), FIELDS, num_classes=2, augment=build_augmentation({"hflip": 1.0}))
    flipped.tubes = True
    moved = flipped[1]
    assert torch.equal(moved["mask"], plain[1]["mask"].flip(-1))
    assert torch.equal(moved["tube"], sample["tube"].flip(-1))


def test_a_run_with_the_skeleton_loss_trains_on_padded_batches_with_tubes(tmp_path):
    with_loss = train(tiny_config(tmp_path / "skeleton", epochs=1, skeleton_weight=1.0))
    without = train(tiny_config(tmp_path / "plain", epochs=1))
    # The recall term is >= 0 and the TinyStrips curves are never wholly found after one epoch.
    assert with_loss["train_loss"] > without["train_loss"]
    rows = [json.loads(x) for x in (tmp_path / "skeleton" / "metrics.jsonl").read_text().splitlines()]
    assert rows[0]["epoch"] == 1


def test_a_rescaled_tube_never_names_another_class_than_its_mask():
    """Class 1 fills rows 0-8 of a 12 x 12 mask and a class-2 line runs along row 9. Halved, the mask gives row 4 to
    class 1 (it covers more of those pixels); the tube, resampled alone, would give that row to class 2, whose tube
    is all it holds there: the tube keeps no pixel where it disagrees with the mask."""
    from srforge.data.rescale import rescale, rescale_mask

    mask = torch.zeros(12, 12, dtype=torch.uint8)
    mask[0:9, :], mask[9, :] = 1, 2
    tube = skeleton_tube(mask, 255)
    assert rescale_mask(tube, (6, 6), 255)[4].eq(2).all()  # what the tube alone would say
    out = rescale({"image": torch.zeros(3, 12, 12, dtype=torch.uint8), "mask": mask, "tube": tube}, 0.5, 255)
    assert out["mask"][4].eq(1).all() and out["tube"][4].eq(0).all()
    assert ((out["tube"] == 0) | (out["tube"] == out["mask"])).all()
