"""AlignedCollate: padded shapes, contents, sizes, the exact inverse, workers, drop-in forms, bad input."""

import warnings

import numpy as np
import pytest
import torch
from helpers import same
from hypothesis import given, settings
from hypothesis import strategies as st
from PIL import Image
from torch.utils.data import DataLoader, Dataset

from srforge import AlignedCollate, Entry, crop_to_sizes, pad_to_multiple, valid_mask


def _scan(name, h, w, c=3, dtype=torch.uint8, seed=0):
    g = torch.Generator().manual_seed(seed)
    image = torch.randint(0, 255, (c, h, w), generator=g).to(dtype)
    mask = torch.randint(0, 3, (h, w), generator=g)
    return Entry(name=name, image=image, mask=mask, depth=float(h))


def test_pads_to_the_batch_max_of_the_next_multiple_and_records_sizes():
    batch = AlignedCollate(divisor=32)([_scan("a", 50, 70), _scan("b", 33, 100)])
    assert batch.image.shape == (2, 3, 64, 128)  # max(64, 64) x max(96, 128)
    assert batch.mask.shape == (2, 64, 128)
    assert batch.sizes.dtype == torch.int64 and batch.sizes.tolist() == [[50, 70], [33, 100]]
    assert batch.image.dtype == torch.uint8 and batch.mask.dtype == torch.int64
    assert batch.is_batched and batch.batch_size == 2 and batch.name == ["a", "b"]
    assert batch.depth.dtype == torch.float32  # other fields follow the Entry rules


def test_sample_sits_top_left_and_pad_values_fill_the_rest():
    s = _scan("a", 5, 7)
    batch = AlignedCollate(divisor=8, pad={"image": 0, "mask": 255})([s, _scan("b", 9, 3)])
    assert torch.equal(batch.image[0, :, :5, :7], s.image)
    assert (batch.image[0, :, 5:, :] == 0).all() and (batch.image[0, :, :, 7:] == 0).all()
    assert (batch.mask[0, 5:, :] == 255).all() and (batch.mask[0, :, 7:] == 255).all()
    assert batch.image.shape[-2:] == (16, 8)


def test_divisor_one_pads_to_the_plain_maximum_and_pairs_work():
    samples = [_scan("a", 5, 7), _scan("b", 9, 3)]
    assert AlignedCollate(divisor=1)(samples).image.shape[-2:] == (9, 7)
    assert AlignedCollate(divisor=(4, 16))(samples).image.shape[-2:] == (12, 16)


def test_uncollate_is_the_exact_inverse():
    samples = [_scan("a", 5, 7, seed=1), _scan("b", 9, 3, seed=2), _scan("c", 1, 1, seed=3)]
    collate = AlignedCollate(divisor=4)
    back = collate.uncollate(collate(samples))
    for original, got in zip(samples, back):
        assert got.name == original.name and not got.is_batched
        assert same(got.image, original.image) and same(got.mask, original.mask)
        assert got.depth.item() == original.depth


def test_crop_pad_and_valid_mask_helpers():
    t = torch.arange(2 * 4 * 6).view(2, 1, 4, 6)
    crops = crop_to_sizes(t, torch.tensor([[2, 3], [4, 6]]))
    assert crops[0].shape == (1, 2, 3) and torch.equal(crops[0], t[0, :, :2, :3]) and crops[1].shape == (1, 4, 6)
    with pytest.raises(ValueError, match="2 samples but sizes has 1"):
        crop_to_sizes(t, torch.tensor([[1, 1]]))
    p = pad_to_multiple(torch.ones(3, 5, 33), 32, value=7)
    assert p.shape == (3, 32, 64) and (p[:, :5, :33] == 1).all() and (p[:, 5:] == 7).all() and (p[:, :, 33:] == 7).all()
    assert pad_to_multiple(torch.ones(4, 4), (2, 3)).shape == (4, 6)
    m = valid_mask(torch.tensor([[1, 2], [3, 3]]), 3, 4)
    assert m.shape == (2, 1, 3, 4) and m.dtype == torch.bool
    assert m[0, 0].sum() == 2 and m[0, 0, 0, :2].all() and not m[0, 0, 1].any() and m[1, 0, :, :3].all()


# -- property test ------------------------------------------------------------------------------
@st.composite
def _batches(draw):
    b = draw(st.integers(1, 4))
    lead = draw(st.sampled_from([(), (1,), (3,), (2, 2)]))
    dtype = draw(st.sampled_from([torch.uint8, torch.float32, torch.int64, torch.bool]))
    divisor = draw(st.one_of(st.integers(1, 9), st.tuples(st.integers(1, 9), st.integers(1, 9))))
    pad_value = draw(st.sampled_from([0, 1, 7]))
    seed = draw(st.integers(0, 1000))
    g = torch.Generator().manual_seed(seed)
    samples = []
    for i in range(b):
        h, w = draw(st.integers(1, 12)), draw(st.integers(1, 12))
        x = torch.randint(0, 5, (*lead, h, w), generator=g).to(dtype)
        samples.append(Entry(name=f"s{i}", x=x, m=torch.randint(0, 4, (h, w), generator=g)))
    return samples, divisor, pad_value, dtype


@settings(max_examples=120, deadline=None)
@given(_batches())
def test_property_shapes_contents_padding_sizes_and_round_trip(case):
    samples, divisor, pad_value, dtype = case
    collate = AlignedCollate(divisor=divisor, pad={"x": pad_value, "m": 255})
    batch = collate(samples)
    dh, dw = (divisor, divisor) if isinstance(divisor, int) else divisor
    hp = max(-(-s.x.shape[-2] // dh) * dh for s in samples)
    wp = max(-(-s.x.shape[-1] // dw) * dw for s in samples)
    assert batch.x.shape == (len(samples), *samples[0].x.shape[:-2], hp, wp) and batch.x.dtype == dtype
    assert batch.sizes.tolist() == [list(s.x.shape[-2:]) for s in samples]
    valid = valid_mask(batch.sizes, hp, wp)[:, 0]  # [B, hp, wp]
    for i, s in enumerate(samples):
        h, w = s.x.shape[-2:]
        assert torch.equal(batch.x[i, ..., :h, :w], s.x)
        pad_region = batch.x[i][..., ~valid[i]]
        assert (pad_region == torch.tensor(pad_value).to(dtype)).all()
        assert (batch.m[i][~valid[i]] == 255).all()
    for original, got in zip(samples, collate.uncollate(batch)):
        assert same(got, Entry(name=original.name, x=original.x, m=original.m))


# -- drop-in forms -------------------------------------------------------------------------------
class Pairs(Dataset):
    """A torchvision-style dataset: (image, mask) tuples of varying size."""

    sizes = [(5, 7), (9, 3), (4, 4), (12, 10), (1, 8)]

    def __len__(self):
        return len(self.sizes)

    def __getitem__(self, i):
        h, w = self.sizes[i]
        return torch.full((3, h, w), i, dtype=torch.uint8), torch.full((h, w), i, dtype=torch.int64)


class Dicts(Pairs):
    def __getitem__(self, i):
        image, mask = super().__getitem__(i)
        return {"image": image, "mask": mask, "id": i}


class Entries(Pairs):
    def __getitem__(self, i):
        image, mask = super().__getitem__(i)
        return Entry(name=f"scan_{i}", image=image, mask=mask)


def test_tuple_samples_in_a_plain_dataloader():
    loader = DataLoader(Pairs(), batch_size=2, collate_fn=AlignedCollate(divisor=4, pad={0: 0, 1: 255}))
    image, mask, sizes = next(iter(loader))
    assert image.shape == (2, 3, 12, 8) and mask.shape == (2, 12, 8)
    assert sizes.tolist() == [[5, 7], [9, 3]]
    assert (mask[0, 5:] == 255).all() and (image[1, :, :9, :3] == 1).all()
    collate = AlignedCollate(divisor=4, pad={0: 0, -1: 255})
    back = collate.uncollate(collate([Pairs()[0], Pairs()[1]]))
    assert torch.equal(back[1][0], Pairs()[1][0]) and torch.equal(back[1][1], Pairs()[1][1])


def test_dict_samples_in_a_plain_dataloader():
    loader = DataLoader(Dicts(), batch_size=3, collate_fn=AlignedCollate(divisor=8))
    batch = next(iter(loader))
    assert type(batch) is dict and batch["image"].shape == (3, 3, 16, 8)
    assert batch["id"].tolist() == [0, 1, 2] and batch["sizes"].tolist() == [[5, 7], [9, 3], [4, 4]]


def _loader_batches(**kwargs):
    loader = DataLoader(Entries(), batch_size=2, collate_fn=AlignedCollate(divisor=4), **kwargs)
    return list(loader)


def test_workers_and_pin_memory_give_the_same_batches_as_the_main_process():
    reference = _loader_batches()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # pin_memory without an accelerator warns and does nothing
        for kwargs in ({"num_workers": 2}, {"num_workers": 2, "pin_memory": True}, {"pin_memory": True}):
            got = _loader_batches(**kwargs)
            assert len(got) == len(reference)
            assert all(same(a.to("cpu"), b) for a, b in zip(got, reference)), kwargs


class _SharedCheck(AlignedCollate):
    def __call__(self, samples):
        batch = super().__call__(samples)
        batch.shared = [batch.image.is_shared(), batch.mask.is_shared()]
        return batch


def test_worker_output_is_allocated_in_shared_memory():
    loader = DataLoader(Entries(), batch_size=5, num_workers=1, collate_fn=_SharedCheck(divisor=4))
    assert next(iter(loader)).shared == [True, True]


# -- bad input -----------------------------------------------------------------------------------
def test_empty_batch():
    with pytest.raises(ValueError, match="empty batch"):
        AlignedCollate()([])


def test_missing_padded_field_names_the_sample_and_field():
    with pytest.raises(ValueError, match=r"sample 1 \('b'\) has no field 'mask'"):
        AlignedCollate()([_scan("a", 4, 4), Entry(name="b", image=torch.zeros(3, 4, 4, dtype=torch.uint8), depth=1.0)])


def test_fields_of_one_sample_that_disagree_on_size():
    bad = Entry(
        name="scan_7",
        image=torch.zeros(3, 481, 3203, dtype=torch.uint8),
        mask=torch.zeros(480, 3203, dtype=torch.int64),
    )
    with pytest.raises(ValueError, match=r"sample 0 \('scan_7'\).*'image' is 481x3203 and field 'mask' is 480x3203"):
        AlignedCollate()([bad])


def test_samples_that_disagree_on_leading_dims_or_dtype():
    gray = Entry(
        name="g", image=torch.zeros(1, 4, 4, dtype=torch.uint8), mask=torch.zeros(4, 4, dtype=torch.int64), depth=1.0
    )
    with pytest.raises(ValueError, match=r"sample 1 \('g'\), field 'image': expected leading dims \[3\].*found \[1\]"):
        AlignedCollate()([_scan("a", 4, 4), gray])
    as_float = _scan("f", 4, 4, dtype=torch.float32)
    with pytest.raises(ValueError, match=r"sample 1 \('f'\), field 'image'.*torch.uint8.*torch.float32"):
        AlignedCollate()([_scan("a", 4, 4), as_float])


def test_zero_sized_and_too_few_dims():
    with pytest.raises(ValueError, match=r"sample 0 \('z'\), field 'image': H and W must be at least 1"):
        AlignedCollate()([Entry(name="z", image=torch.zeros(3, 0, 5), mask=torch.zeros(0, 5))])
    with pytest.raises(
        ValueError, match=r"field 'image': expected a tensor \[..., H, W\] with at least 2 dims, found shape \[5\]"
    ):
        AlignedCollate(pad={"image": 0})([Entry(image=torch.zeros(5))])


def test_pil_image_is_a_type_error_and_numpy_is_converted():
    pil = Image.new("RGB", (4, 4))
    with pytest.raises(TypeError, match=r"sample 0 \('p'\), field 'image': expected a tensor or numpy array.*PIL"):
        AlignedCollate(pad={"image": 0})([Entry(name="p", image=pil)])
    batch = AlignedCollate(divisor=4, pad={"image": 0})([Entry(image=np.ones((2, 3, 3), np.uint8))])
    assert batch.image.shape == (1, 2, 4, 4) and batch.image.dtype == torch.uint8 and batch.image[0, :, :3, :3].all()


def test_bad_divisors_and_positions():
    for divisor in (0, -1, (2,), (1, 0), 2.5):
        with pytest.raises(ValueError, match="divisor must be an int >= 1"):
            AlignedCollate(divisor=divisor)
    with pytest.raises(ValueError, match="need integer positions"):
        AlignedCollate()([Pairs()[0]])
    with pytest.raises(TypeError, match="every sample of a batch must be an Entry/dict"):
        AlignedCollate()([_scan("a", 4, 4), Pairs()[0]])
    with pytest.raises(ValueError, match="already have a field 'sizes'"):
        AlignedCollate(pad={"image": 0})([Entry(image=torch.zeros(1, 2, 2), sizes=1)])


def test_channels_last_batches_equal_the_default_and_are_laid_out_channels_last():
    """Scans as read_image gives them ([C, H, W] views of [H, W, C] pixels) collate to the same values either way; with
    channels_last the image batch has torch.channels_last strides, so each scan is copied in row by row."""
    scans = [torch.randint(0, 256, (h, w, 3), dtype=torch.uint8).permute(2, 0, 1) for h, w in ((5, 9), (7, 4))]
    samples = [
        Entry(name=f"s{i}", image=s, mask=torch.zeros(s.shape[1:], dtype=torch.uint8)) for i, s in enumerate(scans)
    ]
    plain, last = AlignedCollate(4)(samples), AlignedCollate(4, channels_last=True)(samples)
    assert same(plain, last) and plain.image.is_contiguous()
    assert last.image.is_contiguous(memory_format=torch.channels_last) and last.mask.is_contiguous()
    assert "channels_last=True" in repr(AlignedCollate(4, channels_last=True))
