"""How a run stops early and stays resumable: a signal (Ctrl-C, SIGTERM), or a DataLoader worker the system killed.

Either way the main process writes ``last.pt`` at the batch reached (:func:`srforge.train.loop.run_epoch`), and
``--resume RUN_DIR`` continues bit-identically. This module holds what that needs besides the loop itself:

* :func:`interrupts_held` -- while ``last.pt`` is written, a second Ctrl-C or a SIGTERM is noted and delivered
  once the write is done, so that an impatient second Ctrl-C cannot leave ``last.pt`` behind the batch reached.
* :func:`worker_lost` -- torch's "DataLoader worker (pid ...) is killed by signal" / "exited unexpectedly"
  RuntimeError read into a :class:`WorkerLostError` that names the worker, the signal and what to do: the
  out-of-memory killer is the usual cause, and the run is resumable (exit status 3, :mod:`srforge.cli.errors`).
"""

from __future__ import annotations

import re
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager

import torch

from srforge.runtime.signals import Terminated

HELD_SIGNALS = (signal.SIGINT, signal.SIGTERM)

# torch's messages for a worker that died: from the SIGCHLD handler ("is killed by signal: Killed."), from the
# C++ check ("exited unexpectedly with exit code 1."), and from the iterator ("pid(s) 12, 13) exited unexpectedly").
_WORKER_DIED = re.compile(
    r"DataLoader worker \(pid(?:\(s\))? (?P<pids>[\d, ]+)\) (?:is killed by signal: (?P<signal>[^.]+)"
    r"|exited unexpectedly(?: with exit code (?P<code>-?\d+))?)"
)
_OOM = ", most likely out of memory"  # said of a SIGKILL ("Killed"): what the out-of-memory killer sends


# What a collective raises on a surviving rank when another process of the job died (gloo's socket errors, NCCL's
# aborted communicator): torch.distributed.DistBackendError, or a RuntimeError with one of these in its message.
_PEER_GONE = ("Connection reset by peer", "Connection closed by peer", "Broken pipe", "communicator was aborted")


class PeerLostError(RuntimeError):
    """Another process of this torchrun job died under the run; the message says what last.pt holds and how to
    resume."""


def peer_lost(error: BaseException, world: int) -> str | None:
    """What a failed collective says about another rank that died, as one sentence; None for any other error or
    in a single process."""
    if world < 2 or not isinstance(error, RuntimeError):
        return None
    backend = getattr(torch.distributed, "DistBackendError", ())
    text = str(error)
    if not (isinstance(error, backend) or any(part in text for part in _PEER_GONE)):
        return None
    first = next((line.strip() for line in text.splitlines() if line.strip()), type(error).__name__)
    return f"another process of this torchrun job stopped ({first[:160]})"


class WorkerLostError(RuntimeError):
    """A DataLoader worker process died under the run (killed by a signal, the out-of-memory killer most often);
    the message names it, says what ``last.pt`` holds and how to continue."""


def cause(interrupt: KeyboardInterrupt) -> str:
    """What stopped the run, for the console: "SIGTERM" for :class:`Terminated`, else "Ctrl-C"."""
    return "SIGTERM" if isinstance(interrupt, Terminated) else "Ctrl-C"


@contextmanager
def interrupts_held() -> Iterator[list[str]]:
    """Within the block SIGINT and SIGTERM are noted, not acted on; on leaving, the first noted is delivered.

    Yields the list of the signals' names noted so far, so that the block can say what came. A Python signal
    handler runs in the main thread whichever thread the kernel picks, so replacing the handlers holds the
    signals reliably where ``pthread_sigmask`` (one thread's mask) would not. Outside the main thread a no-op.
    """
    noted: list[str] = []
    if threading.current_thread() is not threading.main_thread():
        yield noted
        return

    def note(signum, frame) -> None:
        noted.append(signal.Signals(signum).name)

    previous = {signum: signal.signal(signum, note) for signum in HELD_SIGNALS}
    try:
        yield noted
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, signal.SIG_DFL if handler is None else handler)
        if noted:
            signal.raise_signal(signal.Signals[noted[0]])  # as it would have been, now that the write is done


def worker_lost(error: BaseException) -> str | None:
    """What a RuntimeError of torch's DataLoader says about a worker that died, as one sentence; None for any
    other error. The cause and context chain is read too: the iterator's "exited unexpectedly" often carries the
    signal's name only in the error it was raised from."""
    found: list[re.Match] = []
    seen = 0
    while error is not None and seen < 8:
        if isinstance(error, RuntimeError):
            match = _WORKER_DIED.search(str(error))
            if match:
                found.append(match)
        error, seen = error.__cause__ or error.__context__, seen + 1
    if not found:
        return None
    pids = found[0]["pids"].strip()
    named = next((m for m in found if m["signal"]), None)
    code = next((m["code"] for m in found if m["code"]), None)
    if named is not None:  # "Killed" (SIGKILL) is what the out-of-memory killer sends
        name = named["signal"].strip()
        return f"DataLoader worker (pid {pids}) was killed by signal {name}" + _OOM * (name == "Killed")
    if code is not None:
        return f"DataLoader worker (pid {pids}) exited unexpectedly with exit code {code}"
    return f"DataLoader worker (pid {pids}) died (killed by a signal, most likely){_OOM}"
