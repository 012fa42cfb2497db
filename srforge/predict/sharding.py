"""Many processes, one archive: which process predicts which scans, and the few points where they meet.

Under ``torchrun`` (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK`` in the environment) every process lists the same
archive, checks a strided share of it for finished outputs, and all exchange what is left to do with its sizes
(gloo, whatever the device: only small Python objects travel). The scans left are then split by
:func:`split_by_pixels`, which depends on nothing but the names and sizes, so every process computes the same
split and the same archive with the same world size always splits the same way. Processes on several machines
need nothing more than torchrun's own arguments and one output folder they all see.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence


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
