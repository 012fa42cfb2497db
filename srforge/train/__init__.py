"""Training: :func:`train` runs a resolved config; the loop, the step, evaluation, state, losses and metrics."""

from srforge.train.loop import train

__all__ = ["train"]
