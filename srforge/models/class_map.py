"""Logits to class ids, the one way training, prediction and export take the class of each pixel."""

from __future__ import annotations

import torch


def class_map(logits: torch.Tensor, dim: int = 1, dtype: torch.dtype = torch.int64) -> torch.Tensor:
    """``logits.argmax(dim)`` as ``dtype`` (int64, or uint8 for masks to write): the class of each pixel, ties to
    the lower class, as argmax.

    logits [B, K, H, W] (dim 1) or [K, H, W] (dim 0) -> [B, H, W] or [H, W]. A running comparison over the K
    classes, because torch's CPU argmax over a short, strided class dimension is many times slower.
    """
    best = logits.select(dim, 0)
    index = torch.zeros(best.shape, dtype=dtype, device=logits.device)
    for k in range(1, logits.shape[dim]):
        candidate = logits.select(dim, k)
        better = candidate > best
        best = torch.where(better, candidate, best)
        index.masked_fill_(better, k)
    return index
