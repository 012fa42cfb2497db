"""The torchrun tests' guard: a run that died of a native abort is run once more, fresh; any other failure is not."""

import subprocess
import sys

import pytest
from helpers import NATIVE_ABORT, run_once_more_after_native_abort

# Its first run fails with the message it is given, after making its folder (as a run that aborted at teardown
# leaves a finished run folder behind); a later run says whether it found that folder.
SCRIPT = """
import sys
from pathlib import Path
out, message = Path(sys.argv[1]), sys.argv[2]
tries = out.parent / "tries"
tries.mkdir(exist_ok=True)
n = len(list(tries.iterdir()))
(tries / str(n)).touch()
found = out.exists()
out.mkdir(exist_ok=True)
if n == 0:
    sys.exit(message)
print("run", n, "found its folder" if found else "fresh")
"""


# torchrun reports a child's death with a Python traceback of its own, after the child's abort
TORCHRUN_AFTER = "\nTraceback (most recent call last):\n  ...\nChildFailedError: scripts/train.py FAILED"


@pytest.mark.parametrize("after", ["", TORCHRUN_AFTER])
def test_a_native_abort_is_run_once_more_with_its_folders_removed(tmp_path, after):
    out = tmp_path / "run"
    command = [sys.executable, "-c", SCRIPT, str(out), NATIVE_ABORT + after]
    done = run_once_more_after_native_abort(command, fresh=(out,))
    assert done.returncode == 0 and done.stdout.strip() == "run 1 fresh"


@pytest.mark.parametrize("message", [f"Traceback (most recent call last):\nValueError\n{NATIVE_ABORT}", "Killed"])
def test_a_python_error_or_another_failure_is_not_run_again(tmp_path, message):
    out = tmp_path / "run"
    done = run_once_more_after_native_abort([sys.executable, "-c", SCRIPT, str(out), message], fresh=(out,))
    assert done.returncode == 1 and done.stderr.strip() == message
    assert len(list((tmp_path / "tries").iterdir())) == 1 and out.is_dir()


def test_the_caller_s_arguments_replace_the_defaults():
    with pytest.raises(subprocess.TimeoutExpired):
        run_once_more_after_native_abort([sys.executable, "-c", "import time; time.sleep(30)"], (), timeout=0.5)
