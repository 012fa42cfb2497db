"""What a checkpoint is made of: the training state, how it is saved, and how a resume restores it.

The keys a checkpoint holds are listed in :mod:`srforge.runtime.checkpoint`. Saving goes through
:func:`srforge.runtime.checkpoint.save_checkpoint` (atomic), inside :func:`srforge.atomic.disk_full_names`, so a
full disk is a DiskFullError naming the checkpoint.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from srforge.atomic import disk_full_names
from srforge.config.schema import Config
from srforge.data.sampling import SizeGroupedBatchSampler
from srforge.models.build import UNET_CLASS
from srforge.runtime.checkpoint import save_checkpoint
from srforge.train.rng import rng_state, set_rng_state
from srforge.train.step import Budget, Progress


@dataclass
class TrainState:
    """Everything a checkpoint holds, in one place: the bare model, the optimization state, the run's facts.

    ``model_class``, ``model_args`` and ``model_norm`` rebuild the model from the checkpoint alone
    (:func:`srforge.runtime.checkpoint.model_from_checkpoint`).
    """

    model: torch.nn.Module
    model_args: dict
    optimizer: torch.optim.Optimizer
    scheduler: Any
    scaler: torch.amp.GradScaler
    sampler: SizeGroupedBatchSampler
    cfg: Config
    class_names: list[str]
    image_mode: str
    model_class: str = UNET_CLASS
    model_norm: str = "keep"
    budget: Budget = field(default_factory=Budget)  # the step's pixel budget (the loop shares it with the step)

    def checkpoint(self, epoch: int, progress: Progress, best: float) -> dict[str, Any]:
        """The checkpoint after ``epoch`` complete epochs and ``progress.batches_done`` batches of the next."""
        return {
            "model": self.model.state_dict(),
            "model_class": self.model_class,
            "model_args": self.model_args,
            "model_norm": self.model_norm,
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
            "memory": {"sampler_max_pixels": self.sampler.max_pixels, "step_max_pixels": self.budget.pixels},
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


# A resumed run keeps the pixel budgets its checkpoint records unless the budget it resolves now is smaller by more
# than this share: data.max_pixels: auto measures free memory, which varies a little from start to start, and the
# same budget cuts the same batches, so that the resumed epoch skips exactly the batches done.
RESUME_BUDGET_SLACK = 0.1


def resumed_budgets(ckpt: dict[str, Any], pixels: int | None) -> tuple[int | None, int | None]:
    """(the sampler's budget, the step's budget) a resumed run continues with, given the budget ``pixels`` it
    resolved from its config (None: data.batch_size).

    The checkpoint's own, as long as ``pixels`` is not more than RESUME_BUDGET_SLACK below them (a smaller device,
    or a smaller data.max_pixels given on purpose): then ``pixels``, and the resumed epoch's batches are cut anew.
    The step's budget may sit below the sampler's (the device ran out of memory during the saved epoch; the
    sampler takes it up at the next epoch). A checkpoint from before these budgets: ``pixels`` for both.
    """
    saved = ckpt.get("memory") or {}
    sampler, step = saved.get("sampler_max_pixels"), saved.get("step_max_pixels")

    def kept(value: int | None) -> int | None:
        if value is None:
            return pixels
        return value if pixels is None or pixels >= value * (1 - RESUME_BUDGET_SLACK) else min(value, pixels)

    return (kept(sampler) if pixels is not None else None), kept(step)


def save_epoch(state: TrainState, run_dir: Path, epoch: int, progress: Progress, best: float, improved: bool) -> None:
    """After a complete epoch (main process): best.pt when validation improved, then last.pt.

    ``best`` is recorded in last.pt only once best.pt holds its weights: a Ctrl-C while best.pt is written
    leaves last.pt at the previous best, so the resumed run validates this epoch again and writes best.pt then.
    """
    if improved:
        state.save(run_dir / "best.pt", epoch, progress, best)
    state.save(run_dir / "last.pt", epoch, progress, best)
