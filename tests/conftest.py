"""Fixtures that write tiny image/mask folders (tens of pixels) in every supported format, and the check that no
test leaves a process running."""

import ctypes
import gc
import os
import signal
import sys
import time
from pathlib import Path

import pytest
import torch
from helpers import labels, rgb, write

# A pytest-xdist worker (pyproject's addopts start two) computes on one thread, and so do the processes its tests
# start: two workers of two threads each on two cores spent much of their time waiting for a descheduled thread.
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ["OMP_NUM_THREADS"] = "1"
    torch.set_num_threads(1)

PR_SET_CHILD_SUBREAPER = 36  # prctl(2): orphans of this process's descendants are re-parented to it, not to init
# How long a test's processes may take to end after it: a pool shutting down, a killed tree; a DataLoader gives its
# workers torch's MP_STATUS_CHECK_INTERVAL (5 s) to end before it terminates them.
LEFTOVER_WAIT_S = 10.0


def _adopt_orphans() -> None:
    """Make pytest the subreaper of everything the tests start (Linux): a worker whose parent a test killed is
    re-parented to pytest, where :func:`no_process_left_behind` sees it, instead of vanishing under init."""
    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
        except (OSError, AttributeError):
            pass


_adopt_orphans()


def _running_children() -> dict[int, list[int]]:
    """{parent pid: [child pid]} of every process still running (zombies, which have ended, left out), read from
    /proc/<pid>/stat: "pid (comm) state ppid ...", comm may hold spaces and parentheses."""
    children: dict[int, list[int]] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
        except (OSError, IndexError):  # ended while we looked
            continue
        if fields[0] not in (b"Z", b"X"):
            children.setdefault(int(fields[1]), []).append(int(entry.name))
    return children


def _descendants(pid: int) -> set[int]:
    children, found, todo = _running_children(), set(), [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def _command(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()[:200]
    except OSError:
        return "?"


@pytest.fixture(autouse=True)
def no_process_left_behind():
    """Fail a test that leaves a process running: every descendant of pytest (children, their children, and
    orphans adopted by pytest) that was not there before the test must have ended within LEFTOVER_WAIT_S of its
    end. Processes of wider-scoped fixtures (set up before this one) are there before, so they are left alone.
    The leftovers are killed after being reported, so that they do not trouble the next tests."""
    if not os.path.isdir("/proc/self"):
        yield
        return
    before = _descendants(os.getpid())
    yield
    deadline = time.monotonic() + LEFTOVER_WAIT_S
    left = _descendants(os.getpid()) - before
    if left:  # a DataLoader iterator caught in a reference cycle (an exception's traceback) ends its workers when
        gc.collect()  # collected: collect now rather than blame the test for the collector's timing
    while left and time.monotonic() < deadline:
        time.sleep(0.05)
        left &= _descendants(os.getpid())
    if left:
        described = "; ".join(f"{pid}: {_command(pid)}" for pid in sorted(left))
        for pid in left:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        pytest.fail(f"{len(left)} process(es) still running {LEFTOVER_WAIT_S:.0f} s after the test: {described}")


@pytest.fixture
def make_pair(tmp_path):
    """make_pair(name, image_array, mask_array, image_suffix=".png", root=tmp_path) writes one pair."""

    def make(name, image, mask, image_suffix=".png", root=None, mode=None):
        root = Path(root or tmp_path)
        write(root / "images" / f"{name}{image_suffix}", image, mode)
        if mask is not None:
            write(root / "masks" / f"{name}.png", mask)
        return root

    return make


@pytest.fixture
def folder(make_pair):
    """Three RGB PNG pairs of different sizes with 3-class masks."""
    for i, (h, w) in enumerate([(12, 20), (16, 9), (7, 30)]):
        root = make_pair(f"scan_{i}", rgb(h, w, i), labels(h, w, seed=i))
    return root


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    """A random 3-class UNet checkpoint (predict_fixtures.random_checkpoint), one per test module; a module that
    needs another model defines its own ``ckpt``."""
    from predict_fixtures import random_checkpoint

    return random_checkpoint(tmp_path_factory.mktemp("ckpt") / "random.pt")


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A run folder after one epoch of test_cli_train's Strips (config.yaml, last.pt, best.pt, metrics), for the
    tests that tamper with a real run's checkpoint, copy it or resume it (test_trust.py, test_checkpoint.py,
    test_trainer_resume.py): one per test module, as the module's own fixture was."""
    from test_cli_train import CONFIG

    from srforge.config import resolve
    from srforge.train import train

    run = tmp_path_factory.mktemp("hostile") / "run"
    train(resolve({**CONFIG, "run": {**CONFIG["run"], "dir": str(run)}}))
    return run


# The longest test files, longest first, by their tests' summed time in one run of the suite (2026-12-04, two
# workers: seconds). pytest-xdist's loadfile hands a worker one file at a time, in the order of the collection
# (pyproject's addopts turn off its own reordering, which goes by the number of tests): with the long files first
# and the short ones last the two workers end within seconds of each other, where a long file drawn last kept one
# worker busy for half a minute after the other had finished.
LONGEST_FIRST = [
    "test_adapter_runs.py",  # 69
    "test_unet.py",  # 59
    "test_train.py",  # 46
    "test_export.py",  # 35
    "test_predict.py",  # 31
    "test_predict_pipeline.py",  # 29
    "test_cli_train.py",  # 29
    "test_trainer_faults.py",  # 24
    "test_pixel_budget.py",  # 24
    "test_trainer_resume.py",  # 17
    "test_bench_quality.py",  # 14
    "test_cli_predict.py",  # 11
    "test_adapters.py",  # 11
]


def pytest_collection_modifyitems(config, items):
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: the rest keep their order
