"""FieldView (srforge.data.field_view), any Dataset seen through srforge's field names: a careless Dataset's
mistakes are data errors naming the sample, nothing silently wrong (a float mask truncated); masks travel as
uint8 (dataset -> augmentation -> collate -> pinned batch), int64 beyond 255 classes.
"""

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, Dataset
from torch.utils.data._utils.pin_memory import pin_memory

from srforge.data.augment import build_augmentation
from srforge.data.collate import AlignedCollate
from srforge.data.field_view import FieldView
from srforge.data.images import DataError


class Careless(Dataset):
    """Four tiny scans; ``mistake`` picks what goes wrong."""

    def __init__(self, mistake="none", n=4):
        self.mistake, self.n = mistake, n

    def __len__(self):
        return self.n + (2 if self.mistake == "long" else 0)

    def __getitem__(self, i):
        if i >= self.n:
            raise IndexError(f"index {i} out of range")
        if self.mistake == "raises" and i == 2:
            raise RuntimeError("scan 2 is on a disk that went away")
        labels = np.zeros((8, 16), np.float32 if self.mistake.startswith("float") else np.int64)
        labels[4, 1:15] = {"float": 0.6, "float_whole": 1.0}.get(self.mistake, 1)
        scan = np.repeat(np.where(labels > 0, 30, 220)[None], 3, 0).astype(np.uint8)
        if self.mistake == "tuple":
            return scan, labels
        return {"id": f"careless_{i}", "scan": scan, "labels": labels}


FIELDS = {"image": "scan", "mask": "labels", "name": "id"}


def view(mistake):
    return FieldView(Careless(mistake), FIELDS, num_classes=2)


def test_a_float_mask_with_fractions_is_refused_naming_the_sample():
    with pytest.raises(DataError, match=r"Careless\[0\] \('careless_0'\): mask values \[0\.6\d*\] are not whole"):
        view("float")[0]
    mask = view("float_whole")[0].mask  # whole numbers stored as floats are class ids
    assert mask.dtype == torch.uint8 and int(mask.max()) == 1


@pytest.mark.parametrize(
    "mistake, message",
    [
        ("tuple", r"Careless\[0\] returned a tuple"),
        ("raises", r"Careless\[2\] raised RuntimeError: scan 2 is on a disk that went away"),
        ("long", r"Careless\[4\] raised IndexError: index 4 out of range \(its __len__ is 6\)"),
    ],
)
def test_dataset_mistakes_are_data_errors_naming_the_sample(mistake, message):
    samples = view(mistake)
    with pytest.raises(DataError, match=message):
        for i in range(len(samples)):
            samples[i]


def test_a_field_name_that_is_not_there_names_the_setting():
    samples = FieldView(Careless(), {**FIELDS, "mask": "label"}, num_classes=2)
    with pytest.raises(DataError, match=r"has no field 'label' for the mask.*Set data.fields.mask"):
        samples[0]


def test_a_float_image_above_1_is_refused_naming_the_sample():
    class FloatScans(Careless):
        def __getitem__(self, i):
            sample = super().__getitem__(i)
            return {**sample, "scan": sample["scan"].astype(np.float32) / self.divide}

    scans = FloatScans()
    scans.divide = 1.0
    with pytest.raises(DataError, match=r"FloatScans\[0\] \('careless_0'\): a float image must hold values in"):
        FieldView(scans, FIELDS, num_classes=2)[0]
    scans.divide = 255.0
    assert FieldView(scans, FIELDS, num_classes=2)[0].image.dtype == torch.float32


# -- masks travel as uint8 ------------------------------------------------------------------------------------------
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
