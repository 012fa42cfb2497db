"""Masks travel as uint8 (dataset -> augmentation -> collate -> pinned batch) and become int64 only on the device.

More than 255 classes (or an ignore index beyond 255) keep int64 all the way.
"""

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, Dataset
from torch.utils.data._utils.pin_memory import pin_memory

import srforge.train.assemble as epoch
from srforge.config import resolve
from srforge.data.augment import build_augmentation
from srforge.data.collate import AlignedCollate
from srforge.data.field_view import FieldView
from srforge.train import Trainer, train

EVERY_STEP = {
    "hflip": 1.0,
    "vflip": 1.0,
    "affine": {"degrees": 5, "translate": 0.1, "shear": 3},
    "color_jitter": {"brightness": 0.3},
    "noise": 0.05,
}


class Scans(Dataset):
    """Scans with int64 numpy masks (as a user's Dataset might return them), values 0..classes-1."""

    def __init__(self, n=6, classes=2):
        self.n, self.classes = n, classes

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        rng = np.random.default_rng(i)
        h, w = 10 + i, 15 + 2 * i
        mask = rng.integers(0, self.classes, (h, w)).astype(np.int64)
        return {"image": rng.integers(0, 256, (3, h, w), dtype=np.uint8), "mask": mask, "name": f"s{i}"}


def _batch(classes, augment):
    view = FieldView(Scans(classes=classes), augment=augment, num_classes=classes)
    samples = [view[i] for i in range(len(view))]
    loader = DataLoader(view, batch_size=3, collate_fn=AlignedCollate(8, pad={"image": 0, "mask": 255}))
    return samples, next(iter(loader))


@pytest.mark.parametrize("augment", [None, EVERY_STEP], ids=["plain", "every augmentation"])
def test_up_to_255_classes_masks_stay_uint8_to_the_pinned_batch(augment, monkeypatch):
    samples, batch = _batch(2, build_augmentation(augment, ignore_index=255) if augment else None)
    assert {s.mask.dtype for s in samples} == {torch.uint8}
    assert batch.mask.dtype == torch.uint8
    # Padding is the ignore index: every pixel beyond a scan's true size is 255.
    for i, (h, w) in enumerate(batch.sizes.tolist()):
        assert (batch.mask[i, h:] == 255).all() and (batch.mask[i, :, w:] == 255).all()
        assert set(batch.mask[i, :h, :w].unique().tolist()) <= {0, 1, 255}  # 255 where the affine left no data
    # The DataLoader's pin_memory step, with pinning itself replaced by a copy (pinning needs a GPU; the CUDA
    # tests pin for real): the batch keeps its type and its mask dtype.
    monkeypatch.setattr(torch.Tensor, "pin_memory", lambda self, *args: self.clone())
    pinned = pin_memory(batch)
    assert type(pinned) is type(batch) and pinned.mask.dtype == torch.uint8 and pinned.is_batched


def test_more_than_255_classes_keep_int64():
    samples, batch = _batch(300, build_augmentation({"hflip": 1.0, "affine": {"degrees": 5}}, ignore_index=255))
    assert {s.mask.dtype for s in samples} == {torch.int64} and batch.mask.dtype == torch.int64


def test_the_trainer_moves_uint8_and_the_loss_sees_int64(tmp_path, monkeypatch):
    seen_batches, seen_targets = [], []
    real_to_device, real_loss = Trainer.to_device, epoch.segmentation_loss

    def to_device(self, batch):
        seen_batches.append(batch.mask.dtype)
        return real_to_device(self, batch)

    def loss(logits, target, *args, **kwargs):
        seen_targets.append(target.dtype)
        return real_loss(logits, target, *args, **kwargs)

    monkeypatch.setattr(Trainer, "to_device", to_device)
    monkeypatch.setattr(epoch, "segmentation_loss", loss)
    cfg = resolve(
        {
            "run": {"dir": str(tmp_path / "run"), "device": "cpu"},
            "data": {"dataset": {"class": "test_uint8_masks:Scans"}, "batch_size": 2, "augment": {"hflip": 0.5}},
            "model": {"base_channels": 4, "depth": 2},
            "train": {"epochs": 1},
        }
    )
    train(cfg)
    assert set(seen_batches) == {torch.uint8} and set(seen_targets) == {torch.int64} and len(seen_targets) >= 3
