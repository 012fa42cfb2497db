"""Training: :func:`train` runs a resolved config through a :class:`Trainer`.

Modules, in the order a run meets them: ``run`` (:func:`train`: the resume checkpoint, the run folder, the
process group), ``prepare`` (checks and the run folder, before anything is written), ``build`` (device, data,
model, optimization, batches), ``memory`` (the step's measured memory and the pixel budget), ``trainer`` (the
Trainer: state, the loop, one step), ``hooks`` (validation, checkpoints, logs, progress, EMA, early stopping, the
user's own), ``stop`` (signals held while last.pt is written, a killed DataLoader worker), ``log`` (metrics files,
TensorBoard, the console), and ``rng``, ``losses``, ``metrics``.
"""

from srforge.train.from_config import build_data
from srforge.train.hooks import EarlyStopHook, EMAHook, Hook
from srforge.train.pixel_budget import PixelBudget, ScanTooLargeError
from srforge.train.prepare import RunExistsError
from srforge.train.run import train
from srforge.train.stop import WorkerLostError
from srforge.train.trainer import NonFiniteLossError, Trainer

__all__ = [
    "train",
    "Trainer",
    "Hook",
    "EMAHook",
    "EarlyStopHook",
    "PixelBudget",
    "build_data",
    "NonFiniteLossError",
    "RunExistsError",
    "ScanTooLargeError",
    "WorkerLostError",
]
