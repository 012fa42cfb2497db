"""What a checkpoint is made of: the training state, how it is saved, and how a resume restores it.

The keys a checkpoint holds are listed in :mod:`srforge.runtime.checkpoint`. Saving goes through
:func:`srforge.runtime.checkpoint.save_checkpoint` (atomic), inside :func:`srforge.atomic.disk_full_names`, so a
full disk is a DiskFullError naming the checkpoint.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from srforge.atomic import disk_full_names
from srforge.config.schema import Config
from srforge.data.sampling import SizeGroupedBatchSampler
from srforge.models import UNet
from srforge.runtime.checkpoint import save_checkpoint
from srforge.train.rng import rng_state, set_rng_state
from srforge.train.step import Progress


@dataclass
class TrainState:
    """Everything a checkpoint holds, in one place: the bare model, the optimization state, the run's facts."""

    model: UNet
    model_args: dict
    optimizer: torch.optim.Optimizer
    scheduler: Any
    scaler: torch.amp.GradScaler
    sampler: SizeGroupedBatchSampler
    cfg: Config
    class_names: list[str]
    image_mode: str

    def checkpoint(self, epoch: int, progress: Progress, best: float) -> dict[str, Any]:
        """The checkpoint after ``epoch`` complete epochs and ``progress.batches_done`` batches of the next."""
        return {
            "model": self.model.state_dict(),
            "model_args": self.model_args,
            "size_divisor": self.model.size_divisor,
            "class_names": self.class_names,
            "ignore_index": self.cfg.data.ignore_index,
            "image_mode": self.image_mode,
            "config": self.cfg.to_dict(),
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "scaler": self.scaler.state_dict(),
            "epoch": epoch,
            "step": progress.step,
            "batches_done": progress.batches_done,
            "sampler": self.sampler.state_dict(),
            "rng": rng_state(),
            "best_metric": best,
        }

    def save(self, path: Path, epoch: int, progress: Progress, best: float) -> None:
        with disk_full_names(path):
            save_checkpoint(self.checkpoint(epoch, progress, best), path)


def restore(state: TrainState, ckpt: dict[str, Any]) -> tuple[int, Progress, float]:
    """Load a checkpoint's states into ``state``; returns (epoch to start at, progress within it, best score)."""
    state.model.load_state_dict(ckpt["model"])
    state.optimizer.load_state_dict(ckpt["optimizer"])
    state.scheduler.load_state_dict(ckpt["scheduler"])
    if ckpt["scaler"]:  # empty when the checkpoint was not trained in fp16: a resume in fp16 starts a fresh scale
        state.scaler.load_state_dict(ckpt["scaler"])
    set_rng_state(ckpt["rng"])
    progress = Progress(step=ckpt["step"], batches_done=ckpt.get("batches_done", 0))
    return ckpt["epoch"], progress, ckpt.get("best_metric", -math.inf)


def save_epoch(state: TrainState, run_dir: Path, epoch: int, progress: Progress, best: float, improved: bool) -> None:
    """After a complete epoch (main process): best.pt when validation improved, then last.pt.

    ``best`` is recorded in last.pt only once best.pt holds its weights: a Ctrl-C while best.pt is written
    leaves last.pt at the previous best, so the resumed run validates this epoch again and writes best.pt then.
    """
    if improved:
        state.save(run_dir / "best.pt", epoch, progress, best)
    state.save(run_dir / "last.pt", epoch, progress, best)
