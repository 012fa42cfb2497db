"""One process per folder: a second holder is refused with a message naming the first; the kernel frees the lock
when the holder dies, even by SIGKILL, so a stale lock file never blocks a later run."""

import os
import signal
import subprocess
import sys

import pytest

from srforge.locks import FolderLock, FolderLockedError

HOLD = """
import sys, time
from srforge.locks import FolderLock
lock = FolderLock(sys.argv[1], "run folder").acquire()
print("held", flush=True)
time.sleep(60)
"""


def test_a_second_process_is_refused_and_the_lock_dies_with_its_holder(tmp_path):
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(tmp_path)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(FolderLockedError, match=rf"this run folder is in use by process {holder.pid} on .*-c"):
            FolderLock(tmp_path, "run folder").acquire()
    finally:
        os.kill(holder.pid, signal.SIGKILL)
        holder.wait(10)
        holder.stdout.close()
    with FolderLock(tmp_path, "run folder"):  # the holder's death released it
        with pytest.raises(FolderLockedError):  # and one process cannot take it twice through two objects
            FolderLock(tmp_path).acquire()
    FolderLock(tmp_path).acquire().release()
