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


def test_a_forked_child_does_not_keep_the_lock_of_a_killed_holder(tmp_path):
    """The holder forks a long-lived child (as a DataLoader worker or decoding process is), then dies by SIGKILL:
    the folder is free at once although the child, which inherited the descriptor, still runs."""
    # The holder says "held" once the child runs (its fork handlers done), whatever the machine's load.
    child = "import os\nr, w = os.pipe()\n"
    child += "if os.fork() == 0:\n    os.write(w, b'1')\n    time.sleep(60)\n    os._exit(0)\nos.read(r, 1)\n"
    code = HOLD.replace('print("held"', child + 'print("held"')
    holder = subprocess.Popen([sys.executable, "-c", code, str(tmp_path)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        os.kill(holder.pid, signal.SIGKILL)
        holder.wait(10)
        FolderLock(tmp_path).acquire().release()  # the orphaned child does not hold it
    finally:
        holder.stdout.close()
        subprocess.run(["pkill", "-KILL", "-f", str(tmp_path)], check=False)
