"""Size rules shared by every layer: round up to the size divisor, valid-pixel masks, crops.

A network with ``k`` stride-2 stages needs inputs whose H and W are multiples of ``d = 2 ** k``. A batch of
scans of many sizes is padded, each scan in the top-left corner of its slot, to::

    Hp = max_i round_up(H_i, d)        Wp = max_i round_up(W_i, d)

and the true sizes travel with it as an integer ``[B, 2]`` tensor of (H, W). Everything that must tell true
pixels from padding -- the padding-aware GroupNorm, the loss, metrics, crop-back, tiling, the sampler's waste
figures -- derives it from these few functions. This module imports only torch and numpy, so that models, data
and engine can all stand on it.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch


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
