"""Atomic file writes: a reader, or a run killed at any moment, sees the old file or the new one, never half.

Every file srforge writes (checkpoints, masks, reports, caches, configs, synthetic scans) goes through
:func:`atomic_write`: the data is written to a hidden temporary file beside the target, then renamed over it
(``os.replace`` is atomic within a folder). Temporary names end in ``TEMP_SUFFIX`` so that a rerun can sweep
up what a killed run left behind.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import IO

TEMP_SUFFIX = ".srforge-tmp"


def atomic_write(path: str | os.PathLike, write: Callable[[IO[bytes]], None], fsync: bool = False) -> Path:
    """Call ``write(file)`` on a temporary binary file beside ``path``, then rename it to ``path``.

    ``fsync=True`` also flushes the bytes to the disk before the rename, for files whose loss on a power cut
    would cost more than a rerun (checkpoints). On any error the temporary file is removed and the old
    ``path`` is left as it was.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}{TEMP_SUFFIX}")
    try:
        with open(tmp, "wb") as f:
            write(f)
            if fsync:
                f.flush()
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return path


def atomic_write_text(path: str | os.PathLike, text: str) -> Path:
    return atomic_write(path, lambda f: f.write(text.encode()))


def remove_stale_temporaries(folder: str | os.PathLike) -> int:
    """Delete the temporary files a killed run left under ``folder``; returns how many."""
    folder = Path(folder)
    stale = list(folder.rglob(f".*{TEMP_SUFFIX}")) if folder.is_dir() else []
    for path in stale:
        path.unlink(missing_ok=True)
    return len(stale)
