"""predict_archive: a Predictor over a whole archive, in stages, each on the resource it needs.

    list          ScanArchive: names, rejected members
    skip finished sizes from headers; scans whose outputs are complete are skipped (each process a strided share)
    split         under torchrun, what is left is dealt to the processes by pixels (srforge.engine.sharding)
    plan          size-grouped batches under the pixel budget (Predictor.plan); a .tar.gz in archive-order pools
    read          member bytes in the main process, decoded in ``workers`` background processes, collated ahead
    infer         the device: logits -> class map (uint8), probabilities only when asked (float16)
    write         PNG / npy in background threads, each file atomic (srforge.engine.outputs)
    report        one row per scan; under torchrun per-process reports merged by rank 0

``workers=0`` runs every stage in turn in the calling thread. With workers, memory is bounded: at most
2 x workers scans (and at least two batches) are being decoded, two decoded batches wait for the device, one is
on it, and 2 x writer threads + one batch of scans wait to be written.

Every scan ends as a row: ok, skipped, failed (the error says which stage), rejected (refused by ScanArchive),
or stopped (not reached because the run stopped early: ``strict`` or a full disk). ``strict`` stops at the
first failed or rejected scan by raising :class:`StopRun` inside the stages; a full disk stops the run with
:class:`~srforge.engine.outputs.DiskFullError`, raised again after the report is written.
"""

from __future__ import annotations

import collections
import io
import multiprocessing
import os
import queue
import signal
import threading
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import Future, ProcessPoolExecutor, ThreadPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path
from typing import Any

import torch
from tqdm import tqdm

from srforge.atomic import remove_stale_temporaries
from srforge.data.archive import ScanArchive
from srforge.data.images import DataError, read_image
from srforge.engine import sharding
from srforge.engine.outputs import (
    DiskFullError,
    class_fractions,
    finished_mask,
    merge_partials,
    output_paths,
    prepare_output,
    remove_partials,
    report_row,
    summarise,
    write_partial,
    write_report,
    write_scan,
)
from srforge.engine.predictor import Prediction, Predictor

POOL = 32  # scans of a .tar.gz read together, in archive order (it has no random access)
NOT_REACHED = "not predicted: the run stopped early"


class StopRun(Exception):
    """Raised inside the stages to end a run early (``strict``); the report is still written."""


def default_workers() -> int:
    """Background decoding processes by default: the CPUs this process may use but one (kept for the main
    process: feeding the device, writing), at least 1, at most 8."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        cpus = os.cpu_count() or 1
    return max(1, min(8, cpus - 1))


def writer_threads(workers: int) -> int:
    """Threads that encode and write outputs: none with ``workers=0``, else 2, or workers / 2 when more."""
    return 0 if workers == 0 else max(2, workers // 2)


def _decode(data: bytes, mode: str, label: str) -> torch.Tensor:
    """A worker's job: one member's bytes -> uint8 [C, H, W] (read_image, as in-process reading does)."""
    return read_image(io.BytesIO(data), mode, label=label)


def _worker_init() -> None:
    torch.set_num_threads(1)  # a decoder needs no intra-op threads, and a forked OpenMP pool must stay unused
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the main process's to handle


class _Rows:
    """The report's rows of this process, and the ``strict`` rule: a failed or rejected row stops the run."""

    def __init__(self, strict: bool, bar):
        self.strict, self.bar, self.rows = strict, bar, {}
        self.lock = threading.Lock()

    def add(self, name: str, status: str, *args, stop: bool = True, **kwargs) -> None:
        with self.lock:
            self.rows[name] = report_row(name, status, *args, **kwargs)
        self.bar.update()
        if stop and self.strict and status in ("failed", "rejected"):
            raise StopRun(name)

    def fail(self, name: str, size, error: BaseException | str, stage: str = "") -> None:
        text = error if isinstance(error, str) else str(error) or type(error).__name__
        if isinstance(error, BaseException) and not isinstance(error, DataError):
            text = f"{stage}{type(error).__name__}: {text}"
        self.add(name, "failed", size, error=text)


# -- stages ---------------------------------------------------------------------------------------------
def skip_finished(
    archive: ScanArchive, indices: Sequence[int], out_dir: Path, predictor: Predictor, wanted, overwrite, rows
) -> list[tuple[int, tuple[int, int]]]:
    """[(index, (H, W))] of ``indices`` still to predict; a row for each skipped or unreadable scan."""
    todo = []
    for i in archive.in_archive_order(indices):
        name = archive.names[i]
        try:
            size = archive.size(i)
        except Exception as error:  # any error reading one header is that scan's failure, not the run's
            rows.fail(name, None, error, "cannot read the header: ")
            continue
        mask = None if overwrite else finished_mask(output_paths(out_dir, name), size, predictor.num_classes, wanted)
        if mask is None:
            todo.append((i, size))
        else:
            rows.add(name, "skipped", size, fractions=class_fractions(mask, predictor.num_classes))
    return todo


def plan(archive: ScanArchive, todo: list[tuple[int, tuple[int, int]]], predictor: Predictor) -> list[list[list[int]]]:
    """Pools of batches of archive indices. A .tar.gz comes in pools of POOL scans in archive order, each read at
    once, so the archive is read in one forward pass; anything else is one pool, read batch by batch."""
    todo = [todo[p] for p in _archive_order(archive, todo)]
    pools = [todo[j : j + POOL] for j in range(0, len(todo), POOL)] if archive.sequential else [todo]
    return [[[pool[j][0] for j in batch] for batch in predictor.plan([s for _, s in pool])] for pool in pools]


def _archive_order(archive: ScanArchive, todo) -> list[int]:
    position = {i: p for p, (i, _) in enumerate(todo)}
    return [position[i] for i in archive.in_archive_order(position)]


class _Batch:
    """One planned batch after the read stage: decoded scans, their errors, and their collate (or None)."""

    def __init__(self, indices: list[int]):
        self.indices, self.images, self.errors, self.collated = indices, {}, {}, None


def _collate(predictor: Predictor, batch: _Batch) -> None:
    images = list(batch.images.values())
    fits = len(images) > 1 or (images and predictor.aligned_area(tuple(images[0].shape[-2:])) <= predictor.max_pixels)
    batch.collated = predictor.collate_images(images) if fits else None


def _pool_bytes(archive: ScanArchive, pool: list[list[int]]) -> dict[int, Any]:
    """A .tar.gz pool's member bytes, read at once in archive order; nothing for random-access archives."""
    return archive.read_bytes([i for batch in pool for i in batch]) if archive.sequential else {}


def read_inline(archive: ScanArchive, pools: list[list[list[int]]], predictor: Predictor) -> Iterator[_Batch]:
    """The read stage in the calling thread (``workers=0``)."""
    for pool in pools:
        data = _pool_bytes(archive, pool)
        for indices in pool:
            batch = _Batch(indices)
            for i in indices:
                try:
                    batch.images[i] = archive.read(i, predictor.image_mode, data.pop(i, None))
                except Exception as error:  # one member's error is that scan's failure
                    batch.errors[i] = error
            yield batch


class _Reader(threading.Thread):
    """The read stage with ``workers`` processes: this thread reads member bytes in plan order, the processes
    decode them, and decoded batches (collated) wait in a queue of two for the device."""

    def __init__(self, archive: ScanArchive, pools: list[list[list[int]]], predictor: Predictor, workers: int):
        super().__init__(name="srforge-reader", daemon=True)
        self.archive, self.pools, self.predictor, self.workers = archive, pools, predictor, workers
        self.ready: queue.Queue = queue.Queue(maxsize=2)
        self.stop = threading.Event()
        self.pool = self._new_pool()

    def _new_pool(self) -> ProcessPoolExecutor:
        # fork: workers start at once and share the parent's imports; they run no torch threads (_worker_init).
        pool = ProcessPoolExecutor(self.workers, multiprocessing.get_context("fork"), initializer=_worker_init)
        for future in [pool.submit(int) for _ in range(self.workers)]:  # start them before any thread exists
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

    def _submit(self, indices: list[int], data: dict[int, Any] | None) -> tuple[_Batch, dict[int, tuple]]:
        batch, futures = _Batch(indices), {}
        mode = self.predictor.image_mode
        data = self.archive.read_bytes(indices) if data is None else data
        for i in indices:
            raw = data.pop(i)
            if isinstance(raw, BaseException):
                batch.errors[i] = raw
                continue
            try:
                futures[i] = (self.pool.submit(_decode, raw, mode, self.archive.label(i)), raw)
            except BrokenProcessPool:  # a decoder died (e.g. killed for memory): start new ones
                self.pool.shutdown(wait=False, cancel_futures=True)
                self.pool = self._new_pool()
                futures[i] = (self.pool.submit(_decode, raw, mode, self.archive.label(i)), raw)
        return batch, futures

    def _finish(self, batch: _Batch, futures: dict[int, tuple[Future, bytes]]) -> bool:
        for i, (future, raw) in futures.items():
            try:
                batch.images[i] = future.result()
            except ValueError:  # DataError: ScanArchive.read says it as in-process reading does (a cut member)
                try:
                    batch.images[i] = self.archive.read(i, self.predictor.image_mode, raw)
                except Exception as error:
                    batch.errors[i] = error
            except Exception as error:  # e.g. BrokenProcessPool: the decoder died on this scan
                batch.errors[i] = error
        try:
            _collate(self.predictor, batch)
        except Exception as error:  # collating cannot fail for decoded scans; if it does, infer collates again
            batch.collated = None
            del error
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
                    while len(pending) > 2 and sum(len(f) for _, f in pending) > 2 * self.workers:
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

    def __iter__(self) -> Iterator[_Batch]:
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


class _Writer:
    """The write stage: encode and write each scan's outputs (in ``threads`` background threads, or inline)."""

    def __init__(self, out_dir: Path, archive, predictor: Predictor, rows: _Rows, threads: int, backlog: int):
        self.out_dir, self.archive, self.k, self.rows = out_dir, archive, predictor.num_classes, rows
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
            fractions = write_scan(output_paths(self.out_dir, name), prediction.mask.numpy(), self.k, image, probs)
        except DiskFullError:
            self.rows.add(name, "stopped", size, error="not written: no space left", stop=False)
            raise
        except Exception as error:  # a name too long, a folder in the way: this scan fails, the rest go on
            return self.rows.fail(name, size, error, "cannot write the outputs: ")
        ms += (time.perf_counter() - start) * 1000
        self.rows.add(name, "ok", size, fractions=fractions, ms=ms)

    def check(self) -> None:
        """Raise in the main thread what a writer thread raised (StopRun, DiskFullError)."""
        if self.error is not None:
            raise self.error

    def close(self) -> None:
        if self.pool is not None:
            self.pool.shutdown(wait=True)


def infer_and_write(
    batches: Iterator[_Batch], archive, predictor: Predictor, sizes: dict, writer: _Writer, rows: _Rows, options
) -> None:
    """The infer stage (the device) feeding the write stage, one planned batch at a time."""
    probs_dtype = torch.float16 if options["probabilities"] else None
    for batch in batches:
        start = time.perf_counter()
        for i, error in batch.errors.items():
            rows.fail(archive.names[i], sizes[i], error, "cannot read: ")
        if not batch.images:
            continue
        ready, images = list(batch.images), list(batch.images.values())
        try:
            predictions = predictor.infer(images, probs_dtype, batch.collated)
        except Exception as error:  # e.g. out of memory as one smallest tile: name the scans, go on
            for i in ready:
                rows.fail(archive.names[i], sizes[i], f"inference failed: {error}")
            continue
        ms = (time.perf_counter() - start) * 1000 / len(ready)
        for i, image, prediction in zip(ready, images, predictions):
            writer.submit(i, sizes[i], image if options["overlay"] else None, prediction, ms)
    writer.check()


# -- the run --------------------------------------------------------------------------------------------
def predict_archive(
    predictor: Predictor,
    archive: ScanArchive,
    out_dir,
    *,
    overlay: bool = False,
    probabilities: bool = False,
    overwrite: bool = False,
    strict: bool = False,
    progress: bool = True,
    workers: int = 0,
) -> dict[str, Any]:
    """Predict every scan of ``archive`` into ``out_dir`` (layout: srforge.engine.outputs); returns the summary.

    Statuses: ok (predicted now), skipped (complete outputs found, ``overwrite=False``), failed (unreadable,
    unpredictable or unwritable scan; the error says which), rejected (a member ScanArchive refused), stopped
    (not reached: ``strict`` stopped at the first failed or rejected scan, or the disk filled). ``workers``
    background processes decode scans (0: everything in this thread). Under torchrun each process takes its
    share and rank 0 writes the merged report. Raises DiskFullError (after the report) when the disk fills.
    """
    out_dir, start = Path(out_dir), time.perf_counter()
    rank, world, _ = sharding.process_rank()
    sharding.join()
    prepare_output(out_dir)
    if rank == 0:
        remove_stale_temporaries(out_dir)
        remove_partials(out_dir)
    wanted = ["mask"] + ["overlay"] * overlay + ["probabilities"] * probabilities
    options = {"overlay": overlay, "probabilities": probabilities}
    bar = tqdm(total=len(archive), unit="scan", desc="predict", disable=not progress or rank > 0, dynamic_ncols=True)
    rows = _Rows(strict, bar)
    mine: list[int] = []  # indices this process answers for: a strided share, then its share of what is left
    disk_full: DiskFullError | None = None
    stopped = False
    try:
        if rank == 0:
            for name, reason in archive.rejected:
                rows.add(name, "rejected", error=reason)
        mine = list(range(rank, len(archive), world))
        todo = skip_finished(archive, mine, out_dir, predictor, wanted, overwrite, rows)
    except StopRun:
        stopped, todo = True, []
    everything = sharding.gather((stopped, todo))
    stopped = any(s for s, _ in everything)
    todo = sorted(item for _, part in everything for item in part) if not stopped else []
    left = {i for i, _ in todo}
    mine = [i for i in mine if i not in left]  # checked here but predicted by whichever process it is dealt to
    share = sharding.split_by_pixels(
        [archive.names[i] for i, _ in todo], [predictor.aligned_area(s) for _, s in todo], world
    )[rank]
    todo = [todo[p] for p in share]
    mine += [i for i, _ in todo]
    sizes = dict(todo)
    pools = plan(archive, todo, predictor)
    reader = _Reader(archive, pools, predictor, workers) if workers > 0 and todo and not stopped else None
    threads = writer_threads(workers)
    largest = max((len(batch) for pool in pools for batch in pool), default=1)
    writer = _Writer(out_dir, archive, predictor, rows, threads, 2 * threads + largest)
    try:
        if not stopped:
            read = reader if reader is not None else read_inline(archive, pools, predictor)
            infer_and_write(iter(read), archive, predictor, sizes, writer, rows, options)
    except StopRun:
        stopped = True
    except DiskFullError as error:
        stopped, disk_full = True, error
    finally:
        if reader is not None:
            reader.close()
        writer.close()
    if isinstance(writer.error, DiskFullError):
        stopped, disk_full = True, writer.error
    stopped = stopped or isinstance(writer.error, StopRun)
    bar.close()
    for i in mine:  # a scan is never missing from the report
        if archive.names[i] not in rows.rows:
            rows.add(archive.names[i], "stopped", sizes.get(i), error=NOT_REACHED, stop=False)
    try:
        summary = _report(out_dir, list(rows.rows.values()), stopped, start, predictor, archive, rank, world)
    except DiskFullError:
        if disk_full is None:
            raise
        summary = None  # what report could be written was written; the disk is full either way
    if disk_full is not None:
        raise disk_full
    return summary


def _report(out_dir: Path, rows, stopped, start, predictor, archive, rank: int, world: int) -> dict[str, Any]:
    """Write report.json / report.csv (rank 0, after merging every process's rows); returns the summary."""
    if world > 1:
        try:
            write_partial(out_dir, rank, world, rows, stopped)
        finally:
            sharding.barrier()
        if rank == 0:
            rows, stopped = merge_partials(out_dir, world)
    summary = summarise(
        rows,
        time.perf_counter() - start,
        stopped,
        classes=list(predictor.class_names),
        input=str(archive.path),
        output=str(out_dir),
        processes=world,
    )
    if rank == 0:
        write_report(out_dir, rows, summary, predictor.class_names)
    return sharding.gather(summary)[0]  # every process returns the merged summary, once the report exists
