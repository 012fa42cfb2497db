"""The prediction output folder: where each scan's files go, when they are complete, how reports are written.

Under the output folder::

    masks/<rel>.png           class ids, uint8 PNG mode 'L', exactly the scan's (H, W)
    overlays/<rel>.png        the scan with every non-background class drawn over it     (overlay)
    probabilities/<rel>.npy   float16 [K, H, W] softmax probabilities (np.load)           (probabilities)
    report.json, report.csv   per scan: name, status, size, error, class pixel fractions, milliseconds
    .partial/                 one report per process while several processes share the archive (torchrun)

<rel> is the member's relative path without its suffix. Every file is written to a hidden temporary name
in its folder and renamed over the final name (os.replace), so a kill never leaves a truncated output; a
rerun treats a scan as done when each of its outputs decodes and has the scan's size.

Nothing here knows about models: :mod:`srforge.predict.pipeline` decides what to predict, this module owns the
files.
"""

from __future__ import annotations

import csv
import io
import json
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image
from torchvision.utils import draw_segmentation_masks

from srforge.atomic import as_disk_full, atomic_write, atomic_write_text
from srforge.data.images import DataError
from srforge.data.naming import scan_stem

STATUSES = ("ok", "skipped", "failed", "rejected", "stopped")
PARTIAL = ".partial"  # per-process reports of a multi-process run, merged into report.json at the end
_COLORS = [
    (230, 25, 75),
    (60, 180, 75),
    (0, 130, 200),
    (245, 130, 48),
    (145, 30, 180),
    (70, 240, 240),
    (240, 50, 230),
    (210, 245, 60),
    (250, 190, 212),
    (0, 128, 128),
]


# -- one scan's files -----------------------------------------------------------------------------------
def output_paths(out_dir: Path, name: str) -> dict[str, Path]:
    """Where scan ``name`` (a safe relative path) writes each output."""
    stem = scan_stem(name)  # the key ScanArchive checks for clashes: scan.v1.tif and scan.v2.tif stay apart
    return {
        "mask": out_dir / "masks" / f"{stem}.png",
        "overlay": out_dir / "overlays" / f"{stem}.png",
        "probabilities": out_dir / "probabilities" / f"{stem}.npy",
    }


def read_complete(path: Path, size: tuple[int, int], mode: str) -> np.ndarray | None:
    """The image at path as an array if it decodes fully, in PIL ``mode``, at ``size`` (H, W); else None."""
    try:
        with Image.open(path) as image:
            image.load()
            if image.mode != mode or image.size != (size[1], size[0]):
                return None
            return np.asarray(image)
    except (OSError, ValueError, SyntaxError):  # missing, a folder, a name too long, truncated, not an image
        return None


def _npy_complete(path: Path, shape: tuple[int, ...]) -> bool:
    try:
        return np.load(path, mmap_mode="r").shape == shape
    except (OSError, ValueError):
        return False


def finished_mask(paths: dict[str, Path], size: tuple[int, int], k: int, wanted: Sequence[str]) -> np.ndarray | None:
    """The finished mask uint8 [H, W] when every wanted output of a scan is complete, else None."""
    mask = read_complete(paths["mask"], size, "L")
    if mask is None or ("overlay" in wanted and read_complete(paths["overlay"], size, "RGB") is None):
        return None
    if "probabilities" in wanted and not _npy_complete(paths["probabilities"], (k, *size)):
        return None
    return mask


def class_fractions(mask: np.ndarray, num_classes: int) -> list[float]:
    """Fraction of the pixels of ``mask`` (uint8 [H, W]) in each class, [K] summing to 1."""
    counts = np.bincount(mask.ravel(), minlength=num_classes)[:num_classes]
    return [round(float(c) / mask.size, 6) for c in counts]


def draw_overlay(image: torch.Tensor, mask: torch.Tensor, num_classes: int) -> torch.Tensor:
    """The scan [C, H, W] uint8 as RGB with classes 1..K-1 of ``mask`` [H, W] drawn at half opacity -> [3, H, W]."""
    rgb = image[:3] if image.shape[0] >= 3 else image[:1].expand(3, -1, -1)
    if image.is_floating_point():
        rgb = (rgb.clamp(0, 1) * 255).round().to(torch.uint8)
    classes = torch.arange(1, num_classes)[:, None, None]
    colors = [_COLORS[(c - 1) % len(_COLORS)] for c in range(1, num_classes)]
    return draw_segmentation_masks(rgb, mask[None] == classes, alpha=0.5, colors=colors)


def write_png(path: Path, array: np.ndarray, mode: str) -> None:
    """Write ``array`` ([H, W] for 'L', [H, W, 3] for 'RGB') as a PNG at ``path``, atomically."""
    atomic_write(path, lambda f: Image.fromarray(array, mode).save(f, format="PNG"))


def write_scan(
    paths: dict[str, Path],
    mask: np.ndarray,
    num_classes: int,
    image: torch.Tensor | None = None,
    probabilities: np.ndarray | None = None,
) -> list[float]:
    """Write a scan's mask (uint8 [H, W]) and, when given, its overlay (from ``image`` [C, H, W]) and
    probabilities (float16 [K, H, W]); returns its class fractions. Raises what writing raises, ENOSPC as
    DiskFullError."""
    try:
        if probabilities is not None:
            atomic_write(paths["probabilities"], lambda f: np.save(f, probabilities))
        if image is not None:
            drawn = draw_overlay(image, torch.from_numpy(mask).long(), num_classes)
            write_png(paths["overlay"], drawn.permute(1, 2, 0).contiguous().numpy(), "RGB")
        write_png(paths["mask"], mask, "L")  # last: a complete mask is what marks the scan done
    except OSError as error:
        raise as_disk_full(error, paths["mask"].parents[1]) from error
    return class_fractions(mask, num_classes)


# -- reports ----------------------------------------------------------------------------------------------
def report_row(name, status, size=None, error=None, fractions=None, ms=None) -> dict[str, Any]:
    """One scan's row of the report."""
    height, width = size if size is not None else (None, None)
    return {
        "name": name,
        "status": status,
        "height": height,
        "width": width,
        "error": error,
        "fractions": fractions,
        "ms": None if ms is None else round(ms, 2),
    }


def summarise(rows: Sequence[dict], seconds: float, stopped_early: bool, **extra) -> dict[str, Any]:
    """The report's summary: counts by status, time, throughput, plus ``extra`` (classes, input, output)."""
    counts = {s: sum(r["status"] == s for r in rows) for s in STATUSES}
    return {
        "scans": len(rows),
        **counts,
        "stopped_early": stopped_early,
        "seconds": round(seconds, 3),
        "scans_per_second": round(counts["ok"] / seconds, 3) if seconds > 0 else None,
        **extra,
    }


def write_report(out_dir: Path, rows: list[dict], summary: dict, class_names: Sequence[str]) -> None:
    """report.json ({"summary", "scans"}, rows sorted by name) and report.csv (one row a scan, ``frac_<class>``)."""
    try:
        _write_report(out_dir, rows, summary, class_names)
    except OSError as error:
        raise as_disk_full(error, out_dir) from error


def _write_report(out_dir: Path, rows: list[dict], summary: dict, class_names: Sequence[str]) -> None:
    rows = sorted(rows, key=lambda r: r["name"])
    atomic_write_text(out_dir / "report.json", json.dumps({"summary": summary, "scans": rows}, indent=1))
    buffer = io.StringIO()
    fields = ["name", "status", "height", "width", "ms", "error"] + [f"frac_{c}" for c in class_names]
    writer = csv.DictWriter(buffer, fields)
    writer.writeheader()
    for row in rows:
        fractions = dict(zip(fields[6:], row["fractions"] or []))
        writer.writerow({**{k: row[k] for k in fields[:6]}, **fractions})
    atomic_write_text(out_dir / "report.csv", buffer.getvalue())


def partial_path(out_dir: Path, rank: int, world: int) -> Path:
    return out_dir / PARTIAL / f"rank{rank:05d}-of-{world:05d}.json"


def write_partial(out_dir: Path, rank: int, world: int, rows: list[dict], stopped_early: bool) -> None:
    """This process's rows of a multi-process run, for :func:`merge_partials`."""
    text = json.dumps({"rank": rank, "world": world, "stopped_early": stopped_early, "scans": rows})
    atomic_write_text(partial_path(out_dir, rank, world), text)


def merge_partials(out_dir: Path, world: int) -> tuple[list[dict], bool]:
    """(every row, whether any process stopped early) from the ``world`` partial reports; removes them."""
    rows, stopped = [], False
    for rank in range(world):
        path = partial_path(out_dir, rank, world)
        part = json.loads(path.read_text())
        rows += part["scans"]
        stopped = stopped or part["stopped_early"]
    for rank in range(world):
        partial_path(out_dir, rank, world).unlink()
    return rows, stopped


def remove_partials(out_dir: Path) -> None:
    """Drop partial reports a killed multi-process run left (its scans are found again by their outputs)."""
    for path in (out_dir / PARTIAL).glob("*.json") if (out_dir / PARTIAL).is_dir() else []:
        path.unlink(missing_ok=True)


class StopRun(Exception):
    """Raised inside the stages to end a run early (``strict``); the report is still written."""


class Rows:
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
