"""Batch buffers: where a collate function writes its output.

Inside a DataLoader worker a batch travels to the main process through shared memory. If the
collate function writes into an ordinary tensor, the worker's pickler copies it into shared memory
once more on the way out; ``default_collate`` avoids that copy by allocating its output in shared
memory directly, and so do Entry's stacking and AlignedCollate, through :func:`new_batch_buffer`.

A fresh shared-memory buffer is paid for at its first touch: the kernel zero-fills every page as it is written
(40 ms for a 53 MB batch of two full-size scans on the 2-core machine, against 4 ms to copy into memory touched
before). :class:`BatchRing` lets a worker write its batches into a few buffers it keeps, each reused once the
consumer has released the batch it held. Which batch a buffer holds is written in the buffer itself, a header in
front of the data, so the consumer releases a batch without knowing which worker made it.
"""

from __future__ import annotations

import math
import os
import random
import weakref
from collections.abc import Iterable, Iterator, Mapping

import torch
from torch.utils.data import get_worker_info

HEADER = 64  # bytes in front of a ring buffer's data: magic, ring id, worker, slot, use (int64 each); aligned
MAGIC = int.from_bytes(b"srforgeR", "little")
GROWTH = 1.25  # a slot too small for a batch is replaced by one this much larger than the batch
_RINGS: weakref.WeakValueDictionary[int, BatchRing] = weakref.WeakValueDictionary()  # the consumer's rings, by id


def new_batch_buffer(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device | str = "cpu") -> torch.Tensor:
    """An uninitialised tensor of ``shape`` and ``dtype``; on the CPU inside a worker, in shared memory.

    One allocation, no fill: the caller writes every element exactly once (a fill here would
    double the bytes written, and the page faults of a fresh buffer already dominate the cost).
    """
    if get_worker_info() is None or torch.device(device).type != "cpu":
        return torch.empty(shape, dtype=dtype, device=device)
    nbytes = math.prod(shape) * dtype.itemsize
    storage = torch.UntypedStorage._new_shared(nbytes)
    return torch.empty(0, dtype=dtype).set_(storage, 0, shape)


def _header(storage: torch.UntypedStorage) -> torch.Tensor:
    """The int64 [5] header (magic, ring id, worker, slot, use) at the start of a ring buffer's storage."""
    return torch.empty(0, dtype=torch.int64).set_(storage, 0, (5,))


class BatchRing:
    """Shared-memory batch buffers that a DataLoader's workers reuse once the consumer has released their batch.

    Made in the consumer's process for one DataLoader of ``workers`` workers (a new ring for every DataLoader: its
    workers keep their buffers for their lifetime) and handed to the collate function, which calls
    :meth:`start_batch` at each batch and :meth:`buffer` for each of its padded fields. A worker's batch takes the
    first of its ``slots`` slots that is free -- one buffer a field, reused at every later use of the slot -- and
    marks it busy in a table shared with the consumer; with every slot busy, the batch goes into fresh buffers as
    without a ring. The consumer calls :meth:`release` on a batch once it will read it no more (exactly once a
    batch: the trainer when it draws the next one, ``Entry.pin_memory`` once it has copied it), which frees its
    slot. So a batch is never overwritten while it is held, a consumer that never releases gets fresh buffers, and
    none waits for another. ``slots`` above the DataLoader's prefetch factor leaves a free slot at every batch.
    """

    def __init__(self, workers: int, slots: int = 4):
        if workers < 1 or slots < 1:
            raise ValueError(f"BatchRing: needs workers >= 1 and slots >= 1, found {workers} and {slots}")
        self.id = random.getrandbits(62) + 1
        self.slots = slots
        self.busy = torch.zeros((workers, slots), dtype=torch.int64).share_memory_()  # the use a slot holds, 0: free
        self._local: dict | None = None  # the worker's own: its pid, buffers, current slot and use count
        _RINGS[self.id] = self

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_local": None}  # a worker started by spawn begins with no buffers

    def _worker(self) -> dict:
        if self._local is None or self._local["pid"] != os.getpid():  # a forked worker: its own buffers
            self._local = {"pid": os.getpid(), "buffers": {}, "slot": None, "uses": 0}
        return self._local

    def start_batch(self) -> None:
        """Worker side: the batch about to be collated takes a free slot (none free: fresh buffers)."""
        info = get_worker_info()
        if info is None:
            return
        local, row = self._worker(), self.busy[info.id]
        free = [s for s in range(self.slots) if int(row[s]) == 0]
        local["slot"] = free[0] if free else None
        if free:
            local["uses"] += 1
            row[free[0]] = local["uses"]

    def buffer(self, field: int, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        """Worker side: an uninitialised CPU tensor of ``shape`` for field number ``field`` of the batch: a view
        of the batch's slot (grown if too small), or a fresh buffer (:func:`new_batch_buffer`) with no slot or
        outside a worker."""
        info = get_worker_info()
        local = self._worker() if info is not None else None
        if local is None or local["slot"] is None:
            return new_batch_buffer(shape, dtype)
        nbytes = math.prod(shape) * dtype.itemsize
        key = (local["slot"], field)
        storage = local["buffers"].get(key)
        if storage is None or storage.nbytes() < HEADER + nbytes:
            storage = torch.UntypedStorage._new_shared(HEADER + math.ceil(nbytes * GROWTH))
            local["buffers"][key] = storage
        _header(storage).copy_(torch.tensor([MAGIC, self.id, info.id, local["slot"], local["uses"]]))
        return torch.empty(0, dtype=dtype).set_(storage, HEADER // dtype.itemsize, shape)

    def release(self, batch) -> int:
        """Consumer side: free the slot of every tensor of ``batch`` (an Entry, a mapping, a sequence or a tensor)
        that sits in a buffer of this ring; returns how many slots were freed."""
        headers = (_ring_header(storage) for storage in _storages(batch))
        return sum(self._free(header) for header in headers if header is not None and header[1] == self.id)

    def _free(self, header: list[int]) -> bool:
        """Free the slot a buffer's header names, if it still holds the use the header names (the fields of one
        batch share a slot: the first frees it)."""
        worker, slot, use = header[2:]
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


def _storages(value) -> Iterator[torch.UntypedStorage]:
    """The CPU storages of the tensors in ``value``, nested mappings and sequences included."""
    if isinstance(value, torch.Tensor):
        if value.device.type == "cpu":
            yield value.untyped_storage()
    elif isinstance(value, Mapping):
        for item in value.values():
            yield from _storages(item)
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from _storages(item)


def _ring_header(storage: torch.UntypedStorage) -> list[int] | None:
    """[magic, ring id, worker, slot, use] of a ring buffer's storage; None for any other storage."""
    if storage.nbytes() < HEADER or storage.data_ptr() % 8:
        return None
    header = _header(storage).tolist()
    return header if header[0] == MAGIC else None


def release_batch(batch) -> int:
    """Free the ring slots that ``batch`` holds, whichever rings of this process made them (``Entry.pin_memory``
    calls this once it has copied a batch); returns how many were freed."""
    freed = 0
    for storage in _storages(batch):
        header = _ring_header(storage)
        ring = _RINGS.get(header[1]) if header is not None else None
        freed += ring is not None and ring._free(header)
    return freed
