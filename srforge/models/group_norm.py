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


def _group_mean(per_channel: torch.Tensor, count: torch.Tensor, num_groups: int) -> torch.Tensor:
    """[B, C] per-channel sums over valid pixels, count [B, 1] valid pixels -> [B, C]: each channel's group mean.
    A sample with no valid pixel gets 0 (its sums are 0 and the count is taken as 1), never 0 / 0."""
    batch, channels = per_channel.shape
    per_group = channels // num_groups
    grouped = per_channel.view(batch, num_groups, per_group).sum(-1, keepdim=True) / (count[:, :, None] * per_group)
    return grouped.expand(batch, num_groups, per_group).reshape(batch, channels)


def _hw_sum(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """[B, C, H, W] -> [B, C] in ``dtype``: sum over W in t's dtype, then over H in ``dtype``. The row sums are a
    small tensor, so carrying them in float64 costs nothing, and it keeps the rounding of one long float32 sum out
    of the statistics."""
    return t.sum(3).to(dtype).sum(2)


def _per_channel(t: torch.Tensor) -> torch.Tensor:
    """[B, C] -> [B, C, 1, 1], to broadcast over H and W."""
    return t[:, :, None, None]


class _MaskedGroupNorm(torch.autograd.Function):
    """Autograd function behind masked_group_norm, with the backward written out by hand so that each direction
    allocates one or two [B, C, H, W] buffers and updates them in place in x's memory format; autograd through the
    primitive ops was much slower, and its gradients came back in a layout that slowed the convolutions' backward.

    Precision: the sums and the normalisation run in ``compute`` dtype (float32; float64 for float64 input):
    bf16/fp16 x is promoted by its first multiplication with the float32 mask; the [B, C] arithmetic on the sums
    runs in float64. The reductions are ``sum``, never a matmul, so TF32 (``set_float32_matmul_precision("high")``)
    cannot touch them and autocast has nothing to lower to bf16/fp16. That is also why there is no
    ``torch.autocast(enabled=False)`` block here: under torch.compile with grad enabled such a block leaked out of
    the function and left the next convolution without autocast ("Input type (BFloat16) and weight type (float)
    should be the same"). The variance is two-pass (the mean first, then the mean square of x minus it), and the
    backward's sums are taken around the mean as well: a one-pass E[x^2] - E[x]^2 cancels catastrophically once
    |mean| >> std.
    """

    @staticmethod
    def forward(ctx, x, mask, num_groups, weight, bias, eps):
        compute = torch.promote_types(x.dtype, torch.float32)
        stats = torch.float64  # for the [B, C] arithmetic on the sums: free, and no rounding on top of theirs
        m = mask.to(compute)
        count = m.sum((2, 3)).to(stats).clamp_min(1.0)  # [B, 1]; no valid pixel: mean 0, var 0, output 0
        y = torch.mul(x, m)  # [B, C, H, W] in `compute` (type promotion), 0 on padding; the one buffer
        mean64 = _group_mean(_hw_sum(y, stats), count, num_groups)  # [B, C]
        mean = mean64.to(compute)
        y.addcmul_(_per_channel(mean), m, value=-1.0)  # x - mean on valid pixels, still 0 on padding
        # Second pass over the centred values: their mean square has nothing left to cancel. `resid`, what rounding
        # the mean to `compute` left out, is kept apart because mean + resid would round again.
        resid = mean64 - mean.to(stats)
        square = _group_mean(_hw_sum(y.square_(), stats), count, num_groups)  # in place: y is rebuilt below
        rstd = torch.rsqrt((square - resid * resid).clamp_min(0.0) + eps)  # [B, C]
        scale = rstd if weight is None else rstd * weight.to(stats)
        # Output (x - pivot) * scale + shift: pivot = mean where |mean| > 2 std, so that x - pivot loses nothing to
        # the offset; 0 elsewhere, where x * scale is already accurate and a subtraction would only add a rounding.
        pivot = torch.where(mean.to(stats).square() * rstd.square() > 4.0, mean.to(stats), 0.0)
        shift = (mean.to(stats) + resid - pivot) * -scale
        shift = shift if bias is None else shift + bias.to(stats)
        torch.sub(x, _per_channel(pivot.to(compute)), out=y)
        torch.addcmul(_per_channel(shift.to(compute)), y, _per_channel(scale.to(compute)), out=y)
        y.mul_(m)  # m * ((x - mean - resid) * scale + bias)
        resid, rstd = resid.to(compute), rstd.to(compute)
        ctx.save_for_backward(x, m, mean, resid, rstd, weight)
        ctx.num_groups = num_groups
        return y.to(x.dtype)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, dy):
        x, m, mean, resid, rstd, weight = ctx.saved_tensors
        count = m.sum((2, 3)).clamp_min(1.0)
        g = torch.mul(dy, m)  # in m's dtype; padded outputs are constant zeros: their gradient does not count
        xc = torch.sub(x, _per_channel(mean))  # [B, C, H, W] in m's dtype
        sdy = g.sum((2, 3))  # [B, C] sum over valid pixels of dy
        sdy_xhat = rstd * (xc.mul_(g).sum((2, 3)) - resid * sdy)  # [B, C] sum over valid pixels of dy * xhat
        torch.sub(x, _per_channel(mean), out=xc)  # x - mean again, reusing the buffer
        w = torch.ones_like(rstd) if weight is None else weight.to(m.dtype).expand_as(rstd)
        # dx = rstd * (w dy - mean_g(w dy) - xhat * mean_g(w dy xhat)) on valid pixels, 0 on padding
        a = rstd * _group_mean(w * sdy, count, ctx.num_groups)
        b = rstd * rstd * _group_mean(w * sdy_xhat, count, ctx.num_groups)
        torch.addcmul(_per_channel(b * resid - a), xc, _per_channel(-b), out=xc)
        dx = g.mul_(_per_channel(rstd * w)).addcmul_(xc, m)
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
    Returns [B, C, H, W] in x's dtype and memory format, 0 at padded positions; a sample with no valid pixel gives
    zeros (and zero gradients). Statistics are computed in float32 (also under bf16/fp16 autocast; float64 stays
    float64) in two passes over the valid pixels, selected by multiplication with the mask, so there is no gather
    and no per-sample loop, and padded values, whatever finite values they hold, count 0: the group mean, then
    the mean square of x minus that mean, which is as accurate as ``F.group_norm`` at any offset of x.
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
