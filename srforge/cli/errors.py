"""One map from the exceptions a command expects to exit statuses, and one way to print them.

    0    done
    1    the run itself went wrong: a non-finite loss, a full disk, a failed ONNX check, a run folder removed
         under a running train (and predict's failed scans)
    2    the user's input: a bad config or argument, a missing or unusable file, bad data, a run folder that
         holds another run or is in use by another process, an optional package the model or format needs
    3    stopped by the system, resumable: a DataLoader worker was killed (the out-of-memory killer, most
         often), another torchrun process died, or one scan's step did not fit the device even alone; last.pt
         holds the batch reached (or the last epoch's end), and --resume RUN_DIR continues
    130  interrupted (Ctrl-C)
    143  terminated (SIGTERM: Slurm, Kubernetes, a spot instance's notice); srforge-train wrote last.pt at the
         batch reached first, as for Ctrl-C

Each command catches only the exceptions that are the user's to fix at that point; anything else is a bug and
ends with its traceback.
"""

from __future__ import annotations

import re
import sys

from srforge.atomic import DiskFullError
from srforge.locks import FolderLostError
from srforge.runtime.signals import TERMINATED_STATUS, Terminated

RUN_FAILED = 1
BAD_INPUT = 2
STOPPED = 3
INTERRUPTED = 130
TERMINATED = TERMINATED_STATUS


def _run_failures() -> tuple[type[BaseException], ...]:
    """Exception classes that mean the run failed (status 1), imported only if their module already is."""
    found: list[type[BaseException]] = [DiskFullError, FolderLostError]
    for module, name in (("srforge.train.trainer", "NonFiniteLossError"), ("srforge.export.onnx", "OnnxCheckError")):
        loaded = sys.modules.get(module)
        if loaded is not None:
            found.append(getattr(loaded, name))
    return tuple(found)


def _stopped_by_system() -> tuple[type[BaseException], ...]:
    """Exception classes that mean the system stopped a resumable run (status 3), imported only if loaded: a lost
    DataLoader worker, a scan whose step does not fit the device even alone (last.pt is written for both)."""
    found = []
    stops = (("srforge.train.stop", "WorkerLostError"), ("srforge.train.stop", "PeerLostError"))
    for module, name in (*stops, ("srforge.train.pixel_budget", "ScanTooLargeError")):
        loaded = sys.modules.get(module)
        if loaded is not None:
            found.append(getattr(loaded, name))
    return tuple(found)


def exit_status(exc: BaseException) -> int:
    """The exit status for ``exc``: 143 for SIGTERM, 130 for Ctrl-C, 3 for a run the system stopped, 1 for a run
    that failed, 2 for anything the user gave."""
    if isinstance(exc, Terminated):
        return TERMINATED
    if isinstance(exc, KeyboardInterrupt):
        return INTERRUPTED
    if isinstance(exc, _stopped_by_system()):
        return STOPPED
    return RUN_FAILED if isinstance(exc, _run_failures()) else BAD_INPUT


def message(exc: BaseException) -> str:
    """An exception's own message: one re-raised from a DataLoader worker carries the worker's whole traceback
    in its text ("Caught ValueError in DataLoader worker process 0. Original Traceback ..."); keep its last line."""
    text = str(exc)
    if "Original Traceback" not in text:
        return text
    ends = [m.end() for m in re.finditer(rf"\n(?:[\w.]+\.)?{re.escape(type(exc).__name__)}: ", text)]
    return text[ends[-1] :].strip() if ends else text


def fail(prog: str, exc: BaseException, note: str = "") -> int:
    """Print ``PROG: error: MESSAGE[; NOTE]`` on stderr (nothing for Ctrl-C) and return the exit status."""
    if not isinstance(exc, KeyboardInterrupt):
        print(f"{prog}: error: {message(exc)}{'; ' + note if note else ''}", file=sys.stderr)
    return exit_status(exc)
