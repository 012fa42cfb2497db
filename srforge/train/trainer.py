"""The Trainer: one object that owns a run's model, optimization, batches, progress, stopping and last.pt.

    Trainer(model, train_loader, val_loader, ...)   any model that meets srforge.models.contract, any loader of
                                                    AlignedCollate batches (Entry: image, mask, sizes, name)
    Trainer.from_config(cfg, ...)                   what srforge-train builds from a config (srforge.train.from_config)
    train()      before_train; run_epoch() until the last epoch (or a stop); after_train, always
    run_epoch()  before_epoch; run_step() per optimizer update, after_step after each; after_epoch
    run_step()   forward, loss, backward over the next ``accumulate`` batches; then the update

Everything else a run does is a hook (:mod:`srforge.train.hooks`): validation, the checkpoints at an epoch's end,
the metrics files, the progress bar, EMA of the weights, early stopping, and the user's own. Hooks read the trainer
through the attributes its docstring lists and change it only through :meth:`Trainer.request_stop`,
:meth:`Trainer.add_to_row`, :meth:`Trainer.use_averaged` and :meth:`Trainer.save`. The trainer alone decides
when a run stops and what last.pt holds.

What a first reading of :meth:`Trainer.run_step` may skip lives in :mod:`srforge.train.update`: the valid-pixel
weighting of accumulated parts, the redo in halves of a part that ran out of memory (the pixel budget,
:class:`srforge.train.pixel_budget.PixelBudget`, is lowered to the largest part that fit; a single scan that fails
alone ends the run resumably, ScanTooLargeError), DDP's no_sync and the one gradient all-reduce, and the update's
one device read (whether every rank's loss is finite, the budget proposed, every ``log_every`` updates the running
totals for the progress bar).
"""

from __future__ import annotations

import itertools
import math
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import torch
from tqdm import tqdm

from srforge.atomic import disk_full_names
from srforge.config import ConfigError
from srforge.data import DataError
from srforge.locks import LOCK_NAME, FolderLostError
from srforge.models.class_map import class_map
from srforge.models.contract import check_attributes, class_name
from srforge.runtime import distributed
from srforge.runtime.checkpoint import class_names_or_default, save_checkpoint
from srforge.runtime.device import autocast
from srforge.runtime.device_memory import pixels_text
from srforge.train.from_config import wrap_for_training
from srforge.train.hooks import check_hook_state, named_hooks
from srforge.train.losses import segmentation_loss, valid_pixels
from srforge.train.metrics import confusion_matrix, scores
from srforge.train.pixel_budget import PixelBudget, ScanTooLargeError, scan_too_large
from srforge.train.prepare import write_run_config
from srforge.train.rng import rng_state, set_rng_state, update_randomness
from srforge.train.settings import TrainSettings
from srforge.train.stop import PeerLostError, WorkerLostError, cause, interrupts_held, peer_lost, worker_lost
from srforge.train.update import (
    Update,
    average_gradients,
    backward_or_none,
    each_part,
    no_sync,
    parts_of,
    read_update,
    zero_sums,
)


class NonFiniteLossError(RuntimeError):
    """The loss became NaN or infinite; the message names the step and the batch's samples."""


class LoaderEpochs:
    """A plain iterable of batches (a DataLoader) as the Trainer asks for an epoch's batches: ``epoch(e, skip)``
    calls ``set_epoch(e)`` on its batch sampler, sampler and dataset where they have one, and leaves out the first
    ``skip`` batches (a resumed epoch). Exact resume mid-epoch holds when the order depends on the epoch alone."""

    def __init__(self, loader: Iterable):
        self.loader = loader
        self.num_workers = getattr(loader, "num_workers", 0)

    def epoch(self, epoch: int, skip: int = 0) -> _Skipped:
        parts = ("batch_sampler", "sampler", "dataset")  # each told the epoch: the order, the augmentation
        for part in (getattr(self.loader, name, None) for name in parts):
            if hasattr(part, "set_epoch"):
                part.set_epoch(epoch)
        return _Skipped(self.loader, skip)

    def state_dict(self) -> dict[str, Any]:
        return {}


class _Skipped:
    """``loader`` without its first ``skip`` batches, sized."""

    def __init__(self, loader: Iterable, skip: int):
        self.loader, self.skip = loader, skip

    def __len__(self) -> int:  # an iterable without a length (an IterableDataset's loader) counts as 0 for the bar
        try:
            return max(0, len(self.loader) - self.skip)
        except TypeError:
            return 0

    def __iter__(self):
        return itertools.islice(iter(self.loader), self.skip, None)


def model_facts(model: torch.nn.Module, class_names: Sequence[str] | None = None) -> dict[str, Any]:
    """What a checkpoint records to rebuild ``model`` from the file alone, for a model handed to the Trainer: its
    import path and the contract's arguments (a class that takes others needs them given as ``facts``)."""
    return {
        "model_class": f"{type(model).__module__}:{type(model).__qualname__}",
        "model_args": {"in_channels": model.in_channels, "num_classes": model.num_classes},
        "model_norm": "keep",
        "class_names": class_names_or_default(class_names, model.num_classes),
        "image_mode": "RGB",
        "config": None,
    }


class Trainer:
    """A training run of ``model`` on ``train_loader``'s batches, validated on ``val_loader``'s.

    ``train_loader``: any iterable of collated batches (``batch.image`` [B, C, H, W] uint8 or float, ``batch.mask``
    [B, H, W] class ids with ``settings.ignore_index`` in padding, ``batch.sizes`` [B, 2], ``batch.name``), e.g. a
    DataLoader with :class:`srforge.data.AlignedCollate`; or an object with ``epoch(epoch, skip)`` that returns one
    epoch's batches (srforge's own size-grouped loaders). ``optimizer`` (default AdamW, lr 1e-3), ``scheduler``
    (default constant), ``scaler`` (default: a GradScaler for fp16), ``loss`` (logits, mask) -> scalar (default
    cross-entropy over valid pixels), ``hooks`` run between validation and the checkpoints (objects, or (name, hook)
    pairs: a hook with state is saved under its name), ``settings`` (:class:`TrainSettings`), ``run_dir`` (where
    checkpoints and metrics go: None writes none), ``budget`` (:class:`PixelBudget`; None: no bound), ``memory``
    (the measured step memory, reported per epoch), ``facts`` (what checkpoints record of the model and its data;
    default :func:`model_facts`), ``lock`` (the run folder's FolderLock, checked before every write), ``cfg`` (the
    resolved config, when built from one), ``self_training`` (:class:`srforge.train.self_training.SelfTraining`:
    each update also learns from an unlabelled batch through the EMA teacher; None: off). A batch with a ``tube``
    field (:func:`srforge.data.skeleton.skeleton_tube`, padded with 0) gives it to the loss as ``tube=``.

    Documented attributes, for hooks to read: ``model`` (the bare model), ``net`` (what the step calls: compiled
    and/or DDP-wrapped), ``averaged`` (the weights validation and best.pt use when not ``model``: EMA),
    ``optimizer``, ``scheduler``, ``settings``, ``processes``, ``device``, ``run_dir``, ``val_loader``,
    ``num_classes``, ``epoch`` (complete epochs), ``step`` (optimizer updates), ``batches_done`` (of the running
    epoch), ``epoch_batches``, ``stepped``
    and ``update_batches`` (of the last update), ``progress`` (:class:`srforge.train.update.Progress` of the last
    read, or None), ``started`` (the pass's clock), ``row`` (the epoch's metrics), ``summary``, ``stop_requested``,
    ``stopped_by`` (why the run is stopping: "Ctrl-C", "SIGTERM", a message; None while it runs).
    """

    def __init__(  # noqa: PLR0913 (keyword-only options, as test_structure allows a public class)
        self,
        model: torch.nn.Module,
        train_loader,
        val_loader: Iterable | None = None,
        *,
        optimizer: torch.optim.Optimizer | None = None,
        scheduler=None,
        scaler: torch.amp.GradScaler | None = None,
        loss=None,
        hooks: Sequence = (),
        settings: TrainSettings | None = None,
        run_dir: str | Path | None = None,
        processes: distributed.Processes | None = None,
        budget: PixelBudget | None = None,
        memory=None,
        facts: dict[str, Any] | None = None,
        lock=None,
        cfg=None,
        self_training=None,
    ):
        check_attributes(model, "Trainer(model)")
        self.settings = s = settings or TrainSettings()
        self.model, self.cfg, self.lock, self.memory = model, cfg, lock, memory
        self.self_training = self_training
        self.processes = processes or distributed.environment()
        self.device = self.processes.device or next(model.parameters()).device
        self.run_dir = None if run_dir is None else Path(run_dir)
        self.num_classes = model.num_classes
        self.source = train_loader if hasattr(train_loader, "epoch") else LoaderEpochs(train_loader)
        self.val_loader = val_loader
        self.loss = loss or (lambda logits, mask: segmentation_loss(logits, mask, ignore_index=s.ignore_index))
        self.optimizer = optimizer or torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=1e-4)
        self.scheduler = scheduler or torch.optim.lr_scheduler.LambdaLR(self.optimizer, lambda step: 1.0)
        self.scaler = scaler or torch.amp.GradScaler(self.device.type, enabled=s.precision == "fp16")
        self.budget = budget or PixelBudget(None)
        self.facts = facts or model_facts(model)
        self.epoch = self.step = self.batches_done = self.epoch_batches = self.update_batches = 0
        self.row: dict[str, Any] = {}
        self.summary: dict[str, Any] = {"run_dir": str(self.run_dir), "best_mean_iou": -math.inf}
        self.summary["class_names"] = self.facts["class_names"]
        self.averaged: torch.nn.Module | None = None
        self.stop_requested, self.stopped_by, self.stepped, self.progress = False, None, False, None
        self.saved_epoch_end: int | None = None  # the epoch whose end last.pt holds, once this run wrote it
        self.saved_at, self.best_saved = "last.pt (rank 0 writes it)", -math.inf
        self.last_saved = "what it held when this run started (if it existed)"
        self.start_pass()
        self.hook_names, self.hooks = named_hooks(self, hooks)
        self.net = wrap_for_training(model, compile=s.compile, world=self.processes.world, device=self.device)

    @classmethod
    def from_config(cls, cfg, processes=None, run_dir=None, ckpt: dict[str, Any] | None = None, *, lock=None):
        """The Trainer srforge-train runs: data, model, memory plan, loaders, optimization and hooks built from a
        resolved config (:func:`srforge.train.assemble.trainer_parts`), ``ckpt`` restored when given."""
        from srforge.train.assemble import trainer_parts  # the config's builders, beside the core

        processes = processes or distributed.environment()
        run_dir = Path(run_dir if run_dir is not None else cfg.run.dir)
        parts = trainer_parts(cfg, processes, run_dir, ckpt)
        trainer = cls(**parts, processes=processes, run_dir=run_dir, lock=lock, cfg=cfg)
        if ckpt is not None:
            trainer.load_state_dict(ckpt)
            if processes.main:
                where = f"epoch {trainer.epoch + 1}, step {trainer.step}"
                print(f"srforge: resuming {trainer.run_dir.resolve()} at {where}")
        if processes.main:
            write_run_config(trainer.run_dir, cfg)
        return trainer

    @property
    def params(self) -> list[torch.Tensor]:
        """The parameters the optimizer updates: their gradients are clipped, averaged and set aside."""
        return [p for group in self.optimizer.param_groups for p in group["params"]]

    # -- the calls hooks change the trainer through ------------------------------------------------------------------
    def request_stop(self) -> None:
        """End the run after the running epoch (early stopping)."""
        self.stop_requested = True

    def add_to_row(self, values: dict[str, Any]) -> None:
        """Add ``values`` to the running epoch's metrics row (written by the metrics hook, kept in the summary)."""
        self.row.update(values)

    def add_to_summary(self, values: dict[str, Any]) -> None:
        """Add ``values`` to what :meth:`train` returns (the checkpoint hook's best validation mean IoU)."""
        self.summary.update(values)

    def use_averaged(self, model: torch.nn.Module | None) -> None:
        """Validate and keep in best.pt ``model`` (averaged weights) instead of the bare model; None: the model."""
        self.averaged = model

    # -- the loop ------------------------------------------------------------------------------------------------
    def train(self) -> dict[str, Any]:
        """Run the epochs due (``settings.epochs``, at most ``settings.stop_after`` of them in this call); returns
        the summary: the last epoch's metrics row, the best validation mean IoU, the run folder, the class names.

        A Ctrl-C or SIGTERM, a DataLoader worker the system killed (WorkerLostError) or a scan too large for the
        device even alone (ScanTooLargeError) stops the run resumably: last.pt is written at the batch reached,
        then the error propagates. Another torchrun process that died (a failed collective) is a PeerLostError
        saying what last.pt holds; nothing more is written, since the ranks can no longer agree. The hooks'
        after_train runs whatever happens.
        """
        s = self.settings
        last = s.epochs if s.stop_after is None else min(s.epochs, self.epoch + s.stop_after)
        if self.epoch >= s.epochs and self.processes.main:
            print(f"srforge: {self.run_dir} has trained all {s.epochs} epochs (train.epochs); nothing to do. "
                  "Raise train.epochs to train further.")  # fmt: skip
        self.call("before_train")
        try:
            self.hook_states()  # a state no checkpoint could hold is refused now, not after an epoch
            stop = self.run_epochs(last)
            if stop is not None:  # past the except blocks: the epoch's DataLoader and its workers are gone
                self.stopped_by, error = stop
                self.save_at_stop()
                raise error if isinstance(error, KeyboardInterrupt) else self.stop_error(error)
        finally:
            if self.self_training is not None:
                self.self_training.stream.close()  # its workers end with the run
            self.call("after_train")
        distributed.barrier()
        return self.summary

    def run_epochs(self, last: int) -> tuple[str, BaseException] | None:
        """Epochs until ``last`` or a stop request; a resumable stop as (why, the error to end with), else None."""
        try:
            while self.epoch < last and not self.stop_requested:
                self.run_epoch()
        except KeyboardInterrupt as interrupt:
            return cause(interrupt), interrupt
        except RuntimeError as error:
            peer = peer_lost(error, self.processes.world)
            if peer is not None:  # the group is broken: nothing more can be agreed on, last.pt stays as saved
                raise PeerLostError(
                    f"{peer}; {self.saved_at_epoch_end()} Resume the job as it was started (torchrun "
                    f"--nproc_per_node={self.processes.world} ...) with --resume {self.run_dir}"
                ) from None
            why = str(error) if isinstance(error, ScanTooLargeError) else worker_lost(error)
            if why is None:
                raise
            return why, type(error)
        return None

    def run_epoch(self) -> None:
        """One epoch's training pass, update by update, then the epoch's hooks (validation, checkpoints, logs).
        A resumed epoch skips the batches its checkpoint had done."""
        self.budget.start_epoch(fresh=self.batches_done == 0)
        loader = self.source.epoch(self.epoch, skip=self.batches_done)
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

    def run_step(self, batches) -> bool:
        """One optimizer update: forward, loss and backward of the next ``accumulate`` batches (fewer at the
        epoch's end), then the update; False when there was no batch left. What the model draws (dropout) in each
        comes from that call's own generator (:meth:`randomness`); the batches are fetched outside it, so that a
        Dataset drawing from torch's generator draws from the run's."""
        update = Update.empty(self.num_classes, self.device, self.settings.ignore_index)
        self.optimizer.zero_grad(set_to_none=True)
        for i, batch in enumerate(itertools.islice(batches, self.settings.accumulate)):
            with self.randomness(f"batch {i}"):
                self.forward_backward(update, batch)
        if not update.batches:
            return False
        with self.randomness("unlabelled"):  # self-training's student forward
            self.apply_update(update)
        return True

    def randomness(self, part: str):
        """:func:`srforge.train.rng.update_randomness` for ``part`` of this update, on this rank."""
        return update_randomness(self.settings.seed, self.step, self.processes.rank, self.device, part)

    def forward_backward(self, update: Update, batch) -> None:
        """Forward, loss and backward of one collated batch into the gradients: whole, or in parts of at most the
        budget's pixels, halving any part that runs out of memory (:meth:`run_parts`); its sums into ``update``."""
        tensors = self.to_device(batch)
        image, mask, sizes = tensors[:3]
        if self.self_training is not None:
            self.self_training.remember(image, mask, batch.sizes, self.epoch)  # train.self_training.mix pastes them
        names = batch.name if isinstance(batch.name, list) else [batch.name]
        parts = parts_of(image.shape[0], self.budget.scans_per_part(image.shape))
        weighted = self.settings.accumulate > 1 or len(parts) > 1
        losses, weighted, alone, failed, fit = self.run_parts(tensors, parts, weighted, update)
        if alone is not None:
            raise scan_too_large(names, batch.sizes, alone, image.shape, self.device)
        update.weights.used |= weighted
        update.totals += self.batch_totals(losses, mask, sizes)
        update.names.extend(names)
        update.batches += 1
        if failed is not None:
            update.proposal = min(update.proposal, fit)
            self.report_out_of_memory(names, image.shape, failed, fit)

    def run_parts(self, batch: tuple, parts: list, weighted: bool, update: Update) -> tuple:
        """Each part (lo, hi) of ``batch`` through :meth:`part_step`; a part out of memory is redone in halves, and
        from then on every part of the batch is weighted. Returns (the parts' (loss, valid pixels), weighted, the
        index of a scan that failed alone or None, the pixels of the first part that failed or None, the largest
        part that fit after it)."""
        losses, failed_at, largest_fit, pixels = [], None, 0, batch[0][0, 0].numel()

        def attempt(lo: int, hi: int):  # reads ``weighted`` as it is at the try: parts after a failure are weighted
            part = tuple(t[lo:hi] for t in batch)
            return backward_or_none(self.params, lambda: self.part_step(part, weighted, update), self.device)

        for lo, hi, done in each_part(parts, attempt):
            if done is None:
                failed_at = failed_at or (hi - lo) * pixels
                if hi - lo == 1:
                    return losses, weighted, lo, failed_at, largest_fit
                if not weighted:
                    weighted, losses = True, []
                continue
            loss, pending, logits = done
            losses.append((loss, None if pending is None else pending[0]))
            if pending is not None:  # the weighted part is in the gradients: its pixels count
                update.weights.count(pending)
            mask = batch[1][lo:hi]
            update.confusion += confusion_matrix(class_map(logits), mask, self.num_classes, self.ignore_index)
            del done, logits  # before the next part's forward needs the memory
            if failed_at is not None:
                largest_fit = max(largest_fit, (hi - lo) * pixels)
        return losses, weighted, None, failed_at, largest_fit

    def part_step(self, part: tuple, weighted: bool, update: Update) -> tuple:
        """Forward, loss and backward of one part (image, mask, sizes[, tube]): the plain step. Returns (its loss,
        detached; the pending (valid pixels, unit) of a weighted part, else None; the logits, detached)."""
        image, mask, sizes, *tube = part
        with no_sync(self.net):
            with autocast(self.device, self.settings.precision):
                logits = self.net(image, sizes.clone())  # the model's own copy: srforge counts with sizes
            loss = scaled = self.loss(logits, mask, tube=tube[0]) if tube else self.loss(logits, mask)
            pending = None
            if weighted:
                scaled, pending = update.weights.scaled(loss, mask)
            self.scaler.scale(scaled).backward()
        return loss.detach(), pending, logits.detach()

    def apply_update(self, update: Update) -> None:
        """End an update: gradients rescaled (weighted parts), the unlabelled batch's added (self-training), averaged
        across ranks, the one read, then :meth:`take_step`."""
        s = self.settings
        update.weights.rescale(self.params)
        if self.self_training is not None and self.self_training.active(self.epoch):
            unlabelled = self.self_training.backward(self)
            update.totals[0] += unlabelled.double() * 0  # adds nothing, unless NaN or infinite: then the read sees it
        if self.processes.world > 1:
            average_gradients(self.params, self.processes.world)
        every = s.log_every
        log = self.processes.main and (self.batches_done + update.batches) // every > self.batches_done // every
        reading = read_update(update, self.totals, self.confusion, log)
        # The step and its counts change together: a Ctrl-C or SIGTERM in between would leave a last.pt that counts
        # batches whose update is half applied, so it is held until both are done.
        with interrupts_held():
            self.take_step(update, reading)

    def take_step(self, update: Update, reading) -> None:
        """The optimizer step of an update whose read said ``reading`` (or the non-finite handling), and the counts:
        batches done, steps, the pass's sums, the budget lowered if any rank ran out of memory."""
        s = self.settings
        self.progress = reading.progress
        self.budget.lower(reading.proposal)
        self.batches_done += update.batches
        self.stepped, self.update_batches = reading.finite, update.batches
        if self.self_training is not None:
            self.self_training.commit(reading.finite)  # its unlabelled batch is done with the labelled ones
        if not reading.finite:
            self.non_finite(update)
            self.optimizer.zero_grad(set_to_none=True)
            return
        if s.grad_clip:
            self.scaler.unscale_(self.optimizer)
            torch.nn.utils.clip_grad_norm_(self.params, s.grad_clip)
        self.scaler.step(self.optimizer)
        self.scaler.update()
        self.scheduler.step()
        self.step += 1
        self.totals += update.totals
        self.confusion += update.confusion

    @property
    def ignore_index(self) -> int:
        return self.settings.ignore_index

    def start_pass(self) -> None:
        """Zero the training pass's sums (on the device: loss sum, batches stepped, real pixels; the confusion
        matrix of the predictions taken in training) and start its clock."""
        self.totals, self.confusion = zero_sums(self.num_classes, self.device)
        if self.self_training is not None:
            self.self_training.start_pass(self.device)
        self.started = time.perf_counter()

    def to_device(self, batch) -> tuple[torch.Tensor, ...]:
        """(image uint8 [B, C, H, W], mask int64 [B, H, W], sizes int64 [B, 2]) of a collated batch, on the device,
        and its skeleton ``tube`` [B, H, W] (train.skeleton_weight) after them when the batch has one.

        Images and masks travel as uint8 (masks as int64 only for more than 255 classes); the model normalises the
        image on the device, and the mask is widened there because cross-entropy takes int64 targets. ``sizes``
        is a copy: what the model does to its view of them is never what srforge counts with.
        """
        image = batch.image.to(self.device, non_blocking=True)
        mask = batch.mask.to(self.device, non_blocking=True).long()
        sizes = batch.sizes.to(self.device, non_blocking=True)
        if self.settings.channels_last:
            image = image.contiguous(memory_format=torch.channels_last)
        tube = batch.get("tube") if isinstance(batch, dict) else None
        return (image, mask, sizes) if tube is None else (image, mask, sizes, tube.to(self.device, non_blocking=True))

    def batch_totals(self, parts: list, mask: torch.Tensor, sizes: torch.Tensor) -> torch.Tensor:
        """float64 [3] on the device: (the batch's loss, 1 batch, its real pixels). The loss of a batch run whole
        is its own; of one in parts, the parts' (loss, valid pixels) weighted by their shares of its valid pixels."""
        if len(parts) == 1:
            loss = parts[0][0].detach().double()
        else:
            total = valid_pixels(mask, self.ignore_index).clamp_min(1).double()
            loss = sum(part.double() * valid / total for part, valid in parts)
        return torch.stack([loss, torch.ones_like(loss), sizes.prod(1).sum().double()])

    def non_finite(self, update: Update) -> None:
        """A non-finite loss: NonFiniteLossError naming the step and the update's samples, or with
        ``settings.skip_nonfinite`` a line (main process)."""
        message = (
            f"non-finite loss {update.totals[0].item()} at step {self.step + 1} (epoch {self.epoch + 1}) on samples "
            f"{update.names}"
        )
        if not self.settings.skip_nonfinite:
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
            "bytes_per_pixel": None if self.memory is None else self.memory.bytes_per_pixel,
            "max_pixels": self.budget.pixels,
            "out_of_memory": self.budget.events,
            **({} if self.self_training is None else self.self_training.row()),
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
            ignore, k = self.ignore_index, self.num_classes
            raise DataError(
                f"no training pixel has a class: every mask of the training set is data.ignore_index={ignore} (epoch "
                f"{epoch}, {batches} batches), so there is nothing to learn. Check that the masks hold class ids "
                f"0..{k - 1}, or set data.ignore_index to the value that marks unlabelled pixels."
            )

    @torch.no_grad()
    def validate(self, model: torch.nn.Module | None = None) -> dict[str, Any]:
        """Validation of ``model`` (default: the averaged weights, else the bare model: no gradients to average)
        over this rank's validation batches, summed across ranks: :func:`srforge.train.metrics.scores` of the
        confusion matrix over valid pixels, plus ``loss`` (the mean over batches of the training loss; NaN with no
        batch). Sums stay on the device until the one read at the end."""
        if model is None:
            model = self.model if self.averaged is None else self.averaged
        model.eval()
        totals, confusion = zero_sums(self.num_classes, self.device)
        for batch in () if self.val_loader is None else self.val_loader:
            image, mask, sizes = self.to_device(batch)[:3]
            with autocast(self.device, self.settings.precision):
                logits = model(image, sizes.clone())
            totals += self.batch_totals([(self.loss(logits, mask), None)], mask, sizes)
            confusion += confusion_matrix(class_map(logits), mask, self.num_classes, self.ignore_index)
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
        epoch, else at the batch reached), model, optimizer, scheduler, scaler, batches, pixel budget, every hook
        that has state (by its name), the random generators."""
        return {
            "epoch": self.epoch + 1 if epoch_end else self.epoch,
            "step": self.step,
            "batches_done": 0 if epoch_end else self.batches_done,
            "world": self.processes.world,
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "scaler": self.scaler.state_dict(),
            "sampler": self.source.state_dict() if hasattr(self.source, "state_dict") else {},
            "memory": self.budget.state_dict(),
            "hooks": self.hook_states(),
            **({} if self.self_training is None else {"unlabelled": self.self_training.state_dict()}),
            "rng": rng_state(),
        }

    def hook_states(self) -> dict[str, Any]:
        """{name: state} of every named hook that has a state, each checked to be what a checkpoint can hold
        (:func:`srforge.train.hooks.check_hook_state`)."""
        states = {}
        for name, hook in zip(self.hook_names, self.hooks):
            if name and hasattr(hook, "state_dict"):
                states[name] = hook.state_dict()
                check_hook_state(name, states[name])
        return states

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
        self.best_saved = float(state.get("best_metric", -math.inf))  # what a stop's last.pt records before an epoch
        if self.self_training is not None and "unlabelled" in state:
            self.self_training.load_state_dict(state["unlabelled"])
        saved = state.get("hooks") or {}
        for name, hook in zip(self.hook_names, self.hooks):
            if name in saved and hasattr(hook, "load_state_dict"):
                hook.load_state_dict(saved[name])
        set_rng_state(state["rng"])

    def checkpoint(self, *, epoch_end: bool = False, weights: torch.nn.Module | None = None) -> dict[str, Any]:
        """What a checkpoint file holds: :meth:`state_dict` and the facts that rebuild the model from the file
        alone (srforge.runtime.checkpoint lists them). ``weights``: the module whose weights it keeps as the
        model's (best.pt keeps the averaged ones under EMA); the training state is the bare model's."""
        state = self.state_dict(epoch_end=epoch_end)
        if weights is not None:
            state["model"] = weights.state_dict()
        facts = {key: value for key, value in self.facts.items() if key != "config" or value is not None}
        return {**state, **facts, "size_divisor": self.model.size_divisor, "ignore_index": self.ignore_index}

    def save(self, name: str, *, epoch_end: bool = True, weights: torch.nn.Module | None = None, best: float) -> None:
        """Write checkpoint ``name`` into the run folder (main process; none without a run folder), ``best`` the
        best validation mean IoU it records. The trainer notes what last.pt holds."""
        if not self.processes.main or self.run_dir is None:
            return
        if self.lock is not None and not self.lock.held():
            raise FolderLostError(
                f"{self.run_dir} (or its {LOCK_NAME}) was removed while this run was writing into it, so another run "
                f"may hold it now; this run stops without writing {name}. What it had written went with the folder: "
                f"the training up to epoch {self.epoch + 1}, batch {self.batches_done} is lost unless you restored the "
                "folder (then continue with --resume); else start the run again."
            )
        path = self.run_dir / name
        with disk_full_names(path):
            save_checkpoint({**self.checkpoint(epoch_end=epoch_end, weights=weights), "best_metric": best}, path)
        if name == "last.pt":
            self.best_saved = best
            if epoch_end:
                self.saved_epoch_end, self.last_saved = self.epoch, f"the end of epoch {self.epoch + 1}"

    def save_at_stop(self) -> None:
        """A resumable stop (``stopped_by``): last.pt at the batch reached, unless it holds this epoch's end already;
        Ctrl-C and SIGTERM are held while it is written, and a second one that cuts the write short all the same
        is said: last.pt then still holds what it held."""
        if not self.processes.main or self.run_dir is None or (self.lock is not None and not self.lock.held()):
            return
        path, saved = self.run_dir / "last.pt", self.saved_epoch_end == self.epoch
        where = f"the end of epoch {self.epoch + 1}" if saved else f"epoch {self.epoch + 1}, batch {self.batches_done}"
        self.saved_at, written = f"{path} at {where}", saved
        try:
            with interrupts_held() as noted:
                if not saved:
                    self.save("last.pt", epoch_end=False, best=self.best_saved)
                    written = True
                if self.stopped_by in ("Ctrl-C", "SIGTERM"):
                    tqdm.write(f"\nsrforge: interrupted; wrote {self.saved_at} ({self.stopped_by}). Continue with "
                               f"--resume {self.run_dir}")  # fmt: skip
                if noted:
                    tqdm.write(f"srforge: {noted[0]} came while {path} was written; it was written in full first.")
        except KeyboardInterrupt:
            if not written:
                tqdm.write(
                    f"\nsrforge: interrupted again while {path} was written: it was NOT updated and still holds "
                    f"{self.last_saved}, not {where}; --resume {self.run_dir} repeats the batches since."
                )
            raise

    def call(self, event: str) -> None:
        """``event`` (before_train, before_epoch, after_step, after_epoch, after_train) on every hook, in order. A
        stop that comes once last.pt holds the epoch's end (held while it was written) lets the epoch's remaining
        hooks run first, so that the epoch's row is written with the checkpoint that holds it."""
        for i, hook in enumerate(self.hooks):
            method = getattr(hook, event, None)
            if method is None:
                continue
            try:
                method()
            except KeyboardInterrupt:
                if event == "after_epoch" and self.saved_epoch_end == self.epoch:
                    with interrupts_held():
                        for rest in self.hooks[i + 1 :]:
                            getattr(rest, event, lambda: None)()
                raise

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
        workers = getattr(self.source, "num_workers", 0)
        return WorkerLostError(
            f"{self.stopped_by}; wrote {self.saved_at}. If memory ran short, use fewer data.num_workers (now "
            f"{workers}) or smaller batches (data.batch_size, data.max_pixels); then continue with "
            f"--resume {self.run_dir}"
        )
