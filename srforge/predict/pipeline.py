"""predict_archive: a Predictor over a whole archive, in stages, each on the resource it needs.

    list          ScanArchive: names, rejected members
    skip finished sizes from headers; scans whose outputs are complete are skipped (each process a strided share)
    split         under torchrun, what is left is dealt to the processes by pixels (srforge.predict.sharding)
    plan          size-grouped batches under the pixel budget (Predictor.plan); a .tar.gz in archive-order pools
    read          member bytes in the main process, decoded in ``workers`` background processes, collated ahead
    infer         the device: logits -> class map (uint8), probabilities only when asked (float16)
    write         PNG / npy in background threads, each file atomic (srforge.predict.outputs)
    report        one row per scan; under torchrun per-process reports merged by rank 0

``workers=0`` runs every stage in turn in the calling thread; the background read and write stages, and the
bound they keep on memory, are in srforge.predict.background.

Every scan ends as a row: ok, skipped, failed (the error says which stage), rejected (refused by ScanArchive),
or stopped (not reached because the run stopped early: ``strict`` or a full disk). ``strict`` stops at the
first failed or rejected scan by raising StopRun inside the stages; a full disk stops the run with DiskFullError,
raised again after the report is written (both in srforge.predict.outputs).
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import torch
from tqdm import tqdm

from srforge.atomic import DiskFullError, remove_stale_temporaries
from srforge.data.archive import ScanArchive
from srforge.predict.background import DecodedBatch, Reader, Writer, read_inline, writer_threads
from srforge.predict.folders import prepare_output
from srforge.predict.outputs import (
    Rows,
    StopRun,
    class_fractions,
    finished_mask,
    merge_partials,
    output_paths,
    remove_partials,
    summarise,
    write_partial,
    write_report,
)
from srforge.predict.predictor import Predictor
from srforge.predict.sharding import split_by_pixels
from srforge.runtime import distributed

POOL = 32  # scans of a .tar.gz read together, in archive order (it has no random access)
NOT_REACHED = "not predicted: the run stopped early"


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


def infer_and_write(
    batches: Iterator[DecodedBatch], archive, predictor: Predictor, sizes: dict, writer: Writer, rows: Rows, options
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
    """Predict every scan of ``archive`` into ``out_dir`` (layout: srforge.predict.outputs); returns the summary.

    Statuses: ok (predicted now), skipped (complete outputs found, ``overwrite=False``), failed (unreadable,
    unpredictable or unwritable scan; the error says which), rejected (a member ScanArchive refused), stopped
    (not reached: ``strict`` stopped at the first failed or rejected scan, or the disk filled). ``workers``
    background processes decode scans (0: everything in this thread). Under torchrun each process takes its
    share and rank 0 writes the merged report. Raises DiskFullError (after the report) when the disk fills.
    """
    out_dir, start = Path(out_dir), time.perf_counter()
    processes = distributed.environment()
    rank, world = processes.rank, processes.world
    distributed.join()
    refused: Exception | None = None
    if rank == 0:  # before any other process writes: the sweep must not take another rank's file in flight
        try:
            prepare_output(out_dir)
            remove_stale_temporaries(out_dir)
            remove_partials(out_dir)
        except Exception as error:  # raised after the barrier, so that no other process waits for rank 0
            refused = error
    distributed.barrier()
    if refused is not None:
        raise refused
    if rank > 0:
        prepare_output(out_dir)  # the same check, and the same error, in every process
    wanted = ["mask"] + ["overlay"] * overlay + ["probabilities"] * probabilities
    options = {"overlay": overlay, "probabilities": probabilities}
    bar = tqdm(total=len(archive), unit="scan", desc="predict", disable=not progress or rank > 0, dynamic_ncols=True)
    rows = Rows(strict, bar)
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
    everything = distributed.gather((stopped, todo))
    stopped = any(s for s, _ in everything)
    todo = sorted(item for _, part in everything for item in part) if not stopped else []
    left = {i for i, _ in todo}
    mine = [i for i in mine if i not in left]  # checked here but predicted by whichever process it is dealt to
    share = split_by_pixels(
        [archive.names[i] for i, _ in todo], [predictor.aligned_area(s) for _, s in todo], world
    )[rank]
    todo = [todo[p] for p in share]
    mine += [i for i, _ in todo]
    sizes = dict(todo)
    pools = plan(archive, todo, predictor)
    reader = Reader(archive, pools, predictor, workers) if workers > 0 and todo and not stopped else None
    threads = writer_threads(workers)
    largest = max((len(batch) for pool in pools for batch in pool), default=1)
    writer = Writer(out_dir, archive, predictor, rows, threads, 2 * threads + largest)
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
            distributed.barrier()
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
    return distributed.gather(summary)[0]  # every process returns the merged summary, once the report exists
