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
epoch 2 and resumed to epoch 4 ends with the same bits as one that ran 4 epochs straight. A Ctrl-C or SIGTERM
(srforge-train turns SIGTERM into :class:`srforge.runtime.signals.Terminated`), or a DataLoader worker the system
killed (:class:`srforge.train.stop.WorkerLostError`), writes ``last.pt`` at the batch it reached, and the resumed
run skips the batches already done: bit-identical too.

An epoch that teaches nothing ends the run with an error rather than a "done" with NaN scores: every batch
skipped as non-finite (NonFiniteLossError), or not one training pixel with a class (DataError: every mask is
``data.ignore_index``).

Distributed: under ``torchrun`` each process takes its rank's batches (gloo on CPU, nccl on CUDA), gradients
are averaged by DistributedDataParallel, losses and confusion matrices are summed across ranks, and only rank
0 writes files and shows the progress bar.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch
from tqdm import tqdm

from srforge.atomic import disk_full_names
from srforge.config import ConfigError
from srforge.config.schema import UNET_CLASSES, Config, DataSection
from srforge.data import DataError
from srforge.data.crop import crop_shape, crop_sizes
from srforge.geometry import aligned_size
from srforge.runtime import distributed
from srforge.runtime.distributed import Processes
from srforge.runtime.memory import (
    StepMemory,
    auto_budget,
    free_memory,
    pixels_text,
    planning_share,
    processes_per_device,
    smallest_across_ranks,
)
from srforge.train.build import (
    Data,
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
from srforge.train.prepare import checkpoint_file, claim_run_dir, prepare_synthetic_data, resume_checkpoint
from srforge.train.rng import seed_everything
from srforge.train.state import TrainState, restore, resumed_budgets, save_epoch
from srforge.train.step import (
    Budget,
    NonFiniteLossError,
    Progress,
    ScanTooLargeError,
    StepSettings,
    evaluate,
    probe_memory,
    train_epoch,
)
from srforge.train.stop import WorkerLostError, cause, interrupts_held, worker_lost

__all__ = ["train", "run_epoch", "Loop"]


def train(
    cfg: Config,
    resume: str | os.PathLike | None = None,
    checkpoint: dict[str, Any] | None = None,
    *,
    overwrite: bool = False,
) -> dict[str, Any]:
    """Train by ``cfg`` (a resolved config); returns a summary with the final validation scores.

    ``resume`` (RUN_DIR or a checkpoint file) continues a run from its checkpoint; ``checkpoint`` is that file's
    content when the caller has read it already (srforge-train does, for its config), so it is read once.
    ``run.dir`` is held for the whole run (a second process into it is refused) and must not hold another run
    (last.pt, best.pt or metrics.jsonl) unless ``resume`` continues that very run, or ``overwrite`` removes its
    files first: a RunExistsError otherwise, before anything is written.
    """
    processes = distributed.environment()
    ckpt = resume_checkpoint(resume, cfg.model, checkpoint)
    run_dir = Path(cfg.run.dir)
    lock = None
    if processes.main:
        continues = resume is not None and checkpoint_file(resume).parent.resolve() == run_dir.resolve()
        lock = claim_run_dir(run_dir, cfg, continues=continues, overwrite=overwrite)
    try:
        prepare_synthetic_data(cfg.data.synthetic, processes)
        processes = distributed.start(processes, cfg.train.dist_timeout_s, cfg.run.device)
        try:
            with disk_full_names(run_dir):  # a full disk anywhere else (size caches, TensorBoard): the run folder
                return _train(cfg, ckpt, processes, run_dir)
        finally:
            if processes.owns_group:
                distributed.stop()
    finally:
        if lock is not None:
            lock.release()


def _train(cfg: Config, ckpt: dict[str, Any] | None, processes: Processes, run_dir: Path) -> dict[str, Any]:
    """Build, restore the checkpoint's states when resuming, run the epochs due; returns the summary."""
    tcfg, dcfg, seed = cfg.train, cfg.data, cfg.run.seed
    device = training_device(processes, cfg.run.device, tcfg.precision)
    seed_everything(seed)
    depth = cfg.model.depth if cfg.model.class_ in UNET_CLASSES else None  # other models' divisors come from them
    data = build_data(dcfg, num_classes=cfg.model.num_classes, seed=seed, run_dir=run_dir, depth=depth)
    model, model_args = build_model(cfg.model, device, tcfg.channels_last, load_weights=ckpt is None)
    set_checkpointing(model, cfg.model.checkpointing)
    crop_training_scans(data, dcfg.crop, model.size_divisor)
    settings = step_settings(cfg, device)
    memory, sampler_pixels, step_pixels = plan_memory(cfg, model, data, settings, processes, ckpt)
    settings = replace(settings, budget=Budget(step_pixels))
    budgeted = DataSection({**dcfg, "max_pixels": sampler_pixels}) if dcfg.max_pixels is not None else dcfg
    loaders = build_loaders(budgeted, data, divisor=model.size_divisor, seed=seed, processes=processes, device=device)
    state = build_state(cfg, model, model_args, loaders, device)
    state.budget = settings.budget

    start, progress, best = 0, Progress(), -math.inf
    if ckpt is not None:
        start, progress, best = restore(state, ckpt)
        if processes.main:
            print(f"srforge: resuming {run_dir} at epoch {start + 1}, step {progress.step}")
    loop = Loop(
        state,
        wrap_for_training(model, compile=tcfg.compile, world=processes.world, device=device),
        loaders,
        settings,
        processes,
        run_dir,
        open_tensorboard(run_dir) if processes.main else None,
        epochs=tcfg.epochs,
        val_every=tcfg.val_every,
        memory=memory,
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

    Returns (the epoch's metrics row, the best validation mean IoU so far). A Ctrl-C or SIGTERM anywhere in it --
    validation and saving included -- writes last.pt at the batch reached, then propagates; so does a DataLoader
    worker the system killed, as a WorkerLostError, and a scan too large for the device even alone, as a
    ScanTooLargeError.
    """
    main = loop.processes.main
    lowered, sampler = loop.settings.budget.pixels, loop.loaders.sampler
    # Out of memory in an earlier epoch: smaller batches from this one on. Not in a resumed epoch, whose batches
    # must be those it was cut into at its start.
    fresh = progress.batches_done == 0
    if fresh and lowered is not None and sampler.max_pixels is not None and lowered < sampler.max_pixels:
        sampler.max_pixels = lowered
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
            epoch_saved, loop.last_saved = True, f"the end of epoch {epoch + 1}"
        best = row["val_mean_iou"] if improved else best
        progress.batches_done = 0
        if main:
            log_epoch(loop.run_dir, loop.writer, row, progress.step)
        return row, best
    except KeyboardInterrupt as interrupt:
        if main:
            _save_stopped(loop, epoch, progress, best, epoch_saved, interrupted_by=cause(interrupt))
        raise
    except RuntimeError as error:
        lost = worker_lost(error)
        too_large = str(error) if isinstance(error, ScanTooLargeError) else None
        if lost is None and too_large is None:
            raise
    # A worker died, or a scan does not fit the device. Written here, past the except block, so that the epoch's
    # DataLoader iterator -- held by the traceback -- is gone and its workers are shut down before last.pt is written.
    reached = _save_stopped(loop, epoch, progress, best, epoch_saved) if main else "last.pt (rank 0 writes it)"
    if too_large is not None:
        raise ScanTooLargeError(f"{too_large} Wrote {reached}; once it fits, continue with --resume {loop.run_dir}")
    raise WorkerLostError(
        f"{lost}; wrote {reached}. If memory ran short, use fewer data.num_workers (now {loop.loaders.num_workers}) "
        f"or smaller batches (data.batch_size, data.max_pixels); then continue with --resume {loop.run_dir}"
    )


def _train_pass(loop: Loop, bar: tqdm, epoch: int, progress: Progress) -> dict[str, Any]:
    """The training pass over ``bar``'s batches; returns the epoch's metrics row, summed across ranks."""
    state, main, first = loop.state, loop.processes.main, progress.batches_done
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
    train_scores = scores(distributed.reduce_sum(confusion).cpu())
    no_class = math.isnan(train_scores["pixel_accuracy"])  # NaN exactly when no pixel had a class
    _check_learned(loop, epoch, progress.batches_done - first, batches_stepped, whole=first == 0, no_class=no_class)
    return {
        "epoch": epoch + 1,
        "step": progress.step,
        "lr": state.scheduler.get_last_lr()[0],
        "train_loss": loss_sum / max(batches_stepped, 1),
        "train_mean_iou": train_scores["mean_iou"],
        "real_pixels_per_s": pixels / seconds,
        "seconds": seconds,
        "bytes_per_pixel": loop.memory.bytes_per_pixel if loop.memory is not None else None,
        "max_pixels": loop.settings.budget.pixels,
        "out_of_memory": loop.settings.budget.events,
    }


def _check_learned(loop: Loop, epoch: int, batches: int, stepped: float, *, whole: bool, no_class: bool) -> None:
    """An error for a training pass that taught nothing: ``batches`` run, none ``stepped`` (every loss NaN or
    infinite, skipped by train.skip_nonfinite), or a ``whole`` epoch in which not one pixel had a class
    (``no_class``: every mask all data.ignore_index). Without it the run would end "done" with NaN scores."""
    if batches and not stepped:
        raise NonFiniteLossError(
            f"every batch of epoch {epoch + 1} was skipped as non-finite ({batches} batches, train.skip_nonfinite="
            "true): no step was taken. Look for NaN or infinite pixels in the images, or lower train.lr if the loss "
            "diverged."
        )
    if whole and stepped and no_class:
        ignore = loop.settings.ignore_index
        raise DataError(
            f"no training pixel has a class: every mask of the training set is data.ignore_index={ignore} (epoch "
            f"{epoch + 1}, {batches} batches), so there is nothing to learn. Check that the masks hold class ids "
            f"0..{loop.settings.num_classes - 1}, or set data.ignore_index to the value that marks unlabelled pixels."
        )


def _validate(loop: Loop, row: dict[str, Any], best: float) -> bool:
    """Validation of the bare model (no gradients to average), its scores added to ``row``; whether it beat
    ``best``."""
    val = evaluate(loop.state.model, loop.loaders.val, loop.settings)
    row.update({f"val_{k}": val[k] for k in ("loss", "mean_iou", "pixel_accuracy", "iou", "dice")})
    return math.isfinite(val["mean_iou"]) and val["mean_iou"] > best


def _save_stopped(
    loop: Loop, epoch: int, progress: Progress, best: float, epoch_saved: bool, interrupted_by: str | None = None
) -> str:
    """last.pt at the batch reached (main process), unless the epoch's own is written already; returns what it
    holds ("RUN_DIR/last.pt at epoch 2, batch 3"). With ``interrupted_by`` (Ctrl-C, SIGTERM) the console says so,
    what was written and how to continue.

    Ctrl-C and SIGTERM are held while it is written (:func:`srforge.train.stop.interrupts_held`) and delivered
    after. Should the write be cut short all the same, the console says that last.pt was not updated and what
    it still holds, so that no one takes it for the batch reached.
    """
    path = loop.run_dir / "last.pt"
    where = f"the end of epoch {epoch + 1}" if epoch_saved else f"epoch {epoch + 1}, batch {progress.batches_done}"
    reached, written = f"{path} at {where}", epoch_saved
    try:
        with interrupts_held() as noted:
            if not epoch_saved:
                loop.state.save(path, epoch, progress, best)
                written = True
            if interrupted_by is not None:
                print(
                    f"\nsrforge: interrupted; wrote {reached} ({interrupted_by}). Continue with --resume {loop.run_dir}"
                )
            if noted:
                print(f"srforge: {noted[0]} came while {path} was written; it was written in full first.")
    except KeyboardInterrupt:
        if not written:
            print(
                f"\nsrforge: interrupted again while {path} was written: it was NOT updated and still holds "
                f"{loop.last_saved}, not {where}; --resume {loop.run_dir} repeats the batches since."
            )
        raise
    return reached


# -- before the first epoch: checkpointing, crops, and the pixel budget from the step's measured memory -------------
def set_checkpointing(model: torch.nn.Module, on: bool) -> None:
    """``model.checkpointing``: switch every submodule's ``checkpointing`` attribute (srforge's UNet has one, and
    so may any model class); asked of a model without one, a ConfigError saying so."""
    holders = [m for m in model.modules() if "checkpointing" in vars(m)]
    if on and not holders:
        raise ConfigError(
            f"model.checkpointing: {type(model).__name__} has no checkpointing attribute to switch on (srforge's "
            "UNet has one). Set model.checkpointing=false, or give the model a checkpointing attribute that makes "
            "its forward recompute activations in backward (torch.utils.checkpoint)."
        )
    for module in holders:
        module.checkpointing = on


def crop_training_scans(data: Data, crop: int | list | None, divisor: int) -> None:
    """``data.crop``: the training view cuts every larger scan to a random crop of at most that size (rounded down
    to ``divisor``), and the sampler groups the training scans by their cropped sizes."""
    if crop is None:
        return
    try:
        shape = crop_shape(crop, divisor)
    except ValueError as error:
        raise ConfigError(str(error)) from None
    data.train.crop = shape
    data.train_sizes = crop_sizes(data.train_sizes, shape)


def plan_memory(
    cfg: Config,
    model: torch.nn.Module,
    data: Data,
    settings: StepSettings,
    processes: Processes,
    ckpt: dict[str, Any] | None,
) -> tuple[StepMemory, int | None, int | None]:
    """The training step's measured memory and the pixel budgets (the sampler's, the step's) the run starts with.

    ``data.max_pixels: auto``: the budget from the probe and the device's free memory, the smallest over the ranks;
    a training scan that cannot fit even alone is a ConfigError naming it, before training starts. A number is
    taken as given, None (data.batch_size) leaves batches uncut. A resumed run keeps its checkpoint's budgets
    (:func:`srforge.train.state.resumed_budgets`). The main process prints the figures.
    """
    device, divisor = settings.device, model.size_divisor
    memory = probe_memory(model, settings)
    free = free_memory(device)
    local = processes_per_device() if device.type == "cuda" else processes.local_world
    share = planning_share(free, device.type, local)
    aligned = [aligned_size(h, w, divisor) for h, w in data.train_sizes]
    largest = max(h * w for h, w in aligned)
    pixels = cfg.data.max_pixels
    if pixels == "auto":
        pixels, capacity = smallest_across_ranks(list(auto_budget(memory, share, device.type, divisor)), device)
        if largest > capacity:
            raise too_large(model, data, aligned, capacity, settings, (memory, free, share))
    sampler_pixels, step_pixels = (pixels, pixels) if ckpt is None else resumed_budgets(ckpt, pixels)
    if processes.main:
        print(memory_line(memory, cfg.data, sampler_pixels, largest, (free, share, device)))
    return memory, sampler_pixels, step_pixels


def memory_line(memory: StepMemory, data_cfg: DataSection, pixels: int | None, largest: int, where: tuple) -> str:
    """The start-of-run line: 'srforge: memory: 1.80 KB per padded pixel in bf16, 0.40 GB fixed; 62.0 GB free on
    cuda:0; budget 30.0 Mpx (data.max_pixels: auto), the largest training scan 8.2 Mpx', and for a given budget
    whose step would not fit the share of free memory that auto plans with, what that means."""
    free, share, device = where
    room = "free" if device.type == "cuda" else "of RAM available"
    line = f"srforge: memory: {memory.describe()}; {free / 1e9:.1f} GB {room} on {device}; "
    if pixels is None:
        batch = data_cfg.batch_size * largest
        line += f"batches of {data_cfg.batch_size} scans (data.batch_size), at most {pixels_text(batch)}"
    else:
        given = "auto" if data_cfg.max_pixels == "auto" else "given"
        line += f"budget {pixels_text(pixels)} (data.max_pixels: {given})"
        batch = max(pixels, largest)
    line += f", the largest training scan {pixels_text(largest)}"
    if data_cfg.max_pixels != "auto" and memory.peak(batch) > share:
        line += (
            f". A step over {pixels_text(batch)} needs about {memory.peak(batch) / 1e9:.1f} GB: batches that run "
            "out of memory are redone in parts and the budget lowered (data.max_pixels: auto fits the device)"
        )
    return line


def too_large(model, data: Data, aligned: list, capacity: int, settings: StepSettings, measured: tuple) -> ConfigError:
    """The ConfigError for training scans whose step cannot fit the device even alone: how many, the largest by
    name, what it needs against what there is, and what would make it fit (measured where that is quick)."""
    memory, free, share = measured
    areas = [h * w for h, w in aligned]
    over = sorted((i for i, area in enumerate(areas) if area > capacity), key=lambda i: -areas[i])
    first = over[0]
    (h, w), (ha, wa) = data.train_sizes[first], aligned[first]
    names = ", ".join(f"'{data.train[i]['name']}'" for i in over[:3]) + (", ..." if len(over) > 3 else "")
    return ConfigError(
        f"data.max_pixels: auto: {len(over)} training scan(s) cannot train on {settings.device} even alone "
        f"({names}). The largest, {h} x {w} px ({pixels_text(ha * wa)} padded), needs about "
        f"{memory.peak(ha * wa) / 1e9:.1f} GB for one step at {memory.describe()}; a step may plan with "
        f"{share / 1e9:.1f} GB of the {free / 1e9:.1f} GB free, enough for {pixels_text(capacity)}. To make it "
        f"fit: {'; '.join(fit_hints(model, settings, memory, share, (ha, wa)))}.",
        keys=("data.max_pixels",),
    )


def fit_hints(model, settings: StepSettings, memory: StepMemory, share: float, scan: tuple[int, int]) -> list[str]:
    """What would let a scan of padded size ``scan`` train in ``share`` bytes: checkpointing (measured), bf16
    (measured on CUDA), a crop that fits, a smaller model."""
    hints, divisor, needed = [], model.size_divisor, scan[0] * scan[1]
    capacity = memory.fitting(share)
    if not memory.checkpointing and any("checkpointing" in vars(m) for m in model.modules()):
        set_checkpointing(model, True)
        try:
            with_checkpointing = probe_memory(model, settings).fitting(share)
        finally:
            set_checkpointing(model, False)
        fits = "fits" if with_checkpointing >= needed else "not enough alone"
        hints.append(f"model.checkpointing=true (measured: room for {pixels_text(with_checkpointing)}, {fits})")
    if settings.precision == "fp32":
        if settings.device.type == "cuda":
            bf16 = probe_memory(model, replace(settings, precision="bf16")).fitting(share)
            hints.append(f"train.precision=bf16 (measured: room for {pixels_text(bf16)})")
        else:
            hints.append("train.precision=bf16 (fewer bytes per pixel)")
    height = scan[0] if capacity >= scan[0] * divisor else max(divisor, int(capacity**0.5) // divisor * divisor)
    width = max(divisor, capacity // height // divisor * divisor)
    hints.append(f"data.crop=[{height}, {width}] (train on random crops of the larger scans)")
    hints.append("a smaller model (fewer model.base_channels: bytes per pixel shrink about in proportion)")
    return hints


@dataclass
class Loop:
    """What every epoch works with: the state a checkpoint holds, the module a step calls (``state.model`` or its
    DDP wrapper), the batches, the step's settings, this process, the run folder, TensorBoard (main process, when
    installed), the number of epochs, how often to validate, what this run's last.pt holds (for the console), and
    the step's measured memory."""

    state: TrainState
    net: torch.nn.Module
    loaders: Loaders
    settings: StepSettings
    processes: Processes
    run_dir: Path
    writer: Any
    epochs: int
    val_every: int
    last_saved: str = "what it held when this run started (if it existed)"
    memory: StepMemory | None = None  # the training step's measured memory, for the metrics rows
