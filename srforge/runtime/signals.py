"""Preemption: SIGTERM (what Slurm, Kubernetes and spot instances send before a kill) handled like Ctrl-C.

Inside :func:`terminate_as_interrupt` a SIGTERM raises :class:`Terminated` -- a KeyboardInterrupt -- in the main
thread, so the code that saves ``last.pt`` on Ctrl-C, or writes the prediction report with the scans not reached
marked ``stopped``, runs for a preemption too. The previous handlers come back on leaving.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager

# Exit status of a process ended by SIGTERM, as a shell reports it (128 + 15).
TERMINATED_STATUS = 128 + signal.SIGTERM


class Terminated(KeyboardInterrupt):
    """Raised in the main thread when the process receives SIGTERM (a KeyboardInterrupt, so Ctrl-C paths run)."""


def _raise_terminated(signum, frame) -> None:
    raise Terminated(f"received {signal.Signals(signum).name}")


@contextmanager
def terminate_as_interrupt() -> Iterator[None]:
    """Within the block, SIGTERM raises :class:`Terminated` in the main thread (a no-op in other threads)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, _raise_terminated)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
