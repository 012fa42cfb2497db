"""Training, read top to bottom: :func:`train` checks and prepares, builds, then runs epoch after epoch.

    cfg -> datasets (size-stratified split) -> size-grouped batches -> AlignedCollate(model.size_divisor)
        -> UNet(image, sizes) -> cross-entropy (+ Dice) on valid pixels -> AdamW, warm-up + cosine
        -> validation (confusion matrix over valid pixels) -> last.pt every epoch, best.pt by mean IoU

The phases, each in its module: :mod:`srforge.train.prepare` (the resume checkpoint checked before anything is
written, the run folder, synthetic data before the process group starts), :mod:`srforge.train.build` (device,
data, model, optimization, batches), :mod:`srforge.train.state` (what a checkpoint holds; save and restore), then
per epoch :func:`run_epoch`: :func:`srforge.train.step.train_epoch`, :func:`srforge.train.step.evaluate`,
:func:`srforge.train.state.save_epoch` and :func:`srforge.train.log.log_epoch`.

Exact resume: the batch order depends only on (seed, epoch), augmentation on (seed, epoch, sample), and the
checkpoint holds model, optimizer, scheduler, scaler, step and RNG states, so on the CPU a run stopped after
epoch 2 and resumed to epoch 4 ends with the same bits as one that ran 4 epochs straight. A Ctrl-C writes
``last.pt`` at the batch it reached, and the resumed run skips the batches already done: bit-identical too.

Distributed: under ``torchrun`` each process takes its rank's batches (gloo on CPU, nccl on CUDA), gradients
are averaged by DistributedDataParallel, losses and confusion matrices are summed across ranks, and only rank
0 writes files and shows the progress bar.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from tqdm import tqdm

from srforge.atomic import disk_full_names
from srforge.config.schema import Config
from srforge.runtime import distributed
from srforge.runtime.distributed import Processes
from srforge.train.build import (
    Loaders,
    build_data,
    build_loaders,
    build_model,
    build_state,
    step_settings,
    training_device,
    wrap_for_training,
)
from srforge.train.log import log_epoch, open_tensorboard
from srforge.train.metrics import scores
from srforge.train.prepare import prepare_run_dir, prepare_synthetic_data, resume_checkpoint
from srforge.train.rng import seed_everything
from srforge.train.state import TrainState, restore, save_epoch
from srforge.train.step import Progress, StepSettings, evaluate, train_epoch

__all__ = ["train", "run_epoch", "Loop"]


def train(
    cfg: Config, resume: str | os.PathLike | None = None, checkpoint: dict[str, Any] | None = None
) -> dict[str, Any]:
    """Train by ``cfg`` (a resolved config); returns a summary with the final validation scores.

    ``resume`` (RUN_DIR or a checkpoint file) continues a run from its checkpoint; ``checkpoint`` is that file's
    content when the caller has read it already (srforge-train does, for its config), so it is read once.
    """
    processes = distributed.environment()
    ckpt = resume_checkpoint(resume, cfg.model, checkpoint)
    run_dir = Path(cfg.run.dir)
    if processes.main:
        prepare_run_dir(run_dir, cfg)
    prepare_synthetic_data(cfg.data.synthetic, processes)
    processes = distributed.start(processes, cfg.train.dist_timeout_s, cfg.run.device)
    try:
        with disk_full_names(run_dir):  # a full disk anywhere else (size caches, TensorBoard): the run folder is named
            return _train(cfg, ckpt, processes, run_dir)
    finally:
        if processes.owns_group:
            distributed.stop()


def _train(cfg: Config, ckpt: dict[str, Any] | None, processes: Processes, run_dir: Path) -> dict[str, Any]:
    """Build, restore the checkpoint's states when resuming, run the epochs due; returns the summary."""
    tcfg, dcfg, seed = cfg.train, cfg.data, cfg.run.seed
    device = training_device(processes, cfg.run.device, tcfg.precision)
    seed_everything(seed)
    data = build_data(dcfg, num_classes=cfg.model.num_classes, seed=seed, run_dir=run_dir)
    model, model_args = build_model(cfg.model, device, tcfg.channels_last)
    loaders = build_loaders(dcfg, data, divisor=model.size_divisor, seed=seed, processes=processes, device=device)
    state = build_state(cfg, model, model_args, loaders, device)

    start, progress, best = 0, Progress(), -math.inf
    if ckpt is not None:
        start, progress, best = restore(state, ckpt)
        if processes.main:
            print(f"srforge: resuming {run_dir} at epoch {start + 1}, step {progress.step}")
    loop = Loop(
        state,
        wrap_for_training(model, compile=tcfg.compile, world=processes.world, device=device),
        loaders,
        step_settings(cfg, device),
        processes,
        run_dir,
        open_tensorboard(run_dir) if processes.main else None,
        epochs=tcfg.epochs,
        val_every=tcfg.val_every,
    )

    stop = tcfg.epochs if tcfg.stop_after is None else min(tcfg.epochs, start + tcfg.stop_after)
    summary: dict[str, Any] = {"run_dir": str(run_dir), "best_mean_iou": best, "class_names": state.class_names}
    loop.net.train()
    for epoch in range(start, stop):
        row, best = run_epoch(loop, epoch, progress, best)
        summary.update(row)
    summary["best_mean_iou"] = best
    if loop.writer is not None:
        loop.writer.close()
    distributed.barrier()
    return summary


def run_epoch(loop: Loop, epoch: int, progress: Progress, best: float) -> tuple[dict[str, Any], float]:
    """One epoch: the training pass, validation when due, best.pt / last.pt, the metrics row.

    Returns (the epoch's metrics row, the best validation mean IoU so far). A Ctrl-C anywhere in it -- validation
    and saving included -- writes last.pt at the batch reached, then propagates.
    """
    main = loop.processes.main
    loader = loop.loaders.epoch(epoch, skip=progress.batches_done)  # a resumed epoch skips the batches done
    bar = tqdm(loader, desc=f"epoch {epoch + 1}/{loop.epochs}", disable=not main, leave=False)
    epoch_saved = False
    try:
        row = _train_pass(loop, bar, epoch, progress)
        due = (epoch + 1) % loop.val_every == 0 or epoch + 1 == loop.epochs
        improved = _validate(loop, row, best) if due else False
        if main:
            score = row["val_mean_iou"] if improved else best
            save_epoch(loop.state, loop.run_dir, epoch + 1, Progress(progress.step, 0), score, improved)
            epoch_saved = True
        best = row["val_mean_iou"] if improved else best
        progress.batches_done = 0
        if main:
            log_epoch(loop.run_dir, loop.writer, row, progress.step)
    except KeyboardInterrupt:
        if main:
            _save_interrupted(loop, epoch, progress, best, epoch_saved)
        raise
    return row, best


def _train_pass(loop: Loop, bar: tqdm, epoch: int, progress: Progress) -> dict[str, Any]:
    """The training pass over ``bar``'s batches; returns the epoch's metrics row, summed across ranks."""
    state, main = loop.state, loop.processes.main
    totals, confusion, seconds = train_epoch(
        loop.net,
        bar,
        state.optimizer,
        state.scheduler,
        state.scaler,
        progress,
        loop.settings,
        world=loop.processes.world,
        bar=bar if main else None,
        epoch=epoch,
    )
    bar.close()
    loss_sum, batches_stepped, pixels = distributed.reduce_sum(totals).tolist()
    return {
        "epoch": epoch + 1,
        "step": progress.step,
        "lr": state.scheduler.get_last_lr()[0],
        "train_loss": loss_sum / max(batches_stepped, 1),
        "train_mean_iou": scores(distributed.reduce_sum(confusion).cpu())["mean_iou"],
        "real_pixels_per_s": pixels / seconds,
        "seconds": seconds,
    }


def _validate(loop: Loop, row: dict[str, Any], best: float) -> bool:
    """Validation of the bare model (no gradients to average), its scores added to ``row``; whether it beat
    ``best``."""
    val = evaluate(loop.state.model, loop.loaders.val, loop.settings)
    row.update({f"val_{k}": val[k] for k in ("loss", "mean_iou", "pixel_accuracy", "iou", "dice")})
    return math.isfinite(val["mean_iou"]) and val["mean_iou"] > best


def _save_interrupted(loop: Loop, epoch: int, progress: Progress, best: float, epoch_saved: bool) -> None:
    """After a Ctrl-C (main process): last.pt at the batch reached, unless the epoch's own is written already."""
    if not epoch_saved:
        loop.state.save(loop.run_dir / "last.pt", epoch, progress, best)
    print(
        f"\nsrforge: interrupted; wrote {loop.run_dir / 'last.pt'} (epoch {epoch + 1}, "
        f"{progress.batches_done} batches done). Continue with --resume {loop.run_dir}"
    )


@dataclass
class Loop:
    """What every epoch works with: the state a checkpoint holds, the module a step calls (``state.model`` or its
    DDP wrapper), the batches, the step's settings, this process, the run folder, TensorBoard (main process, when
    installed), the number of epochs and how often to validate."""

    state: TrainState
    net: torch.nn.Module
    loaders: Loaders
    settings: StepSettings
    processes: Processes
    run_dir: Path
    writer: Any
    epochs: int
    val_every: int
