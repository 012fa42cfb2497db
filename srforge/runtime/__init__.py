"""What training and prediction both run on: the device and precision, the processes under torchrun, checkpoints.

Submodules: ``device`` (choosing a device, autocast), ``memory`` (bytes per pixel and pixel budgets on CUDA),
``distributed`` (torchrun's environment, read once; the process group; sums across ranks), ``checkpoint``
(the one file that resumes a run or configures prediction).
"""

from srforge.runtime.checkpoint import load_checkpoint, model_from_checkpoint, save_checkpoint
from srforge.runtime.device import autocast, resolve_device
from srforge.runtime.device_memory import cuda_pixel_budget
from srforge.runtime.distributed import Processes, environment

__all__ = [
    "Processes",
    "autocast",
    "cuda_pixel_budget",
    "environment",
    "load_checkpoint",
    "model_from_checkpoint",
    "resolve_device",
    "save_checkpoint",
]
