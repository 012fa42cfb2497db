"""Training: :func:`train` runs a resolved config through a :class:`Trainer`.

Modules: ``trainer`` (the Trainer: any model and loaders, the loop, its plain step, stopping and last.pt),
``update`` (the step's pieces a first reading may skip: valid-pixel weighting, the redo in halves on running out of
memory, DDP's reduction, the update's one read), ``settings`` (TrainSettings), ``hooks`` (validation, checkpoints,
logs, progress, EMA, early stopping, the user's own), ``assemble`` (Trainer.from_config's parts, in order),
``from_config`` (device, data, model, optimization, batches from their config sections), ``pixel_budget`` (the
step's measured memory and the pixel budget), ``run`` (:func:`train`: the resume checkpoint, the run folder, the
synthetic data, the process group), ``prepare`` (checks and the run folder, before anything is written), ``stop``
(signals held while last.pt is written, a killed DataLoader worker), ``log`` (metrics files, TensorBoard, the
console), ``self_training`` (learning from unlabelled scans through the EMA teacher), and ``rng``, ``losses``,
``metrics``.
"""

from srforge.train.from_config import build_data
from srforge.train.hooks import EarlyStopHook, EMAHook, Hook
from srforge.train.pixel_budget import PixelBudget, ScanTooLargeError
from srforge.train.prepare import RunExistsError
from srforge.train.run import train
from srforge.train.self_training import SelfTraining
from srforge.train.settings import TrainSettings
from srforge.train.stop import WorkerLostError
from srforge.train.trainer import NonFiniteLossError, Trainer

__all__ = [
    "train",
    "Trainer",
    "TrainSettings",
    "Hook",
    "EMAHook",
    "EarlyStopHook",
    "PixelBudget",
    "SelfTraining",
    "build_data",
    "NonFiniteLossError",
    "RunExistsError",
    "ScanTooLargeError",
    "WorkerLostError",
]
