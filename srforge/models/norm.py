"""GroupNorm helpers and the padding-aware (masked) GroupNorm.

Why plain GroupNorm is not enough for padded batches: ``F.group_norm`` takes the mean and variance of each
(sample, group) over all H x W positions of the tensor it is given. When a scan is zero-padded to the size of its
largest batch-mate, those statistics include the padding, and the amount of padding depends on the batch-mates.
The same scan then gets different activations, hence different logits, depending on what it was batched with.
The masked variant here takes the statistics over a scan's valid pixels only, so they do not depend on the
padding at all.
"""

import torch
import torch.nn.functional as F
from torch import nn


def group_count(channels: int, max_groups: int = 32, min_group_size: int = 4) -> int:
    """Number of GroupNorm groups for ``channels``: the largest divisor of ``channels`` that is at most
    ``max_groups`` and leaves at least ``min_group_size`` channels in every group; 1 if there is none.

    It always divides ``channels``, so any channel count works: 3 -> 1, 24 -> 6, 40 -> 10, 64 -> 16, 512 -> 32.
    """
    if channels < 1:
        raise ValueError(f"group_count: channels must be >= 1, got {channels}")
    limit = min(max_groups, channels // min_group_size)
    return max((g for g in range(1, limit + 1) if channels % g == 0), default=1)


def _group_stats(s1: torch.Tensor, s2: torch.Tensor, count: torch.Tensor, num_groups: int, eps: float):
    """Per-channel mean and 1/std from per-channel sums. s1, s2: [B, C] sum x, sum x^2; count: [B, 1] valid
    pixels. Returns (mean, rstd), each [B, C] in the sums' dtype, equal within a group."""
    batch, channels = s1.shape
    per_group = channels // num_groups
    n = count * per_group
    mean = s1.view(batch, num_groups, per_group).sum(-1) / n
    var = (s2.view(batch, num_groups, per_group).sum(-1) / n - mean * mean).clamp_min(0.0)  # rounding < 0
    return mean.repeat_interleave(per_group, 1), torch.rsqrt(var + eps).repeat_interleave(per_group, 1)


def _group_sum(per_channel: torch.Tensor, num_groups: int) -> torch.Tensor:
    """[B, C] -> [B, C]: each entry replaced by the sum over its group."""
    batch, channels = per_channel.shape
    grouped = per_channel.view(batch, num_groups, channels // num_groups)
    return grouped.sum(-1, keepdim=True).expand_as(grouped).reshape(batch, channels)


def _hw_dot(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """[B, C, H, W] twice -> [B, C]: sum over H and W of a * b; a batched dot product (no temporary) when both
    are contiguous."""
    batch, channels = a.shape[:2]
    if a.is_contiguous() and b.is_contiguous():
        return torch.bmm(a.view(batch * channels, 1, -1), b.view(batch * channels, -1, 1)).view(batch, channels)
    return (a * b).sum((2, 3))


def _add_outer_(t: torch.Tensor, per_channel: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """In place t[b, c, h, w] += per_channel[b, c] * mask[b, 0, h, w]; t [B, C, H, W], per_channel [B, C],
    mask [B, 1, H, W]. A rank-1 update per sample (one pass over t) in either memory format."""
    batch, channels, height, width = t.shape
    if t.is_contiguous():
        t.view(batch, channels, -1).baddbmm_(per_channel[:, :, None], mask.reshape(batch, 1, -1))
    elif t.is_contiguous(memory_format=torch.channels_last):
        rows = t.permute(0, 2, 3, 1).view(batch, height * width, channels)
        rows.baddbmm_(mask.reshape(batch, -1, 1), per_channel[:, None, :])
    else:
        t.add_(per_channel[:, :, None, None] * mask)
    return t


class _MaskedGroupNorm(torch.autograd.Function):
    """Autograd function behind masked_group_norm. Written out by hand so that each direction is one allocation
    plus a few in-place passes in x's memory format; autograd through the primitive ops was ~2x slower, and its
    gradients came back in a layout that slowed the convolutions' backward."""

    @staticmethod
    def forward(ctx, x, mask, num_groups, weight, bias, eps):
        with torch.autocast(x.device.type, enabled=False):  # autocast would run the bmm sums in bf16
            return _MaskedGroupNorm._forward(ctx, x, mask, num_groups, weight, bias, eps)

    @staticmethod
    def _forward(ctx, x, mask, num_groups, weight, bias, eps):
        compute = torch.promote_types(x.dtype, torch.float32)  # float32, or float64 for float64 input
        xf, m = x.to(compute), mask.to(compute)
        y = xf * m  # [B, C, H, W], 0 on padding
        mean, rstd = _group_stats(y.sum((2, 3)), _hw_dot(y, y), m.sum((2, 3)), num_groups, eps)  # [B, C] each
        scale = rstd if weight is None else rstd * weight.to(compute)
        shift = -mean * scale if bias is None else bias.to(compute) - mean * scale
        y.mul_(scale[:, :, None, None])
        _add_outer_(y, shift, m)  # y = m * (x * scale + shift)
        ctx.save_for_backward(x, m, mean, rstd, weight)
        ctx.num_groups = num_groups
        return y.to(x.dtype)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, dy):
        with torch.autocast(dy.device.type, enabled=False):
            return _MaskedGroupNorm._backward(ctx, dy)

    @staticmethod
    def _backward(ctx, dy):
        x, m, mean, rstd, weight = ctx.saved_tensors
        xf = x.to(m.dtype)
        dx = dy.to(m.dtype) * m  # padded outputs are constant zeros: their gradient does not count
        w = torch.ones_like(rstd) if weight is None else weight.to(m.dtype).expand_as(rstd)
        sdy = dx.sum((2, 3))  # [B, C]
        sdy_xhat = rstd * (_hw_dot(dx, xf) - mean * sdy)  # [B, C] sum over valid pixels of dy * xhat
        n = m.sum((2, 3)) * (x.shape[1] // ctx.num_groups)  # [B, 1]
        # dx = rstd * (w dy - mean_g(w dy) - xhat * mean_g(w dy xhat)) on valid pixels, 0 on padding
        a = rstd * _group_sum(w * sdy, ctx.num_groups) / n
        b = rstd * rstd * _group_sum(w * sdy_xhat, ctx.num_groups) / n
        dx.mul_((rstd * w)[:, :, None, None]).addcmul_(xf, -b[:, :, None, None]).mul_(m)
        _add_outer_(dx, b * mean - a, m)
        dweight = sdy_xhat.sum(0).to(weight.dtype) if ctx.needs_input_grad[3] else None
        dbias = sdy.sum(0).to(x.dtype if weight is None else weight.dtype) if ctx.needs_input_grad[4] else None
        return dx.to(x.dtype), None, None, dweight, dbias, None


def masked_group_norm(
    x: torch.Tensor,
    mask: torch.Tensor,
    num_groups: int,
    weight: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
    eps: float = 1e-5,
) -> torch.Tensor:
    """GroupNorm whose mean and variance are taken over the valid pixels of each sample only.

    x: [B, C, H, W] any float dtype (channels_last is fine); mask: [B, 1, H, W], 1 valid / 0 padded.
    weight, bias: [C] affine parameters, or None.
    Returns [B, C, H, W] in x's dtype and memory format, 0 at padded positions. Statistics are computed in
    float32 (also under bf16 autocast; float64 stays float64), in one pass: sum x and sum x^2 over valid pixels
    via multiplication by the mask, so there is no gather and no per-sample loop, and padded values, whatever
    they are, count 0.
    """
    if mask.shape != (x.shape[0], 1, *x.shape[2:]):
        raise ValueError(
            f"masked_group_norm: mask must be [B, 1, H, W] = {[x.shape[0], 1, *x.shape[2:]]} "
            f"for x {list(x.shape)}, got {list(mask.shape)}"
        )
    if x.shape[1] % num_groups:
        raise ValueError(f"masked_group_norm: {x.shape[1]} channels do not split into {num_groups} groups")
    return _MaskedGroupNorm.apply(x, mask, num_groups, weight, bias, eps)


class GroupNorm2d(nn.GroupNorm):
    """nn.GroupNorm with ``groups=group_count(channels)`` and an optional valid-pixel mask.

    forward(x [B, C, H, W], mask [B, 1, H, W] | None) -> [B, C, H, W]. Without a mask it is exactly
    ``nn.GroupNorm`` (and its fused kernel); with one it is ``masked_group_norm``. The state_dict keys are those of
    ``nn.GroupNorm`` (weight, bias), so checkpoints stay plain.
    """

    def __init__(self, channels: int, eps: float = 1e-5):
        super().__init__(group_count(channels), channels, eps=eps)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        if mask is None:
            return F.group_norm(x, self.num_groups, self.weight, self.bias, self.eps)
        return masked_group_norm(x, mask, self.num_groups, self.weight, self.bias, self.eps)
