"""The report of a prediction run: one row a scan, the summary, report.json / report.csv, and under torchrun
one partial report per process, merged by rank 0.

Under the output folder::

    report.json, report.csv   per scan: name, status, size, error, class pixel fractions, milliseconds;
                              report.json also how many tiles each scan predicted now was cut into (1: none)
    .partial/                 one report per process while several processes share the archive (torchrun)

A row's status is one of STATUSES: ok, skipped, failed (the error says which stage), rejected (refused by
ScanArchive) or stopped (not reached: the run stopped early). :class:`Report` holds this process's rows and
applies ``strict``: a failed or rejected row raises :class:`StopRun`. Names and errors are written as text any
reader can take: a file name that is not valid UTF-8 keeps its undecodable bytes as ``\\xNN`` escapes
(:func:`printable`). The next run reads the last report back (:class:`PastReport`): the scans it lists as
predicted are srforge's, whatever lies at their output paths now.
"""

from __future__ import annotations

import csv
import io
import json
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from srforge.atomic import as_disk_full, atomic_write_text
from srforge.data.images import DataError
from srforge.data.naming import scan_stem

STATUSES = ("ok", "skipped", "failed", "rejected", "stopped")
PARTIAL = ".partial"  # per-process reports of a multi-process run, merged into report.json at the end


def report_row(name, status, size=None, error=None, fractions=None, ms=None, tiles=None) -> dict[str, Any]:
    """One scan's row of the report (``tiles``: how many tiles a scan predicted now was cut into, 1 for none)."""
    height, width = size if size is not None else (None, None)
    return {
        "name": name,
        "status": status,
        "height": height,
        "width": width,
        "error": error,
        "fractions": fractions,
        "ms": None if ms is None else round(ms, 2),
        "tiles": tiles,
    }


def printable(text: str) -> str:
    """``text`` as valid UTF-8: the bytes of a file name that are not UTF-8 (which Python holds as lone surrogates,
    os.fsdecode) become ``\\xNN`` escapes, so that ``scan_\\xff.png`` is written where the name would not encode."""
    try:
        return text.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
    except UnicodeEncodeError:  # a surrogate no file name decodes to
        return text.encode("utf-8", "backslashreplace").decode("utf-8")


def _printable_row(row: dict[str, Any]) -> dict[str, Any]:
    return {key: printable(value) if isinstance(value, str) else value for key, value in row.items()}


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
    rows = [_printable_row(row) for row in sorted(rows, key=lambda r: r["name"])]
    summary = _printable_row(summary)
    atomic_write_text(out_dir / "report.json", json.dumps({"summary": summary, "scans": rows}, indent=1))
    buffer = io.StringIO()
    fields = ["name", "status", "height", "width", "ms", "error"] + [f"frac_{c}" for c in class_names]
    writer = csv.DictWriter(buffer, fields)
    writer.writeheader()
    for row in rows:
        fractions = dict(zip(fields[6:], row["fractions"] or []))
        writer.writerow({**{k: row[k] for k in fields[:6]}, **fractions})
    atomic_write_text(out_dir / "report.csv", buffer.getvalue())


# -- several processes ------------------------------------------------------------------------------------
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


class PastReport:
    """The scans the last report.json in ``out_dir`` lists as predicted (ok or skipped), read on first use (most
    runs never ask: their outputs bear srforge's mark, or are not there). A missing or unreadable report lists
    none."""

    def __init__(self, out_dir: Path):
        self.path = out_dir / "report.json"
        self.stems: frozenset[str] | None = None

    def predicted(self, name: str) -> bool:
        """Whether the last report lists a scan with ``name``'s output name as predicted."""
        if self.stems is None:
            predicted = [row["name"] for row in self._rows() if row.get("status") in ("ok", "skipped")]
            self.stems = frozenset(map(scan_stem, predicted))
        return scan_stem(name) in self.stems

    def _rows(self) -> list[dict]:
        try:
            rows = json.loads(self.path.read_text())["scans"]
            return [row for row in rows if isinstance(row, dict) and isinstance(row.get("name"), str)]
        except (OSError, ValueError, KeyError, TypeError):
            return []


class StopRun(Exception):
    """Raised inside the stages to end a run early (``strict``); the report is still written."""


class Report:
    """This process's rows, by scan name, and the ``strict`` rule: a failed or rejected row stops the run.

    Rows are added from the main thread and from writer threads; each added row advances the progress ``bar``.
    """

    def __init__(self, strict: bool, bar):
        self.strict, self.bar = strict, bar
        self.by_name: dict[str, dict[str, Any]] = {}
        self.lock = threading.Lock()

    def add(self, name: str, status: str, *args, stop: bool = True, **kwargs) -> None:
        """Add scan ``name``'s row (:func:`report_row`); raise StopRun when ``strict`` and ``stop`` and it failed
        or was rejected."""
        with self.lock:
            self.by_name[name] = report_row(name, status, *args, **kwargs)
        self.bar.update()
        if stop and self.strict and status in ("failed", "rejected"):
            raise StopRun(name)

    def fail(self, name: str, size, error: BaseException | str, stage: str = "") -> None:
        """Add a failed row; its error is ``error``'s message, after ``stage`` and the error's type unless it is a
        DataError."""
        text = error if isinstance(error, str) else str(error) or type(error).__name__
        if isinstance(error, BaseException) and not isinstance(error, DataError):
            text = f"{stage}{type(error).__name__}: {text}"
        self.add(name, "failed", size, error=text)
