"""One training epoch and one validation pass, with at most one read from the device per training step.

Every number the loop keeps (loss sums, batch and pixel counts, the confusion matrix) stays on the device. The
only value a step reads back is whether every rank's loss is finite -- the step cannot be taken otherwise -- and
every ``log_every`` steps the running totals for the progress bar travel in that same transfer. On a GPU each
read drains the queue of launched kernels, so the read comes after the backward pass is queued: the GPU works
through the backward while the host waits.

The loss is the same quantity in training and validation: the mean over batches of the batch's
:func:`srforge.train.losses.segmentation_loss` (cross-entropy over its valid pixels, plus ``dice_weight`` x
Dice), summed across ranks.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import torch
from tqdm import tqdm

from srforge.models.class_map import class_map
from srforge.runtime import distributed
from srforge.runtime.device import autocast
from srforge.train.losses import segmentation_loss
from srforge.train.metrics import confusion_matrix, scores


class NonFiniteLossError(RuntimeError):
    """The loss became NaN or infinite; the message names the step and the batch's samples."""


@dataclass
class Progress:
    """How far training got: optimizer steps taken and batches of the current epoch done (skipped ones too).

    Updated in place batch by batch, so that a Ctrl-C anywhere knows what to write into ``last.pt``.
    """

    step: int = 0
    batches_done: int = 0


@dataclass(frozen=True)
class StepSettings:
    """What a training step and a validation pass need besides the model and the batch.

    The first six serve both passes; the last three concern training alone (``evaluate`` ignores them):
    ``grad_clip`` (the gradient norm's bound; None or 0: no clipping), ``skip_nonfinite`` (skip a batch whose loss
    is NaN or infinite on any rank, instead of raising), ``log_every`` (the progress bar's numbers are read along
    with every ``log_every``-th step's one read).
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
    """One pass over ``loader``: forward, loss, backward, step. Returns the rank's totals on the device.

    ``net`` is what runs the batch (the model, or its DistributedDataParallel wrapper); gradients are clipped over
    ``optimizer``'s parameters. Returns (float64 [3] = loss sum, batches stepped, real pixels; int64 [K, K]
    confusion matrix of the predictions taken during training; seconds). A non-finite loss on any rank raises
    NonFiniteLossError, or with ``settings.skip_nonfinite`` skips the batch on every rank alike.
    """
    device, num_classes = settings.device, settings.num_classes
    totals = torch.zeros(3, dtype=torch.float64, device=device)
    confusion = torch.zeros(num_classes, num_classes, dtype=torch.int64, device=device)
    params = [p for group in optimizer.param_groups for p in group["params"]]
    started = time.perf_counter()
    for batch in loader:
        image, mask, sizes = to_device(batch, device, settings.channels_last)
        with autocast(device, settings.precision):
            logits = net(image, sizes)
        loss = segmentation_loss(logits, mask, settings.ignore_index, settings.dice_weight)
        optimizer.zero_grad(set_to_none=True)
        scaler.scale(loss).backward()
        log = bar is not None and (progress.batches_done + 1) % settings.log_every == 0
        finite, shown = _read_step(loss, totals, confusion, log)
        if not finite:
            _non_finite(loss, batch, progress, epoch, settings.skip_nonfinite, bar)
            optimizer.zero_grad(set_to_none=True)
            progress.batches_done += 1
            continue
        if settings.grad_clip:
            scaler.unscale_(optimizer)
            torch.nn.utils.clip_grad_norm_(params, settings.grad_clip)
        scaler.step(optimizer)
        scaler.update()
        scheduler.step()
        progress.step += 1
        progress.batches_done += 1
        with torch.no_grad():
            confusion += confusion_matrix(class_map(logits.detach()), mask, num_classes, settings.ignore_index)
            totals += _totals(loss, sizes)
        if shown is not None:
            _show(bar, shown, num_classes, world, time.perf_counter() - started)
    if device.type == "cuda":
        torch.cuda.synchronize(device)  # once an epoch: the seconds include the last steps' queued kernels
    return totals, confusion, time.perf_counter() - started


def _read_step(
    loss: torch.Tensor, totals: torch.Tensor, confusion: torch.Tensor, log: bool
) -> tuple[bool, list[float] | None]:
    """The step's one read: whether every rank's loss is finite, and with ``log`` the totals so far, in one transfer.

    All ranks must agree to step or to skip, or DDP hangs. Returns (finite, None) or (finite, [loss sum, batches,
    real pixels, the K x K confusion matrix flattened]) for the progress bar.
    """
    finite = distributed.reduce_min(torch.isfinite(loss.detach()).double().reshape(1))
    if not log:
        return bool(finite), None
    packet = torch.cat([finite, totals, confusion.flatten().double()]).tolist()
    return packet[0] > 0, packet[1:]


def _non_finite(loss: torch.Tensor, batch, progress: Progress, epoch: int, skip: bool, bar: tqdm | None) -> None:
    """A non-finite loss: NonFiniteLossError naming the step and the batch's samples, or with ``skip`` a line."""
    message = f"non-finite loss {loss.item()} at step {progress.step + 1} (epoch {epoch + 1}) on samples {batch.name}"
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
