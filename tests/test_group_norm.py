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


@pytest.mark.parametrize("offset", [0.0, 100.0, 1000.0, 10000.0])
def test_masked_group_norm_is_as_accurate_as_group_norm_far_from_zero(offset):
    """Max |error| against float64, all pixels valid: at most 2x F.group_norm's on the same float32 input. A one-pass
    E[x^2] - E[x]^2 variance fails this from offset 100 on (errors of 1e-2 and more)."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 32, 32, 64, generator=g) + offset
    mask = torch.ones(2, 1, 32, 64)
    for weight, bias in [(None, None), (torch.randn(32, generator=g), torch.randn(32, generator=g))]:
        exact = F.group_norm(x.double(), 8, *(None if t is None else t.double() for t in (weight, bias)))
        plain_error = (F.group_norm(x, 8, weight, bias).double() - exact).abs().max()
        masked_error = (masked_group_norm(x, mask, 8, weight, bias).double() - exact).abs().max()
        assert masked_error <= 2 * plain_error, (offset, masked_error.item(), plain_error.item())


def test_masked_group_norm_of_a_sample_without_valid_pixels_is_zero():
    x, sizes, mask, w, b = _batch(torch.float32)
    mask[1] = 0  # sample 1: all padding
    x, w, b = x.requires_grad_(), w.requires_grad_(), b.requires_grad_()
    y = masked_group_norm(x, mask, 2, w, b)
    assert torch.equal(y[1], torch.zeros_like(y[1]))
    h, wd = sizes[0].tolist()
    torch.testing.assert_close(y[:1, :, :h, :wd], F.group_norm(x[:1, :, :h, :wd], 2, w, b))  # others unaffected
    dx, dw, db = torch.autograd.grad((y * torch.randn_like(y)).sum(), (x, w, b))
    assert torch.equal(dx[1], torch.zeros_like(dx[1]))
    assert all(torch.isfinite(g).all() for g in (dx, dw, db))


def test_masked_group_norm_gradcheck_with_affine_padding_and_an_empty_sample():
    x, _, mask, w, b = _batch()
    x, mask = x[:, :4, :3, :5].contiguous(), mask[:, :, :3, :5].clone()
    mask[2] = 0  # sample 2 has no valid pixel; samples 0 and 1 are partly padded
    x = (x + 50).requires_grad_()  # far from zero: the backward's sums around the mean are exercised too
    w, b = w[:4].clone().requires_grad_(), b[:4].clone().requires_grad_()
    assert torch.autograd.gradcheck(lambda t, wt, bt: masked_group_norm(t, mask, 2, wt, bt), (x, w, b))


class _AtenOps(torch.utils._python_dispatch.TorchDispatchMode):
    """Records the aten overload packets run inside it, including those of a backward run by the autograd engine."""

    def __init__(self):
        super().__init__()
        self.ops = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.add(func.overloadpacket.__name__)
        return func(*args, **(kwargs or {}))


def test_masked_group_norm_sums_never_go_through_matmul_so_never_tf32():
    """Matmul-family ops would run in TF32 on CUDA under set_float32_matmul_precision("high"); the sums use none,
    and the results are bit-identical whatever the setting."""
    x, _, mask, w, b = _batch(torch.float32)
    x, w, b = x.requires_grad_(), w.requires_grad_(), b.requires_grad_()
    dy = torch.randn_like(x)

    def forward_backward():
        y = masked_group_norm(x, mask, 2, w, b)
        return (y, *torch.autograd.grad((y * dy).sum(), (x, w, b)))

    with _AtenOps() as recorded:
        expected = forward_backward()
    assert {"mul", "sum"} <= recorded.ops  # the mode sees the function's ops
    assert not recorded.ops & {"mm", "bmm", "baddbmm", "addmm", "addbmm", "matmul", "dot", "vdot", "einsum"}
    previous = torch.get_float32_matmul_precision()
    try:
        torch.set_float32_matmul_precision("high")
        got = forward_backward()
    finally:
        torch.set_float32_matmul_precision(previous)
    assert all(torch.equal(g, e) for g, e in zip(got, expected))
