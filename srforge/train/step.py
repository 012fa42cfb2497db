"""One training epoch and one validation pass, with at most one read from the device per optimizer update.

Every number the loop keeps (loss sums, batch and pixel counts, the confusion matrix) stays on the device. The
only value an update reads back is whether every rank's loss is finite -- the step cannot be taken otherwise --
together with the pixel budget any rank proposes after running out of memory; every ``log_every`` batches the
running totals for the progress bar travel in that same transfer. On a GPU each read drains the queue of launched
kernels, so the read comes after the backward pass is queued: the GPU works through the backward while the host
waits.

An optimizer update gathers ``settings.accumulate`` batches (gradient accumulation; 1 by default). With more than
one, or when a batch is redone in parts, each part's loss is weighted by its share of the update's valid pixels
(:func:`srforge.train.losses.valid_pixels`), so the gradients add up to those of one batch holding every part:
exactly for the cross-entropy, and for the Dice term as the valid-pixel-weighted mean of the parts' Dice (a
ratio over the whole batch does not split). The weights need the update's total before its last part is known, so
each part is weighted against the first part's count and the gradients are rescaled once at the end.

Out of memory during a forward or backward pass (CUDA's OutOfMemoryError, or cuBLAS / cuDNN failing to
allocate: :func:`srforge.runtime.memory.is_out_of_memory`) does not end the run: the part's gradients are dropped,
the batch is redone in halves (each half again, as needed) that add up to the same update, and the pixel budget
(:class:`Budget`) is lowered to the largest part that fit, for the rest of the run: later batches above it are
run in parts straight away, and the sampler cuts smaller batches from the next epoch on. Only a single scan that
fails alone ends the run (:class:`ScanTooLargeError`, naming it).

Under torchrun every forward and backward runs in DDP's ``no_sync`` mode and the gradients are averaged by one
all-reduce at the end of the update, before its read: a rank that runs out of memory redoes its batch in parts
alone, while the others wait at that all-reduce, so no rank is ever left waiting in a collective the others do
not reach. The ranks agree on the lowered budget through the read (the smallest proposal wins), so their
samplers keep cutting the same batches.

The loss is the same quantity in training and validation: the mean over batches of the batch's
:func:`srforge.train.losses.segmentation_loss` (cross-entropy over its valid pixels, plus ``dice_weight`` x
Dice), summed across ranks.
"""

from __future__ import annotations

import math
import time
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.nn.parallel import DistributedDataParallel
from tqdm import tqdm

from srforge.models.class_map import class_map
from srforge.runtime import distributed
from srforge.runtime.device import autocast
from srforge.runtime.memory import StepMemory, is_out_of_memory, measure_step_memory, pixels_text
from srforge.train.losses import segmentation_loss, valid_pixels
from srforge.train.losses import segmentation_loss as probe_loss  # the probe's own name: not a training batch
from srforge.train.metrics import confusion_matrix, scores


class NonFiniteLossError(RuntimeError):
    """The loss became NaN or infinite; the message names the step and the batch's samples."""


class ScanTooLargeError(RuntimeError):
    """One scan's training step does not fit in the device's memory even alone; the message names the scan."""


@dataclass
class Progress:
    """How far training got: optimizer steps taken and batches of the current epoch done (skipped ones too).

    Updated in place update by update (a batch, or ``train.accumulate`` batches), so that a Ctrl-C anywhere knows
    what to write into ``last.pt``: always an update boundary, and a resumed run redoes a partial update.
    """

    step: int = 0
    batches_done: int = 0


@dataclass
class Budget:
    """The padded pixels (B x Hp x Wp) one forward and backward may take at once; None: no bound is known.

    Starts at the run's ``data.max_pixels`` (resolved when it is ``auto``). Lowered in place when the device runs
    out of memory (``events`` counts those times), for the rest of the run: a batch above it runs in parts of at
    most this many pixels, and the sampler cuts smaller batches from the next epoch on.
    """

    pixels: int | None = None
    events: int = 0

    def scans_per_part(self, shape: torch.Size) -> int:
        """How many scans of a batch ``shape`` [B, C, Hp, Wp] one part may hold: all of them without a bound."""
        if self.pixels is None:
            return shape[0]
        return max(1, min(shape[0], self.pixels // (shape[-2] * shape[-1])))


@dataclass(frozen=True)
class StepSettings:
    """What a training step and a validation pass need besides the model and the batch.

    The first six serve both passes; the rest concern training alone (``evaluate`` ignores them):
    ``grad_clip`` (the gradient norm's bound; None or 0: no clipping), ``skip_nonfinite`` (skip an update whose
    loss is NaN or infinite on any rank, instead of raising), ``log_every`` (the progress bar's numbers are read
    along with the update that completes every ``log_every``-th batch), ``accumulate`` (batches per optimizer
    update), ``budget`` (the run's pixel budget, lowered in place on running out of memory).
    """

    device: torch.device
    precision: str  # fp32 | bf16 | fp16
    channels_last: bool
    num_classes: int
    ignore_index: int
    dice_weight: float
    grad_clip: float | None = None
    skip_nonfinite: bool = False
    log_every: int = 1
    accumulate: int = 1
    budget: Budget = field(default_factory=Budget, compare=False)


def to_device(batch, device: torch.device, channels_last: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(image uint8 [B, C, H, W], mask int64 [B, H, W], sizes int64 [B, 2]) of a collated batch, on ``device``.

    Images and masks travel as uint8 (masks as int64 only for more than 255 classes); the model normalises the
    image on the device, and the mask is widened there because cross-entropy takes int64 targets.
    """
    image = batch.image.to(device, non_blocking=True)
    mask = batch.mask.to(device, non_blocking=True).long()
    sizes = batch.sizes.to(device, non_blocking=True)
    if channels_last:
        image = image.contiguous(memory_format=torch.channels_last)
    return image, mask, sizes


def _totals(loss: torch.Tensor, sizes: torch.Tensor) -> torch.Tensor:
    """float64 [3]: (the batch's loss, 1 batch, its real pixels), built on the device."""
    one = torch.ones((), dtype=torch.float64, device=loss.device)
    return torch.stack([loss.detach().double(), one, sizes.prod(1).sum().double()])


@dataclass
class Pass:
    """One training pass's working set: the module a step calls, what updates the weights, the pass's sums."""

    net: torch.nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: Any
    scaler: torch.amp.GradScaler
    progress: Progress
    settings: StepSettings
    world: int
    bar: tqdm | None
    epoch: int
    params: list[torch.Tensor]
    totals: torch.Tensor  # float64 [3]: loss sum, batches stepped, real pixels
    confusion: torch.Tensor  # int64 [K, K]
    started: float


@dataclass
class Update:
    """The optimizer update being gathered: its batches' sums (added to the pass's only if it is stepped), their
    sample names, and the loss weights' state: ``unit`` (valid pixels of its first weighted part, at least 1),
    ``valid`` (valid pixels of every weighted part so far), ``weighted`` (whether any part was weighted, so that
    the gradients need rescaling by unit / valid), ``proposal`` (the budget this rank proposes after running out of
    memory; infinite when it did not)."""

    totals: torch.Tensor
    confusion: torch.Tensor
    names: list = field(default_factory=list)
    batches: int = 0
    unit: torch.Tensor | None = None
    valid: torch.Tensor | None = None
    weighted: bool = False
    proposal: float = math.inf

    @classmethod
    def start(cls, settings: StepSettings) -> Update:
        device, k = settings.device, settings.num_classes
        zeros = torch.zeros(3, dtype=torch.float64, device=device)
        return cls(zeros, torch.zeros(k, k, dtype=torch.int64, device=device))


def train_epoch(
    net: torch.nn.Module,
    loader,
    optimizer: torch.optim.Optimizer,
    scheduler,
    scaler: torch.amp.GradScaler,
    progress: Progress,
    settings: StepSettings,
    *,
    world: int = 1,
    bar: tqdm | None = None,
    epoch: int = 0,
) -> tuple[torch.Tensor, torch.Tensor, float]:
    """One pass over ``loader``: forward, loss, backward, and an optimizer step every ``settings.accumulate``
    batches (and after the last). Returns the rank's totals on the device.

    ``net`` is what runs the batch (the model, or its DistributedDataParallel wrapper); gradients are clipped over
    ``optimizer``'s parameters. Returns (float64 [3] = loss sum, batches stepped, real pixels; int64 [K, K]
    confusion matrix of the predictions taken during training; seconds). A non-finite loss on any rank raises
    NonFiniteLossError, or with ``settings.skip_nonfinite`` skips the update on every rank alike.
    """
    device, k = settings.device, settings.num_classes
    run = Pass(
        net,
        optimizer,
        scheduler,
        scaler,
        progress,
        settings,
        world,
        bar,
        epoch,
        [p for group in optimizer.param_groups for p in group["params"]],
        torch.zeros(3, dtype=torch.float64, device=device),
        torch.zeros(k, k, dtype=torch.int64, device=device),
        time.perf_counter(),
    )
    update = Update.start(settings)
    for batch in loader:
        if update.batches == 0:
            optimizer.zero_grad(set_to_none=True)
        run_batch(run, update, batch)
        if update.batches == settings.accumulate:
            finish_update(run, update)
            update = Update.start(settings)
    if update.batches:  # the epoch's last, shorter update
        finish_update(run, update)
    if device.type == "cuda":
        torch.cuda.synchronize(device)  # once an epoch: the seconds include the last steps' queued kernels
    return run.totals, run.confusion, time.perf_counter() - run.started


def run_batch(run: Pass, update: Update, batch) -> None:
    """Forward and backward of one collated batch into ``update``'s gradients: whole, or in parts of at most the
    budget's pixels, halving any part that runs out of memory. A single scan that does not fit is a
    ScanTooLargeError naming it."""
    settings = run.settings
    image, mask, sizes = to_device(batch, settings.device, settings.channels_last)
    count, per_part = image.shape[0], settings.budget.scans_per_part(image.shape)
    parts = [(lo, min(lo + per_part, count)) for lo in range(0, count, per_part)]
    weighted = settings.accumulate > 1 or len(parts) > 1
    losses, failed_at, largest_fit = [], None, 0
    while parts:
        lo, hi = parts.pop(0)
        done = try_part(run, update, (image[lo:hi], mask[lo:hi], sizes[lo:hi]), weighted)
        if done is None:  # out of memory: every part of this batch from now on is weighted
            failed_at = failed_at or (hi - lo) * image.shape[-2] * image.shape[-1]
            if hi - lo == 1:
                raise scan_too_large(batch, lo, image.shape, settings.device)
            if not weighted:
                weighted, losses = True, []
            middle = (lo + hi) // 2
            parts[:0] = [(lo, middle), (middle, hi)]
            continue
        losses.append(done)
        if failed_at is not None:
            largest_fit = max(largest_fit, (hi - lo) * image.shape[-2] * image.shape[-1])
    update.weighted |= weighted
    update.totals += _totals(batch_loss(losses, mask, settings.ignore_index), sizes)
    update.names.extend(batch.name if isinstance(batch.name, list) else [batch.name])
    update.batches += 1
    if failed_at is not None:
        update.proposal = min(update.proposal, largest_fit)
        report_out_of_memory(run, batch, image.shape, failed_at, largest_fit)


def batch_loss(parts: list[tuple[torch.Tensor, torch.Tensor | None]], mask: torch.Tensor, ignore: int) -> torch.Tensor:
    """The batch's loss as the progress bar and metrics report it, from its parts' (loss, valid pixels): the loss
    itself for a batch run whole, else the parts' losses weighted by their shares of the batch's valid pixels."""
    if len(parts) == 1:
        return parts[0][0]
    total = valid_pixels(mask, ignore).clamp_min(1).double()
    return sum(loss.double() * valid / total for loss, valid in parts)


def try_part(run: Pass, update: Update, part: tuple, weighted: bool) -> tuple[torch.Tensor, Any] | None:
    """Forward and backward of one part (image, mask, sizes), its gradients added to those the parameters hold;
    returns (its loss, its valid pixels or None), or None when the device ran out of memory, with no trace of
    the part left in the gradients (the gradients so far are set aside during the backward and put back)."""
    held = [p.grad for p in run.params]
    for p in run.params:
        p.grad = None
    try:
        done = forward_backward(run, update, part, weighted)
    except RuntimeError as error:
        if not is_out_of_memory(error):
            raise
        done = None
    for p, old in zip(run.params, held):
        if done is None or p.grad is None:
            p.grad = old
        elif old is not None:
            p.grad = old.add_(p.grad)
    if done is None and run.settings.device.type == "cuda":
        torch.cuda.empty_cache()  # the failed part's blocks, in sizes the halves may not reuse
    return done


def forward_backward(run: Pass, update: Update, part: tuple, weighted: bool) -> tuple[torch.Tensor, Any]:
    """Forward, loss, backward of (image, mask, sizes); the loss weighted by its share of the update's valid
    pixels when ``weighted``. Under DDP the backward does not reduce (the update averages once at its end).
    Adds the part's predictions to ``update.confusion``; returns (its loss, detached; its valid pixels or None)."""
    image, mask, sizes = part
    settings = run.settings
    local = run.net.no_sync() if isinstance(run.net, DistributedDataParallel) else nullcontext()
    valid = unit = None
    with local:
        with autocast(settings.device, settings.precision):
            logits = run.net(image, sizes)
        loss = segmentation_loss(logits, mask, settings.ignore_index, settings.dice_weight)
        scaled = loss
        if weighted:
            valid = valid_pixels(mask, settings.ignore_index)
            unit = update.unit if update.unit is not None else valid.clamp_min(1)
            scaled = loss * (valid.double() / unit).to(loss.dtype)
        run.scaler.scale(scaled).backward()
    if weighted:  # the part is in the gradients: its pixels count
        update.unit = unit
        update.valid = valid if update.valid is None else update.valid + valid
    with torch.no_grad():
        update.confusion += confusion_matrix(
            class_map(logits.detach()), mask, settings.num_classes, settings.ignore_index
        )
    return loss.detach(), valid


def finish_update(run: Pass, update: Update) -> None:
    """End an update: gradients rescaled (weighted parts) and averaged across ranks, the one read, then the
    optimizer step (or the non-finite handling), the budget lowered if any rank ran out of memory, the sums."""
    settings, progress = run.settings, run.progress
    if update.weighted:
        factor = (update.unit.double() / update.valid.clamp_min(1)).float()
        for p in run.params:
            if p.grad is not None:
                p.grad.mul_(factor.to(p.grad.dtype))
    if run.world > 1:
        average_gradients(run.params, run.world)
    log = run.bar is not None and (progress.batches_done + update.batches) // settings.log_every > (
        progress.batches_done // settings.log_every
    )
    finite, proposal, shown = read_update(update, run.totals, run.confusion, log)
    lower_budget(settings.budget, proposal)
    if not finite:
        _non_finite(update.totals[0], update.names, progress, run.epoch, settings.skip_nonfinite, run.bar)
        run.optimizer.zero_grad(set_to_none=True)
        progress.batches_done += update.batches
        return
    if settings.grad_clip:
        run.scaler.unscale_(run.optimizer)
        torch.nn.utils.clip_grad_norm_(run.params, settings.grad_clip)
    run.scaler.step(run.optimizer)
    run.scaler.update()
    run.scheduler.step()
    progress.step += 1
    progress.batches_done += update.batches
    run.totals += update.totals
    run.confusion += update.confusion
    if shown is not None:
        _show(run.bar, shown, settings.num_classes, run.world, time.perf_counter() - run.started)


def average_gradients(params: list[torch.Tensor], world: int) -> None:
    """Every parameter's gradient averaged over the ``world`` ranks, one all-reduce per dtype (a parameter with
    no gradient on this rank takes part with zeros, and receives the average)."""
    by_dtype: dict[torch.dtype, list[torch.Tensor]] = {}
    for p in params:
        if p.requires_grad:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
            by_dtype.setdefault(p.grad.dtype, []).append(p)
    for group in by_dtype.values():
        flat = torch.cat([p.grad.reshape(-1) for p in group])
        distributed.reduce_sum(flat).div_(world)
        for p, chunk in zip(group, flat.split([p.numel() for p in group])):
            p.grad.copy_(chunk.view(p.grad.shape))


def read_update(
    update: Update, totals: torch.Tensor, confusion: torch.Tensor, log: bool
) -> tuple[bool, float, list[float] | None]:
    """The update's one read: whether every rank's loss is finite and the smallest budget any rank proposes after
    running out of memory (one all-reduce MIN of both), and with ``log`` the totals so far, in one transfer.

    All ranks must agree to step or to skip, or DDP hangs, and on the budget, or their samplers part ways.
    Returns (finite, proposal (infinite: none), None) or with ``log`` also [loss sum, batches, real pixels, the
    K x K confusion matrix flattened] for the progress bar.
    """
    finite = torch.isfinite(update.totals[0]).double().reshape(1)
    proposal = torch.full((1,), update.proposal, dtype=torch.float64, device=finite.device)
    agreed = distributed.reduce_min(torch.cat([finite, proposal]))
    if not log:
        packet = agreed.tolist()
        return packet[0] > 0, packet[1], None
    packet = torch.cat([agreed, totals, confusion.flatten().double()]).tolist()
    return packet[0] > 0, packet[1], packet[2:]


def lower_budget(budget: Budget, proposal: float) -> None:
    """Lower ``budget`` to ``proposal`` (pixels), when it is a lower one, for the rest of the run."""
    if math.isfinite(proposal) and (budget.pixels is None or proposal < budget.pixels):
        budget.pixels = max(1, int(proposal))
        budget.events += 1


def report_out_of_memory(run: Pass, batch, shape: torch.Size, failed: int, fit: int) -> None:
    """One line on the console for a batch that ran out of memory and was redone in parts, with the numbers."""
    rank = f" (rank {distributed.environment().rank})" if run.world > 1 else ""
    before = run.settings.budget.pixels
    was = pixels_text(before) if before is not None else "none (data.batch_size)"
    names = list(batch.name) if isinstance(batch.name, list) else [batch.name]
    message = (
        f"srforge: out of memory{rank} at step {run.progress.step + 1} (epoch {run.epoch + 1}) on {pixels_text(failed)}"
        f" of a batch of {shape[0]} scans padded to {shape[-2]} x {shape[-1]} ({', '.join(map(str, names[:4]))}"
        f"{', ...' if len(names) > 4 else ''}): redone in parts of at most {pixels_text(fit)} whose gradients add "
        f"up to the same update; the pixel budget is lowered from {was} to {pixels_text(fit)} for the rest of "
        "the run."
    )
    tqdm.write(message)


def scan_too_large(batch, index: int, shape: torch.Size, device: torch.device) -> ScanTooLargeError:
    """The error for scan ``index`` of ``batch``, which ran out of memory as a batch of its own."""
    names = batch.name if isinstance(batch.name, list) else [batch.name]
    height, width = batch.sizes[index].tolist()
    pixels = shape[-2] * shape[-1]
    return ScanTooLargeError(
        f"scan '{names[index]}' ({height} x {width} px, padded to {shape[-2]} x {shape[-1]} = {pixels_text(pixels)}) "
        f"does not fit in the memory of {device} even as a batch of its own. Make its step smaller: "
        "model.checkpointing=true, train.precision=bf16, data.crop=[H, W] (train on random crops of large scans), "
        "or a smaller model (model.base_channels)."
    )


def _non_finite(loss: torch.Tensor, names: list, progress: Progress, epoch: int, skip: bool, bar: tqdm | None) -> None:
    """A non-finite loss: NonFiniteLossError naming the step and the update's samples, or with ``skip`` a line."""
    message = f"non-finite loss {loss.item()} at step {progress.step + 1} (epoch {epoch + 1}) on samples {names}"
    if not skip:
        raise NonFiniteLossError(message + "; set train.skip_nonfinite=true to skip such batches.")
    if bar is not None:
        tqdm.write(f"srforge: skipped a batch with a {message}")


def _show(bar: tqdm, packet: list[float], num_classes: int, world: int, seconds: float) -> None:
    """Loss, mean IoU and real px/s (this rank's, times the ranks) on the bar, from the numbers read."""
    loss_sum, batches, pixels = packet[:3]
    if not batches:
        return
    confusion = torch.tensor(packet[3:], dtype=torch.float64).view(num_classes, num_classes)
    bar.set_postfix(
        loss=f"{loss_sum / batches:.4f}",
        mIoU=f"{scores(confusion)['mean_iou']:.3f}",
        px_s=f"{pixels * world / max(seconds, 1e-9):.3g}",
    )


def probe_memory(model: torch.nn.Module, settings: StepSettings) -> StepMemory:
    """The measured memory of one training step of ``model`` as ``settings`` run it (precision, channels_last, the
    model's own checkpointing), from :func:`srforge.runtime.memory.measure_step_memory`.

    The step: forward of a blank [1, C, H, W] uint8 image, the training loss against an all-class-0 mask, backward;
    its gradients are dropped after. AdamW's two moments per parameter (the optimizer state a real step adds) are
    counted into the fixed part. The model's weights and the random number generators are left as they were.
    """
    device = settings.device

    def run_at(height: int, width: int) -> None:
        image = torch.zeros((1, model.in_channels, height, width), dtype=torch.uint8, device=device)
        if settings.channels_last:
            image = image.contiguous(memory_format=torch.channels_last)
        mask = torch.zeros((1, height, width), dtype=torch.int64, device=device)
        sizes = torch.tensor([[height, width]], device=device)
        with autocast(device, settings.precision):
            logits = model(image, sizes)
        probe_loss(logits, mask, settings.ignore_index, settings.dice_weight).backward()
        model.zero_grad(set_to_none=True)

    trainable = [p for p in model.parameters() if p.requires_grad]
    optimizer_bytes = 2.0 * sum(p.numel() * p.element_size() for p in trainable)
    was_training = model.training
    model.train()
    try:
        with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
            return measure_step_memory(
                run_at,
                model.size_divisor,
                device,
                settings.precision,
                optimizer_bytes=optimizer_bytes,
                checkpointing=bool(getattr(model, "checkpointing", False)),
            )
    finally:
        model.zero_grad(set_to_none=True)
        model.train(was_training)


@torch.no_grad()
def evaluate(model: torch.nn.Module, loader, settings: StepSettings) -> dict[str, Any]:
    """Validation over ``loader``, summed across ranks: the loss as training measures it, and per-class scores.

    Returns :func:`srforge.train.metrics.scores` of the confusion matrix over valid pixels, plus ``loss`` (the
    mean over batches of the batch loss; NaN with no batch). Sums stay on the device until the one read at the end.
    """
    device, num_classes, ignore_index = settings.device, settings.num_classes, settings.ignore_index
    model.eval()
    confusion = torch.zeros(num_classes, num_classes, dtype=torch.int64, device=device)
    totals = torch.zeros(2, dtype=torch.float64, device=device)  # loss sum, batches
    for batch in loader:
        image, mask, sizes = to_device(batch, device, settings.channels_last)
        with autocast(device, settings.precision):
            logits = model(image, sizes)
        totals += _totals(segmentation_loss(logits, mask, ignore_index, settings.dice_weight), sizes)[:2]
        confusion += confusion_matrix(class_map(logits), mask, num_classes, ignore_index)
    distributed.reduce_sum(confusion)
    distributed.reduce_sum(totals)
    model.train()
    out = scores(confusion.cpu())
    loss_sum, batches = totals.tolist()
    out["loss"] = loss_sum / batches if batches else float("nan")
    return out
