"""Atomic file writes: a reader, or a run killed at any moment, sees the old file or the new one, never half.

Every file srforge writes (checkpoints, masks, reports, caches, configs, synthetic scans) goes through
:func:`atomic_write`: the data is written to a hidden temporary file beside the target, created exclusively under a
random name (never a file or link already there: a shared folder cannot make srforge write elsewhere), then renamed
over it (``os.replace`` is atomic within a folder). Temporary names end in ``TEMP_SUFFIX`` so that a rerun can
sweep up what a killed run left behind.
"""

from __future__ import annotations

import errno
import os
import secrets
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import IO

TEMP_SUFFIX = ".srforge-tmp"


class DiskFullError(OSError):
    """No space left (or the quota spent) on the device that holds ``path``; training and prediction stop with
    exit status 1 and this message, after writing what they still can."""

    def __init__(self, path):
        super().__init__(errno.ENOSPC, f"no space left on {path}")
        self.path = path

    def __str__(self) -> str:
        return f"no space left on {self.path}"


def no_space(error: BaseException | None) -> OSError | None:
    """The ENOSPC / EDQUOT OSError behind ``error``, if any. Looks down the cause and context chain: torch.save,
    for one, reports a full disk as a RuntimeError raised while closing the file, with the OSError as context."""
    for _ in range(8):
        if error is None:
            return None
        if isinstance(error, OSError) and error.errno in (errno.ENOSPC, errno.EDQUOT):
            return error
        error = error.__cause__ or error.__context__
    return None


def as_disk_full(error: BaseException, path) -> BaseException:
    """``error`` as a DiskFullError naming the file the OSError names (else ``path``) when a full disk is behind
    it (:func:`no_space`); any other error unchanged."""
    full = no_space(error)
    if full is None or isinstance(error, DiskFullError):
        return error
    return DiskFullError(full.filename or path)


@contextmanager
def disk_full_names(path) -> Iterator[None]:
    """Inside the block, a full disk (OSError or RuntimeError with one behind it) is raised as a DiskFullError
    naming the file, or ``path``; every other error passes unchanged."""
    try:
        yield
    except (OSError, RuntimeError) as exc:
        converted = as_disk_full(exc, path)
        if converted is exc:
            raise
        raise converted from None


# The longest file name most file systems take, in bytes.
NAME_MAX = 255


def exclusive_temporary(target: Path) -> tuple[Path, IO[bytes]]:
    """(path, binary file) of a new temporary file beside ``target``, created exclusively: ``O_CREAT | O_EXCL``
    never opens a file or a link someone planted at the name (``O_NOFOLLOW`` too), and the name has a random part.
    It is hidden, names its target where that fits (``.best.pt.<random>.srforge-tmp``), and is short otherwise
    (``.<random>.srforge-tmp``), so a target's name near the file system's limit still gets a temporary file."""
    extra = getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
    for _ in range(16):
        token = secrets.token_hex(6)
        name = f".{target.name}.{token}{TEMP_SUFFIX}"
        tmp = target.with_name(name if len(os.fsencode(name)) <= NAME_MAX else f".{token}{TEMP_SUFFIX}")
        try:  # "x": O_CREAT | O_EXCL, which fails on anything at the name, a link included
            return tmp, open(tmp, "xb", opener=lambda name, flags: os.open(name, flags | extra, 0o666))
        except FileExistsError:
            continue  # taken (or planted): draw another name
    raise FileExistsError(errno.EEXIST, f"no free temporary name beside {target} after 16 tries", str(target))


def atomic_write(path: str | os.PathLike, write: Callable[[IO[bytes]], None], fsync: bool = False) -> Path:
    """Call ``write(file)`` on a temporary binary file beside ``path`` (:func:`exclusive_temporary`), then rename it
    to ``path``.

    ``fsync=True`` also flushes the bytes to the disk before the rename, for files whose loss on a power cut
    would cost more than a rerun (checkpoints). On any error the temporary file is removed and the old
    ``path`` is left as it was; the error raised is always the one that stopped the write: where the removal
    fails too (a read-only file system refuses even the removal of a file that is not there), its OSError is
    dropped, and a temporary file it left is swept by :func:`remove_stale_temporaries`. The rename replaces
    whatever is at ``path`` (a link there included) and never writes through it.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = None
    try:
        tmp, f = exclusive_temporary(path)
        with f:
            write(f)
            if fsync:
                f.flush()
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if tmp is not None:
            with suppress(OSError):
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
