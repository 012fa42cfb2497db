"""Comparison helpers shared by the tests."""

from collections.abc import Mapping

import numpy as np
import torch


def same(a, b) -> bool:
    """Deep equality that compares tensors by dtype, shape and values, and Entries by batch state too."""
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return (
            isinstance(a, torch.Tensor)
            and isinstance(b, torch.Tensor)
            and a.dtype == b.dtype
            and a.shape == b.shape
            and bool(torch.equal(a, b))
        )
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return isinstance(a, np.ndarray) and isinstance(b, np.ndarray) and a.dtype == b.dtype and np.array_equal(a, b)
    if isinstance(a, Mapping):
        if type(a) is not type(b) or list(a.keys()) != list(b.keys()):
            return False
        if getattr(a, "is_batched", None) != getattr(b, "is_batched", None):
            return False
        return all(same(a[k], b[k]) for k in a.keys())
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    return type(a) is type(b) and a == b
