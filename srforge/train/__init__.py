"""Training: :func:`train` runs a resolved config.

Modules, in the order a run meets them: ``prepare`` (the resume checkpoint, the run folder, synthetic data),
``build`` (device, data, model, optimization, batches), ``state`` (what a checkpoint holds; save and restore),
``loop`` (:func:`train` and the epoch), ``step`` (one training pass and one validation pass), ``stop`` (how a run
stops early and stays resumable: signals held while last.pt is written, a killed DataLoader worker), ``log``
(metrics files, TensorBoard, the console), and ``rng``, ``losses``, ``metrics``.
"""

from srforge.train.build import build_data
from srforge.train.loop import train
from srforge.train.prepare import RunExistsError
from srforge.train.state import TrainState
from srforge.train.step import NonFiniteLossError, Progress, StepSettings, evaluate, train_epoch
from srforge.train.stop import WorkerLostError

__all__ = [
    "train",
    "build_data",
    "evaluate",
    "train_epoch",
    "NonFiniteLossError",
    "RunExistsError",
    "WorkerLostError",
    "Progress",
    "StepSettings",
    "TrainState",
]
