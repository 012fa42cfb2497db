"""Where each epoch's metrics row goes (main process): metrics.jsonl and metrics.csv in the run folder,
TensorBoard when it is installed, and one JSON line on the console."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path
from typing import Any

from tqdm import tqdm

from srforge.atomic import atomic_write_text, disk_full_names


def open_tensorboard(run_dir: Path):
    """A SummaryWriter into RUN_DIR/tensorboard, or None when tensorboard is not installed (it is optional)."""
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:
        return None
    return SummaryWriter(str(run_dir / "tensorboard"))


def log_epoch(run_dir: Path, writer, row: dict[str, Any], step: int) -> None:
    """The epoch's row into the metrics files, TensorBoard (``writer``, or None) at ``step``, and the console."""
    _write_metrics(run_dir, row)
    if writer is not None:
        for key, value in row.items():
            if isinstance(value, float):
                writer.add_scalar(key, value, step)
    shown = {k: (round(v, 4) if isinstance(v, float) else v) for k, v in row.items() if not isinstance(v, list)}
    tqdm.write(f"srforge: {json.dumps(shown)}")


def _write_metrics(run_dir: Path, row: dict[str, Any]) -> None:
    """Append the epoch's row to metrics.jsonl, then rewrite metrics.csv from all rows (atomically).

    The CSV is rebuilt rather than appended so that its header covers every column, also when a later row
    gains validation columns (``train.val_every`` > 1) or a resumed run appends.
    """
    with disk_full_names(run_dir / "metrics.jsonl"), open(run_dir / "metrics.jsonl", "a") as f:
        f.write(json.dumps(row) + "\n")
    rows = []
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        record = json.loads(line)
        flat = {k: v for k, v in record.items() if not isinstance(v, list)}
        for name in ("iou", "dice"):
            for c, value in enumerate(record.get(f"val_{name}", [])):
                flat[f"val_{name}_{c}"] = value
        rows.append(flat)
    columns = list(dict.fromkeys(k for r in rows for k in r))
    text = io.StringIO()
    writer = csv.DictWriter(text, fieldnames=columns)
    writer.writeheader()
    writer.writerows(rows)
    with disk_full_names(run_dir / "metrics.csv"):
        atomic_write_text(run_dir / "metrics.csv", text.getvalue())
