"""Many processes, one archive: which process predicts which scans, and the few points where they meet.

Under ``torchrun`` (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK`` in the environment) every process lists the same
archive, checks a strided share of it for finished outputs, and all exchange what is left to do with its sizes
(gloo, whatever the device: only small Python objects travel). The scans left are then split by
:func:`split_by_pixels`, which depends on nothing but the names and sizes, so every process computes the same
split and the same archive with the same world size always splits the same way. Processes on several machines
need nothing more than torchrun's own arguments and one output folder they all see.
"""

from __future__ import annotations

import datetime
import heapq
import os
from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist

# A process group's collectives wait this long for the slowest process (the default, 30 min, could end a
# long archive's final barrier while one process still writes its last scans).
TIMEOUT = datetime.timedelta(hours=24)


def process_rank() -> tuple[int, int, int]:
    """(rank, world size, local rank) from torchrun's environment; (0, 1, 0) without it."""
    if "RANK" not in os.environ or "WORLD_SIZE" not in os.environ:
        return 0, 1, 0
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    return rank, world, int(os.environ.get("LOCAL_RANK", rank))


def rank_device(device: str) -> str:
    """The device this process predicts on: under torchrun, "auto" and "cuda" mean cuda:LOCAL_RANK."""
    rank, world, local = process_rank()
    if world > 1 and device in ("auto", "cuda") and torch.cuda.is_available():
        return f"cuda:{local % torch.cuda.device_count()}"
    return device


def join() -> None:
    """Join the process group of a multi-process run (gloo; a no-op for one process or when joined)."""
    _, world, _ = process_rank()
    if world > 1 and not dist.is_initialized():
        dist.init_process_group("gloo", timeout=TIMEOUT)


def gather(obj: Any) -> list[Any]:
    """Every process's ``obj``, in rank order (``[obj]`` for one process)."""
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return [obj]
    out: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


def barrier() -> None:
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.barrier()


def split_by_pixels(keys: Sequence[str], pixels: Sequence[int], world: int) -> list[list[int]]:
    """Positions of ``keys`` dealt to ``world`` processes so each gets about the same number of pixels.

    Largest first (ties by key), each to the process with the fewest pixels so far (ties: the lower rank):
    deterministic, and within one scan's pixels of the ideal share. Each list comes back in position order.
    """
    loads = [(0, rank) for rank in range(world)]
    shares: list[list[int]] = [[] for _ in range(world)]
    for position in sorted(range(len(keys)), key=lambda p: (-pixels[p], keys[p])):
        load, rank = heapq.heappop(loads)
        shares[rank].append(position)
        heapq.heappush(loads, (load + pixels[position], rank))
    return [sorted(share) for share in shares]
