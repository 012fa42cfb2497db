"""The read and write stages of predict_archive, in the calling thread or in the background.

Read: member bytes are read in the main process (a .tar.gz in pools, in archive order), decoded into uint8
[C, H, W] scans -- in ``workers`` forked processes by :class:`Reader`, or in turn by :func:`read_inline` -- and
each planned batch is collated ahead, so the device finds it ready. Write: :class:`Writer` encodes and writes
each scan's outputs in background threads (or in turn), and adds its row to the report.

Memory stays bounded: the Reader keeps at most 2 x workers scans (and at least two batches) decoding and two
decoded batches waiting; the Writer holds at most 2 x threads + one batch of scans not yet written.

A decoding process leaves Ctrl-C and SIGTERM to the main process (which stops the run and writes the report) and
dies with it however it ends, SIGKILL included (:func:`die_with_parent`): a forked worker blocked on its task
pipe never sees that pipe close, since it holds the pipe's other end itself, so it would otherwise wait forever.
"""

from __future__ import annotations

import collections
import ctypes
import io
import multiprocessing
import os
import queue
import signal
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import Future, ProcessPoolExecutor, ThreadPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path
from typing import Any

import torch

from srforge.atomic import DiskFullError
from srforge.data.archive import ScanArchive
from srforge.data.images import read_image
from srforge.predict.outputs import output_paths, write_scan
from srforge.predict.predictor import Prediction, Predictor
from srforge.predict.report import Report
from srforge.runtime.distributed import environment

# Decoded pixels handed to a decoding process in one task: each task costs a round trip through the pool (a pickle
# each way, a wake-up of the process and of the pool's thread), about as much as decoding a tiny scan, so tiny scans
# go in runs; a scan this big or bigger is a task alone, as a full-size scan always is.
DECODE_CHUNK_PIXELS = 2**16


def default_workers() -> int:
    """Background decoding processes by default: this process's share of the CPUs (under torchrun the machine's
    CPUs are shared by its LOCAL_WORLD_SIZE processes) but one, kept for the main process (feeding the device,
    writing); at least 1, at most 8."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        cpus = os.cpu_count() or 1
    return max(1, min(8, cpus // environment().local_world - 1))


def writer_threads(workers: int) -> int:
    """Threads that encode and write outputs: none with ``workers=0``, else 2, or workers / 2 when more."""
    return 0 if workers == 0 else max(2, workers // 2)


def _decode(items: list[tuple[bytes, str]], mode: str) -> list[Any]:
    """A worker's job: members' (bytes, label) -> for each, its uint8 [H, W, C] pixels (a numpy array: pickled into
    the result pipe, where a tensor would go through a shared-memory file of its own) or the exception decoding it
    raised (read_image, as in-process reading does)."""
    out: list[Any] = []
    for data, label in items:
        try:
            out.append(read_image(io.BytesIO(data), mode, label=label).permute(1, 2, 0).numpy())
        except Exception as error:  # one member's error is that scan's alone
            out.append(error)
    return out


def decode_chunks(indices: list[int], sizes: dict[int, tuple[int, int]]) -> list[list[int]]:
    """``indices`` cut into runs handed to one decoding process at once: scans in order while their pixels (from
    ``sizes``, (H, W) by index) add up to at most DECODE_CHUNK_PIXELS; a bigger scan alone."""
    chunks: list[list[int]] = []
    pixels = DECODE_CHUNK_PIXELS + 1
    for i in indices:
        h, w = sizes.get(i, (DECODE_CHUNK_PIXELS, 1))
        if pixels + h * w > DECODE_CHUNK_PIXELS:
            chunks.append([])
            pixels = 0
        chunks[-1].append(i)
        pixels += h * w
    return chunks


PR_SET_PDEATHSIG = 1  # prctl(2): the signal this process gets when the thread that forked it ends


def _kernel_kills_orphan() -> bool:
    """Ask Linux to SIGKILL this process when the thread that forked it ends; False where that is not possible."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        return ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def _watch_parent(parent: int) -> None:
    while os.getppid() == parent:  # an orphan is adopted by another process: its parent pid changes
        time.sleep(0.5)
    os._exit(1)


def die_with_parent(parent: int) -> None:
    """End this process when process ``parent`` ends, however it ends: on Linux the kernel sends SIGKILL
    (PR_SET_PDEATHSIG), elsewhere a thread ends it within half a second of its parent pid changing. The parent may
    have died already, before either was in place: then end at once."""
    if not _kernel_kills_orphan():
        threading.Thread(target=_watch_parent, args=(parent,), name="srforge-parent-watch", daemon=True).start()
    if os.getppid() != parent:
        os._exit(1)


def _worker_init(parent: int) -> None:
    torch.set_num_threads(1)  # a decoder needs no intra-op threads, and a forked OpenMP pool must stay unused
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C and SIGTERM are the main process's to handle: it stops
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # the run, writes the report and ends its workers
    die_with_parent(parent)


class DecodedBatch:
    """One planned batch after the read stage: decoded scans, their errors, and their collate (or None)."""

    def __init__(self, indices: list[int]):
        self.indices, self.images, self.errors, self.collated = indices, {}, {}, None


def _collate(predictor: Predictor, batch: DecodedBatch) -> None:
    images = list(batch.images.values())
    fits = len(images) > 1 or (images and predictor.aligned_area(tuple(images[0].shape[-2:])) <= predictor.max_pixels)
    batch.collated = predictor.collate_images(images) if fits else None


def _pool_bytes(archive: ScanArchive, pool: list[list[int]]) -> dict[int, Any]:
    """A .tar.gz pool's member bytes, read at once in archive order; nothing for random-access archives."""
    return archive.read_bytes([i for batch in pool for i in batch]) if archive.sequential else {}


def read_inline(archive: ScanArchive, pools: list[list[list[int]]], predictor: Predictor) -> Iterator[DecodedBatch]:
    """The read stage in the calling thread (``workers=0``)."""
    for pool in pools:
        data = _pool_bytes(archive, pool)
        for indices in pool:
            batch = DecodedBatch(indices)
            for i in indices:
                try:
                    batch.images[i] = archive.read(i, predictor.image_mode, data.pop(i, None))
                except Exception as error:  # one member's error is that scan's failure
                    batch.errors[i] = error
            yield batch


class Reader(threading.Thread):
    """The read stage with ``workers`` processes: this thread reads member bytes in plan order, the processes
    decode them, and decoded batches (collated) wait in a queue of two for the device."""

    def __init__(
        self, archive: ScanArchive, pools: list[list[list[int]]], predictor: Predictor, workers: int, sizes: dict
    ):
        super().__init__(name="srforge-reader", daemon=True)
        self.archive, self.pools, self.predictor, self.workers = archive, pools, predictor, workers
        self.sizes = sizes  # (H, W) by archive index, from the headers: how scans are cut into tasks
        self.ready: queue.Queue = queue.Queue(maxsize=2)
        self.stop = threading.Event()
        self.pool = self._new_pool()

    def _new_pool(self) -> ProcessPoolExecutor:
        # fork: workers start at once and share the parent's imports; they run no torch threads (_worker_init).
        # They are forked by the thread that calls this (the first submit): the main thread, or this reader thread
        # when it replaces a broken pool; the kernel ends them when that thread ends, once they are no longer used.
        context = multiprocessing.get_context("fork")
        pool = ProcessPoolExecutor(self.workers, context, initializer=_worker_init, initargs=(os.getpid(),))
        for future in [pool.submit(int) for _ in range(self.workers)]:  # started now, not lazily from the reader thread
            future.result()
        return pool

    def _put(self, item) -> bool:
        while not self.stop.is_set():
            try:
                self.ready.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def _submit(self, indices: list[int], data: dict[int, Any] | None) -> tuple[DecodedBatch, list[tuple]]:
        """Hand a batch's members to the decoders, a run of scans a task (:func:`decode_chunks`) -> (the batch,
        [(future, {index: bytes})] one a task)."""
        batch, tasks = DecodedBatch(indices), []
        data = self.archive.read_bytes(indices) if data is None else data
        for i in indices:
            if isinstance(data[i], BaseException):  # the member could not be read
                batch.errors[i] = data.pop(i)
        for chunk in decode_chunks([i for i in indices if i not in batch.errors], self.sizes):
            raws = {i: data.pop(i) for i in chunk}
            items = [(raws[i], self.archive.label(i)) for i in chunk]
            try:
                future = self.pool.submit(_decode, items, self.predictor.image_mode)
            except BrokenProcessPool:  # a decoder died (e.g. killed for memory): start new ones
                self.pool.shutdown(wait=False, cancel_futures=True)
                self.pool = self._new_pool()
                future = self.pool.submit(_decode, items, self.predictor.image_mode)
            tasks.append((future, raws))
        return batch, tasks

    def _finish(self, batch: DecodedBatch, tasks: list[tuple[Future, dict[int, bytes]]]) -> bool:
        for future, raws in tasks:
            try:
                decoded = future.result()
            except Exception as error:  # e.g. BrokenProcessPool: the decoder died on this task's scans
                decoded = [error] * len(raws)
            for (i, raw), pixels in zip(raws.items(), decoded):
                if isinstance(pixels, ValueError):  # DataError: ScanArchive.read says it as in-process reading does
                    try:
                        batch.images[i] = self.archive.read(i, self.predictor.image_mode, raw)
                    except Exception as error:
                        batch.errors[i] = error
                elif isinstance(pixels, BaseException):
                    batch.errors[i] = pixels
                else:
                    batch.images[i] = torch.from_numpy(pixels).permute(2, 0, 1)  # [C, H, W], channels-last strides
        try:
            _collate(self.predictor, batch)
        except Exception:  # collating decoded scans should not fail; if it does, infer collates again and reports it
            batch.collated = None
        return self._put(batch)

    def run(self) -> None:
        try:
            pending: collections.deque = collections.deque()
            for pool in self.pools:
                data = _pool_bytes(self.archive, pool)
                for indices in pool:
                    if self.stop.is_set():
                        return
                    pending.append(self._submit(indices, data if self.archive.sequential else None))
                    while len(pending) > 2 and sum(len(b.indices) for b, _ in pending) > 2 * self.workers:
                        if not self._finish(*pending.popleft()):
                            return
            while pending:
                if not self._finish(*pending.popleft()):
                    return
            self._put(None)
        except BaseException as error:  # an error outside any one scan: hand it to the main thread
            self._put(error)
        finally:
            self.pool.shutdown(wait=False, cancel_futures=True)

    def __iter__(self) -> Iterator[DecodedBatch]:
        self.start()
        while True:
            item = self.ready.get()
            if item is None:
                return
            if isinstance(item, BaseException):
                raise item
            yield item

    def close(self) -> None:
        self.stop.set()
        self.join(timeout=60)


class Writer:
    """The write stage: encode and write each scan's outputs (in ``threads`` background threads, or inline)."""

    def __init__(self, out_dir: Path, archive, predictor: Predictor, report: Report, threads: int, backlog: int):
        self.out_dir, self.archive, self.k, self.report = out_dir, archive, predictor.num_classes, report
        self.model = predictor.fingerprint  # the mark on every file written
        self.pool = ThreadPoolExecutor(threads, thread_name_prefix="srforge-writer") if threads else None
        self.slots = threading.Semaphore(backlog)  # scans handed over and not yet written
        self.error: BaseException | None = None  # StopRun or DiskFullError from a writer thread

    def submit(self, i: int, size, image: torch.Tensor | None, prediction: Prediction, ms: float) -> None:
        self.check()
        if self.pool is None:
            return self._write(i, size, image, prediction, ms)
        self.slots.acquire()
        self.pool.submit(self._write_in_thread, i, size, image, prediction, ms)

    def _write_in_thread(self, *args) -> None:
        try:
            self._write(*args)
        except BaseException as error:
            self.error = self.error or error
        finally:
            self.slots.release()

    def _write(self, i: int, size, image, prediction: Prediction, ms: float) -> None:
        name = self.archive.names[i]
        start = time.perf_counter()
        try:
            prediction.wait()
            probs = None if prediction.probabilities is None else prediction.probabilities.numpy()
            paths, mask = output_paths(self.out_dir, name), prediction.mask.numpy()
            fractions = write_scan(paths, mask, self.k, image, probs, self.model)
        except DiskFullError:
            self.report.add(name, "stopped", size, error="not written: no space left", stop=False)
            raise
        except Exception as error:  # a name too long, a folder in the way: this scan fails, the rest go on
            return self.report.fail(name, size, error, "cannot write the outputs: ")
        ms += (time.perf_counter() - start) * 1000
        self.report.add(name, "ok", size, fractions=fractions, ms=ms, tiles=prediction.tiles)

    def check(self) -> None:
        """Raise in the main thread what a writer thread raised (StopRun, DiskFullError)."""
        if self.error is not None:
            raise self.error

    def close(self) -> None:
        if self.pool is not None:
            self.pool.shutdown(wait=True)
