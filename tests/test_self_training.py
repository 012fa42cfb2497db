"""Self-training on unlabelled scans (data.unlabelled, train.self_training): pseudo-labels worked out by hand, the
unlabelled stream (hostile members refused, ranks disjoint, its position resumed exactly), the config's refusals, and
runs that learn from it, stopped and resumed to the same bits."""

import hashlib
import json
import math
import re
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import rgb, write
from test_train import TinyStrips, tiny_config, torchrun_custom_dataset  # noqa: F401 (TinyStrips: imported by the config)

from srforge.config import ConfigError, resolve
from srforge.config.preflight import TEACHER
from srforge.data import DataError
from srforge.data.unlabelled import UnlabelledScans, UnlabelledStream
from srforge.runtime.checkpoint import load_checkpoint, save_checkpoint
from srforge.train import train
from srforge.train.self_training import (
    SelfTraining,
    class_mix,
    class_thresholds,
    confident_labels,
    flip_guess,
    mirror_mix,
    pseudo_labels,
)


def unlabelled_folder(root: Path, n: int = 7) -> Path:
    """``n`` scans without masks, 14-17 x 30-84 px, a dark curve on light paper like TinyStrips'."""
    for i in range(n):
        rng = np.random.default_rng(100 + i)
        h, w = 14 + i % 4, 30 + 9 * i
        pixels = np.full((h, w), 220, np.int64)
        pixels[h // 2, 2 : w - 2] = 30
        pixels = (pixels + rng.integers(0, 20, (h, w))).astype(np.uint8)
        write(root / f"u{i}.png", np.repeat(pixels[..., None], 3, 2))
    return root


def self_training_config(run_dir: Path, unlabelled, self_training: dict | None = None, **train_keys):
    """tiny_config over 3 epochs with train.ema 0.9 (unless ``train_keys`` say otherwise), learning from
    ``unlabelled`` (train.self_training: a weight of 1, confidence 0.6, flips and brightness for the student, updated
    by ``self_training``)."""
    cfg = tiny_config(run_dir, **{"ema": 0.9, "epochs": 3, **train_keys}).to_dict()
    spec = {"weight": 1.0, "confidence": 0.6, "augment": {"hflip": 0.5, "color_jitter": {"brightness": 0.2}}}
    cfg["train"]["self_training"] = {**spec, **(self_training or {})}
    cfg["data"]["unlabelled"] = str(unlabelled)
    return resolve(cfg)


# -- pseudo-labels --------------------------------------------------------------------------------------------------
def test_pseudo_labels_keep_confident_pixels_inside_each_scan_only():
    """Two scans padded to 2 x 3: scan 0 is 2 x 2, scan 1 is 1 x 3. Class-1 probabilities (2 classes) are set by the
    logit difference d: sigmoid(d). With confidence 0.8, p = 0.9 (class 1) and p = 0.1 (class 0 at 0.9) count,
    p = 0.6 and 0.4 do not; padding never counts, confident or not."""
    p = torch.tensor([[[0.9, 0.6, 0.9], [0.1, 0.4, 0.1]], [[0.1, 0.9, 0.5], [0.9, 0.9, 0.9]]])
    d = torch.log(p / (1 - p))
    logits = torch.stack([torch.zeros_like(d), d], 1)  # [2, 2, 2, 3]
    sizes = torch.tensor([[2, 2], [1, 3]])
    labels, confident = pseudo_labels(logits, sizes, confidence=0.8, ignore_index=255)
    assert labels.tolist() == [[[1, 255, 255], [0, 255, 255]], [[0, 1, 255], [255, 255, 255]]]
    assert confident.sum().item() == 4
    assert pseudo_labels(logits, sizes, confidence=0.0)[1].sum().item() == 4 + 3  # every pixel of both scans


def test_balanced_pseudo_labels_keep_the_more_confident_half_of_each_class():
    """One 2 x 3 scan, confidence 0.95 (nothing of class 1 reaches it). Class 1's pixels have p = 0.9, 0.6, 0.7: its
    threshold is their median 0.7; class 0's have p = 0.95, 0.6, 0.9 (class-1 p of 0.05, 0.4, 0.1): median 0.9."""
    p = torch.tensor([[[0.9, 0.6, 0.7], [0.05, 0.4, 0.1]]])
    d = torch.log(p / (1 - p))
    logits = torch.stack([torch.zeros_like(d), d], 1)
    labels, confident = pseudo_labels(logits, torch.tensor([[2, 3]]), 0.95, 255, balanced=True)
    assert labels.tolist() == [[[1, 255, 1], [0, 255, 0]]] and confident.sum().item() == 4
    assert pseudo_labels(logits, torch.tensor([[2, 3]]), 0.95, 255)[0].tolist() == [[[255] * 3, [0, 255, 255]]]


def test_each_class_may_have_its_own_confidence():
    """The scan of the test above, thresholds 0.55 for class 0 and 0.8 for class 1: class 1 keeps p = 0.9 alone,
    class 0 keeps 0.95, 0.6 and 0.9; one threshold of 0.55 keeps class 1's 0.6 and 0.7 too. The same list given to
    SelfTraining becomes a tuple, and its device tensor teaches the same labels. A list of the wrong length says
    what it expected."""
    p = torch.tensor([[[0.9, 0.6, 0.7], [0.05, 0.4, 0.1]]])
    d = torch.log(p / (1 - p))
    logits = torch.stack([torch.zeros_like(d), d], 1)
    sizes = torch.tensor([[2, 3]])
    strict = [[[1, 255, 255], [0, 0, 0]]]
    assert pseudo_labels(logits, sizes, [0.55, 0.8], 255)[0].tolist() == strict
    assert pseudo_labels(logits, sizes, 0.55, 255)[0].tolist() == [[[1, 1, 1], [0, 0, 0]]]
    spec = SelfTraining.from_config({"confidence": [0.55, 0.8]}, None, ignore_index=255, seed=0)
    assert spec.confidence == (0.55, 0.8)
    thresholds = class_thresholds(spec.confidence, 2)
    guess = logits.softmax(1).max(1)
    assert confident_labels(*guess, sizes, 2, thresholds, 255)[0].tolist() == strict
    confident_labels(*guess, sizes, 2, thresholds, 255, balanced=True)  # lowers its own copy to the medians
    assert thresholds.tolist() == pytest.approx([0.55, 0.8])
    with pytest.raises(ValueError, match=r"expected one threshold or 2 \(one a class\), found 3"):
        pseudo_labels(logits, sizes, [0.6, 0.8, 0.9], 255)


def test_the_balanced_student_loss_weighs_each_class_alike():
    """Three background pixels with cross-entropy log 2 (logits 0, 0) and one curve pixel with log(1 + e^-2) (logits
    0, 2), one ignored: the plain mean is (3 log 2 + log(1 + e^-2)) / 4, the balanced one (log 2 + log(1 + e^-2))
    / 2."""
    logits = torch.zeros(1, 2, 2, 3)
    logits[0, 1, 1, 0] = 2.0
    labels = torch.tensor([[[0, 0, 0], [1, 255, 255]]])
    a, b = math.log(2), math.log(1 + math.exp(-2))
    plain = SelfTraining(None, balance=False).student_loss(logits, labels, torch.tensor(4))
    balanced = SelfTraining(None, balance=True).student_loss(logits, labels, torch.tensor(4))
    assert abs(plain.item() - (3 * a + b) / 4) < 1e-6 and abs(balanced.item() - (a + b) / 2) < 1e-6


def test_the_skeleton_term_asks_the_student_to_cover_each_confident_curves_medial_line():
    """Two scans padded to 5 x 7: scan 0 (5 x 6) has a 1-px curve of class 1 along row 2 at columns 0-4, the
    teacher unsure at column 5 and at (4, 0) (ignored); scan 1 (3 x 4) a 3-px band, rows 0-2 at columns 0-3, thinned
    to row 1's columns 0-1, whose diamond of radius 2 covers the band but for its far corners (0, 3) and (2, 3).
    Padding is class 1 here (as if the teacher had marked it): only the scans' extents keep it out of the tubes.
    The student's class-1 probability is 0.9 on scan 0's curve except 0.2 at column 4, and 0.5 everywhere on scan
    1: recalls (4 * 0.9 + 0.2) / 5 = 0.76 and 0.5; the loss, 1 - their mean, is 0.37, and the two scans done apart
    add up to it."""
    ignore = 255
    labels = torch.ones(2, 5, 7, dtype=torch.int64)
    labels[0, :5, :6] = 0
    labels[0, 2, :5] = 1
    labels[0, 2, 5] = labels[0, 4, 0] = ignore
    sizes = torch.tensor([[5, 6], [3, 4]])
    tube = SelfTraining(None, skeleton=1.0, ignore_index=ignore).tubes(labels, sizes)
    expected = torch.zeros(2, 5, 7, dtype=torch.uint8)
    expected[0, 2, :5], expected[1, :3, :4] = 1, 1
    expected[1, 0, 3] = expected[1, 2, 3] = 0
    assert torch.equal(tube, expected)
    p = torch.full((2, 5, 7), 0.5)
    p[0, 2, :4], p[0, 2, 4] = 0.9, 0.2
    logits = torch.stack([torch.zeros_like(p), torch.log(p / (1 - p))], 1).requires_grad_()
    pairs = SelfTraining(None, skeleton=1.0).totals(labels, 2, tube)[2]
    assert pairs.item() == 2
    loss = SelfTraining.tube_loss(logits, tube, pairs)
    assert abs(loss.item() - (1 - (0.76 + 0.5) / 2)) < 1e-6
    parts = SelfTraining.tube_loss(logits[:1], tube[:1], pairs) + SelfTraining.tube_loss(logits[1:], tube[1:], pairs)
    assert torch.allclose(parts, loss)
    (grad,) = torch.autograd.grad(loss, logits)
    assert grad[:, 1][tube == 0].abs().max() == 0  # pixels outside the tubes, padding included, get nothing
    nothing = torch.full((1, 5, 7), ignore)  # nothing confident: no tube
    assert SelfTraining(None, skeleton=1.0).tubes(nothing, torch.tensor([[5, 7]])).sum() == 0
    alone = [SelfTraining(None, ignore_index=ignore).tubes(labels[b : b + 1], sizes[b : b + 1]) for b in (0, 1)]
    assert torch.equal(torch.cat(alone), tube)  # a scan's tube does not depend on its batch company


class Strict(torch.nn.Module):
    """A per-pixel classifier (1x1 convolution of the image / 255) that runs out of memory, as a device would, on a
    batch of more than ``fits`` scans: forward(image uint8 [B, 3, H, W], sizes) -> logits [B, 2, H, W]."""

    def __init__(self, fits: int | None = None):
        super().__init__()
        torch.manual_seed(3)
        self.conv, self.fits, self.calls = torch.nn.Conv2d(3, 2, 1), fits, 0

    def forward(self, image, sizes=None):
        self.calls += 1
        if self.fits is not None and image.shape[0] > self.fits:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB (simulated)")
        return self.conv(image.float() / 255)


def test_the_flip_teacher_averages_each_scans_mirror_images_within_its_extent():
    """A teacher blind to the image whose class-1 logit is the column's place, d(x) = x - 1.5 over a padded width
    of 4: scan 0 is 1 x 3, scan 1 is 1 x 2. Mirrored left-right within its extent a scan's column x reads column
    w - 1 - x (upside-down changes nothing at height 1), so its class-1 probability is the mean of sigmoid(d(x))
    and sigmoid(d(w - 1 - x)); padding columns stay where they are, and pseudo-labels never count them."""
    ramp = torch.arange(4.0) - 1.5

    def teacher(view, sizes):
        return torch.stack([torch.zeros(2, 1, 4), ramp.expand(2, 1, 4)], 1)  # [2, 2, 1, 4]

    image, sizes = torch.zeros(2, 3, 1, 4, dtype=torch.uint8), torch.tensor([[1, 3], [1, 2]])
    s = torch.sigmoid(ramp)
    expected = torch.tensor([
        [(s[0] + s[2]) / 2, s[1], (s[0] + s[2]) / 2, s[3]],  # w = 3: columns 0 and 2 swap; 3 is padding
        [(s[0] + s[1]) / 2, (s[0] + s[1]) / 2, s[2], s[3]],  # w = 2: columns 0 and 1 swap; 2 and 3 are padding
    ])  # fmt: skip
    probability, label = flip_guess(teacher, image, sizes)
    class_1 = torch.where(label == 1, probability, 1 - probability)[:, 0]
    assert torch.allclose(class_1, expected, atol=1e-6)
    assert label[:, 0].tolist() == [[0, 0, 0, 1], [0, 0, 1, 1]]
    labels, confident = confident_labels(probability, label, sizes, 2, confidence=0.6, ignore_index=255)
    # p(class 0): scan 0 0.598 at columns 0 and 2 (unflipped, column 0 would be sure at 0.818), 0.622 at column 1;
    # scan 1 0.720 at both; padding ignored
    assert labels[:, 0].tolist() == [[255, 0, 255, 255], [0, 0, 255, 255]]
    alone = flip_guess(teacher, image[1:], sizes[1:])  # a scan's guess does not depend on its batch company
    assert torch.equal(alone[0][0, :, :2], probability[1, :, :2])


def unlabelled_step(
    tmp_path, fits: int | None, balance: bool, student_fits: int | None = None, damaged=(), tta: str = "none",
    teacher_calls: list | None = None, fixed: bool = False, skeleton: float = 0.0,
):  # fmt: skip
    """One SelfTraining.backward over a batch of 4 unlabelled scans (those in ``damaged`` cut short), teacher
    Strict(fits) and student Strict(student_fits, default fits), train.self_training's ``tta``: the loss, the
    student's gradients and the pending sums (loss, batches, confident, real pixels); the teacher's forward calls
    are appended to ``teacher_calls``. ``fixed``: the teacher is SelfTraining's own (train.self_training.teacher)
    and the trainer's EMA one a model that fails when called. ``skeleton``: train.self_training.skeleton."""
    from types import SimpleNamespace

    folder = unlabelled_folder(tmp_path, n=4)
    for i in damaged:
        damage(folder / f"u{i}.png")
    stream = UnlabelledStream(UnlabelledScans(str(folder)), divisor=4, seed=0, batch_size=4)
    net, teacher = Strict(fits if student_fits is None else student_fits), Strict(fits)
    teacher.conv.weight.data += 0.5  # a teacher unlike its student: the loss is not 0
    settings = SimpleNamespace(precision="fp32", channels_last=False)
    averaged = Strict(0) if fixed else teacher  # Strict(0) holds no scan: a call is out of memory, said
    trainer = SimpleNamespace(
        device=torch.device("cpu"), settings=settings, averaged=averaged, net=net, num_classes=2, step=0,
        params=list(net.parameters()), scaler=torch.amp.GradScaler("cpu", enabled=False),
    )  # fmt: skip
    spec = {"confidence": 0.5, "balance": balance, "tta": tta, "augment": None, "teacher": "t.pt" if fixed else None,
            "skeleton": skeleton}  # fmt: skip
    own = (teacher, "t.pt", "digest") if fixed else None
    self_training = SelfTraining.from_config(spec, stream, ignore_index=255, seed=0, teacher=own)
    loss = self_training.backward(trainer)
    if teacher_calls is not None:
        teacher_calls.append(teacher.calls)
    return loss, [None if p.grad is None else p.grad.clone() for p in net.parameters()], self_training.pending


@pytest.mark.parametrize(("balance", "skeleton"), [(False, 0.0), (True, 0.0), (False, 2.0), (True, 2.0)])
def test_an_unlabelled_batch_out_of_memory_is_redone_in_parts_to_the_same_loss_and_gradients(
    tmp_path, balance, skeleton
):
    whole, grads, _ = unlabelled_step(tmp_path / "whole", None, balance, skeleton=skeleton)
    parts, part_grads, _ = unlabelled_step(tmp_path / "parts", 1, balance, skeleton=skeleton)  # halves, quarters
    assert whole > 0 and torch.allclose(parts, whole, rtol=1e-5, atol=1e-7)
    if skeleton:  # the skeleton term is in the loss: more than the cross-entropy alone
        assert whole > unlabelled_step(tmp_path / "plain", None, balance)[0] + 1e-3
    for a, b in zip(grads, part_grads):
        assert torch.allclose(a, b, rtol=1e-5, atol=1e-7)


def test_a_flip_teacher_that_is_a_per_pixel_classifier_teaches_what_it_teaches_unflipped(tmp_path):
    """Strict classifies each pixel alone, so its mirror images give each pixel the same probabilities: the flip
    teacher's loss and gradients are the plain teacher's, whole or in parts (the four views mirror back exactly)."""
    calls = []
    plain, grads, _ = unlabelled_step(tmp_path / "plain", None, balance=False, teacher_calls=calls)
    for fits, name in ((None, "whole"), (1, "parts")):
        flipped, flip_grads, _ = unlabelled_step(tmp_path / name, fits, balance=False, tta="flip", teacher_calls=calls)
        assert plain > 0 and torch.allclose(flipped, plain, rtol=1e-5, atol=1e-7)
        assert all(torch.allclose(a, b, rtol=1e-5, atol=1e-7) for a, b in zip(grads, flip_grads))
    # the flip teacher sees four views of each part: the batch of 4 whole; in parts, the batch and its two halves
    # each fail at their first view, then its 4 quarters take 4 views each
    assert calls == [1, 4, 1 + 2 + 4 * 4]


def test_a_fixed_teacher_labels_the_unlabelled_scans_in_place_of_the_ema(tmp_path, capsys):
    calls = []
    ema, grads, _ = unlabelled_step(tmp_path / "ema", None, balance=False, teacher_calls=calls)
    fixed, fixed_grads, _ = unlabelled_step(tmp_path / "fixed", None, balance=False, teacher_calls=calls, fixed=True)
    assert ema > 0 and torch.equal(fixed, ema) and all(torch.equal(a, b) for a, b in zip(grads, fixed_grads))
    assert calls == [1, 1] and "does not fit the teacher" not in capsys.readouterr().out  # the EMA never called


def test_a_scan_the_teacher_cannot_hold_alone_skips_the_unlabelled_batch_and_says_so(tmp_path, capsys):
    loss, grads, pending = unlabelled_step(tmp_path, 0, balance=False)
    assert loss == 0 and grads == [None, None]  # nothing of the batch in the gradients
    assert pending.tolist() == [0, 0, 0, 0]  # nor in the epoch's unlabelled_loss and confident_share
    assert "alone does not fit the teacher" in capsys.readouterr().out


def test_scans_the_student_cannot_hold_alone_are_left_out_and_the_rest_still_learned(tmp_path, capsys):
    loss, grads, pending = unlabelled_step(tmp_path, None, balance=False, student_fits=0)  # no scan fits
    assert loss == 0 and grads == [None, None] and pending.tolist() == [0, 0, 0, 0]
    assert capsys.readouterr().out.count("alone does not fit the student's step") == 4


def test_a_batch_none_of_whose_scans_decodes_teaches_nothing(tmp_path):
    loss, grads, pending = unlabelled_step(tmp_path, None, balance=False, damaged=(0, 1, 2, 3))
    assert loss == 0 and grads == [None, None] and pending.tolist() == [0, 0, 0, 0]


def test_class_mix_pastes_a_labelled_scans_foreground_where_both_scans_extend():
    """Unlabelled scans 3 x 4 and 2 x 2 (padded to 3 x 4), image 10, pseudo-labels 0 with one ignored pixel; one
    labelled scan 2 x 3 (padded to 3 x 4), image 200, classes [[1, 0, 2], [255, 1, 0]]: scan 0 takes its classes 1
    and 2 at (0, 0), (0, 2), (1, 1) and nothing else; scan 1 (2 x 2) only (0, 0) and (1, 1); padding untouched."""
    image = torch.full((2, 3, 3, 4), 10, dtype=torch.uint8)
    image[1, :, 2:, :] = image[1, :, :, 2:] = 0  # scan 1's padding
    labels = torch.zeros(2, 3, 4, dtype=torch.long)
    labels[0, 2, 3] = labels[1, 2:, :] = labels[1, :, 2:] = 255
    source = torch.full((1, 3, 3, 4), 200, dtype=torch.uint8)
    mask = torch.full((1, 3, 4), 255, dtype=torch.long)
    mask[0, :2, :3] = torch.tensor([[1, 0, 2], [255, 1, 0]])
    mixed, mixed_labels = class_mix(image, labels, [(3, 4), (2, 2)], (source, mask, [(2, 3)]), 255)
    want = torch.zeros(2, 3, 4, dtype=torch.bool)
    want[0, 0, 0] = want[0, 0, 2] = want[0, 1, 1] = want[1, 0, 0] = want[1, 1, 1] = True
    pasted = want[:, None].expand_as(image)
    assert torch.equal(mixed[:, 0] == 200, want) and torch.equal(mixed[~pasted], image[~pasted])
    expected = labels.clone()
    expected[0, 0, 0] = expected[0, 1, 1] = expected[1, 0, 0] = expected[1, 1, 1] = 1
    expected[0, 0, 2] = 2
    assert torch.equal(mixed_labels, expected)
    assert torch.equal(image[0, 0], torch.full((3, 4), 10, dtype=torch.uint8))  # the inputs are not changed
    floats = class_mix(image, labels, [(3, 4), (2, 2)], (source.float() / 255, mask, [(2, 3)]), 255)
    assert torch.equal(floats[0], mixed) and torch.equal(floats[1], mixed_labels)  # a Dataset's float images alike
    with pytest.raises(ValueError, match="the labelled scans have 1 channel.s. and the unlabelled ones 3"):
        class_mix(image, labels, [(3, 4), (2, 2)], (source[:, :1], mask, [(2, 3)]), 255)


def test_a_run_with_mix_pastes_the_updates_labelled_scans_into_the_students_view(tmp_path, monkeypatch):
    import srforge.train.self_training as self_training

    real, seen = self_training.class_mix, []

    def spy(image, labels, sizes, labelled, ignore_index):
        seen.append((len(sizes), labelled[0].shape[0], labelled[1].shape))
        mixed = real(image, labels, sizes, labelled, ignore_index)
        assert (mixed[1] != labels).any()  # TinyStrips' curves landed on the unlabelled scans' labels
        return mixed

    monkeypatch.setattr(self_training, "class_mix", spy)
    folder = unlabelled_folder(tmp_path / "scans")
    train(self_training_config(tmp_path / "run", folder, self_training={"mix": True, "start_epoch": 3}))
    assert sorted(labelled for _, labelled, _ in seen) == [2, 3, 3]  # epoch 3's updates: 8 scans in batches of 3


def test_mirror_mix_pastes_each_scans_own_confident_foreground_mirrored_within_its_extent():
    """Scans 3 x 4 and 2 x 2 (padded to 3 x 4): scan 0's curve pixel (1, 0) lands at (1, 3) and its class-2 pixel
    (0, 1) at (0, 2); its ignored pixel (2, 3) is not pasted at (2, 0), image nor label; scan 1's (0, 0) lands at
    (0, 1) within its 2 x 2, not at (0, 3) in its padding; backgrounds and padding untouched."""
    image = torch.full((2, 1, 3, 4), 10, dtype=torch.uint8)
    labels = torch.zeros(2, 3, 4, dtype=torch.long)
    image[0, 0, 1, 0], image[0, 0, 0, 1], image[0, 0, 2, 3], image[1, 0, 0, 0] = 200, 150, 77, 90
    labels[0, 1, 0], labels[0, 0, 1], labels[0, 2, 3], labels[1, 0, 0] = 1, 2, 255, 1
    labels[1, 2:, :] = labels[1, :, 2:] = 255  # scan 1's padding
    given = image.clone(), labels.clone()
    mixed, mixed_labels = mirror_mix(image, labels, [(3, 4), (2, 2)], 255)
    expected_image, expected = image.clone(), labels.clone()
    expected_image[0, 0, 1, 3], expected[0, 1, 3] = 200, 1
    expected_image[0, 0, 0, 2], expected[0, 0, 2] = 150, 2
    expected_image[1, 0, 0, 1], expected[1, 0, 1] = 90, 1
    assert torch.equal(mixed, expected_image) and torch.equal(mixed_labels, expected)
    assert torch.equal(image, given[0]) and torch.equal(labels, given[1])  # the inputs are not changed


@pytest.mark.parametrize("mix, kept", [(True, True), ("labelled", True), ("mirror", False), (False, False)])
def test_only_labelled_mix_keeps_the_updates_labelled_batch(mix, kept):
    """mix true is spelt labelled too; the mirror, like no mix, keeps no labelled batch (from start_epoch on)."""
    unlabelled = SelfTraining(None, mix=mix, start_epoch=2)
    batch = (torch.zeros(1, 1, 2, 2, dtype=torch.uint8), torch.zeros(1, 2, 2, dtype=torch.long), torch.tensor([[2, 2]]))
    unlabelled.remember(*batch, epoch=0)  # epoch 1, before start_epoch: nothing kept whatever the mix
    assert unlabelled.labelled is None
    unlabelled.remember(*batch, epoch=1)
    assert (unlabelled.labelled is not None) is kept


@pytest.mark.parametrize("mix", [1, 0, "Mirror", ""])
def test_self_training_refuses_a_mix_it_does_not_know(mix):
    with pytest.raises(ValueError, match="train.self_training.mix: expected false, true, labelled or mirror"):
        SelfTraining(None, mix=mix)


def test_a_run_with_mirror_mix_pastes_the_scans_own_curves_and_keeps_no_labelled_batch(tmp_path, monkeypatch):
    import srforge.train.self_training as self_training

    real, seen = self_training.mirror_mix, []

    def spy(image, labels, sizes, ignore_index):
        seen.append(len(sizes))
        return real(image, labels, sizes, ignore_index)

    def refuse(*args):
        raise AssertionError("mix: mirror pasted a labelled scan")

    monkeypatch.setattr(self_training, "mirror_mix", spy)
    monkeypatch.setattr(self_training, "class_mix", refuse)
    folder = unlabelled_folder(tmp_path / "scans")
    train(self_training_config(tmp_path / "run", folder, self_training={"mix": "mirror", "start_epoch": 3}))
    assert sorted(seen) == [1, 3, 3]  # epoch 3's updates: the stream's 7 scans in batches of 3 (what it pastes: above)


# -- the stream -----------------------------------------------------------------------------------------------------
def test_hostile_members_are_refused_and_named_the_rest_are_read(tmp_path):
    folder = unlabelled_folder(tmp_path / "scans", n=3)
    (folder / "notes.txt").write_text("not a scan")
    (folder / "link.png").symlink_to(folder / "u0.png")
    archive = tmp_path / "scans.zip"
    with zipfile.ZipFile(archive, "w") as z:
        z.write(folder / "u1.png", "ok/u1.png")
        z.write(folder / "u2.png", "../escape.png")
    scans = UnlabelledScans([str(folder), str(archive)])
    assert len(scans) == 4 and scans.sizes[0] == (14, 30)
    refused = dict(scans.rejected)
    assert "symlink" in refused[f"{folder}:link.png"] and "not a scan" in refused[f"{folder}:notes.txt"]
    assert f"{archive}:../escape.png" in refused
    assert scans[3]["name"] == f"{archive}:ok/u1.png" and scans[3]["image"].shape == (3, 15, 39)


def test_an_archive_with_no_readable_scan_is_an_error_naming_it(tmp_path):
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "a.txt").write_text("x")
    with pytest.raises(DataError, match="no readable scan in .*empty .1 member"):
        UnlabelledScans(str(tmp_path / "empty"))


def test_two_ranks_take_disjoint_batches_of_one_pass(tmp_path):
    scans = UnlabelledScans(str(unlabelled_folder(tmp_path / "scans", n=8)))
    names = []
    for rank in (0, 1):
        stream = UnlabelledStream(scans, divisor=4, seed=0, batch_size=2, num_replicas=2, rank=rank)
        assert len(stream) == 2  # 4 batches of the 8 scans, dealt to 2 ranks
        names.append([n for _ in range(len(stream)) for n in stream.next()["name"]])
    assert not set(names[0]) & set(names[1]) and set(names[0]) | set(names[1]) == set(scans.names)
    with pytest.raises(DataError, match="8 scan.s. make fewer batches than the 2 processes"):
        UnlabelledStream(scans, divisor=4, seed=0, batch_size=5, num_replicas=2, rank=0)  # 5 + 3: the short one cut


def test_the_stream_goes_on_from_its_committed_position_pass_after_pass(tmp_path):
    scans = UnlabelledScans(str(unlabelled_folder(tmp_path / "scans", n=5)))
    stream = UnlabelledStream(scans, divisor=4, seed=1, batch_size=2)  # 3 batches a pass
    drawn = []
    for _ in range(7):  # two passes and one batch of the third
        batch = stream.next()
        assert batch["image"].shape[-2] % 4 == 0 and batch["sizes"].shape == (len(batch["name"]), 2)
        drawn.append(batch["name"])
        stream.commit()
    assert sorted(n for names in drawn[:3] for n in names) == sorted(scans.names)  # a pass holds every scan once
    assert drawn[:3] != drawn[3:6]  # each pass in its own order
    assert stream.state_dict() == {"pass": 2, "done": 1, "max_pixels": None}
    handed = stream.next()  # handed out, never committed (its update was not taken): a resume draws it again
    again = UnlabelledStream(scans, divisor=4, seed=1, batch_size=2)
    again.load_state_dict(stream.state_dict())
    assert again.next()["name"] == handed["name"]
    assert again.next()["name"] == stream.next()["name"]


def damage(path: Path) -> None:
    """Keep a PNG's header (its size still reads) and cut its pixels short: it no longer decodes."""
    data = path.read_bytes()
    path.write_bytes(data[: max(60, len(data) // 3)])


@pytest.mark.parametrize("workers", [0, 1])
def test_a_scan_that_does_not_decode_is_left_out_of_its_batch_and_named_once(tmp_path, capsys, workers):
    folder = unlabelled_folder(tmp_path / "scans", n=5)
    damage(folder / "u2.png")
    scans = UnlabelledScans(str(folder))
    assert len(scans) == 5 and not scans.rejected  # its header reads: listed, and found out only when decoded
    stream = UnlabelledStream(scans, divisor=4, seed=1, batch_size=2, num_workers=workers)  # 3 batches a pass
    drawn = [[] if batch is None else batch["name"] for batch in (stream.next() for _ in range(6))]  # two passes
    for names in (drawn[:3], drawn[3:]):
        assert sorted(n for batch in names for n in batch) == sorted(set(scans.names) - {f"{folder}/u2.png"})
    out = capsys.readouterr().out
    assert out.count("warning: data.unlabelled: left out") == 1
    assert f"left out {folder}/u2.png, which does not decode: " in out


def test_a_batch_without_a_scan_that_decodes_is_none_and_a_pass_of_them_an_error(tmp_path):
    folder = unlabelled_folder(tmp_path / "scans", n=3)
    for path in folder.glob("*.png"):
        damage(path)
    stream = UnlabelledStream(UnlabelledScans(str(folder)), divisor=4, seed=0, batch_size=2)  # 2 batches a pass
    assert stream.next() is None and stream.next() is None  # one batch a call all the same: ranks stay in step
    assert stream.cursor == (0, 2)
    with pytest.raises(DataError, match=r"not one scan of 3 batches in a row decodes \(3 unreadable so far, e\.g\."):
        stream.next()


def test_past_the_first_unreadable_scans_the_rest_are_counted_not_named(tmp_path, capsys, monkeypatch):
    import srforge.data.unlabelled as unlabelled

    monkeypatch.setattr(unlabelled, "NAMED_UNREADABLE", 2)
    folder = unlabelled_folder(tmp_path / "scans", n=5)
    for i in (0, 1, 2, 3):
        damage(folder / f"u{i}.png")
    stream = UnlabelledStream(UnlabelledScans(str(folder)), divisor=4, seed=0, batch_size=1)
    for _ in range(5):
        stream.next()
    out = capsys.readouterr().out
    assert out.count("which does not decode") == 2 and out.count("from here on they are left out unnamed") == 1


def test_a_stream_under_a_pixel_budget_resumes_where_it_was_whatever_the_passes_lengths(tmp_path):
    """Under a budget the passes hold different numbers of batches (16 scans of random sizes, 2,500 px: 10, 11, 11,
    10 and 11 batches). Resumed at pass 1's last batch, or just past it, the stream goes on as the stream never
    stopped did, each pass measured by its own length; the checkpoint's budget, not one resolved anew, cuts them."""
    rng = np.random.default_rng(5)
    sizes = [(int(rng.integers(8, 40)), int(rng.integers(8, 80))) for _ in range(16)]
    for i, (h, w) in enumerate(sizes):
        write(tmp_path / "scans" / f"r{i:02d}.png", rgb(h, w, i))
    scans = UnlabelledScans(str(tmp_path / "scans"))
    straight = UnlabelledStream(scans, divisor=4, seed=0, max_pixels=2500)
    lengths = []
    for p in range(3):
        straight.sampler.set_epoch(p)
        lengths.append(len(straight.sampler))
    assert lengths[1] > lengths[0], lengths  # else this test shows nothing
    drawn = [straight.next()["name"] for _ in range(lengths[0] + lengths[1] + 1)]
    for done, expected in ((lengths[1] - 1, drawn[-2]), (lengths[1], drawn[-1])):
        resumed = UnlabelledStream(scans, divisor=4, seed=0, max_pixels=4000)  # a budget resolved anew
        resumed.load_state_dict({"pass": 1, "done": done, "max_pixels": 2500})
        assert resumed.next()["name"] == expected, done


def test_scans_larger_than_the_budget_alone_are_left_out_and_named(tmp_path):
    scans = UnlabelledScans(str(unlabelled_folder(tmp_path / "scans", n=4)))  # 14 x 30 ... 17 x 57 px
    scans.leave_out(lambda h, w: h * w > 500, "larger than the pixel budget")
    assert len(scans) == 1 and scans.sizes == [(14, 30)]
    assert [why for _, why in scans.rejected] == ["larger than the pixel budget"] * 3
    with pytest.raises(DataError, match="every scan was left out"):
        scans.leave_out(lambda h, w: True, "too large")


# -- config ---------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "change, expected",
    [
        ({"ema": None}, "train.self_training: the teacher is the EMA of the weights, but train.ema is null"),
        ({"unlabelled": None}, "train.self_training is set but data.unlabelled is null"),
        ({"self_training": None}, "data.unlabelled is set but train.self_training is null"),
        ({"self_training": {"augment": {"scale": [0.5, 2]}}}, "train.self_training.augment.scale: the student must"),
        ({"self_training": {"confidence": 1.5}}, "train.self_training.confidence: expected a probability"),
        ({"self_training": {"confidence": [0.9, 1.0]}}, "confidence[1]: expected a probability from 0 to below 1, or"),
        ({"self_training": {"confidence": [True, 0.9]}}, "train.self_training.confidence[0]: expected a probability"),
        ({"self_training": {"confidence": [0.9]}}, "train.self_training.confidence: expected one threshold a class, 2"),
        ({"self_training": {"wieght": 1}}, "train.self_training: unknown key 'wieght'"),
        ({"self_training": {"mix": "yes"}}, "train.self_training.mix: expected false, true or labelled (the update"),
        ({"self_training": {"mix": 1}}, "train.self_training.mix: expected false, true or labelled (the update"),
        ({"self_training": {"mix": 0}}, "train.self_training.mix: expected false, true or labelled (the update"),
        ({"self_training": {"tta": "mirror"}}, "train.self_training.tta: expected none (the teacher sees each scan"),
        ({"self_training": {"teacher": 5}}, "train.self_training.teacher: expected null (the teacher is the EMA"),
        ({"self_training": {"skeleton": -1}}, "train.self_training.skeleton: expected a number >= 0"),
        ({"self_training": {"skeleton": float("nan")}}, "train.self_training.skeleton: expected a finite number"),
    ],
)
def test_self_training_without_its_parts_is_a_config_error(tmp_path, change, expected):
    cfg = self_training_config(tmp_path / "run", tmp_path).to_dict()
    cfg["train"]["self_training"] = dict(cfg["train"]["self_training"])
    for key, value in change.items():
        section = "data" if key == "unlabelled" else "train"
        cfg[section][key] = value if not isinstance(value, dict) else {**cfg[section][key], **value}
    with pytest.raises(ConfigError, match=re.escape(expected)):
        resolve(cfg)


def test_a_list_of_confidences_one_a_class_resolves(tmp_path):
    cfg = self_training_config(tmp_path / "run", tmp_path).to_dict()
    cfg["train"]["self_training"] = {**cfg["train"]["self_training"], "confidence": [0.6, 0.8]}
    assert resolve(cfg).train.self_training["confidence"] == [0.6, 0.8]


# -- runs -----------------------------------------------------------------------------------------------------------
def test_a_run_learns_from_unlabelled_scans_and_reports_them(tmp_path, capsys):
    folder = unlabelled_folder(tmp_path / "scans")
    (folder / "notes.txt").write_text("x")
    cfg = self_training_config(tmp_path / "run", folder, self_training={"start_epoch": 2})
    train(cfg)
    out = capsys.readouterr().out
    assert f"srforge: warning: data.unlabelled: left out {folder}:notes.txt: not a scan" in out
    assert "self-training on 7 unlabelled scan(s)" in out
    rows = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert rows[0]["unlabelled_loss"] is None and rows[0]["confident_share"] is None  # before start_epoch
    for row in rows[1:]:
        assert row["unlabelled_loss"] > 0 and 0 < row["confident_share"] <= 1
    # 3 updates an epoch (10 scans: 8 train in batches of 3), one unlabelled batch each from epoch 2 on: 6 batches,
    # two passes of the 7 unlabelled scans in batches of 3.
    assert load_checkpoint(tmp_path / "run" / "last.pt")["unlabelled"] == {"pass": 1, "done": 3, "max_pixels": None}
    assert "val_mean_iou" in rows[-1]


def cut_while_teaching(monkeypatch, cfg) -> None:
    """Train ``cfg`` and stop it with a Ctrl-C in epoch 2's second update (3 updates an epoch), while the teacher's
    guess becomes labels: the stream has handed out that batch and not committed it."""
    import srforge.train.self_training as self_training

    real, calls = self_training.confident_labels, []

    def interrupt(*args, **kwargs):
        calls.append(1)
        if len(calls) == 5:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(self_training, "confident_labels", interrupt)
    with pytest.raises(KeyboardInterrupt):
        train(cfg)
    monkeypatch.setattr(self_training, "confident_labels", real)


def test_a_run_interrupted_while_the_teacher_labels_resumes_to_the_same_bits(tmp_path, monkeypatch):
    folder = unlabelled_folder(tmp_path / "scans")
    train(self_training_config(tmp_path / "straight", folder))
    cut_while_teaching(monkeypatch, self_training_config(tmp_path / "cut", folder))
    saved = load_checkpoint(tmp_path / "cut" / "last.pt")
    position = {"pass": 1, "done": 1, "max_pixels": None}
    assert (saved["epoch"], saved["batches_done"], saved["unlabelled"]) == (1, 1, position)
    train(self_training_config(tmp_path / "cut", folder), resume=tmp_path / "cut")
    a = load_checkpoint(tmp_path / "straight" / "last.pt")
    b = load_checkpoint(tmp_path / "cut" / "last.pt")
    assert a["unlabelled"] == b["unlabelled"]
    assert all(torch.equal(a["model"][k], b["model"][k]) for k in a["model"])
    # ... and it can fail: the same run without the unlabelled scans ends elsewhere.
    plain = train(tiny_config(tmp_path / "plain", ema=0.9, epochs=3))
    c = load_checkpoint(Path(plain["run_dir"]) / "last.pt")
    assert not all(torch.equal(a["model"][k], c["model"][k]) for k in a["model"])


def test_a_run_with_the_skeleton_term_learns_otherwise_and_resumes_to_the_same_bits(tmp_path, monkeypatch):
    """train.self_training.skeleton reaches the student's loss (the run ends elsewhere than without it), and a run
    cut while the teacher labels resumes to the bits of one never stopped (the tubes come from the labels alone)."""
    folder = unlabelled_folder(tmp_path / "scans")
    spec = {"skeleton": 1.0}
    train(self_training_config(tmp_path / "straight", folder, spec))
    cut_while_teaching(monkeypatch, self_training_config(tmp_path / "cut", folder, spec))
    train(self_training_config(tmp_path / "cut", folder, spec), resume=tmp_path / "cut")
    train(self_training_config(tmp_path / "without", folder))
    a, b, c = (load_checkpoint(tmp_path / run / "last.pt")["model"] for run in ("straight", "cut", "without"))
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not all(torch.equal(a[k], c[k]) for k in a)


def test_a_fixed_teacher_needs_no_ema_and_a_resume_keeps_it_or_refuses(tmp_path, monkeypatch):
    """A first run's best.pt teaches a second run without train.ema from epoch 1; the second run, cut while its
    teacher labels and resumed, ends in the bits of the run that went straight through, and a resume whose teacher
    file is another one is refused before anything trains."""
    folder = unlabelled_folder(tmp_path / "scans")
    train(tiny_config(tmp_path / "first", epochs=1))
    teacher = tmp_path / "first" / "best.pt"
    second = lambda run: self_training_config(run, folder, {"teacher": str(teacher)}, ema=None, epochs=2)  # noqa: E731
    train(second(tmp_path / "straight"))
    straight = load_checkpoint(tmp_path / "straight" / "last.pt")
    assert straight["unlabelled"]["teacher"] == hashlib.sha256(teacher.read_bytes()).hexdigest()
    assert straight["unlabelled"]["teacher_file"] == str(teacher)
    rows = [json.loads(x) for x in (tmp_path / "straight" / "metrics.jsonl").read_text().splitlines()]
    assert all(r["unlabelled_loss"] > 0 for r in rows)  # from epoch 1: the teacher has learned already
    cut_while_teaching(monkeypatch, second(tmp_path / "cut"))
    other = tmp_path / "other.pt"
    other.write_bytes(teacher.read_bytes())
    save_checkpoint({**load_checkpoint(other), "epoch": 7}, other)  # the same weights, another file
    cfg = self_training_config(tmp_path / "cut", folder, {"teacher": str(other)}, ema=None, epochs=2)
    was = rf"--resume: this run's teacher was {teacher} \(sha256 [0-9a-f]{{64}}\), and {TEACHER} now gives {other} "
    with pytest.raises(ConfigError, match=was.replace(".", r"\.")):
        train(cfg, resume=tmp_path / "cut")
    with pytest.raises(ConfigError, match=r"now gives null, the EMA\. A resumed run keeps its teacher"):
        train(self_training_config(tmp_path / "cut", folder, epochs=2), resume=tmp_path / "cut")
    train(second(tmp_path / "cut"), resume=tmp_path / "cut")
    cut = load_checkpoint(tmp_path / "cut" / "last.pt")
    assert cut["unlabelled"] == straight["unlabelled"]
    assert all(torch.equal(straight["model"][k], cut["model"][k]) for k in straight["model"])


def test_a_teacher_that_does_not_fit_the_run_is_a_config_error_naming_it(tmp_path):
    from srforge.models.unet import UNet

    folder = unlabelled_folder(tmp_path / "scans")
    train(tiny_config(tmp_path / "first", epochs=1))
    best = load_checkpoint(tmp_path / "first" / "best.pt")

    def other(**args):  # the checkpoint of a model built with other arguments
        kwargs = {**best["model_args"], **args}
        model = UNet(**kwargs)
        return {**best, "model": model.state_dict(), "model_args": kwargs, "size_divisor": model.size_divisor}

    cases = {
        "missing.pt": (None, "Checkpoint not found: .*missing.pt; give an srforge checkpoint"),
        "names.pt": ({**best, "class_names": ["paper", "pencil"]},
                     r"class_names \['paper', 'pencil'\], and this run's \['paper', 'ink'\] \(model.class_names\)"),
        "gray.pt": ({**best, "image_mode": "L"}, "image_mode L, and this run's RGB: the teacher must read"),
        "mono.pt": (other(in_channels=1), "in_channels 1, and this run's 3"),
        "three.pt": (other(num_classes=3), "num_classes 3, and this run's 2"),
        "deeper.pt": (other(depth=3), "size_divisor is 8, which does not divide this run's 4"),
        "foreign.pt": ({**best, "model_class": "elsewhere.models:Net"}, "neither srforge's own nor this run's"),
    }  # fmt: skip
    for name, (ckpt, expected) in cases.items():
        if ckpt is not None:
            save_checkpoint(ckpt, tmp_path / name)
        cfg = self_training_config(tmp_path / name.replace(".pt", ""), folder, {"teacher": str(tmp_path / name)})
        with pytest.raises(ConfigError, match=rf"train\.self_training\.teacher: .*{expected}"):
            train(cfg)
    own = tmp_path / "own"  # a teacher in the run's own folder, which the run may rewrite or remove
    (own / "kept").mkdir(parents=True)
    (own / "kept" / "best.pt").write_bytes((tmp_path / "first" / "best.pt").read_bytes())
    with pytest.raises(ConfigError, match=r"lies in this run's own folder run\.dir"):
        train(self_training_config(own, folder, {"teacher": str(own / "kept" / "best.pt")}))


def test_the_cli_refuses_a_teacher_before_it_touches_the_run_folder(tmp_path):
    from srforge.config.preflight import check_before_training

    cfg = self_training_config(tmp_path / "run", unlabelled_folder(tmp_path / "scans"), {"teacher": "nowhere.pt"})
    with pytest.raises(ConfigError, match="train.self_training.teacher: Checkpoint not found: nowhere.pt"):
        check_before_training(cfg)
    assert not (tmp_path / "run").exists()
    with pytest.raises(ValueError, match="pass its model, teacher=srforge.train.teacher.load_teacher"):
        SelfTraining.from_config(cfg.train.self_training, None, ignore_index=255, seed=0)


@pytest.mark.slow
def test_two_processes_self_train_on_their_own_unlabelled_batches(tmp_path):
    folder = unlabelled_folder(tmp_path / "scans", n=9)
    done = torchrun_custom_dataset(
        tmp_path / "ddp", "train.ema=0.9", f"data.unlabelled={folder}", "train.self_training={confidence: 0.6}"
    )
    assert done.returncode == 0, done.stderr[-3000:]
    rows = [json.loads(line) for line in (tmp_path / "ddp" / "metrics.jsonl").read_text().splitlines()]
    assert all(r["unlabelled_loss"] > 0 for r in rows)
    # 9 scans in 5 batches of 2, cut to 4 for 2 ranks: 2 each a pass; 2 updates an epoch per rank, 2 epochs.
    assert load_checkpoint(tmp_path / "ddp" / "last.pt")["unlabelled"] == {"pass": 1, "done": 2, "max_pixels": None}


@pytest.mark.slow
def test_two_processes_learn_from_one_fixed_teacher(tmp_path):
    import subprocess
    import sys

    from test_train import ROOT

    first = [f"run.dir={tmp_path / 'first'}", "data.dataset.args.n=10", "data.batch_size=2", "model.base_channels=4"]
    script, config = ROOT / "scripts" / "train.py", ROOT / "configs" / "custom_dataset.yaml"
    made = subprocess.run([sys.executable, script, "--config", config, *first, "train.epochs=1"], cwd=ROOT,
                          capture_output=True, text=True)  # fmt: skip
    assert made.returncode == 0, made.stderr[-3000:]
    teacher, folder = tmp_path / "first" / "best.pt", unlabelled_folder(tmp_path / "scans", n=9)
    spec = f"train.self_training={{confidence: 0.6, teacher: {teacher}}}"
    done = torchrun_custom_dataset(tmp_path / "ddp", f"data.unlabelled={folder}", spec)  # no train.ema
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.count(f"self-training's teacher: {teacher}") == 1  # said once, by rank 0
    rows = [json.loads(line) for line in (tmp_path / "ddp" / "metrics.jsonl").read_text().splitlines()]
    assert all(r["unlabelled_loss"] > 0 for r in rows)
    saved = load_checkpoint(tmp_path / "ddp" / "last.pt")["unlabelled"]
    digest = hashlib.sha256(teacher.read_bytes()).hexdigest()
    assert saved == {"pass": 1, "done": 2, "max_pixels": None, "teacher": digest, "teacher_file": str(teacher)}


def test_a_teacher_is_hashed_from_the_bytes_loaded_and_one_that_appears_mid_check_is_refused(tmp_path, monkeypatch):
    from predict_fixtures import random_checkpoint

    from srforge.config.preflight import teacher_checkpoint

    teacher = random_checkpoint(tmp_path / "teacher.pt", class_names=("background", "curve"))
    ckpt, digest = teacher_checkpoint(str(teacher), "srforge.models.unet:UNet", str(tmp_path / "run"))
    assert digest == hashlib.sha256(teacher.read_bytes()).hexdigest() and ckpt["class_names"] == ["background", "curve"]
    # not a file when first looked at, a file when loaded: its bytes were not the ones read, so no digest is claimed
    looks = iter([False])
    real_is_file = Path.is_file
    monkeypatch.setattr(Path, "is_file", lambda self: next(looks, True) if self == teacher else real_is_file(self))
    with pytest.raises(ConfigError, match=rf"^{TEACHER}: \S+teacher.pt changed while it was read"):  # key named once
        teacher_checkpoint(str(teacher), "srforge.models.unet:UNet", str(tmp_path / "run"))
