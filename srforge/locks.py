"""One process per run folder or output folder: a lock that names its holder.

A second ``train.py`` into the same run folder, or a second ``predict.py`` into the same output folder, would
interleave metrics, overwrite the other's checkpoints or sweep its temporary files. The first process takes an
exclusive ``flock`` on ``FOLDER/.srforge.lock`` and writes who it is (pid, host, command, start time) into it;
a second one is refused with a message that names the holder. The kernel drops the lock when the holder exits,
however it exits (a kill -9 included), so a stale lock file never blocks a later run.

An ``flock`` belongs to the open file, which a forked child (a DataLoader worker, a decoding process) would share:
such a child could keep a killed holder's lock alive. Forked children therefore close their copy at once
(``os.register_at_fork``), so the lock lives exactly as long as the process that took it.
"""

from __future__ import annotations

import datetime
import fcntl
import json
import os
import socket
import sys
from pathlib import Path

LOCK_NAME = ".srforge.lock"
_HELD: set[int] = set()  # descriptors of the locks this process holds


def _close_in_child() -> None:
    for fd in _HELD:
        try:
            os.close(fd)
        except OSError:
            pass
    _HELD.clear()


os.register_at_fork(after_in_child=_close_in_child)


class FolderLockedError(RuntimeError):
    """Another process holds the folder; the message names it and says what to do."""


class FolderLostError(RuntimeError):
    """The folder (or its lock file) this process held was removed under it; the message says what was lost."""


def _holder(path: Path) -> str:
    try:
        info = json.loads(path.read_text())
        return f"process {info['pid']} on {info['host']} ({info['command']}, since {info['since']})"
    except (OSError, ValueError, KeyError, TypeError):
        return "another process"


class FolderLock:
    """``with FolderLock(folder, "run folder"):`` holds ``folder`` for this process (the folder must exist).

    Re-entrant within a process only through one object: take it once, at the top of the command.
    """

    def __init__(self, folder: str | os.PathLike, what: str = "folder"):
        self.path = Path(folder) / LOCK_NAME
        self.what = what
        self._fd: int | None = None

    def acquire(self) -> FolderLock:
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise FolderLockedError(
                f"{self.path.parent}: this {self.what} is in use by {_holder(self.path)}; wait for it to finish, "
                "stop it, or choose another folder"
            ) from None
        info = {
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "command": " ".join([Path(sys.argv[0]).name, *sys.argv[1:]])[:200],
            "since": datetime.datetime.now().isoformat(timespec="seconds"),
        }
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(info).encode(), 0)
        self._fd = fd
        _HELD.add(fd)
        return self

    def held(self) -> bool:
        """Whether the lock file this process holds is still the one at its path (the folder not removed, the file
        not replaced), so that no other process can have taken the folder meanwhile."""
        if self._fd is None:
            return False
        try:
            mine, there = os.fstat(self._fd), os.stat(self.path)
        except OSError:
            return False
        return (mine.st_dev, mine.st_ino) == (there.st_dev, there.st_ino)

    def release(self) -> None:
        if self._fd is not None:
            _HELD.discard(self._fd)
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None

    def __enter__(self) -> FolderLock:
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()
