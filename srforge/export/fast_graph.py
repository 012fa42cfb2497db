"""The UNet as ONNX Runtime runs it fastest on a CPU: the same values in fewer passes over its activations.

The convolutions run near the CPU's peak in ONNX Runtime as in PyTorch; what else a full-size scan costs is passes
over [B, C, H, W] tensors, memory-bound. :func:`export_copy` gives the exporter a copy of the model with two
rewrites, each exact up to float rounding:

1. The padding-aware GroupNorm in seven passes (six before a ReLU) instead of about eleven
   (:func:`rectangle_group_norm`).
2. A decoder block's convolution of ``cat(upsampled, skip)`` as two convolutions added,
   ``conv(cat(a, b)) = conv_a(a) + conv_b(b)`` with the kernel split along its inputs (:class:`SplitUpBlock`):
   no concatenated copy, and ONNX Runtime folds the addition into the second convolution.

The norm:

srforge.models.group_norm's masked_group_norm is written for PyTorch (a hand-written backward, in-place updates of
one buffer); exported as it stands it is about eleven element-wise operators, each a full pass over a
[B, C, H, W] activation in ONNX Runtime, which fuses none of them on the CPU. Here the same normalisation in
seven passes, for export only (:func:`export_copy`):

    row sums    MatMul(x [B, C*H, W], columns [B, W, 1])   one read of x: the sum over each row's valid columns
    centred     d = x - mean; d * d; MatMul(., columns)    the second, centred pass, as masked_group_norm's
    output      BatchNormalization(d [1, B*C, H, W]) * mask  one per-(scan, channel) affine, then zero on padding

The sums over rows and the [B, C] arithmetic on them run in float64, as in masked_group_norm; the variance is
two-pass (the mean first, then the mean square of x minus it), with the rounding of the mean to float32 taken
back out. The masks srforge builds (geometry.level_mask, NormContext.mask) are top-left rectangles, one per scan:
a row is valid where its first column is, a column where its first row is, which is what lets the row sums read
x once. srforge-export checks the exported graph against the model itself (check_onnx), which is where a mask of
another shape would show.

Inside the UNet's blocks the norm feeds a ReLU and nothing else, so the mask's multiplication (a seventh pass) is
folded into the two passes around it (``below_zero``): the centring subtracts, on padded columns only, the mean
plus PUSH (1e15, signed as the channel's weight), and the affine runs per (scan, channel, row) with scale and shift
0 on padded rows. Padded rows come out 0, padded columns far below 0, and the ReLU makes both 0; valid pixels get
the same arithmetic as before, bit for bit. About 4% of a full-size scan's run in ONNX Runtime (its profiler on
one 544 x 3,200 scan of welllog.yaml's model: Mul 385 -> 217 ms of about 4.3 s, the Sub and BatchNormalization
passes as before). Only before ReLU or ReLU6 (:data:`CLEARING`), and only for an affine that lets the push
dominate (:func:`pushable`: no weight 0, whose channel is its bias everywhere); the others keep the multiplication.
"""

from __future__ import annotations

import copy

import torch
import torch.nn.functional as F
from torch import nn

from srforge.models.group_norm import GroupNorm2d
from srforge.models.norms import MaskedNorm
from srforge.models.unet import ConvNormAct, UNet, UpBlock

STATS = torch.float64  # the [B, C, H] row sums and the [B, C] statistics, as in masked_group_norm
# How far below the data a padded column's centred value is pushed: far beyond any activation (so that
# scale * (x - mean - PUSH) + shift < 0 for every realistic x, scale, shift), while its square, 1e30, stays finite in
# float32 (3.4e38): the column sums multiply it by the column's 0, and 0 * inf would be NaN. The exported graph is
# float32; converted to float16, PUSH would overflow to inf and the statistics would be NaN.
PUSH = 1e15


def _valid_sum(x: torch.Tensor, rows: torch.Tensor, columns: torch.Tensor) -> torch.Tensor:
    """x [B, C, H, W] float32, rows [B, 1, H, 1], columns [B, 1, 1, W] (1 valid, 0 padded) -> [B, C] float64: the sum
    of x over each scan's valid rectangle. One MatMul sums each row over its valid columns (a single read of x),
    the rows' sums are added in float64."""
    b, c, h, w = x.shape
    per_row = torch.matmul(x.reshape(b, c * h, w), columns.reshape(b, w, 1)).reshape(b, c, h)
    return (per_row.to(STATS) * rows.reshape(b, 1, h).to(STATS)).sum(2)


def _group_mean(per_channel: torch.Tensor, count: torch.Tensor, num_groups: int) -> torch.Tensor:
    """[B, C] sums over valid pixels, count [B, 1] -> [B, C]: each channel's group mean."""
    b, c = per_channel.shape
    grouped = per_channel.reshape(b, num_groups, c // num_groups).sum(-1, keepdim=True)
    return (grouped / (count[:, :, None] * (c // num_groups))).expand(b, num_groups, c // num_groups).reshape(b, c)


def rectangle_group_norm(  # noqa: PLR0913 (F.group_norm's arguments, the mask, and how padding leaves)
    x: torch.Tensor, mask: torch.Tensor, num_groups: int, weight: torch.Tensor | None, bias: torch.Tensor | None,
    eps: float, below_zero: bool = False,
) -> torch.Tensor:  # fmt: skip
    """masked_group_norm for a mask that is one top-left rectangle per scan, in seven passes over x (six with
    ``below_zero``).

    x [B, C, H, W] float32; mask [B, 1, H, W] float 1 valid / 0 padded, each scan's valid pixels the top-left
    rectangle; weight, bias [C] or None. Returns [B, C, H, W]: masked_group_norm's values on the valid pixels; on
    padding 0 (all 0 for a scan without valid pixels), or, with ``below_zero``, 0 on padded rows and at most
    -PUSH / 2 * |scale| on padded columns, so that a following ReLU makes them 0 (:func:`clears_far_below_zero`).
    ``below_zero`` needs an affine the push dominates (:func:`pushable`: no weight 0, whose channel would leave its
    bias on the padding).
    """
    b, c, h, w = x.shape
    rows, columns = mask[:, :, :, :1], mask[:, :, :1, :]  # [B, 1, H, 1], [B, 1, 1, W]
    count = (rows.sum((2, 3)).to(STATS) * columns.sum((2, 3)).to(STATS)).clamp_min(1.0)  # [B, 1]
    mean64 = _group_mean(_valid_sum(x, rows, columns), count, num_groups)  # [B, C]
    mean = mean64.to(x.dtype)
    resid = mean64 - mean.to(STATS)  # what rounding the mean to float32 left out
    offset = mean[:, :, None, None]  # [B, C, 1, 1]
    if below_zero:  # padded columns pushed far below zero, PUSH signed as each weight: [B, C, 1, W]
        sign = torch.ones(c, dtype=x.dtype, device=x.device) if weight is None else torch.sign(weight).to(x.dtype)
        offset = offset + sign.reshape(1, c, 1, 1) * (PUSH * (1.0 - columns))
    centred = x - offset
    square = _group_mean(_valid_sum(centred * centred, rows, columns), count, num_groups)
    rstd = torch.rsqrt((square - resid * resid).clamp_min(0.0) + eps)  # [B, C]
    scale = rstd if weight is None else rstd * weight.to(STATS)
    # The output from the centred values: (x - mean) * scale + bias, with nothing left to cancel however far the
    # mean lies from 0 (x * scale + (bias - mean * scale) would lose |mean| / std of float32's digits).
    shift = -resid * scale if bias is None else bias.to(STATS) - resid * scale
    if below_zero:  # one affine per (scan, channel, row), 0 on padded rows: the mask's multiplication folded in
        valid_rows = rows.reshape(b, 1, h).to(STATS)
        return _affine(centred, scale[:, :, None] * valid_rows, shift[:, :, None] * valid_rows)
    return _affine(centred, scale, shift) * mask


def _affine(centred: torch.Tensor, scale: torch.Tensor, shift: torch.Tensor) -> torch.Tensor:
    """centred [B, C, H, W] * scale + shift in one pass, the affine float64 [B, C] (one per scan and channel) or
    [B, C, H] (one per row): BatchNormalization over [1, N, ...] (N its entries) with mean 0, variance 1 and eps 0
    is exactly that."""
    n = scale.numel()
    flat_scale, flat_shift = scale.reshape(n).to(centred.dtype), shift.reshape(n).to(centred.dtype)
    zero, one = torch.zeros_like(flat_scale), torch.ones_like(flat_scale)
    flat = centred.reshape(1, n, *centred.shape[scale.dim() :])
    return F.batch_norm(flat, zero, one, flat_scale, flat_shift, training=False, eps=0.0).reshape(centred.shape)


# Activations that are exactly 0 on every value <= 0 in PyTorch and in ONNX Runtime alike (Relu, Clip): a norm before
# one may leave its padding far below zero. Others that look so in PyTorch (SiLU, GELU: x times a factor that
# underflows) run on ONNX Runtime's own approximations, which need not reach exactly 0.
CLEARING = (nn.ReLU, nn.ReLU6)
# The largest |bias| / |weight| a channel may have for the push to dominate its shift: bias / scale = bias * std /
# weight stays far below PUSH for any activation std below PUSH / MAX_BIAS_RATIO / 2.
MAX_BIAS_RATIO = 1e6


def clears_far_below_zero(activation: nn.Module) -> bool:
    """Whether ``activation`` maps 0 and every value below it to exactly 0 (ReLU, ReLU6): then a norm before it may
    leave its padding far below zero instead of multiplying it by the mask."""
    return type(activation) in CLEARING


def pushable(weight: torch.Tensor | None, bias: torch.Tensor | None) -> bool:
    """Whether a norm's affine lets the push clear its padding: every weight non-zero (a channel of weight 0 is its
    bias everywhere) and no bias more than MAX_BIAS_RATIO times its weight."""
    if weight is None:
        return True
    if not bool((weight != 0).all()):
        return False
    return bias is None or bool((bias.abs() <= MAX_BIAS_RATIO * weight.abs()).all())


class RectangleGroupNorm(nn.Module):
    """Stands in for a GroupNorm2d (``forward(x, mask)``) or a MaskedNorm (mask from its NormContext) in an export
    copy, sharing its weight and bias; without a mask it is ``F.group_norm``, as they are."""

    def __init__(self, norm: nn.GroupNorm, below_zero: bool = False):
        super().__init__()
        self.num_groups, self.eps, self.weight, self.bias = norm.num_groups, norm.eps, norm.weight, norm.bias
        self.context = norm.context if isinstance(norm, MaskedNorm) else None
        # Padded columns left far below zero for the ReLU after it, where the affine lets the push dominate.
        self.below_zero = below_zero and pushable(self.weight, self.bias)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        if self.context is not None:
            mask = self.context.mask(x)
        if mask is None:
            return F.group_norm(x, self.num_groups, self.weight, self.bias, self.eps)
        mask = mask.to(x.dtype)
        return rectangle_group_norm(x, mask, self.num_groups, self.weight, self.bias, self.eps, self.below_zero)


class SplitUpBlock(nn.Module):
    """A UNet UpBlock without its concatenation: forward(x [B, 2C, h, w], skip [B, C, 2h, 2w], mask | None) ->
    [B, C, 2h, 2w], as UpBlock's. The first convolution's kernel [C, 2C, 3, 3] is split into the halves that read
    the upsampled x and the skip; the block's own modules (up, norms, activations, second conv) are shared."""

    def __init__(self, block: UpBlock):
        super().__init__()
        first = block.conv.first
        self.up, self.norm, self.act, self.second = block.up, first.norm, first.act, block.conv.second
        self.act_keeps_zero = first.act_keeps_zero
        conv, half = first.conv, block.up.out_channels
        self.from_up, self.from_skip = (
            nn.Conv2d(half, conv.out_channels, 3, padding=1, bias=False).to(conv.weight) for _ in range(2)
        )
        self.from_up.weight.copy_(conv.weight[:, :half])
        self.from_skip.weight.copy_(conv.weight[:, half:])

    def forward(self, x: torch.Tensor, skip: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        x = self.up(x)
        if mask is not None:
            x = x * mask.to(x.dtype)
        y = self.act(self.norm(self.from_up(x) + self.from_skip(skip.to(x.dtype)), mask))
        if mask is not None and not self.act_keeps_zero:
            y = y * mask.to(y.dtype)
        return self.second(y, mask)


def splittable(block: UpBlock) -> bool:
    """Whether ``block``'s first convolution is the plain 3x3 one SplitUpBlock splits (stride 1, padding 1, no
    bias, no groups) over the concatenation of two halves."""
    conv = block.conv.first.conv
    plain = conv.kernel_size == (3, 3) and conv.stride == (1, 1) and conv.padding == (1, 1) and conv.groups == 1
    return plain and conv.bias is None and conv.in_channels == 2 * block.up.out_channels


def _replaceable(model: nn.Module) -> list[str]:
    """Names of the norms whose masks are srforge's rectangles: a UNet's GroupNorm2d (its level masks) and every
    MaskedNorm (an adapter's NormContext)."""
    names = []
    unets = [name for name, module in model.named_modules() if isinstance(module, UNet)]
    for name, module in model.named_modules():
        in_unet = any(name.startswith(f"{u}.") or u == "" for u in unets)
        if isinstance(module, MaskedNorm) or (isinstance(module, GroupNorm2d) and in_unet):
            names.append(name)
        elif isinstance(module, UpBlock) and splittable(module):
            names.append(name)
    return names


def _rectangle(owner: nn.Module, norm: nn.GroupNorm) -> RectangleGroupNorm:
    """The stand-in for ``norm``, a child of ``owner``: inside a UNet's ConvNormAct, whose norm feeds its activation
    alone, the padding may be left far below zero when that activation clears it (ReLU)."""
    plain_block = isinstance(owner, ConvNormAct) and type(owner).forward is ConvNormAct.forward
    below_zero = plain_block and owner.norm is norm and clears_far_below_zero(owner.act)
    return RectangleGroupNorm(norm, below_zero)


def export_copy(model: nn.Module) -> tuple[nn.Module, int]:
    """A deep copy of ``model`` whose padding-aware norms are :class:`RectangleGroupNorm` and whose UpBlocks are
    :class:`SplitUpBlock`, and how many modules were replaced; ``model`` itself is untouched (and is what the export
    is checked against)."""
    names = _replaceable(model)
    if not names:
        return model, 0
    twin = copy.deepcopy(model)
    with torch.no_grad():
        for name in reversed(names):  # the norms inside an UpBlock before the block itself
            parent, _, child = name.rpartition(".")
            owner = twin.get_submodule(parent) if parent else twin
            module = getattr(owner, child)
            setattr(owner, child, SplitUpBlock(module) if isinstance(module, UpBlock) else _rectangle(owner, module))
    return twin, len(names)
