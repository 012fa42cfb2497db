"""Scoring scans: true and predicted masks read in background threads, grouped by size into padded batches, their
counts computed on the device (srforge.evaluate.metrics.batch_counts), one row a scan.

    names -> chunks of CHUNK scans, read ahead by a thread (decoding in ``threads`` threads)
          -> size-grouped batches of at most ``max_pixels`` padded pixels -> AlignedCollate(1)
          -> batch_counts on the device -> host: one row per scan

A row is ``{"name", "status": "ok" | "failed", "error", "height", "width", "confusion", "tolerance"}``; a scan
whose prediction is missing, unreadable or of another size, or whose masks hold ids outside the classes, is a
failed row that says which file, what was expected and what was found. Under torchrun each process scores every
world-th scan and every process gets all rows (srforge.runtime.distributed.gather).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import torch

from srforge.constants import CPU_PIXELS
from srforge.data.collate import AlignedCollate
from srforge.data.images import invalid_mask_values
from srforge.data.sampling import SizeGroupedBatchSampler
from srforge.evaluate.metrics import batch_counts
from srforge.runtime import distributed

CHUNK = 64  # scans read ahead together
DEFAULT_SCORE_PIXELS = CPU_PIXELS  # padded pixels per scoring batch: ~50 B a pixel for 3 classes, ~200 MB


@contextlib.contextmanager
def one_host_thread() -> Iterator[None]:
    """torch's CPU operations in one thread inside (the setting is the process's; restored on leaving).

    Scoring and drawing are a few passes over bytes each, bound by memory: splitting them between torch's
    threads gains nothing and costs a wait at every operation, and where another process holds one of the cores
    that wait is the whole time slice (measured on 2 shared cores: a batch's counts 1.2 to 2.7 s in 2 threads,
    0.03 s in one). The model is not inside: prediction keeps every thread.
    """
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def failed_row(name: str, error: str, size=None) -> dict[str, Any]:
    height, width = size if size is not None else (None, None)
    return {"name": name, "status": "failed", "error": error, "height": height, "width": width}


class Scorer:
    """Scores of masks against the classes ``class_names`` (ids 0..K-1) on ``device``; ``tolerance`` px for the
    tolerance F1; true pixels of ``ignore_index`` count nowhere; ``max_pixels`` padded pixels per batch."""

    def __init__(self, class_names, ignore_index: int, tolerance: int, device, max_pixels: int | None = None):
        if tolerance < 0:
            raise ValueError(f"tolerance must be >= 0 px, got {tolerance}")
        self.class_names, self.k = list(class_names), len(class_names)
        self.ignore, self.tolerance = ignore_index, tolerance
        self.device = torch.device(device)
        self.max_pixels = max_pixels or DEFAULT_SCORE_PIXELS
        # the prediction is padded as the truth is: padding never differs, and the counts look where they differ
        self.collate = AlignedCollate(1, pad={"truth": ignore_index, "pred": ignore_index})

    def pair(self, name: str, truth, pred, truths, predictions) -> dict[str, Any] | tuple:
        """(truth, pred) ready to score, or the failed row saying what is wrong."""
        if isinstance(truth, Exception):
            return failed_row(name, f"cannot read the true mask: {truth}")
        size = tuple(truth.shape)
        if isinstance(pred, Exception):
            return failed_row(name, str(pred), size)
        if tuple(pred.shape) != size:
            return failed_row(
                name,
                f"{predictions.label(name)}: the prediction is {tuple(pred.shape)} (H, W) but the true mask "
                f"{truths.label(name)} is {size}; they must match",
                size,
            )
        return truth, pred

    def score(self, items: list[tuple[str, torch.Tensor, torch.Tensor]]) -> list[dict[str, Any]]:
        """Rows of scans (name, truth [H, W], pred [H, W]) that pair up, in size-grouped batches on the device."""
        rows: list[dict[str, Any]] = []
        if not items:
            return rows
        sizes = [tuple(truth.shape) for _, truth, _ in items]
        batches = SizeGroupedBatchSampler(sizes, max_pixels=self.max_pixels, divisor=1, shuffle=False)
        for batch in batches:
            collated = self.collate([{"truth": items[i][1], "pred": items[i][2]} for i in batch])
            counts = batch_counts(
                collated["pred"].to(self.device, non_blocking=True),
                collated["truth"].to(self.device, non_blocking=True),
                self.k,
                self.ignore,
                self.tolerance,
            )
            counts = {key: value.cpu() for key, value in counts.items()}  # one copy per batch
            for b, i in enumerate(batch):
                rows.append(self._row(items[i], sizes[i], {key: value[b] for key, value in counts.items()}))
        return rows

    def _row(self, item, size, counts: dict[str, torch.Tensor]) -> dict[str, Any]:
        name, truth, pred = item
        bad_truth, bad_pred = counts["invalid"].tolist()
        if bad_truth:
            values = invalid_mask_values(truth, self.k, self.ignore)
            return failed_row(
                name,
                f"true mask values {values[:20]} are not one of the model's {self.k} classes (0..{self.k - 1}) "
                f"nor ignore_index={self.ignore}; fix the mask or evaluate with the right checkpoint",
                size,
            )
        if bad_pred:
            values = invalid_mask_values(pred, self.k, -1)
            return failed_row(name, f"predicted ids {values[:20]} are not one of the {self.k} classes", size)
        return {
            "name": name,
            "status": "ok",
            "error": None,
            "height": size[0],
            "width": size[1],
            "confusion": counts["confusion"].tolist(),
            "tolerance": counts["tolerance"].tolist(),
        }


def _load(names: list[str], truths, predictions, scorer: Scorer, pool) -> tuple[list, list]:
    """(items that pair up, failed rows) of one chunk."""
    read = truths.read(names, pool)
    preds = dict(zip(names, pool.map(predictions.read, names)))
    items, failed = [], []
    for name in names:
        paired = scorer.pair(name, read[name], preds[name], truths, predictions)
        if isinstance(paired, dict):
            failed.append(paired)
        else:
            items.append((name, *paired))
    return items, failed


def score_scans(names: list[str], truths, predictions, scorer: Scorer, threads: int = 2) -> list[dict[str, Any]]:
    """Every row of ``names`` (this process's share under torchrun; all rows returned to every process), sorted by
    name. ``truths``: a LabelledArchive or MaskFolder; ``predictions``: Predictions."""
    processes = distributed.environment()
    mine = names[processes.rank :: processes.world]
    chunks = [mine[j : j + CHUNK] for j in range(0, len(mine), CHUNK)]
    rows: list[dict[str, Any]] = []
    with one_host_thread(), ThreadPoolExecutor(max(1, threads)) as pool, ThreadPoolExecutor(1) as ahead:
        pending = ahead.submit(_load, chunks[0], truths, predictions, scorer, pool) if chunks else None
        for k in range(len(chunks)):
            items, failed = pending.result()
            if k + 1 < len(chunks):  # the next chunk decodes while this one is on the device
                pending = ahead.submit(_load, chunks[k + 1], truths, predictions, scorer, pool)
            rows += failed + scorer.score(items)
    everything = [row for part in distributed.gather(rows) for row in part]
    return sorted(everything, key=lambda row: row["name"])
