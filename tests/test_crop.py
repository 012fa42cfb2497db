"""Random training crops (data.crop, srforge.data.crop): aligned to the divisor, inside each scan, drawn per (seed,
epoch, sample), only for scans larger than the crop; the sampler batches cropped sizes, validation stays whole.
"""

import pytest
import torch
from test_train import tiny_config
from torch.utils.data import Dataset

from srforge.config import ConfigError
from srforge.data.crop import crop_shape, crop_sizes, crop_window, sample_seed
from srforge.data.field_view import FieldView
from srforge.models import UNet
from srforge.runtime.device_memory import StepMemory
from srforge.runtime.distributed import Processes
from srforge.train import pixel_budget as train_memory
from srforge.train import train
from srforge.train.from_config import Data, build_loaders, crop_training_scans

CPU = torch.device("cpu")


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
