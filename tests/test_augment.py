"""Augmentation: image and mask move together, the mask is filled with ignore_index, bad keys are named."""

import pytest
import torch

from srforge.data.augment import build_augmentation
from srforge.data.entry import Entry


def sample(h=16, w=24, seed=0):
    g = torch.Generator().manual_seed(seed)
    mask = torch.randint(0, 3, (h, w), generator=g)
    image = (mask * 100).to(torch.uint8)[None].repeat(3, 1, 1)  # the image shows the mask: alignment is visible
    return Entry(name="scan", image=image, mask=mask)


def test_hflip_and_vflip_move_both():
    e = sample()
    out = build_augmentation({"hflip": 1.0})(e)
    assert torch.equal(out.image, e.image.flip(-1)) and torch.equal(out.mask, e.mask.flip(-1))
    out = build_augmentation({"vflip": 1.0})(e)
    assert torch.equal(out.image, e.image.flip(-2)) and torch.equal(out.mask, e.mask.flip(-2))
    assert out.name == "scan" and out is not e and torch.equal(e.mask, sample().mask)  # input untouched


def test_affine_fills_mask_with_ignore_index_and_image_with_zero():
    torch.manual_seed(0)
    e = sample(20, 20)
    out = build_augmentation({"affine": {"degrees": [45, 45]}}, ignore_index=77)(e)  # the corners leave the scan
    assert out.mask.dtype == torch.int64 and out.mask.shape == (20, 20)
    assert out.image.dtype == torch.uint8 and out.image.shape == (3, 20, 20)
    corners = [(0, 0), (0, -1), (-1, 0), (-1, -1)]
    assert all(out.mask[y, x] == 77 for y, x in corners) and all((out.image[:, y, x] == 0).all() for y, x in corners)
    assert set(out.mask.unique().tolist()) <= {0, 1, 2, 77}


def test_affine_keeps_image_and_mask_aligned():
    torch.manual_seed(1)
    e = sample(32, 32)
    e["mask"] = torch.zeros(32, 32, dtype=torch.int64)
    e.mask[8:24, 10:20] = 1
    e["image"] = (e.mask * 200).to(torch.uint8)[None].repeat(3, 1, 1)
    aug = build_augmentation({"affine": {"degrees": 10, "translate": 0.1, "shear": 5}})
    for _ in range(5):
        out = aug(e)
        valid = out.mask != 255
        agree = ((out.image[0] > 100) == (out.mask == 1))[valid].float().mean()
        assert agree > 0.95 and (out.mask == 1).sum() > 100


def test_color_jitter_and_noise_change_only_the_image():
    torch.manual_seed(2)
    e = sample()
    e["image"] = torch.full((3, 16, 24), 128, dtype=torch.uint8)
    out = build_augmentation({"color_jitter": {"brightness": 0.5, "contrast": 0.3}, "noise": 0.05})(e)
    assert out.image.dtype == torch.uint8 and torch.equal(out.mask, e.mask)
    assert out.image.float().std() > 3  # the noise is there, in 8-bit units


def test_the_keys_that_resized_outside_the_size_policy_name_their_replacement():
    with pytest.raises(ValueError, match=r"data\.augment\.crop is no longer an option: use data\.crop: \[H, W\]"):
        build_augmentation({"crop": {"max_height": 10, "max_width": 12}})
    replaced = r"data\.augment\.affine\.scale is no longer an option: use data\.augment\.scale"
    with pytest.raises(ValueError, match=replaced):
        build_augmentation({"affine": {"degrees": 2, "scale": [0.9, 1.1]}})


def test_unknown_keys_are_named_with_the_valid_ones():
    with pytest.raises(ValueError, match=r"'hfilp'.*hflip"):
        build_augmentation({"hfilp": 0.5})
    with pytest.raises(ValueError, match=r"'angle'.*degrees"):
        build_augmentation({"affine": {"angle": 3}})
    with pytest.raises(ValueError, match="mapping"):
        build_augmentation({"affine": 3})


def test_empty_config_is_identity_and_batches_work():
    e = sample()
    out = build_augmentation({})(e)
    assert torch.equal(out.image, e.image) and torch.equal(out.mask, e.mask)
    batch = Entry.collate([sample(seed=0), sample(seed=1)])
    flipped = build_augmentation({"hflip": 1.0})(batch)
    assert torch.equal(flipped.mask, batch.mask.flip(-1))


def test_a_replaced_key_set_to_null_is_absent_so_a_run_that_had_it_resumes():
    recipe = {"hflip": 1.0, "crop": None, "affine": {"degrees": 0, "scale": None}}
    e = sample()
    out = build_augmentation(recipe)(e)
    assert torch.equal(out.mask, e.mask.flip(-1))
