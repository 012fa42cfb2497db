"""DataTransform: fields named by parameters, dispatch on is_batched, field mapping, no mutation."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from helpers import same

from srforge import DataTransform, Entry


class CropBorder(DataTransform):  # SR-Forge's batched example: one call on [B, C, H, W]
    def __init__(self, border: int):
        super().__init__()
        self.border = border

    def transform(self, image: torch.Tensor) -> torch.Tensor:
        b = self.border
        return image[..., b:-b, b:-b]


class PerChannelNormalize(DataTransform):  # SR-Forge's example: unpacks [B, C, H, W]
    def transform(self, image: torch.Tensor) -> torch.Tensor:
        B, C, H, W = image.shape
        mean = image.mean(dim=(2, 3), keepdim=True)
        std = image.std(dim=(2, 3), keepdim=True)
        return (image - mean) / (std + 1e-8)


class PerSampleResize(DataTransform):  # SR-Forge's example: one sample at a time
    def __init__(self, size):
        super().__init__()
        self.size = size
        self.calls = 0

    def transform_unbatched(self, image: torch.Tensor) -> torch.Tensor:
        assert image.dim() == 3, "transform_unbatched must see [C, H, W]"
        self.calls += 1
        return F.interpolate(image.unsqueeze(0), size=self.size).squeeze(0)


class FlipBoth(DataTransform):  # two fields in, a tuple out
    def transform_unbatched(self, image, mask):
        return image.flip(-1), mask.flip(-1)


def _batch(n=3, h=6, w=6):
    return Entry.collate(
        [Entry(name=f"s{i}", image=torch.randn(3, h, w), mask=torch.randint(0, 2, (h, w))) for i in range(n)]
    )


def test_batched_transform_on_a_batch():
    batch = _batch()
    out = CropBorder(1)(batch)
    assert out.image.shape == (3, 3, 4, 4) and out.is_batched
    assert torch.equal(out.image, batch.image[..., 1:-1, 1:-1])


def test_batched_transform_on_a_single_sample_adds_and_removes_the_batch_dim():
    sample = _batch()[0]
    out = PerChannelNormalize()(sample)  # would fail to unpack B, C, H, W on a [C, H, W] tensor
    assert out.image.shape == (3, 6, 6) and not out.is_batched
    assert out.name == "s0"
    assert torch.allclose(out.image.mean(dim=(1, 2)), torch.zeros(3), atol=1e-5)


def test_batched_transform_on_a_sample_leaves_other_fields_untouched():
    sample = Entry(image=torch.ones(1, 4, 4), scale=4, meta={"w": 0.5}, arr=np.zeros(2))
    out = CropBorder(1)(sample)
    assert out.image.shape == (1, 2, 2)
    assert out.scale == 4 and type(out.scale) is int and out.meta == {"w": 0.5} and isinstance(out.arr, np.ndarray)


def test_unbatched_transform_on_a_batch_runs_per_sample_and_recollates():
    batch = _batch(n=3)
    resize = PerSampleResize((4, 5))
    out = resize(batch)
    assert resize.calls == 3
    assert out.image.shape == (3, 3, 4, 5) and out.is_batched and out.name == ["s0", "s1", "s2"]
    assert torch.equal(out.image[1], F.interpolate(batch.image[1:2], size=(4, 5))[0])


def test_unbatched_transform_on_a_sample():
    out = PerSampleResize((2, 2))(_batch()[1])
    assert out.image.shape == (3, 2, 2) and not out.is_batched


def test_several_fields_return_a_tuple_written_back_in_order():
    batch = _batch()
    out = FlipBoth()(batch)
    assert torch.equal(out.image, batch.image.flip(-1)) and torch.equal(out.mask, batch.mask.flip(-1))


def test_field_mapping_serves_differently_named_fields():
    entry = Entry(lr=torch.arange(25.0).view(1, 5, 5), hr=torch.zeros(1, 5, 5))
    out = CropBorder(1).with_fields(image="lr")(entry)
    assert out.lr.shape == (1, 3, 3) and out.hr.shape == (1, 5, 5) and "image" not in out
    also = CropBorder(1)
    also.fields = {"image": "hr"}
    assert also(entry).hr.shape == (1, 3, 3)


def test_the_input_entry_is_never_modified():
    batch = _batch()
    before = batch.copy()
    image = batch.image.clone()
    for t in (CropBorder(1), PerSampleResize((2, 2)), FlipBoth()):
        t(batch)
        t(batch[0])
    assert same(batch, before) and torch.equal(batch.image, image)


def test_missing_field_names_the_transform_and_the_fields():
    with pytest.raises(KeyError, match=r"CropBorder.transform reads fields \['image'\].*\['lr'\]"):
        CropBorder(1)(Entry(lr=torch.zeros(1, 4, 4)))


def test_wrong_number_of_returned_values_is_explained():
    class Bad(DataTransform):
        def transform_unbatched(self, image, mask):
            return image

    with pytest.raises(ValueError, match="must return a tuple of 2"):
        Bad()(Entry(image=torch.zeros(1), mask=torch.zeros(1)))


def test_a_transform_must_define_one_of_the_two_methods():
    class Nothing(DataTransform):
        pass

    with pytest.raises(TypeError, match="defines neither transform"):
        Nothing()


def test_a_transform_only_takes_entries():
    with pytest.raises(TypeError, match="expects an Entry"):
        CropBorder(1)({"image": torch.zeros(1, 4, 4)})
