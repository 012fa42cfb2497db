"""Batch buffers: where a collate function writes its output.

Inside a DataLoader worker a batch travels to the main process through shared memory. If the collate function
writes into an ordinary tensor, the worker's pickler copies it into shared memory once more on the way out;
``default_collate`` avoids that copy by allocating its output in shared memory directly, and so do Entry's stacking
and AlignedCollate, through :func:`new_batch_buffer`.
"""

from __future__ import annotations

import math

import torch
from torch.utils.data import get_worker_info


def new_batch_buffer(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device | str = "cpu") -> torch.Tensor:
    """An uninitialised tensor of ``shape`` and ``dtype``; on the CPU inside a worker, in shared memory.

    One allocation, no fill: the caller writes every element exactly once (a fill here would double the bytes
    written, and the page faults of a fresh buffer already dominate the cost).
    """
    if get_worker_info() is None or torch.device(device).type != "cpu":
        return torch.empty(shape, dtype=dtype, device=device)
    storage = torch.UntypedStorage._new_shared(math.prod(shape) * dtype.itemsize)
    return torch.empty(0, dtype=dtype).set_(storage, 0, shape)
