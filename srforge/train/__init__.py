"""Training: :func:`train` runs a resolved config.

Modules, in the order a run meets them: ``prepare`` (the resume checkpoint, the run folder, synthetic data),
``build`` (device, data, model, optimization, batches), ``state`` (what a checkpoint holds; save and restore),
``loop`` (:func:`train` and the epoch), ``step`` (one training pass and one validation pass), ``log`` (metrics
files, TensorBoard, the console), and ``rng``, ``losses``, ``metrics``.
"""

from srforge.train.build import build_data
from srforge.train.loop import train
from srforge.train.state import TrainState
from srforge.train.step import NonFiniteLossError, Progress, StepSettings, evaluate, train_epoch

__all__ = [
    "train",
    "build_data",
    "evaluate",
    "train_epoch",
    "NonFiniteLossError",
    "Progress",
    "StepSettings",
    "TrainState",
]
