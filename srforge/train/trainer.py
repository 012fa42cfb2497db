"""The Trainer: one object that owns a run's model, optimization, batches, pixel budget and progress.

    Trainer(cfg, processes, run_dir, ckpt)          builds everything from the config; a checkpoint restores it
    train()      before_train; run_epoch() until the last epoch (or a hook stops it); after_train
    run_epoch()  before_epoch; run_step() per optimizer update, after_step after each; after_epoch
    run_step()   the next train.accumulate batches: run_batch() each -> forward, loss, .backward(); one read; step

Everything else a run does is a hook (:mod:`srforge.train.hooks`): validation, best.pt and last.pt, the metrics
files, TensorBoard and the console, the progress bar, writing last.pt when a run is stopped, EMA of the weights,
early stopping, and the user's own. :meth:`Trainer.state_dict` composes each stateful part's own state (model,
optimizer, scheduler, scaler, sampler, pixel budget, hooks, random generators), so a resumed run continues with
the same bits.

One optimizer update, read on the device: every number the loop keeps (loss sums, batch and pixel counts, the
confusion matrix) stays there; the one value an update reads back is whether every rank's loss is finite (the step
cannot be taken otherwise), together with the pixel budget any rank proposes after running out of memory, and every
``train.log_every`` batches the running totals for the progress bar travel in that same transfer. On a GPU each
read drains the queue of launched kernels, so it comes after the backward pass is queued.

Gradient accumulation and batches in parts: with ``train.accumulate`` > 1, or when a batch is redone in parts,
each part's loss is weighted by its share of the update's valid pixels (:func:`srforge.train.losses.valid_pixels`)
so that the gradients add up to those of one batch holding every part (exactly for the cross-entropy; the Dice term
becomes the valid-pixel-weighted mean of the parts' Dice). The weights need the update's total before its last part
is known, so each part is weighted against the first part's count and the gradients are rescaled once at the end.

Out of memory in a forward or backward pass (:func:`srforge.runtime.device_memory.is_out_of_memory`) does not end the
run: the part's gradients are dropped, the batch is redone in halves (each half again, as needed) that add up to
the same update, and the pixel budget (:class:`srforge.train.pixel_budget.PixelBudget`) is lowered to the largest part
that fit. Only a single scan that fails alone ends the run (ScanTooLargeError, naming it; last.pt is written).

Under torchrun every forward and backward runs in DDP's ``no_sync`` mode and the gradients are averaged by one
all-reduce at the end of the update, before its read: a rank that runs out of memory redoes its batch in parts
alone while the others wait at that all-reduce, and the ranks agree on the lowered budget through the read.
"""

from __future__ import annotations

import functools
import itertools
import math
import time
from collections.abc import Iterator
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch.nn.parallel import DistributedDataParallel
from tqdm import tqdm

from srforge.config import ConfigError
from srforge.config.schema import Config
from srforge.constants import UNET_CLASSES
from srforge.data import DataError
from srforge.models.class_map import class_map
from srforge.models.contract import class_name
from srforge.runtime import distributed
from srforge.runtime.checkpoint import class_names_or_default
from srforge.runtime.device import autocast
from srforge.runtime.device_memory import is_out_of_memory, pixels_text
from srforge.runtime.distributed import Processes
from srforge.train.from_config import (
    build_data,
    build_loaders,
    build_model,
    build_optimization,
    crop_training_scans,
    scan_warnings,
    set_checkpointing,
    training_device,
    wrap_for_training,
)
from srforge.train.hooks import built_in_hooks, user_hooks
from srforge.train.losses import segmentation_loss, valid_pixels
from srforge.train.metrics import confusion_matrix, scores
from srforge.train.pixel_budget import PixelBudget, ScanTooLargeError, plan_memory, scan_too_large
from srforge.train.prepare import write_run_config
from srforge.train.rng import rng_state, seed_everything, set_rng_state
from srforge.train.stop import PeerLostError, WorkerLostError, cause, peer_lost, worker_lost


class NonFiniteLossError(RuntimeError):
    """The loss became NaN or infinite; the message names the step and the batch's samples."""


@dataclass
class Update:
    """The optimizer update being gathered: its batches' sums (added to the epoch's only if it is stepped), their
    sample names, and the loss weights' state: ``unit`` (valid pixels of its first weighted part, at least 1),
    ``valid`` (valid pixels of every weighted part so far), ``weighted`` (whether any part was weighted, so that
    the gradients need rescaling by unit / valid), ``proposal`` (the budget this rank proposes after running out of
    memory; infinite when it did not)."""

    totals: torch.Tensor  # float64 [3]: loss sum, batches, real pixels
    confusion: torch.Tensor  # int64 [K, K]
    names: list = field(default_factory=list)
    batches: int = 0
    unit: torch.Tensor | None = None
    valid: torch.Tensor | None = None
    weighted: bool = False
    proposal: float = math.inf


class Trainer:
    """A training run: builds its parts from ``cfg`` in this process (``processes``, from srforge.runtime.
    distributed), writes into ``run_dir`` (main process; ``lock``, the run folder's FolderLock, is checked before
    every checkpoint), and continues ``ckpt`` when given.

    Progress is ``epoch`` (complete epochs), ``step`` (optimizer updates) and ``batches_done`` (of the running
    epoch, skipped ones too), advanced update by update, so that a stop anywhere knows what last.pt must hold: an
    update boundary. ``row`` is the running epoch's metrics row (hooks add to it), ``summary`` what :meth:`train`
    returns, ``averaged`` the model that validation and best.pt use when it is not ``model`` (EMA), and
    ``stop_requested`` ends the run after the running epoch (early stopping).
    """

    def __init__(
        self, cfg: Config, processes: Processes, run_dir: Path, ckpt: dict[str, Any] | None = None, *, lock=None
    ):
        tcfg, dcfg, seed = cfg.train, cfg.data, cfg.run.seed
        self.cfg, self.processes, self.run_dir, self.lock = cfg, processes, Path(run_dir), lock
        self.device = training_device(processes, cfg.run.device, tcfg.precision)
        seed_everything(seed)
        depth = cfg.model.depth if cfg.model.class_ in UNET_CLASSES else None  # others' divisors come from them
        k, layout = cfg.model.num_classes, tcfg.channels_last
        data = build_data(dcfg, num_classes=k, seed=seed, run_dir=self.run_dir, depth=depth, channels_last=layout)
        self.model, self.model_args = build_model(cfg.model, self.device, tcfg.channels_last, load_weights=ckpt is None)
        set_checkpointing(self.model, cfg.model.checkpointing)
        crop_training_scans(data, dcfg.crop, self.model.size_divisor)
        if processes.main:
            for line in scan_warnings(data, self.model.size_divisor):
                print(f"srforge: warning: {line}")
        self.loss = functools.partial(segmentation_loss, ignore_index=dcfg.ignore_index, dice_weight=tcfg.dice_weight)
        self.memory, pixels = plan_memory(cfg, self.model, data, self.device, processes)
        self.loaders = build_loaders(
            dcfg, data, divisor=self.model.size_divisor, seed=seed, processes=processes, device=self.device,
            max_pixels=pixels, channels_last=tcfg.channels_last,
        )  # fmt: skip
        self.budget = PixelBudget(pixels, self.loaders.sampler)
        if ckpt is not None:  # before the schedule counts the epoch's batches, which the budget cuts
            self.budget.load_state_dict(ckpt.get("memory"))
        self.optimizer, self.scheduler, self.scaler = build_optimization(
            self.model,
            device=self.device,
            lr=tcfg.lr,
            weight_decay=tcfg.weight_decay,
            warmup_steps=tcfg.warmup_steps,
            min_lr_ratio=tcfg.min_lr_ratio,
            total_steps=tcfg.epochs * math.ceil(len(self.loaders.sampler) / tcfg.accumulate),
            precision=tcfg.precision,
        )
        self.epoch = self.step = self.batches_done = 0
        self.row: dict[str, Any] = {}
        self.summary: dict[str, Any] = {"run_dir": str(self.run_dir), "best_mean_iou": -math.inf}
        self.summary["class_names"] = class_names_or_default(cfg.model.class_names, cfg.model.num_classes)
        self.averaged: torch.nn.Module | None = None
        self.stop_requested, self.stopped_by, self.saved_at = False, None, "last.pt (rank 0 writes it)"
        self.saved_epoch_end: int | None = None  # the epoch whose end last.pt holds, once this run wrote it
        self.stepped, self.update_batches, self.shown = False, 0, None
        self.start_pass()
        before, after = built_in_hooks(self)  # EMA copies the model: before it is compiled
        named = [*((h.name, h) for h in before), *user_hooks(tcfg.hooks), *((h.name, h) for h in after)]
        self.hook_names, self.hooks = [name for name, _ in named], [hook for _, hook in named]
        for hook in self.hooks:
            hook.trainer = self
        self.net = wrap_for_training(self.model, compile=tcfg.compile, world=processes.world, device=self.device)
        if ckpt is not None:
            self.load_state_dict(ckpt)
            if processes.main:
                print(f"srforge: resuming {self.run_dir.resolve()} at epoch {self.epoch + 1}, step {self.step}")
        if processes.main:
            write_run_config(self.run_dir, cfg)

    @property
    def params(self) -> list[torch.Tensor]:
        """The parameters the optimizer updates: their gradients are clipped, averaged and set aside."""
        return [p for group in self.optimizer.param_groups for p in group["params"]]

    # -- the loop ------------------------------------------------------------------------------------------------
    def train(self) -> dict[str, Any]:
        """Run the epochs due (``train.epochs``, at most ``train.stop_after`` of them in this call); returns the
        summary: the last epoch's metrics row, the best validation mean IoU, the run folder, the class names.

        A Ctrl-C or SIGTERM, a DataLoader worker the system killed (WorkerLostError) or a scan too large for the
        device even alone (ScanTooLargeError) stops the run resumably: the hooks' after_train sees
        ``stopped_by`` (last.pt is written at the batch reached), then the error propagates. Another torchrun
        process that died (a failed collective) is a PeerLostError saying what last.pt holds; nothing more is
        written, since the ranks can no longer agree.
        """
        tcfg = self.cfg.train
        last = tcfg.epochs if tcfg.stop_after is None else min(tcfg.epochs, self.epoch + tcfg.stop_after)
        if self.epoch >= tcfg.epochs and self.processes.main:
            print(f"srforge: {self.run_dir} has trained all {tcfg.epochs} epochs (train.epochs); nothing to do. "
                  "Raise train.epochs to train further.")  # fmt: skip
        self.call("before_train")
        try:
            while self.epoch < last and not self.stop_requested:
                self.run_epoch()
        except KeyboardInterrupt as interrupt:
            self.stopped_by = cause(interrupt)
            self.call("after_train")
            raise
        except RuntimeError as error:
            peer = peer_lost(error, self.processes.world)
            if peer is not None:  # the group is broken: nothing more can be agreed on, last.pt stays as saved
                raise PeerLostError(
                    f"{peer}; {self.saved_at_epoch_end()} Resume the job as it was started (torchrun "
                    f"--nproc_per_node={self.processes.world} ...) with --resume {self.run_dir}"
                ) from None
            too_large = isinstance(error, ScanTooLargeError)
            self.stopped_by = str(error) if too_large else worker_lost(error)
            if self.stopped_by is None:
                raise
            kind = ScanTooLargeError if too_large else WorkerLostError
        if self.stopped_by is not None:  # past the except block: the epoch's DataLoader and its workers are gone
            self.call("after_train")
            raise self.stop_error(kind)
        self.call("after_train")
        distributed.barrier()
        return self.summary

    def run_epoch(self) -> None:
        """One epoch's training pass, update by update, then the epoch's hooks (validation, checkpoints, logs).
        A resumed epoch skips the batches its checkpoint had done."""
        self.budget.start_epoch(fresh=self.batches_done == 0)
        loader = self.loaders.epoch(self.epoch, skip=self.batches_done)
        self.epoch_batches, first = len(loader), self.batches_done
        self.start_pass()
        self.call("before_epoch")
        self.net.train()
        batches = iter(loader)
        while self.run_step(batches):
            self.call("after_step")
        del batches, loader  # the workers end before the hooks write files
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)  # once an epoch: the seconds include the last steps' queued kernels
        self.row = self.epoch_row(first)
        self.call("after_epoch")
        self.summary.update(self.row)
        self.epoch, self.batches_done = self.epoch + 1, 0

    def run_step(self, batches: Iterator) -> bool:
        """One optimizer update over the next ``train.accumulate`` batches (fewer at the epoch's end); False when
        there was none left."""
        update = Update(*self.zeros())
        self.optimizer.zero_grad(set_to_none=True)
        for batch in itertools.islice(batches, self.cfg.train.accumulate):
            self.run_batch(update, batch)
        if not update.batches:
            return False
        self.finish_update(update)
        return True

    def run_batch(self, update: Update, batch) -> None:
        """Forward and backward of one collated batch into the gradients: whole, or in parts of at most the
        budget's pixels, halving any part that runs out of memory; its sums into ``update``."""
        image, mask, sizes = self.to_device(batch)
        names = batch.name if isinstance(batch.name, list) else [batch.name]
        count, per_part, pixels = image.shape[0], self.budget.scans_per_part(image.shape), image[0, 0].numel()
        parts = [(lo, min(lo + per_part, count)) for lo in range(0, count, per_part)]
        weighted = self.cfg.train.accumulate > 1 or len(parts) > 1
        losses, failed_at, largest_fit = [], None, 0
        while parts:
            lo, hi = parts.pop(0)
            done = self.try_part(update, (image[lo:hi], mask[lo:hi], sizes[lo:hi]), weighted)
            if done is None:  # out of memory: every part of this batch from now on is weighted
                failed_at = failed_at or (hi - lo) * pixels
                if hi - lo == 1:
                    raise scan_too_large(names, batch.sizes, lo, image.shape, self.device)
                if not weighted:
                    weighted, losses = True, []
                parts[:0] = [(lo, (lo + hi) // 2), ((lo + hi) // 2, hi)]
                continue
            losses.append(done)
            if failed_at is not None:
                largest_fit = max(largest_fit, (hi - lo) * pixels)
        update.weighted |= weighted
        update.totals += self.batch_totals(losses, mask, sizes)
        update.names.extend(names)
        update.batches += 1
        if failed_at is not None:
            update.proposal = min(update.proposal, largest_fit)
            self.report_out_of_memory(names, image.shape, failed_at, largest_fit)

    def try_part(self, update: Update, part: tuple, weighted: bool) -> tuple[torch.Tensor, Any] | None:
        """Forward, loss and backward of one part (image, mask, sizes), its gradients added to those held so far;
        the loss weighted by its share of the update's valid pixels when ``weighted``. Returns (its loss, detached;
        its valid pixels or None), or None when the device ran out of memory, with no trace of the part left in the
        gradients (those so far are set aside during the backward and put back). Under DDP the backward does not
        reduce (the update averages once at its end)."""
        image, mask, sizes = part
        params = self.params
        held = [p.grad for p in params]
        for p in params:
            p.grad = None
        valid = unit = None
        try:
            with self.net.no_sync() if isinstance(self.net, DistributedDataParallel) else nullcontext():
                with autocast(self.device, self.cfg.train.precision):
                    logits = self.net(image, sizes.clone())  # the model's own copy: srforge counts with sizes
                loss = self.loss(logits, mask)
                scaled = loss
                if weighted:
                    valid = valid_pixels(mask, self.cfg.data.ignore_index)
                    unit = update.unit if update.unit is not None else valid.clamp_min(1)
                    scaled = loss * (valid.double() / unit).to(loss.dtype)
                self.scaler.scale(scaled).backward()
            done = loss.detach(), valid
        except RuntimeError as error:
            if not is_out_of_memory(error):
                raise
            done = logits = None
        for p, old in zip(params, held):
            p.grad = old if done is None or p.grad is None else (p.grad if old is None else old.add_(p.grad))
        if done is None:
            if self.device.type == "cuda":
                torch.cuda.empty_cache()  # the failed part's blocks, in sizes the halves may not reuse
            return None
        if weighted:  # the part is in the gradients: its pixels count
            update.unit, update.valid = unit, valid if update.valid is None else update.valid + valid
        with torch.no_grad():
            update.confusion += confusion_matrix(
                class_map(logits.detach()), mask, self.cfg.model.num_classes, self.cfg.data.ignore_index
            )
        return done

    def finish_update(self, update: Update) -> None:
        """End an update: gradients rescaled (weighted parts) and averaged across ranks, the one read, then the
        optimizer step (or the non-finite handling), the budget lowered if any rank ran out of memory, the sums."""
        tcfg = self.cfg.train
        if update.weighted:
            factor = (update.unit.double() / update.valid.clamp_min(1)).float()
            for p in self.params:
                if p.grad is not None:
                    p.grad.mul_(factor.to(p.grad.dtype))
        if self.processes.world > 1:
            average_gradients(self.params, self.processes.world)
        every = tcfg.log_every
        log = self.processes.main and (self.batches_done + update.batches) // every > self.batches_done // every
        finite, proposal, self.shown = self.read_update(update, log)
        self.budget.lower(proposal)
        self.batches_done += update.batches
        self.stepped, self.update_batches = finite, update.batches
        if not finite:
            self.non_finite(update)
            self.optimizer.zero_grad(set_to_none=True)
            return
        if tcfg.grad_clip:
            self.scaler.unscale_(self.optimizer)
            torch.nn.utils.clip_grad_norm_(self.params, tcfg.grad_clip)
        self.scaler.step(self.optimizer)
        self.scaler.update()
        self.scheduler.step()
        self.step += 1
        self.totals += update.totals
        self.confusion += update.confusion

    def start_pass(self) -> None:
        """Zero the training pass's sums (on the device: loss sum, batches stepped, real pixels; the confusion
        matrix of the predictions taken in training) and start its clock."""
        self.totals, self.confusion = self.zeros()
        self.started = time.perf_counter()

    # -- the pieces of a step ------------------------------------------------------------------------------------
    def zeros(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(float64 [3], int64 [K, K]) zeros on the device: an update's totals and confusion matrix."""
        k = self.cfg.model.num_classes
        return (
            torch.zeros(3, dtype=torch.float64, device=self.device),
            torch.zeros(k, k, dtype=torch.int64, device=self.device),
        )

    def to_device(self, batch) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(image uint8 [B, C, H, W], mask int64 [B, H, W], sizes int64 [B, 2]) of a collated batch, on the device.

        Images and masks travel as uint8 (masks as int64 only for more than 255 classes); the model normalises the
        image on the device, and the mask is widened there because cross-entropy takes int64 targets. ``sizes``
        is a copy: what the model does to its view of them is never what srforge counts with.
        """
        image = batch.image.to(self.device, non_blocking=True)
        mask = batch.mask.to(self.device, non_blocking=True).long()
        sizes = batch.sizes.to(self.device, non_blocking=True)
        if self.cfg.train.channels_last:
            image = image.contiguous(memory_format=torch.channels_last)
        return image, mask, sizes

    def batch_totals(self, parts: list, mask: torch.Tensor, sizes: torch.Tensor) -> torch.Tensor:
        """float64 [3] on the device: (the batch's loss, 1 batch, its real pixels). The loss of a batch run whole
        is its own; of one in parts, the parts' (loss, valid pixels) weighted by their shares of its valid pixels."""
        if len(parts) == 1:
            loss = parts[0][0].detach().double()
        else:
            total = valid_pixels(mask, self.cfg.data.ignore_index).clamp_min(1).double()
            loss = sum(part.double() * valid / total for part, valid in parts)
        return torch.stack([loss, torch.ones_like(loss), sizes.prod(1).sum().double()])

    def read_update(self, update: Update, log: bool) -> tuple[bool, float, list[float] | None]:
        """The update's one read: whether every rank's loss is finite and the smallest budget any rank proposes
        after running out of memory (one all-reduce MIN of both), and with ``log`` the epoch's totals so far, in
        one transfer. All ranks must agree to step or to skip, or DDP hangs, and on the budget, or their samplers
        part ways. Returns (finite, proposal (infinite: none), [loss sum, batches, real pixels, the K x K confusion
        matrix flattened] with ``log``, else None)."""
        finite = torch.isfinite(update.totals[0]).double().reshape(1)
        proposal = torch.full((1,), update.proposal, dtype=torch.float64, device=finite.device)
        agreed = distributed.reduce_min(torch.cat([finite, proposal]))
        if not log:
            packet = agreed.tolist()
            return packet[0] > 0, packet[1], None
        values = torch.cat([agreed, self.totals, self.confusion.flatten().double()]).tolist()
        return values[0] > 0, values[1], values[2:]

    def non_finite(self, update: Update) -> None:
        """A non-finite loss: NonFiniteLossError naming the step and the update's samples, or with
        ``train.skip_nonfinite`` a line (main process)."""
        message = (
            f"non-finite loss {update.totals[0].item()} at step {self.step + 1} (epoch {self.epoch + 1}) on samples "
            f"{update.names}"
        )
        if not self.cfg.train.skip_nonfinite:
            raise NonFiniteLossError(message + "; set train.skip_nonfinite=true to skip such batches.")
        if self.processes.main:
            tqdm.write(f"srforge: skipped a batch with a {message}")

    def report_out_of_memory(self, names: list, shape: torch.Size, failed: int, fit: int) -> None:
        """One line on the console for a batch that ran out of memory and was redone in parts, with the numbers."""
        rank = f" (rank {self.processes.rank})" if self.processes.world > 1 else ""
        before = self.budget.pixels
        was = pixels_text(before) if before is not None else "none (data.batch_size)"
        tqdm.write(
            f"srforge: out of memory{rank} at step {self.step + 1} (epoch {self.epoch + 1}) on {pixels_text(failed)}"
            f" of a batch of {shape[0]} scans padded to {shape[-2]} x {shape[-1]} ({', '.join(map(str, names[:4]))}"
            f"{', ...' if len(names) > 4 else ''}): redone in parts of at most {pixels_text(fit)} whose gradients "
            f"add up to the same update; the pixel budget is lowered from {was} to {pixels_text(fit)} for the rest "
            "of the run."
        )

    # -- the epoch's numbers, validation ---------------------------------------------------------------------------
    def epoch_row(self, first: int) -> dict[str, Any]:
        """The training pass's metrics row, summed across ranks; an error for a pass that taught nothing."""
        seconds = time.perf_counter() - self.started
        loss_sum, stepped, pixels = distributed.reduce_sum(self.totals).tolist()
        train_scores = scores(distributed.reduce_sum(self.confusion).cpu())
        no_class = math.isnan(train_scores["pixel_accuracy"])  # NaN exactly when no pixel had a class
        self.check_learned(self.batches_done - first, stepped, whole=first == 0, no_class=no_class)
        return {
            "epoch": self.epoch + 1,
            "step": self.step,
            "lr": self.scheduler.get_last_lr()[0],
            "train_loss": loss_sum / max(stepped, 1),
            "train_mean_iou": train_scores["mean_iou"],
            "real_pixels_per_s": pixels / seconds,
            "seconds": seconds,
            "bytes_per_pixel": self.memory.bytes_per_pixel,
            "max_pixels": self.budget.pixels,
            "out_of_memory": self.budget.events,
        }

    def check_learned(self, batches: int, stepped: float, *, whole: bool, no_class: bool) -> None:
        """An error for a training pass that taught nothing: ``batches`` run, none ``stepped`` (every loss NaN or
        infinite, skipped by train.skip_nonfinite), or a ``whole`` epoch in which not one pixel had a class
        (``no_class``: every mask all data.ignore_index). Without it the run would end "done" with NaN scores."""
        epoch = self.epoch + 1
        if batches and not stepped:
            raise NonFiniteLossError(
                f"every batch of epoch {epoch} was skipped as non-finite ({batches} batches, train.skip_nonfinite="
                "true): no step was taken. Look for NaN or infinite pixels in the images, or lower train.lr if the "
                "loss diverged."
            )
        if whole and stepped and no_class:
            ignore, k = self.cfg.data.ignore_index, self.cfg.model.num_classes
            raise DataError(
                f"no training pixel has a class: every mask of the training set is data.ignore_index={ignore} (epoch "
                f"{epoch}, {batches} batches), so there is nothing to learn. Check that the masks hold class ids "
                f"0..{k - 1}, or set data.ignore_index to the value that marks unlabelled pixels."
            )

    @torch.no_grad()
    def validate(self, model: torch.nn.Module) -> dict[str, Any]:
        """Validation of ``model`` (the bare model or its average: no gradients to average) over this rank's
        validation batches, summed across ranks: :func:`srforge.train.metrics.scores` of the confusion matrix over
        valid pixels, plus ``loss`` (the mean over batches of the training loss; NaN with no batch). Sums stay on
        the device until the one read at the end."""
        k = self.cfg.model.num_classes
        model.eval()
        confusion = torch.zeros(k, k, dtype=torch.int64, device=self.device)
        totals = torch.zeros(3, dtype=torch.float64, device=self.device)  # loss sum, batches, pixels
        for batch in self.loaders.val:
            image, mask, sizes = self.to_device(batch)
            with autocast(self.device, self.cfg.train.precision):
                logits = model(image, sizes.clone())
            totals += self.batch_totals([(self.loss(logits, mask), None)], mask, sizes)
            confusion += confusion_matrix(class_map(logits), mask, k, self.cfg.data.ignore_index)
        distributed.reduce_sum(confusion)
        distributed.reduce_sum(totals)
        model.train()
        out = scores(confusion.cpu())
        loss_sum, batches, _ = totals.tolist()
        out["loss"] = loss_sum / batches if batches else float("nan")
        return out

    # -- state ---------------------------------------------------------------------------------------------------
    def state_dict(self, *, epoch_end: bool = False) -> dict[str, Any]:
        """The training state, each stateful part's own: progress (``epoch_end``: as at the end of the running
        epoch, else at the batch reached), model, optimizer, scheduler, scaler, sampler, pixel budget, every hook
        that has state (by its name), the random generators."""
        named = zip(self.hook_names, self.hooks)
        hooks = {name: hook.state_dict() for name, hook in named if name and hasattr(hook, "state_dict")}
        return {
            "epoch": self.epoch + 1 if epoch_end else self.epoch,
            "step": self.step,
            "batches_done": 0 if epoch_end else self.batches_done,
            "world": self.processes.world,
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "scaler": self.scaler.state_dict(),
            "sampler": self.loaders.sampler.state_dict(),
            "memory": self.budget.state_dict(),
            "hooks": hooks,
            "rng": rng_state(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`state_dict` saved. A hook's state is given to the configured hook of that name; a
        state no hook claims is left alone (a checkpoint names no code to run). The random generators last."""
        self.epoch, self.step, self.batches_done = state["epoch"], state["step"], state.get("batches_done", 0)
        saved_world = state.get("world", self.processes.world)
        if self.batches_done and saved_world != self.processes.world:
            raise ConfigError(
                f"--resume: this checkpoint was written in the middle of epoch {self.epoch + 1} by {saved_world} "
                f"process(es), and this run has {self.processes.world}: each process's share of the epoch's batches "
                f"depends on their number, so the batches done cannot be skipped exactly. Resume with "
                f"{saved_world} process(es) (torchrun --nproc_per_node={saved_world}), or from a checkpoint written "
                "at the end of an epoch."
            )
        try:
            self.model.load_state_dict(state["model"])
        except RuntimeError as error:  # the model's code changed since the checkpoint: other shapes or names
            found = "; ".join(line.strip() for line in str(error).splitlines()[1:3])[:300]
            raise ConfigError(
                f"--resume: the checkpoint's weights do not fit the {class_name(self.model)} built now; its code or "
                f"arguments changed since the checkpoint was written ({found}). "
                "A resumed run keeps its model: restore the model's code, or start a new run in another run.dir."
            ) from None
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        if state["scaler"]:  # empty when the checkpoint was not trained in fp16: a resume in fp16 starts a fresh scale
            self.scaler.load_state_dict(state["scaler"])
        self.budget.load_state_dict(state.get("memory"))
        saved = state.get("hooks") or {}
        for name, hook in zip(self.hook_names, self.hooks):
            if name in saved and hasattr(hook, "load_state_dict"):
                hook.load_state_dict(saved[name])
        set_rng_state(state["rng"])

    def checkpoint(self, *, epoch_end: bool = False, weights: torch.nn.Module | None = None) -> dict[str, Any]:
        """What a checkpoint file holds: :meth:`state_dict` and the facts that rebuild the model from the file
        alone (srforge.runtime.checkpoint lists them). ``weights``: the module whose weights it keeps as the
        model's (best.pt keeps the averaged ones under EMA); the training state is the bare model's."""
        mcfg = self.cfg.model
        state = self.state_dict(epoch_end=epoch_end)
        if weights is not None:
            state["model"] = weights.state_dict()
        return {
            **state,
            "model_class": mcfg.class_,
            "model_args": self.model_args,
            "model_norm": mcfg.norm,
            "size_divisor": self.model.size_divisor,
            "class_names": self.summary["class_names"],
            "ignore_index": self.cfg.data.ignore_index,
            "image_mode": getattr(self.loaders.train.dataset, "image_mode", "RGB"),
            "config": self.cfg.to_dict(),
        }

    def call(self, event: str) -> None:
        """``event`` (before_train, before_epoch, after_step, after_epoch, after_train) on every hook, in order."""
        for hook in self.hooks:
            method = getattr(hook, event, None)
            if method is not None:
                method()

    def saved_at_epoch_end(self) -> str:
        """What last.pt holds when a run must stop without writing it: 'RUN/last.pt holds the end of epoch N.'"""
        if self.epoch == 0:
            return f"no epoch had ended, so {self.run_dir} holds no last.pt of this run (start it again)."
        return f"{self.run_dir / 'last.pt'} holds the end of epoch {self.epoch}."

    def stop_error(self, kind: type) -> RuntimeError:
        """The error (``kind``) a resumable stop other than Ctrl-C / SIGTERM ends the run with: what happened, what
        last.pt holds, how to continue."""
        if kind is ScanTooLargeError:
            return ScanTooLargeError(
                f"{self.stopped_by} Wrote {self.saved_at}; once it fits, continue with --resume {self.run_dir}"
            )
        return WorkerLostError(
            f"{self.stopped_by}; wrote {self.saved_at}. If memory ran short, use fewer data.num_workers (now "
            f"{self.loaders.num_workers}) or smaller batches (data.batch_size, data.max_pixels); then continue with "
            f"--resume {self.run_dir}"
        )


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
