"""GroupNorm helpers: the group-count rule, valid masks, and masked GroupNorm against a per-scan crop reference."""

import pytest
import torch
import torch.nn.functional as F

from srforge.models import GroupNorm2d, group_count, level_mask, masked_group_norm


@pytest.mark.parametrize("channels, groups", [(1, 1), (3, 1), (8, 2), (24, 6), (40, 10), (64, 16), (512, 32)])
def test_group_count_rule(channels, groups):
    assert group_count(channels) == groups


def test_group_count_divides_every_channel_count():
    for channels in range(1, 600):
        groups = group_count(channels)
        assert channels % groups == 0 and 1 <= groups <= 32
        assert groups == 1 or channels // groups >= 4


def test_level_mask_uses_ceil_per_stride():
    mask = level_mask(torch.tensor([[5, 7], [8, 8]]), 4, 4, stride=2)
    assert mask.shape == (2, 1, 4, 4)
    assert mask[0, 0].sum() == 3 * 4  # ceil(5/2)=3 rows, ceil(7/2)=4 columns
    assert mask[0, 0, 3].sum() == 0 and mask[1].sum() == 16


def _batch(dtype=torch.float64, seed=0):
    """x [3, 8, 6, 10] with garbage in the padding, its sizes, mask, affine params."""
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(3, 8, 6, 10, generator=g, dtype=dtype) * 2 + 1) * 10 ** torch.rand(1, 8, 1, 1, generator=g)
    sizes = torch.tensor([[6, 10], [3, 7], [1, 2]])
    return x, sizes, level_mask(sizes, 6, 10).to(dtype), torch.randn(8, dtype=dtype), torch.randn(8, dtype=dtype)


def test_masked_group_norm_equals_group_norm_on_each_crop():
    x, sizes, mask, w, b = _batch()
    y = masked_group_norm(x, mask, 2, w, b)
    for i, (h, wd) in enumerate(sizes.tolist()):
        expected = F.group_norm(x[i : i + 1, :, :h, :wd], 2, w, b)
        torch.testing.assert_close(y[i : i + 1, :, :h, :wd], expected)
    assert (y * (1 - mask)).abs().max() == 0  # padding is exactly zero


def test_masked_group_norm_gradients_match_crop_reference():
    x, sizes, mask, w, b = _batch()
    dy = torch.randn_like(x)  # nonzero on the padding too: it must not leak into any gradient
    grads = torch.autograd.grad(
        (masked_group_norm(x.requires_grad_(), mask, 2, w.requires_grad_(), b.requires_grad_()) * dy).sum(), (x, w, b)
    )
    reference = sum(
        (F.group_norm(x[i : i + 1, :, :h, :wd], 2, w, b) * dy[i : i + 1, :, :h, :wd]).sum()
        for i, (h, wd) in enumerate(sizes.tolist())
    )
    for got, expected in zip(grads, torch.autograd.grad(reference, (x, w, b))):
        torch.testing.assert_close(got, expected)
    assert (grads[0] * (1 - mask)).abs().max() == 0


def test_masked_group_norm_gradcheck_without_affine():
    x, _, mask, _, _ = _batch()
    x = x[:, :4, :3, :5].contiguous().requires_grad_()
    assert torch.autograd.gradcheck(lambda t: masked_group_norm(t, mask[:, :, :3, :5], 2), (x,))


def test_masked_group_norm_float32_channels_last_and_bf16():
    x, _, mask, w, b = _batch(torch.float32)
    y = masked_group_norm(x, mask, 2, w, b)
    y_cl = masked_group_norm(x.to(memory_format=torch.channels_last), mask, 2, w, b)
    assert y_cl.is_contiguous(memory_format=torch.channels_last)
    torch.testing.assert_close(y_cl, y, atol=1e-5, rtol=1e-5)
    y_bf16 = masked_group_norm(x.bfloat16(), mask, 2, w, b)
    assert y_bf16.dtype == torch.bfloat16
    torch.testing.assert_close(y_bf16.float(), y, atol=0.1, rtol=0.02)


def test_masked_group_norm_rejects_wrong_mask_shape():
    x, _, mask, _, _ = _batch()
    with pytest.raises(ValueError, match=r"mask must be \[B, 1, H, W\]"):
        masked_group_norm(x, mask[:, :, :3], 2)


def test_group_norm2d_without_mask_is_plain_group_norm():
    norm = GroupNorm2d(40)
    assert norm.num_groups == 10 and set(norm.state_dict()) == {"weight", "bias"}
    x = torch.randn(2, 40, 3, 5)
    torch.testing.assert_close(norm(x), F.group_norm(x, 10, norm.weight, norm.bias))
