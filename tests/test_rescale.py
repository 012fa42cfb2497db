"""Rescaling training scans (data.augment.scale): factors drawn per (seed, epoch, sample), sizes the sampler and the
batches agree on, masks whose curves survive shrinking, the pixel budget kept in every epoch, config errors."""

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from test_train import tiny_config
from torch.utils.data import DataLoader, Dataset

from srforge.config import ConfigError, resolve
from srforge.constants import IGNORE_INDEX
from srforge.data.augment import build_augmentation, check_recipe
from srforge.data.collate import AlignedCollate
from srforge.data.crop import crop_sizes, sample_seed
from srforge.data.field_view import FieldView
from srforge.data.rescale import (
    area_coverage,
    epoch_sizes,
    rescale,
    rescale_mask,
    scale_factor,
    scaled_size,
)
from srforge.data.sampling import SizeGroupedBatchSampler, aligned_sizes, training_sampler
from srforge.runtime.distributed import Processes
from srforge.train.from_config import Data, build_data, build_loaders, crop_training_scans, training_epoch_sizes

CPU = torch.device("cpu")


class Sheets(Dataset):
    """Scans of tens of pixels, each of its own size: a 1-px curve (class 1), a patch of class 2, an unlabelled
    corner (ignore index); the image encodes the pixel position, so a resize shows in it."""

    def __init__(self, n=12):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        h, w = 10 + 3 * (i % 5), 16 + 5 * i
        mask = np.zeros((h, w), np.uint8)
        mask[h // 2, :] = 1
        mask[1:4, 2:6] = 2
        mask[-2:, -3:] = IGNORE_INDEX
        rng = np.random.default_rng(i)
        image = rng.integers(0, 256, (3, h, w), dtype=np.uint8)
        return {"image": image, "mask": mask, "name": f"sheet_{i:02d}"}

    def sizes(self):
        return [(10 + 3 * (i % 5), 16 + 5 * i) for i in range(self.n)]


# -- the factor and the sizes ------------------------------------------------------------------------------------------
def test_the_factor_is_log_uniform_in_the_range_and_depends_on_seed_epoch_index_only():
    factors = [scale_factor(7, epoch, index, (0.5, 2.0)) for epoch in range(20) for index in range(50)]
    assert all(0.5 <= f < 2.0 for f in factors)
    logs = np.log(factors)
    assert abs(logs.mean()) < 0.05  # log-uniform: as likely below 1 as above
    assert abs(np.mean(logs < 0) - 0.5) < 0.05
    assert scale_factor(7, 3, 11, [0.5, 2.0]) == scale_factor(7, 3, 11, (0.5, 2.0))  # pure function
    assert len({scale_factor(7, e, 11, (0.5, 2.0)) for e in range(10)}) == 10  # changes with the epoch
    assert scale_factor(7, 3, 11, (0.8, 0.8)) == 0.8 and scale_factor(1, 2, 3, (1, 1)) == 1.0
    # Its own stream: the crop's seed for the same sample is what it was.
    assert sample_seed(7, 3, 11, "crop") != sample_seed(7, 3, 11, "scale")
    with pytest.raises(ValueError, match="data.augment.scale"):
        scale_factor(0, 0, 0, (2.0, 1.0))


def test_scaled_size_rounds_and_keeps_a_pixel():
    assert scaled_size((10, 20), 1.0) == (10, 20)
    assert scaled_size((10, 21), 0.5) == (5, round(10.5))
    assert scaled_size((3, 40), 0.1) == (1, 4)  # never 0
    assert scaled_size((12, 7), 1.5) == (18, round(10.5))


def test_epoch_sizes_draw_with_the_dataset_indices_then_crop():
    sizes, indices = [(20, 30), (40, 12), (9, 50)], [5, 0, 17]  # a view over dataset samples 5, 0 and 17
    got = epoch_sizes(sizes, indices, seed=3, epoch=2, scale_range=(0.5, 2.0), crop=(24, 32))
    want = [scaled_size(s, scale_factor(3, 2, i, (0.5, 2.0))) for s, i in zip(sizes, indices)]
    assert got == crop_sizes(want, (24, 32))
    assert epoch_sizes(sizes, indices, 3, 2, None, None) == sizes
    with pytest.raises(ValueError, match="one index per size"):
        epoch_sizes(sizes, [0, 1], 3, 2, (0.5, 2.0), None)


# -- images and masks --------------------------------------------------------------------------------------------------
def test_images_resize_bilinearly_and_keep_their_dtype():
    image = torch.randint(0, 256, (3, 20, 30), dtype=torch.uint8)
    sample = rescale({"image": image, "mask": torch.zeros(20, 30, dtype=torch.uint8), "name": "a"}, 0.5)
    assert sample["image"].dtype == torch.uint8 and sample["image"].shape == (3, 10, 15)
    assert sample["mask"].dtype == torch.uint8 and sample["mask"].shape == (10, 15) and sample["name"] == "a"
    want = F.interpolate(image[None].float(), size=(10, 15), mode="bilinear", align_corners=False, antialias=True)
    assert torch.equal(sample["image"], want[0].round().to(torch.uint8))
    flat = torch.full((1, 8, 8), 0.25)
    assert torch.allclose(
        rescale({"image": flat, "mask": torch.zeros(8, 8)}, 1.75)["image"], torch.full((1, 14, 14), 0.25)
    )


def test_factor_one_returns_the_sample_as_it_was():
    sample = {"image": torch.ones(3, 9, 9), "mask": torch.zeros(9, 9, dtype=torch.int64)}
    image, mask = sample["image"], sample["mask"]
    out = rescale(sample, 1.0)
    assert out is sample and out["image"] is image and out["mask"] is mask
    view, plain = FieldView(Sheets(), num_classes=3, seed=1), FieldView(Sheets(), num_classes=3, seed=1)
    view.scale = (1.0, 1.0)
    for i in range(len(view)):
        assert torch.equal(view[i].image, plain[i].image) and torch.equal(view[i].mask, plain[i].mask)


@pytest.mark.parametrize("dtype", [torch.uint8, torch.int64])
def test_enlarged_masks_are_nearest_neighbour_with_no_new_values(dtype):
    mask = torch.from_numpy(np.random.default_rng(0).choice([0, 1, 2, IGNORE_INDEX], (13, 17))).to(dtype)
    for factor in (1.3, 1.7, 2.0, 3.1):
        size = scaled_size(mask.shape, factor)
        out = rescale_mask(mask, size)
        assert out.dtype == dtype and tuple(out.shape) == size
        assert set(out.unique().tolist()) <= set(mask.unique().tolist())
        want = F.interpolate(mask[None, None].double(), size=size, mode="nearest-exact")[0, 0].to(dtype)
        assert torch.equal(out, want)


def _line(shape, kind, offset):
    mask = torch.zeros(shape, dtype=torch.uint8)
    h, w = shape
    if kind == "horizontal":
        mask[offset % h, :] = 1
    elif kind == "vertical":
        mask[:, offset % w] = 1
    else:  # a diagonal staircase across the whole square scan, shifted by offset
        for x in range(w):
            mask[(x + offset) % h, x] = 1
    return mask


@pytest.mark.parametrize("kind", ["horizontal", "vertical", "diagonal"])
def test_one_pixel_lines_survive_shrinking_at_0_3(kind):
    lost_by_nearest = 0
    for offset in range(12):  # every position of the line relative to the output grid
        for side in (30, 37, 41):
            mask = _line((side, side), kind, offset)
            size = scaled_size(mask.shape, 0.3)
            out = rescale_mask(mask, size)
            assert set(out.unique().tolist()) <= {0, 1}
            line = out == 1
            if kind in ("horizontal", "diagonal"):
                assert line.any(0).all(), (side, offset)  # every column keeps a pixel of the line
            if kind in ("vertical", "diagonal"):
                assert line.any(1).all(), (side, offset)  # every row does
            if kind == "diagonal" and offset == 0:
                assert line.sum() <= 3 * size[0]  # still a thin line, not a band
            nearest = F.interpolate(mask[None, None].float(), size=size, mode="nearest-exact")[0, 0]
            lost_by_nearest += not bool((nearest == 1).any(0).all() and (nearest == 1).any(1).all())
    assert lost_by_nearest > 0  # ... where the nearest neighbour alone loses it


@pytest.mark.parametrize("factor", [0.12, 0.3, 0.45, 0.5, 0.77, 0.9, 0.99])
def test_a_line_survives_at_any_factor_and_offset(factor):
    for offset in range(8):
        mask = _line((29, 43), "horizontal", offset)
        assert (rescale_mask(mask, scaled_size(mask.shape, factor)) == 1).any(0).all(), (factor, offset)


def _lost_columns(factors, sides, shifts):
    """How many (factor, side, shift) shrink a 45-degree 1-px line so that some output column loses it."""
    lost = 0
    for factor in factors:
        for side in sides:
            for shift in shifts:
                mask = torch.zeros(side + shift, side, dtype=torch.uint8)
                mask[torch.arange(side) + shift, torch.arange(side)] = 1
                lost += not bool((rescale_mask(mask, scaled_size(mask.shape, factor)) == 1).any(0).all())
    return lost


def test_diagonal_lines_survive_at_factors_near_one(monkeypatch):
    import srforge.data.rescale as rescale_module

    factors, sides, shifts = (0.7, 0.8, 0.9, 0.95, 0.98), range(30, 46), range(4)
    assert _lost_columns(factors, sides, shifts) == 0
    # Half the ratio keeps every horizontal line but not every diagonal one: hence 4/9 (rescale.COVERAGE).
    monkeypatch.setattr(rescale_module, "COVERAGE", 0.5)
    assert _lost_columns(factors, sides, shifts) > 0


def test_coverage_is_exact_area():
    region = torch.zeros(6, 6, dtype=torch.bool)
    region[:2, :2] = True  # output pixels of 1.5 x 1.5 px: the first fully covered, a third of the next
    axis = torch.tensor([1.0, 1 / 3, 0.0, 0.0], dtype=torch.float64)
    assert torch.allclose(area_coverage(region, (4, 4)), axis[:, None] * axis[None, :])
    assert torch.allclose(area_coverage(region, (3, 2)), torch.tensor([[4 / 6, 0], [0, 0], [0, 0]]).double())


def test_ignore_stays_ignore_and_background_stays_background_when_shrinking():
    mask = torch.zeros(40, 40, dtype=torch.uint8)
    mask[:20, :20] = IGNORE_INDEX  # an unlabelled block
    mask[30, :] = 2  # a line of class 2 far from it
    out = rescale_mask(mask, scaled_size(mask.shape, 0.3))  # 12 x 12: 3.33 px an output pixel
    assert (out[:6, :6] == IGNORE_INDEX).all()  # inside the block: still ignore, never foreground
    assert set(out.unique().tolist()) == {0, 2, IGNORE_INDEX}
    assert not (out[:8] == 2).any() and (out[8:11] == 2).any(0).all()  # the line (output row 9) stays where it was
    only = torch.full((30, 30), IGNORE_INDEX, dtype=torch.int64)
    only[10:, 10:] = 0
    shrunk = rescale_mask(only, (9, 9))
    assert set(shrunk.unique().tolist()) == {0, IGNORE_INDEX} and shrunk.dtype == torch.int64
    custom = torch.zeros(20, 20, dtype=torch.int64)
    custom[:, 3] = 7  # a 1-px line of 7: kept as a class, but as the ignore index it is not thickened
    assert (rescale_mask(custom, (6, 6)) == 7).any(1).all()
    assert (rescale_mask(custom, (6, 6), ignore_index=7) == 0).all()  # the nearest neighbour samples miss it


# -- the view, the batches and the sampler -----------------------------------------------------------------------------
def test_the_view_rescales_before_the_crop_with_the_dataset_index():
    view = FieldView(Sheets(), indices=[4, 9, 2, 7], num_classes=3, seed=5)
    view.scale, view.crop = (0.5, 2.0), (16, 32)
    for epoch in range(3):
        view.set_epoch(epoch)
        expected = epoch_sizes(
            [Sheets().sizes()[i] for i in view.indices], view.indices, 5, epoch, (0.5, 2.0), (16, 32)
        )
        for i in range(len(view)):
            entry = view[i]
            assert tuple(entry.image.shape[-2:]) == tuple(entry.mask.shape) == expected[i]
            assert entry.mask.dtype == torch.uint8


def test_batches_record_the_rescaled_sizes_through_the_trainer_data_path(tmp_path):
    cfg = tiny_config(tmp_path / "run")
    cfg = resolve(
        {
            **cfg,
            "data": {
                **cfg["data"],
                "dataset": {"class": "test_rescale:Sheets", "args": {"n": 10}},
                "fields": {},
                "augment": {"hflip": 0.5, "scale": [0.6, 1.8]},
            },
        }
    )
    data = build_data(cfg.data, num_classes=3, seed=cfg.run.seed, run_dir=tmp_path / "run")
    assert data.train.scale == (0.6, 1.8) and data.val.scale is None
    assert data.train_sizes == [scaled_size(s, 1.8) for s in data.train_true_sizes]  # the largest any epoch draws
    crop_training_scans(data, None, 4)
    loaders = build_loaders(cfg.data, data, divisor=4, seed=cfg.run.seed, processes=Processes(), device=CPU)
    true = dict(zip((f"sheet_{i:02d}" for i in data.train.indices), data.train_true_sizes))
    position = {f"sheet_{i:02d}": i for i in data.train.indices}
    for epoch in range(3):
        seen = 0
        for batch in loaders.epoch(epoch):
            for name, size in zip(batch.name, batch.sizes.tolist()):
                factor = scale_factor(cfg.run.seed, epoch, position[name], (0.6, 1.8))
                assert tuple(size) == scaled_size(true[name], factor), (epoch, name)
                seen += 1
        assert seen == len(data.train)
    val_sizes = sorted(tuple(s) for b in loaders.val for s in b.sizes.tolist())
    assert val_sizes == sorted(map(tuple, data.val_sizes))  # validation is never rescaled


@pytest.mark.parametrize("crop", [None, (20, 40)])
def test_the_sampler_keeps_the_pixel_budget_with_each_epochs_rescaled_sizes(crop):
    view = FieldView(Sheets(24), num_classes=3, seed=2)
    view.scale, view.crop = (0.5, 2.0), crop
    divisor, budget = 4, 3 * 24 * 48
    sampler = training_sampler(
        Sheets(24).sizes(),
        seed=2,
        divisor=divisor,
        max_pixels=budget,
        epoch_sizes=lambda e: epoch_sizes(Sheets(24).sizes(), view.indices, view.seed, e, view.scale, view.crop),
    )
    collate = AlignedCollate(divisor, pad={"image": 0, "mask": IGNORE_INDEX})
    epochs = []
    for epoch in range(4):
        sampler.set_epoch(epoch)
        view.set_epoch(epoch)
        batches = list(sampler)
        assert sorted(i for b in batches for i in b) == list(range(24))
        for b in batches:
            actual = [tuple(view[i].image.shape[-2:]) for i in b]  # the sizes the view really gives
            aligned = aligned_sizes(actual, divisor)
            assert len(b) == 1 or len(b) * aligned[:, 0].max() * aligned[:, 1].max() <= budget, (epoch, b, actual)
            assert collate([view[i] for i in b]).sizes.tolist() == [list(s) for s in actual]
        epochs.append(batches)
    assert any(epochs[e] != epochs[0] for e in range(1, 4))  # the batches change with each epoch's sizes


def test_the_sampler_without_epoch_sizes_or_with_fixed_ones_is_as_before():
    sizes = Sheets(20).sizes()
    plain = SizeGroupedBatchSampler(sizes, max_pixels=2000, divisor=4, seed=1)
    fixed = SizeGroupedBatchSampler(sizes, max_pixels=2000, divisor=4, seed=1, epoch_sizes=lambda e: sizes)
    for epoch in range(3):
        plain.set_epoch(epoch)
        fixed.set_epoch(epoch)
        assert list(plain) == list(fixed)
    wrong = SizeGroupedBatchSampler(sizes, batch_size=2, seed=1, epoch_sizes=lambda e: sizes[:-1])
    with pytest.raises(ValueError, match=r"epoch_sizes\(0\) gave 19 sizes for 20 indices"):
        list(wrong)


def test_the_sampler_calls_epoch_sizes_once_per_seed_and_epoch():
    calls = []

    def sizes_in(epoch):
        calls.append(epoch)
        return epoch_sizes(Sheets(8).sizes(), list(range(8)), 0, epoch, (0.5, 2.0), None)

    sampler = SizeGroupedBatchSampler(Sheets(8).sizes(), max_pixels=4000, divisor=4, epoch_sizes=sizes_in)
    for epoch in (0, 0, 1, 1):
        sampler.set_epoch(epoch)
        len(sampler), list(sampler)
    assert calls == [0, 1]


def _names_and_pixels(batch):
    return [(n, tuple(i.shape), int(i.long().sum()), int(m.long().sum())) for n, i, m in zip(*batch)]


def _as_tuple(samples):
    return [s.name for s in samples], [s.image for s in samples], [s.mask for s in samples]


def test_the_factor_is_the_same_in_any_worker_and_any_order():
    view = FieldView(Sheets(), num_classes=3, seed=9)
    view.scale = (0.5, 2.0)
    view.set_epoch(3)
    order = list(reversed(range(len(view))))
    alone = _names_and_pixels(_as_tuple([view[i] for i in range(len(view))]))
    loader = DataLoader(view, batch_sampler=[[i] for i in order], num_workers=2, collate_fn=_as_tuple)
    in_workers = [row for batch in loader for row in _names_and_pixels(batch)]
    assert sorted(in_workers) == sorted(alone)
    copy = FieldView(Sheets(), indices=[6, 2], num_classes=3, seed=9)  # another view of the same samples
    copy.scale = (0.5, 2.0)
    copy.set_epoch(3)
    assert tuple(copy[0].image.shape) == tuple(view[6].image.shape) and torch.equal(copy[1].mask, view[2].mask)


def test_training_epoch_sizes_use_the_views_seed_indices_and_crop():
    view = FieldView(Sheets(), indices=[3, 8, 1], num_classes=3, seed=11)
    data = Data(view, view, [(1, 1)] * 3, [], [Sheets().sizes()[i] for i in (3, 8, 1)])
    assert training_epoch_sizes(data) is None  # no scale: the sizes never change
    view.scale, view.crop = (0.7, 1.4), (12, 24)
    sizes_in = training_epoch_sizes(data)
    for epoch in range(3):
        view.set_epoch(epoch)
        assert sizes_in(epoch) == [tuple(view[i].image.shape[-2:]) for i in range(3)]


# -- config ------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("bad", [[2.0, 0.5], [0, 1], [-1, 2], "big", 1.5, [1], [1, 2, 3], [True, 2], [None, 2]])
def test_bad_scale_values_name_data_augment_scale(tmp_path, bad):
    cfg = tiny_config(tmp_path / "run")
    with pytest.raises(ConfigError, match=r"data\.augment\.scale"):
        resolve({**cfg, "data": {**cfg["data"], "augment": {"scale": bad}}})
    with pytest.raises(ValueError, match=r"data\.augment\.scale: expected \[lo, hi\].*found"):
        check_recipe({"scale": bad})


def test_scale_builds_no_torchvision_step():
    assert repr(build_augmentation({"scale": [0.5, 2.0]})) == repr(build_augmentation({}))
    check_recipe({"scale": [0.5, 2], "affine": {"degrees": 2}})
    check_recipe({"scale": [1, 1]})
    assert math.isclose(scale_factor(0, 0, 0, [1, 1]), 1.0)
