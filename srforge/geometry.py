"""Size rules shared by every layer: round up to the size divisor, valid-pixel masks, crops.

A network with ``k`` stride-2 stages needs inputs whose H and W are multiples of ``d = 2 ** k``. A batch of
scans of many sizes is padded, each scan in the top-left corner of its slot, to::

    Hp = max_i round_up(H_i, d)        Wp = max_i round_up(W_i, d)

and the true sizes travel with it as an integer ``[B, 2]`` tensor of (H, W). Everything that must tell true
pixels from padding -- the padding-aware GroupNorm, the loss, metrics, crop-back, tiling, the sampler's waste
figures -- derives it from these few functions. How deep ``k`` may go is here too: at most MAX_DEPTH, and no
deeper than the scans' sizes make sensible (:func:`depth_problem`). This module imports only torch and numpy,
so that models, data and engine can all stand on it.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np
import torch

from srforge.constants import MAX_DEPTH


def round_up(n, d):
    """``n`` rounded up to a multiple of ``d`` (ints, or numpy arrays / tensors of them)."""
    return -(-n // d) * d


def divisor_pair(divisor: int | Sequence[int]) -> tuple[int, int]:
    """``(dh, dw)`` from one divisor or a pair; a ValueError names what was found if either is not an int >= 1."""
    pair = tuple(divisor) if isinstance(divisor, (tuple, list)) else (divisor, divisor)
    if len(pair) != 2 or not all(isinstance(d, (int, np.integer)) and not isinstance(d, bool) and d >= 1 for d in pair):
        raise ValueError(f"divisor must be an int >= 1 or a pair (dh, dw) of them; found {divisor!r}.")
    return int(pair[0]), int(pair[1])


def aligned_size(height: int, width: int, divisor: int | Sequence[int]) -> tuple[int, int]:
    """The slot a scan of true size (height, width) needs on its own: each side rounded up to the divisor."""
    dh, dw = divisor_pair(divisor)
    return round_up(int(height), dh), round_up(int(width), dw)


def valid_mask(sizes: torch.Tensor, height: int, width: int) -> torch.Tensor:
    """bool ``[B, 1, height, width]``: True where a pixel lies inside its sample's true ``sizes[b] = (H, W)``."""
    rows = torch.arange(height, device=sizes.device) < sizes[:, 0, None]  # [B, height]
    cols = torch.arange(width, device=sizes.device) < sizes[:, 1, None]  # [B, width]
    return (rows[:, :, None] & cols[:, None, :]).unsqueeze(1)


def level_mask(sizes: torch.Tensor, height: int, width: int, stride: int = 1) -> torch.Tensor:
    """Valid-pixel mask of a padded batch at resolution 1 / stride.

    sizes: [B, 2] int64 true (H, W) at full resolution, each scan in the top-left corner of its slot.
    height, width: the padded size at this resolution (full size // stride).
    Returns [B, 1, height, width] float32: 1 where the position covers a true pixel, 0 on padding. At stride s a
    scan of true size H covers ceil(H / s) rows, because a row that mixes true and padded pixels is still valid.
    """
    return valid_mask(round_up(sizes.to(torch.int64), stride) // stride, height, width).float()


def crop_to_sizes(tensor: torch.Tensor, sizes: torch.Tensor) -> list[torch.Tensor]:
    """Per-sample crops ``[..., H_i, W_i]`` (views) of a padded batch ``[B, ..., Hp, Wp]``."""
    if tensor.shape[0] != sizes.shape[0]:
        raise ValueError(
            f"crop_to_sizes: the tensor holds {tensor.shape[0]} samples but sizes has {sizes.shape[0]} rows."
        )
    return [tensor[i, ..., :h, :w] for i, (h, w) in enumerate(sizes.tolist())]


def largest_sensible_depth(sizes: Iterable[Sequence[int]]) -> int:
    """The largest depth (at most MAX_DEPTH) whose deepest stride-2 stage still halves more than one row of the
    tallest scan and more than one column of the widest: ``2 ** (depth - 1) < min(max H, max W)`` over ``sizes``
    [(H, W), ...] (at least one).

    One stage deeper, that stage sees every scan as a single row (or column), so it adds no context, only padding:
    every scan is padded to more than twice its height (or width). 0 when scans are 1 px high or wide.
    """
    sizes = list(sizes)
    extent = min(max(int(h) for h, _ in sizes), max(int(w) for _, w in sizes))
    depth = 0
    while depth < MAX_DEPTH and 2**depth < extent:
        depth += 1
    return depth


def depth_problem(sizes: Iterable[Sequence[int]], depth: int) -> str | None:
    """Why a U-Net of ``depth`` stride-2 stages (size divisor ``2 ** depth``) is too deep for scans of ``sizes``
    [(H, W), ...], naming the largest sensible depth (:func:`largest_sensible_depth`); None when it is not, or when
    there are no sizes. Check it once the sizes are known, before a batch is padded: the padding grows as 4**depth.
    """
    sizes = [(int(h), int(w)) for h, w in sizes]
    if not sizes:
        return None
    largest = largest_sensible_depth(sizes)
    if depth <= largest:
        return None
    tallest, widest = max(h for h, _ in sizes), max(w for _, w in sizes)
    side, extent, line = ("height", tallest, "row") if tallest <= widest else ("width", widest, "column")
    found = f"depth {depth} (size divisor 2**{depth})"
    if largest == 0:
        return f"{found}: the largest scan {side} is {extent} px, too small for any depth; scans need 2 px or more"
    return (
        f"{found} is too deep for these scans: the largest scan {side} is {extent} px, so the deepest stages would "
        f"see every scan as a single {line} and only add padding; use depth {largest} or less (size divisor "
        f"{2**largest}), the largest sensible depth for them."
    )
