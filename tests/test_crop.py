"""Gradient accumulation (train.accumulate) and random training crops (data.crop).

Accumulation: N batches of B scans make the same optimizer update as one batch of N x B, pixel for pixel (the
cross-entropy over every valid pixel of the update, whatever each batch holds), the LR schedule counts updates, and
a run resumes exactly, also after a Ctrl-C in the middle of an update. Crops: aligned to the divisor, inside each
scan, drawn per (seed, epoch, sample), only for scans larger than the crop, and the sampler batches cropped sizes.
"""

import json

import numpy as np
import pytest
import torch
from helpers import run_pass, stepping_trainer
from test_train import tiny_config
from torch.utils.data import Dataset

from srforge.config import ConfigError
from srforge.data.collate import AlignedCollate
from srforge.data.crop import crop_shape, crop_sizes, crop_window, sample_seed
from srforge.data.field_view import FieldView
from srforge.models import UNet
from srforge.runtime.checkpoint import load_checkpoint
from srforge.runtime.device_memory import StepMemory
from srforge.runtime.distributed import Processes
from srforge.train import pixel_budget as train_memory
from srforge.train import train
from srforge.train.from_config import Data, build_loaders, crop_training_scans
from srforge.train.losses import segmentation_loss

CPU = torch.device("cpu")


class PatchyStrips(Dataset):
    """Scans of several sizes whose masks leave out (ignore index 255) a different share of pixels each, so that
    averaging batch means would weight pixels unequally."""

    def __len__(self):
        return 6

    def __getitem__(self, i):
        rng = np.random.default_rng(i)
        h, w = 9 + 2 * i, 14 + 5 * i
        mask = rng.integers(0, 3, (h, w)).astype(np.uint8)
        mask[: (i * h) // 7] = 255  # from none to most rows unlabelled
        image = rng.integers(0, 256, (3, h, w), dtype=np.uint8)
        return {"image": image, "mask": mask, "name": f"p{i}"}


def _batches(sizes_per_batch):
    view = FieldView(PatchyStrips(), num_classes=3)
    collate = AlignedCollate(4, pad={"image": 0, "mask": 255})
    batches, start = [], 0
    for count in sizes_per_batch:
        batches.append(collate([view[i] for i in range(start, start + count)]))
        start += count
    return batches


def _update(tmp_path, batches, accumulate, dice=0.0):
    """The trainer (its weights from seed 0) after one SGD(lr=1) pass over ``batches``: weights - the gradient."""
    trainer = stepping_trainer(
        tmp_path / f"run{accumulate}{dice}", "test_accumulate_crop:PatchyStrips", num_classes=3,
        accumulate=accumulate, dice_weight=dice,
    )  # fmt: skip
    torch.manual_seed(0)
    trainer.model.load_state_dict(UNet(num_classes=3, base_channels=4, depth=2).state_dict())
    run_pass(trainer, batches)
    return trainer.model, trainer


def test_accumulated_batches_equal_one_batch_of_them_all(tmp_path):
    one, progress_one = _update(tmp_path, _batches([6]), accumulate=1)
    three, progress_three = _update(tmp_path, _batches([2, 2, 2]), accumulate=3)
    assert (progress_one.step, progress_three.step) == (1, 1) and progress_three.batches_done == 3
    worst = max((a - b).abs().max().item() for a, b in zip(one.parameters(), three.parameters()))
    assert worst <= 1e-6, worst
    # ... and the test can fail: the mean of the three batches' mean losses weights pixels unequally.
    torch.manual_seed(0)
    naive = UNet(num_classes=3, base_channels=4, depth=2)
    for batch in _batches([2, 2, 2]):
        (segmentation_loss(naive(batch.image, batch.sizes), batch.mask.long(), 255) / 3).backward()
    with torch.no_grad():
        for p in naive.parameters():
            p -= p.grad
    assert max((a - b).abs().max().item() for a, b in zip(one.parameters(), naive.parameters())) > 1e-4


def test_an_epoch_ends_with_a_shorter_update_and_dice_is_weighted_by_valid_pixels(tmp_path):
    model, progress = _update(tmp_path, _batches([2, 2, 2]), accumulate=2)  # updates of 2 batches, then of 1
    assert (progress.step, progress.batches_done) == (2, 3)
    one, _ = _update(tmp_path, _batches([6]), accumulate=1, dice=1.0)
    three, _ = _update(tmp_path, _batches([2, 2, 2]), accumulate=3, dice=1.0)
    # Dice is a ratio over the batch: the valid-pixel-weighted mean of the parts' Dice is close, not equal.
    worst = max((a - b).abs().max().item() for a, b in zip(one.parameters(), three.parameters()))
    assert worst < 0.05


def test_accumulation_resumes_exactly_and_the_schedule_counts_updates(tmp_path):
    """8 training scans in batches of 3 (3 batches an epoch), 2 batches an update: 2 updates an epoch, 8 in 4
    epochs, and the cosine schedule over 8 steps ends at lr x min_lr_ratio."""
    train(tiny_config(tmp_path / "straight", accumulate=2))
    train(tiny_config(tmp_path / "stopped", accumulate=2, stop_after=2))
    train(tiny_config(tmp_path / "stopped", accumulate=2), resume=tmp_path / "stopped")
    a = load_checkpoint(tmp_path / "straight" / "last.pt")
    b = load_checkpoint(tmp_path / "stopped" / "last.pt")
    assert a["step"] == b["step"] == 8
    assert all(torch.equal(a["model"][k], b["model"][k]) for k in a["model"])
    rows = [json.loads(x) for x in (tmp_path / "straight" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [2, 4, 6, 8] and rows[-1]["lr"] == pytest.approx(0.01 * 0.01)


def test_a_ctrl_c_inside_an_update_saves_its_start_and_the_resumed_run_redoes_it(tmp_path, monkeypatch):
    import srforge.train.assemble as trainer

    train(tiny_config(tmp_path / "straight", accumulate=2))
    real_loss, calls = trainer.segmentation_loss, []

    def interrupt(*args, **kwargs):
        calls.append(1)
        if len(calls) == 6:  # 3 training batches and 1 validation batch an epoch: epoch 2, inside its first update
            raise KeyboardInterrupt
        return real_loss(*args, **kwargs)

    monkeypatch.setattr(trainer, "segmentation_loss", interrupt)
    with pytest.raises(KeyboardInterrupt):
        train(tiny_config(tmp_path / "cut", accumulate=2))
    monkeypatch.setattr(trainer, "segmentation_loss", real_loss)
    saved = load_checkpoint(tmp_path / "cut" / "last.pt")
    assert (saved["epoch"], saved["batches_done"], saved["step"]) == (1, 0, 2)  # the update boundary before it
    train(tiny_config(tmp_path / "cut", accumulate=2), resume=tmp_path / "cut")
    a = load_checkpoint(tmp_path / "straight" / "last.pt")["model"]
    b = load_checkpoint(tmp_path / "cut" / "last.pt")["model"]
    assert all(torch.equal(a[k], b[k]) for k in a)


# -- data.crop -------------------------------------------------------------------------------------------------------
def test_crop_sizes_round_down_to_the_divisor():
    assert crop_shape(100, 32) == (96, 96) and crop_shape([70, 300], 8) == (64, 296)
    with pytest.raises(ValueError, match=r"data.crop: \[20, 300\] rounds down to \[0, 288\] .* divisor 32"):
        crop_shape([20, 300], 32)
    assert crop_sizes([(50, 400), (120, 90)], (64, 296)) == [(50, 296), (64, 90)]


class Coordinates(Dataset):
    """Float scans whose pixels tell their own row and column, in four sizes, with masks of the same size."""

    SIZES = [(10, 40), (30, 50), (17, 90), (8, 12)]

    def __len__(self):
        return len(self.SIZES)

    def __getitem__(self, i):
        h, w = self.SIZES[i]
        rows = torch.arange(h, dtype=torch.float32)[:, None].expand(h, w)
        cols = torch.arange(w, dtype=torch.float32)[None, :].expand(h, w)
        image = torch.stack([rows / 100, cols / 100, torch.full((h, w), i / 100)])
        return {"image": image, "mask": torch.ones(h, w, dtype=torch.int64), "name": f"c{i}"}


def test_crops_are_aligned_inside_each_scan_and_drawn_per_seed_epoch_and_sample():
    view = FieldView(Coordinates(), num_classes=2, seed=5)
    view.crop = crop_shape([16, 32], 8)
    for epoch in (0, 1):
        view.set_epoch(epoch)
        for i, (h, w) in enumerate(Coordinates.SIZES):
            entry = view[i]
            ch, cw = min(h, 16), min(w, 32)
            assert tuple(entry.image.shape[-2:]) == (ch, cw) == tuple(entry.mask.shape)
            top, left = round(float(entry.image[0, 0, 0]) * 100), round(float(entry.image[1, 0, 0]) * 100)
            assert 0 <= top <= h - ch and 0 <= left <= w - cw  # inside the scan, never beyond its edge
            assert (top, left, ch, cw) == crop_window((h, w), (16, 32), sample_seed(5, epoch, i, "crop"))
            assert torch.equal(entry.image, Coordinates()[i]["image"][:, top : top + ch, left : left + cw])
    assert view[3].image.shape[-2:] == (8, 12)  # a scan that fits stays whole
    view.set_epoch(0)
    again = FieldView(Coordinates(), num_classes=2, seed=5)
    again.crop = view.crop
    assert torch.equal(again[2].image, view[2].image)  # the same (seed, epoch, sample): the same crop
    lefts = set()
    for epoch in range(6):
        view.set_epoch(epoch)
        lefts.add(round(float(view[2].image[1, 0, 0]) * 100))
    assert len(lefts) > 1  # the position changes from epoch to epoch


def test_the_sampler_batches_cropped_sizes_and_validation_stays_whole(tmp_path):
    view = FieldView(Coordinates(), num_classes=2, seed=5)
    val = FieldView(Coordinates(), indices=[1, 2], num_classes=2)
    data = Data(view, val, list(Coordinates.SIZES), [Coordinates.SIZES[1], Coordinates.SIZES[2]])
    crop_training_scans(data, [20, 36], divisor=8)  # -> (16, 32)
    assert data.train.crop == (16, 32) and data.val.crop is None
    assert data.train_sizes == [(10, 32), (16, 32), (16, 32), (8, 12)]
    cfg = tiny_config(tmp_path / "run")["data"]
    cfg["batch_size"], cfg["max_pixels"] = None, 2 * 16 * 32
    loaders = build_loaders(cfg, data, divisor=8, seed=0, processes=Processes(), device=CPU)
    seen = 0
    for batch in loaders.epoch(0):
        assert batch.image.shape[0] * batch.image.shape[-2] * batch.image.shape[-1] <= 2 * 16 * 32
        assert all(h <= 16 and w <= 32 for h, w in batch.sizes.tolist())
        seen += batch.image.shape[0]
    assert seen == 4
    assert sorted(tuple(b.image.shape[-2:]) for b in loaders.val) == [(24, 96), (32, 56)]  # whole, aligned to 8
    with pytest.raises(ConfigError, match=r"data.crop: \[4, 36\] rounds down to \[0, 32\]"):
        crop_training_scans(data, [4, 36], divisor=8)


def test_training_with_crops_runs_and_crops_only_training_scans(tmp_path, monkeypatch):
    shapes = []
    real = UNet.forward

    def forward(self, image, sizes=None):
        shapes.append((torch.is_grad_enabled(), tuple(image.shape[-2:])))
        return real(self, image, sizes)

    monkeypatch.setattr(UNet, "forward", forward)
    monkeypatch.setattr(train_memory, "probe_memory", lambda *args, **kw: StepMemory(500.0, 0.0, "cpu", "fp32"))
    cfg = tiny_config(tmp_path / "run", epochs=1)
    cfg["data"]["crop"] = [12, 40]  # depth 2: multiples of 4 -> (12, 40)
    train(cfg)
    training = [s for grad, s in shapes if grad]
    validation = [s for grad, s in shapes if not grad]
    assert all(h <= 12 and w <= 40 for h, w in training)
    assert any(w > 40 for _, w in validation)  # validation scans stay whole (TinyStrips 6: 13 x 62 px)
