"""predict_archive: a Predictor over a whole archive, in stages, each on the resource it needs.

    lock          the output folder is held by one run (rank 0 holds it for all its processes)
    list          ScanArchive: names, rejected members
    skip finished sizes from headers; scans whose outputs are complete and bear this model's mark are skipped,
                  scans with a file srforge did not write at an output path fail (each process a strided share)
    split         under torchrun, what is left is dealt to the processes by pixels (srforge.predict.sharding)
    plan          size-grouped batches under the pixel budget (Predictor.plan); a .tar.gz in archive-order pools
    read          member bytes in the main process, decoded in ``workers`` background processes, collated ahead
    infer         the device: logits -> class map (uint8), probabilities only when asked (float16)
    write         PNG / npy in background threads, each file atomic (srforge.predict.outputs)
    report        one row per scan; under torchrun per-process reports merged by rank 0 (srforge.predict.report)

``workers=0`` runs every stage in turn in the calling thread; the background read and write stages, and the
bound they keep on memory, are in srforge.predict.background.

Every scan ends as a row: ok, skipped, failed (the error says which stage), rejected (refused by ScanArchive),
or stopped (not reached because the run stopped early: ``strict``, a full disk, Ctrl-C or SIGTERM). ``strict``
stops at the first failed or rejected scan by raising StopRun (srforge.predict.report) inside the stages; a full
disk stops the run with DiskFullError, and Ctrl-C (or SIGTERM under srforge.runtime.signals) with
KeyboardInterrupt, each raised again after the report is written. :class:`Ending` records which, if any.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from tqdm import tqdm

from srforge.atomic import DiskFullError, remove_stale_temporaries
from srforge.data.archive import ScanArchive
from srforge.locks import FolderLockedError
from srforge.predict.background import DecodedBatch, Reader, Writer, read_inline, writer_threads
from srforge.predict.folders import OutputError, check_reports, hold_output, prepare_output
from srforge.predict.outputs import class_fractions, finished_mask, foreign_outputs, not_srforge, output_paths
from srforge.predict.predictor import Predictor
from srforge.predict.report import (
    PastReport,
    Report,
    StopRun,
    merge_partials,
    remove_partials,
    summarise,
    write_partial,
    write_report,
)
from srforge.predict.sharding import split_by_pixels
from srforge.runtime import distributed

POOL = 32  # scans of a .tar.gz read together, in archive order (it has no random access)
NOT_REACHED = "not predicted: the run stopped early"

Todo = list[tuple[int, tuple[int, int]]]  # [(archive index, (H, W))] of the scans still to predict


# -- stages ---------------------------------------------------------------------------------------------
def prepare_folder(job: Job, held: contextlib.ExitStack) -> None:
    """Create and check the output folder; rank 0 holds it for the run (``held`` releases it), then sweeps what a
    killed run left (temporaries, partial reports), before any other process writes, so the sweep never takes a
    file in flight: not another rank's, nor another run's, which cannot hold the folder meanwhile."""
    refused: Exception | None = None
    if job.rank == 0:
        try:
            prepare_output(job.out_dir)
            held.enter_context(hold_output(job.out_dir))
            check_reports(job.out_dir)
            remove_stale_temporaries(job.out_dir)
            remove_partials(job.out_dir)
        except Exception as error:  # raised after the exchange, so that no other process waits for rank 0
            refused = error
    first = distributed.gather(None if refused is None else (isinstance(refused, FolderLockedError), str(refused)))[0]
    if refused is not None:
        raise refused
    if job.rank > 0:
        prepare_output(job.out_dir)  # the same check, and the same error, in every process
        if first is not None:  # rank 0 was refused: so is every process of its run
            raise (FolderLockedError if first[0] else OutputError)(first[1])


def skip_finished(job: Job, indices: Sequence[int], report: Report) -> Todo:
    """[(index, (H, W))] of ``indices`` still to predict; a row for each skipped or unreadable scan, and a failed
    row for each scan with a file srforge did not write at one of its output paths (never overwritten)."""
    todo, k = [], job.predictor.num_classes
    for i in job.archive.in_archive_order(indices):
        name = job.archive.names[i]
        try:
            size = job.archive.size(i)
        except Exception as error:  # any error reading one header is that scan's failure, not the run's
            report.fail(name, None, error, "cannot read the header: ")
            continue
        paths = output_paths(job.out_dir, name)
        mask = None if job.overwrite else finished_mask(paths, size, k, job.wanted, job.predictor.fingerprint)
        if mask is not None:  # finished by this model: srforge's files, nothing more to check
            report.add(name, "skipped", size, fractions=class_fractions(mask, k))
        elif foreign := foreign_outputs(paths, job.wanted, lambda: job.past.predicted(name)):
            report.fail(name, size, not_srforge(foreign[0], job.out_dir))
        else:
            todo.append((i, size))
    return todo


def list_and_skip(job: Job, report: Report, ending: Ending) -> tuple[list[int], Todo]:
    """(indices this process checked, what is left of them to predict): rank 0 reports the rejected members,
    each process checks a strided share for finished outputs."""
    checked = list(range(job.rank, len(job.archive), job.world))  # before a --strict stop: each gets a row
    try:
        if job.rank == 0:
            for name, reason in job.archive.rejected:
                report.add(name, "rejected", error=reason)
        return checked, skip_finished(job, checked, report)
    except (StopRun, KeyboardInterrupt) as error:
        ending.note(error)
        return checked, []


def share_out(job: Job, checked: list[int], todo: Todo, ending: Ending) -> tuple[list[int], Todo]:
    """(indices this process answers for in the report, its share of every process's ``todo``, by pixels).

    Every process learns whether any stopped; then none predicts anything."""
    everything = distributed.gather((ending.stopped, todo))
    ending.stopped = any(s for s, _ in everything)
    todo = sorted(item for _, part in everything for item in part) if not ending.stopped else []
    left = {i for i, _ in todo}
    mine = [i for i in checked if i not in left]  # checked here but predicted by whichever process it is dealt to
    keys, pixels = [job.archive.names[i] for i, _ in todo], [job.predictor.aligned_area(s) for _, s in todo]
    todo = [todo[p] for p in split_by_pixels(keys, pixels, job.world)[job.rank]]
    return mine + [i for i, _ in todo], todo


def plan_pools(archive: ScanArchive, todo: Todo, predictor: Predictor) -> list[list[list[int]]]:
    """Pools of batches of archive indices. A .tar.gz comes in pools of POOL scans in archive order, each read at
    once, so the archive is read in one forward pass; anything else is one pool, read batch by batch."""
    todo = [todo[p] for p in _archive_order(archive, todo)]
    pools = [todo[j : j + POOL] for j in range(0, len(todo), POOL)] if archive.sequential else [todo]
    return [[[pool[j][0] for j in batch] for batch in predictor.plan([s for _, s in pool])] for pool in pools]


def _archive_order(archive: ScanArchive, todo: Todo) -> list[int]:
    position = {i: p for p, (i, _) in enumerate(todo)}
    return [position[i] for i in archive.in_archive_order(position)]


def infer_and_write(batches: Iterator[DecodedBatch], job: Job, sizes: dict, writer: Writer, report: Report) -> None:
    """The infer stage (the device) feeding the write stage, one planned batch at a time."""
    archive, predictor = job.archive, job.predictor
    probs_dtype = torch.float16 if "probabilities" in job.wanted else None
    for batch in batches:
        start = time.perf_counter()
        for i, error in batch.errors.items():
            report.fail(archive.names[i], sizes[i], error, "cannot read: ")
        if not batch.images:
            continue
        ready, images = list(batch.images), list(batch.images.values())
        try:
            predictions = predictor.infer(images, probs_dtype, batch.collated)
        except Exception as error:  # e.g. out of memory as one smallest tile: name the scans, go on
            for i in ready:
                report.fail(archive.names[i], sizes[i], f"inference failed: {error}")
            continue
        ms = (time.perf_counter() - start) * 1000 / len(ready)
        for i, image, prediction in zip(ready, images, predictions):
            writer.submit(i, sizes[i], image if "overlay" in job.wanted else None, prediction, ms)
    writer.check()


def read_infer_write(job: Job, todo: Todo, report: Report, ending: Ending) -> None:
    """Predict ``todo`` (nothing once ``ending.stopped``): read, infer and write; a StopRun, DiskFullError or
    KeyboardInterrupt (Ctrl-C, SIGTERM) in any stage ends the run in ``ending``, once the scans handed to the
    writers are written; any other error propagates once the stages are shut down."""
    pools = plan_pools(job.archive, todo, job.predictor)
    reading = job.workers > 0 and todo and not ending.stopped
    reader = Reader(job.archive, pools, job.predictor, job.workers, dict(todo)) if reading else None
    threads = writer_threads(job.workers)
    largest = max((len(batch) for pool in pools for batch in pool), default=1)
    writer = Writer(job.out_dir, job.archive, job.predictor, report, threads, 2 * threads + largest)
    try:
        if not ending.stopped:
            read = reader if reader is not None else read_inline(job.archive, pools, job.predictor)
            infer_and_write(iter(read), job, dict(todo), writer, report)
    except (StopRun, DiskFullError, KeyboardInterrupt) as error:
        ending.note(error)
    finally:
        if reader is not None:
            reader.close()
        writer.close()
    ending.note(writer.error)  # a writer thread's StopRun or DiskFullError, also one after the last check


def add_unreached(archive: ScanArchive, mine: list[int], sizes: dict, report: Report) -> None:
    """A "stopped" row for each of ``mine`` with no row yet: a scan is never missing from the report."""
    for i in mine:
        if archive.names[i] not in report.by_name:
            report.add(archive.names[i], "stopped", sizes.get(i), error=NOT_REACHED, stop=False)


def write_merged_report(job: Job, rows: list[dict], stopped: bool, start: float) -> dict[str, Any]:
    """Write report.json / report.csv (rank 0, after merging every process's rows); returns the summary."""
    if job.world > 1:
        try:
            write_partial(job.out_dir, job.rank, job.world, rows, stopped)
        finally:
            distributed.barrier()
        if job.rank == 0:
            rows, stopped = merge_partials(job.out_dir, job.world)
    summary = summarise(
        rows,
        time.perf_counter() - start,
        stopped,
        classes=list(job.predictor.class_names),
        input=str(job.archive.path),
        output=str(job.out_dir),
        processes=job.world,
        model=job.predictor.fingerprint,
        runtime=job.predictor.runtime,
    )
    if job.rank == 0:
        write_report(job.out_dir, rows, summary, job.predictor.class_names)
    return distributed.gather(summary)[0]  # every process returns the merged summary, once the report exists


def finish_report(job: Job, report: Report, ending: Ending, start: float) -> dict[str, Any] | None:
    """The report stage: write the report and return its summary. After a full disk or an interruption, write what
    can be written, then raise what stopped the run (an interruption first: a preempted run ends as one)."""
    try:
        summary = write_merged_report(job, list(report.by_name.values()), ending.stopped, start)
    except DiskFullError:
        if ending.disk_full is None and ending.interrupted is None:
            raise
        summary = None  # the disk is full either way; the caller tells whether report.json was written
    if ending.interrupted is not None:
        raise ending.interrupted
    if ending.disk_full is not None:
        raise ending.disk_full
    return summary


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

    Statuses: ok (predicted now), skipped (complete outputs of this model found, ``overwrite=False``), failed
    (unreadable, unpredictable or unwritable scan, or a file srforge did not write at one of its output paths;
    the error says which), rejected (a member ScanArchive refused), stopped (not reached: ``strict`` stopped at
    the first failed or rejected scan, the disk filled, or the run was interrupted). ``workers`` background
    processes decode scans (0: everything in this thread). The output folder is held for the run (FolderLock; a
    second run into it raises FolderLockedError). Under torchrun each process takes its share and rank 0 writes
    the merged report. Raises DiskFullError when the disk fills, KeyboardInterrupt on Ctrl-C (Terminated on a
    SIGTERM under terminate_as_interrupt), each after writing what report it can.
    """
    start = time.perf_counter()
    processes = distributed.environment()
    distributed.join()
    wanted = ["mask"] + ["overlay"] * overlay + ["probabilities"] * probabilities
    job = Job(predictor, archive, Path(out_dir), wanted, overwrite, workers, processes.rank, processes.world)
    with contextlib.ExitStack() as held:
        prepare_folder(job, held)
        bar = tqdm(
            total=len(archive), unit="scan", desc="predict", disable=not progress or job.rank > 0, dynamic_ncols=True
        )
        report, ending = Report(strict, bar), Ending()
        mine, todo = share_out(job, *list_and_skip(job, report, ending), ending)
        read_infer_write(job, todo, report, ending)
        bar.close()
        add_unreached(archive, mine, dict(todo), report)
        return finish_report(job, report, ending, start)


# -- what the stages share ------------------------------------------------------------------------------
@dataclass
class Job:
    """What one predict_archive call predicts, where, which outputs each scan needs, and this process's place."""

    predictor: Predictor
    archive: ScanArchive
    out_dir: Path
    wanted: list[str]  # "mask", then "overlay" and "probabilities" when asked for
    overwrite: bool
    workers: int
    rank: int
    world: int
    past: PastReport = field(init=False)  # the scans the last report lists as predicted: their files are srforge's

    def __post_init__(self) -> None:
        self.past = PastReport(self.out_dir)


@dataclass
class Ending:
    """How the run ended: ``stopped`` early (``strict``, a full disk, an interruption, or another process
    stopped), and the DiskFullError or KeyboardInterrupt that stopped it, raised again once the report is
    written."""

    stopped: bool = False
    disk_full: DiskFullError | None = None
    interrupted: KeyboardInterrupt | None = None

    def note(self, error: BaseException | None) -> None:
        """Record a StopRun, DiskFullError or KeyboardInterrupt from a stage; anything else (or None) ends
        nothing."""
        if isinstance(error, DiskFullError):
            self.stopped, self.disk_full = True, error
        elif isinstance(error, KeyboardInterrupt):
            self.stopped, self.interrupted = True, self.interrupted or error
        elif isinstance(error, StopRun):
            self.stopped = True
