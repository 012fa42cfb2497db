"""Batch buffers: where a collate function writes its output.

Inside a DataLoader worker a batch travels to the main process through shared memory. If the
collate function writes into an ordinary tensor, the worker's pickler copies it into shared memory
once more on the way out; ``default_collate`` avoids that copy by allocating its output in shared
memory directly, and so do Entry's stacking and AlignedCollate, through :func:`new_batch_buffer`.

A fresh shared-memory buffer is paid for at its first touch: the kernel zero-fills every page as it is written
(40 ms for a 53 MB batch of two full-size scans on the 2-core machine, against 4 ms to copy into memory touched
before). :class:`BatchRing` lets a worker write its batches into a few buffers it keeps, each reused once the
consumer has released the batch it held. The batch carries its ticket (ring, worker, slot, use) in its Entry, so the
consumer releases it without knowing which worker made it, and a batch releases its slot once at most.
"""

from __future__ import annotations

import math
import os
import weakref
from collections.abc import Iterable, Iterator, Mapping

import torch
from torch.utils.data import get_worker_info

GROWTH = 1.25  # a slot too small for a batch is replaced by one this much larger than the batch
_RINGS: weakref.WeakValueDictionary[int, BatchRing] = weakref.WeakValueDictionary()  # the consumer's rings, by id


def new_batch_buffer(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device | str = "cpu") -> torch.Tensor:
    """An uninitialised tensor of ``shape`` and ``dtype``; on the CPU inside a worker, in shared memory.

    One allocation, no fill: the caller writes every element exactly once (a fill here would
    double the bytes written, and the page faults of a fresh buffer already dominate the cost).
    """
    if get_worker_info() is None or torch.device(device).type != "cpu":
        return torch.empty(shape, dtype=dtype, device=device)
    return _view(torch.UntypedStorage._new_shared(math.prod(shape) * dtype.itemsize), shape, dtype)


def _view(storage: torch.UntypedStorage, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """A ``shape`` tensor of ``dtype`` over the start of ``storage``."""
    return torch.empty(0, dtype=dtype).set_(storage, 0, shape)


def _ticket(batch) -> tuple[int, int, int, int] | None:
    """The ring ticket (ring id, worker, slot, use) an Entry batch holds; None for anything else."""
    return getattr(batch, "_ring", None) if isinstance(batch, Mapping) else None


class BatchRing:
    """Shared-memory batch buffers that a DataLoader's workers reuse once the consumer has released their batch.

    Made in the consumer's process for one DataLoader of ``workers`` workers (a new ring for every DataLoader: its
    workers keep their buffers for their lifetime) and handed to the collate function, which calls :meth:`begin`
    at each batch, :meth:`buffer` for each of its padded fields and :meth:`ticket` at the end, and keeps the
    ticket in the batch (``Entry._ring``). A worker's batch takes the first of its ``slots`` slots that is free --
    one buffer a field, reused at every later use of the slot -- and marks it busy in a table shared with the
    consumer; with every slot busy, the batch goes into fresh buffers as without a ring. The consumer calls
    :meth:`release` on a batch once it will read it no more (the trainer when it draws the next one,
    ``Entry.pin_memory`` once it has copied it), which frees its slot and clears the batch's ticket, so a second
    release does nothing. So a batch is never overwritten while it is held, a consumer that never releases gets
    fresh buffers, and none waits for another. ``slots`` above the DataLoader's prefetch factor leaves a free slot
    at every batch.
    """

    def __init__(self, workers: int, slots: int = 4):
        if workers < 1 or slots < 1:
            raise ValueError(f"BatchRing: needs workers >= 1 and slots >= 1, found {workers} and {slots}")
        self.id = int.from_bytes(os.urandom(8), "little") >> 1  # not Python's random: its state is resumed exactly
        self.slots = slots
        self.busy = torch.zeros((workers, slots), dtype=torch.int64).share_memory_()  # the use a slot holds, 0: free
        self._local: dict | None = None  # the worker's own: its pid, buffers, this batch's slot and the use count
        _RINGS[self.id] = self

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_local": None}  # a worker started by spawn begins with no buffers

    def _worker(self) -> dict | None:
        """The calling worker's state (None outside a DataLoader worker); a forked worker starts its own."""
        info = get_worker_info()
        if info is None:
            return None
        if self._local is None or self._local["pid"] != os.getpid():
            self._local = {"pid": os.getpid(), "id": info.id, "buffers": {}, "slot": None, "uses": 0, "on": False}
        return self._local

    def begin(self, enabled: bool = True) -> None:
        """Worker side: a batch starts; its first :meth:`buffer` takes a free slot (``enabled`` False: none)."""
        local = self._worker()
        if local is not None:
            local["slot"], local["on"] = None, enabled

    def _take(self, local: dict) -> int | None:
        row = self.busy[local["id"]]
        free = [s for s in range(self.slots) if int(row[s]) == 0]
        if not free:
            return None
        local["uses"] += 1
        row[free[0]] = local["uses"]
        return free[0]

    def buffer(self, field: int, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        """Worker side: an uninitialised CPU tensor of ``shape`` for field number ``field`` of the batch: a view
        of the batch's slot (grown if too small), or a fresh buffer (:func:`new_batch_buffer`) when every slot is
        busy, the batch takes none, or outside a worker."""
        local = self._worker()
        if local is None or not local["on"]:
            return new_batch_buffer(shape, dtype)
        if local["slot"] is None:
            local["slot"] = self._take(local)
            if local["slot"] is None:
                local["on"] = False
                return new_batch_buffer(shape, dtype)
        nbytes = math.prod(shape) * dtype.itemsize
        key = (local["slot"], field)
        storage = local["buffers"].get(key)
        if storage is None or storage.nbytes() < nbytes:
            storage = torch.UntypedStorage._new_shared(math.ceil(nbytes * GROWTH))
            local["buffers"][key] = storage
        return _view(storage, shape, dtype)

    def ticket(self) -> tuple[int, int, int, int] | None:
        """Worker side, at the end of a batch: (ring id, worker, slot, use) of the slot it took, None if none."""
        local = self._worker()
        if local is None or local["slot"] is None:
            return None
        slot, local["slot"] = local["slot"], None
        return self.id, local["id"], slot, local["uses"]  # _take numbered this batch's use

    def abandon(self) -> None:
        """Worker side: the batch failed before it left the worker; its slot is free again."""
        local = self._worker()
        if local is not None and local["slot"] is not None:
            self.busy[local["id"], local["slot"]] = 0
            local["slot"] = None

    def release(self, batch) -> bool:
        """Consumer side: free the slot ``batch`` (an Entry made with this ring) holds and clear its ticket; False
        for a batch without one (fresh buffers, another ring, released before)."""
        ticket = _ticket(batch)
        if ticket is None or ticket[0] != self.id:
            return False
        batch._ring = None
        _, worker, slot, use = ticket
        if int(self.busy[worker, slot]) != use:
            return False
        self.busy[worker, slot] = 0
        return True

    def batches(self, loader: Iterable) -> Iterator:
        """The batches of ``loader``, each released when the next is drawn: for a consumer that is done with a
        batch by the time it asks for the next one, and keeps none of its tensors (the trainer)."""
        held = None
        iterator = iter(loader)
        while True:
            if held is not None:
                self.release(held)
                held = None
            try:
                held = next(iterator)
            except StopIteration:
                return
            yield held


def release_batch(batch) -> bool:
    """Free the ring slot that ``batch`` holds, whichever ring of this process made it (``Entry.pin_memory`` calls
    this once it has copied a batch); False for a batch that holds none."""
    ticket = _ticket(batch)
    ring = _RINGS.get(ticket[0]) if ticket is not None else None
    return ring is not None and ring.release(batch)
