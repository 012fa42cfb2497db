"""Hooks: what a run does around its training steps, each a small object the Trainer calls at five points.

    before_train   before the first epoch of this call (after a resume's states are restored)
    before_epoch   the epoch's batches are cut; before its first step
    after_step     after each optimizer update (``trainer.stepped``: whether it was taken; a non-finite one is not)
    after_epoch    after the epoch's training pass; ``trainer.row`` holds its metrics, hooks add to it
    after_train    at the end, also when the run is stopped (``trainer.stopped_by`` says why)

srforge's own, in the order they run: the progress bar, EMA of the weights (``train.ema``), validation,
early stopping (``train.early_stop``), the user's own (``train.hooks``), checkpoints (best.pt, last.pt, and
last.pt at the batch reached when the run is stopped), the metrics files, TensorBoard and the console. The
user's run before the checkpoints, so that what they change at the end of an epoch is in that epoch's last.pt.

A hook with ``state_dict()`` / ``load_state_dict(state)`` has its state saved in every checkpoint under its
name, and given back on resume. A user's hook is built from the config, ``train.hooks: [{class:
"my_pkg.hooks:MyHook", args: {...}}]``, under the same trust rule as ``model.class``
(srforge.config.trust): a checkpoint's embedded config names no class srforge imports unless the user's own config
names it too, and a checkpoint's hook states never name code: they only go to the hooks configured.
"""

from __future__ import annotations

import copy
import math
import sys
import time
from typing import TYPE_CHECKING, Any

import torch
from tqdm import tqdm

from srforge.atomic import disk_full_names
from srforge.config import ConfigError, import_object
from srforge.locks import LOCK_NAME, FolderLostError
from srforge.runtime.checkpoint import save_checkpoint
from srforge.train.log import log_epoch, open_tensorboard
from srforge.train.metrics import scores
from srforge.train.stop import interrupts_held

if TYPE_CHECKING:
    from srforge.train.trainer import Trainer

EVENTS = ("before_train", "before_epoch", "after_step", "after_epoch", "after_train")


class Hook:
    """A hook: override any of the five events (each does nothing here). ``trainer`` is set before the first."""

    name = ""  # the key of its state in checkpoints, for hooks with a state_dict
    trainer: Trainer

    def before_train(self) -> None: ...

    def before_epoch(self) -> None: ...

    def after_step(self) -> None: ...

    def after_epoch(self) -> None: ...

    def after_train(self) -> None: ...


class ProgressHook(Hook):
    """The epoch's progress bar (main process, on a terminal): batches done, and every ``train.log_every``
    batches the loss, mean IoU and real px/s read along with the update (no read of its own)."""

    bar = None

    def before_epoch(self) -> None:
        t = self.trainer
        self.bar = tqdm(
            total=t.epoch_batches,
            desc=f"epoch {t.epoch + 1}/{t.cfg.train.epochs}",
            leave=False,
            disable=not sys.stderr.isatty(),  # a log file gets the epoch's line, not a frame per update
        )

    def after_step(self) -> None:
        t = self.trainer
        self.bar.update(t.update_batches)
        if t.shown is None:
            return
        loss_sum, batches, pixels = t.shown[:3]
        if batches:
            k = t.cfg.model.num_classes
            confusion = torch.tensor(t.shown[3:], dtype=torch.float64).view(k, k)
            seconds = max(1e-9, _elapsed(t))
            self.bar.set_postfix(
                loss=f"{loss_sum / batches:.4f}",
                mIoU=f"{scores(confusion)['mean_iou']:.3f}",
                px_s=f"{pixels * t.processes.world / seconds:.3g}",
            )

    def after_epoch(self) -> None:
        self.bar.close()

    def after_train(self) -> None:
        if self.bar is not None:
            self.bar.close()


def _elapsed(trainer: Trainer) -> float:
    return time.perf_counter() - trainer.started


class EMAHook(Hook):
    """``train.ema: DECAY``: an exponential moving average of the weights, updated after every optimizer step
    taken; validation and best.pt use it (``trainer.averaged``), last.pt keeps it with the training state.

    The decay warms up as ``min(DECAY, (1 + n) / (10 + n))`` after n updates, so that in a short run the average
    is not dominated by the initial weights. Buffers (normalisation statistics) are copied, not averaged.
    """

    name = "ema"

    def __init__(self, model: torch.nn.Module, decay: float):
        self.decay, self.updates = decay, 0
        self.model = copy.deepcopy(model).requires_grad_(False)

    def before_train(self) -> None:
        self.trainer.averaged = self.model

    def after_step(self) -> None:
        if self.trainer.stepped:
            self.update(self.trainer.model)

    @torch.no_grad()
    def update(self, model: torch.nn.Module) -> None:
        self.updates += 1
        decay = min(self.decay, (1 + self.updates) / (10 + self.updates))
        torch._foreach_lerp_(list(self.model.parameters()), list(model.parameters()), 1.0 - decay)
        for mine, theirs in zip(self.model.buffers(), model.buffers()):
            mine.copy_(theirs)

    def state_dict(self) -> dict[str, Any]:
        return {"weights": self.model.state_dict(), "updates": self.updates, "decay": self.decay}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.model.load_state_dict(state["weights"])
        self.updates = int(state["updates"])


class ValidationHook(Hook):
    """Validation every ``train.val_every`` epochs and after the last, of the averaged weights under EMA: the
    scores into the epoch's row (val_loss, val_mean_iou, val_pixel_accuracy, val_iou, val_dice)."""

    def after_epoch(self) -> None:
        t = self.trainer
        epoch, every = t.epoch + 1, t.cfg.train.val_every
        if epoch % every and epoch != t.cfg.train.epochs:
            return
        val = t.validate(t.averaged if t.averaged is not None else t.model)
        t.row.update({f"val_{k}": val[k] for k in ("loss", "mean_iou", "pixel_accuracy", "iou", "dice")})


class EarlyStopHook(Hook):
    """``train.early_stop: {patience: N, min_delta: x}``: ends the run once N validations in a row have not
    raised the validation mean IoU by more than x over the best so far, with a line that says so. A resumed run
    that stopped early stays stopped."""

    name = "early_stop"

    def __init__(self, patience: int, min_delta: float = 0.0):
        self.patience, self.min_delta = patience, min_delta
        self.best, self.best_epoch, self.waited, self.stopped = -math.inf, 0, 0, False

    def before_train(self) -> None:
        if self.stopped:
            self.trainer.stop_requested = True
            self.say(f"early stopping ended this run after epoch {self.trainer.epoch}; nothing to do")

    def after_epoch(self) -> None:
        t = self.trainer
        if "val_mean_iou" not in t.row:
            return
        score = t.row["val_mean_iou"]
        if math.isfinite(score) and score > self.best + self.min_delta:
            self.best, self.best_epoch, self.waited = score, t.epoch + 1, 0
            return
        self.waited += 1
        if self.waited >= self.patience:
            self.stopped = t.stop_requested = True
            self.say(
                f"early stop after epoch {t.epoch + 1}: the validation mean IoU has not risen by more than "
                f"{self.min_delta:g} over its best, {self.best:.4f} at epoch {self.best_epoch}, for {self.waited} "
                f"validations (train.early_stop.patience={self.patience})"
            )

    def say(self, text: str) -> None:
        if self.trainer.processes.main:
            tqdm.write(f"srforge: {text}")

    def state_dict(self) -> dict[str, Any]:
        return {"best": self.best, "best_epoch": self.best_epoch, "waited": self.waited, "stopped": self.stopped}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.best, self.best_epoch = float(state["best"]), int(state["best_epoch"])
        self.waited, self.stopped = int(state["waited"]), bool(state["stopped"])


class CheckpointHook(Hook):
    """best.pt when validation improved, then last.pt, after every epoch (main process); and when the run is
    stopped (Ctrl-C, SIGTERM, a lost DataLoader worker, a scan too large), last.pt at the batch reached.

    ``best`` (the best validation mean IoU) is recorded in last.pt only once best.pt holds its weights: a Ctrl-C
    while best.pt is written leaves last.pt at the previous best, so the resumed run validates that epoch again.
    While the checkpoints are written, Ctrl-C and SIGTERM are held and delivered after; should a stop's write be cut
    short all the same, the console says that last.pt was not updated and what it still holds.
    """

    name = "checkpoint"

    def __init__(self):
        self.best = -math.inf
        self.last_saved = "what it held when this run started (if it existed)"

    def after_epoch(self) -> None:
        t = self.trainer
        score = t.row.get("val_mean_iou")
        # A Ctrl-C or SIGTERM inside torch.save would surface as its zip writer's RuntimeError, not as the
        # interrupt: both files are written first, then the signal acts (the run stops at this epoch's end).
        with interrupts_held():
            if score is not None and math.isfinite(score) and score > self.best:
                previous, self.best = self.best, score
                try:
                    self.save("best.pt", weights=t.averaged)
                except BaseException:
                    self.best = previous
                    raise
            self.save("last.pt")
            t.saved_epoch_end, self.last_saved = t.epoch, f"the end of epoch {t.epoch + 1}"
        t.summary["best_mean_iou"] = self.best

    def save(self, name: str, *, epoch_end: bool = True, weights: torch.nn.Module | None = None) -> None:
        t = self.trainer
        if not t.processes.main:
            return
        if t.lock is not None and not t.lock.held():
            raise FolderLostError(
                f"{t.run_dir} (or its {LOCK_NAME}) was removed while this run was writing into it, so another run "
                f"may hold it now; this run stops without writing {name}. What it had written went with the folder: "
                f"the training up to epoch {t.epoch + 1}, batch {t.batches_done} is lost unless you restored the "
                "folder (then continue with --resume); else start the run again."
            )
        path = t.run_dir / name
        with disk_full_names(path):
            save_checkpoint({**t.checkpoint(epoch_end=epoch_end, weights=weights), "best_metric": self.best}, path)

    def after_train(self) -> None:
        t = self.trainer
        t.summary["best_mean_iou"] = self.best
        if t.stopped_by is None or not t.processes.main or (t.lock is not None and not t.lock.held()):
            return
        path, saved = t.run_dir / "last.pt", t.saved_epoch_end == t.epoch
        where = f"the end of epoch {t.epoch + 1}" if saved else f"epoch {t.epoch + 1}, batch {t.batches_done}"
        t.saved_at, written = f"{path} at {where}", saved
        try:
            with interrupts_held() as noted:
                if not saved:
                    self.save("last.pt", epoch_end=False)
                    written = True
                if t.stopped_by in ("Ctrl-C", "SIGTERM"):
                    tqdm.write(
                        f"\nsrforge: interrupted; wrote {t.saved_at} ({t.stopped_by}). Continue with --resume "
                        f"{t.run_dir}"
                    )
                if noted:
                    tqdm.write(f"srforge: {noted[0]} came while {path} was written; it was written in full first.")
        except KeyboardInterrupt:
            if not written:
                tqdm.write(
                    f"\nsrforge: interrupted again while {path} was written: it was NOT updated and still holds "
                    f"{self.last_saved}, not {where}; --resume {t.run_dir} repeats the batches since."
                )
            raise

    def state_dict(self) -> dict[str, Any]:
        return {"best": self.best}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.best = float(state["best"])


class MetricsHook(Hook):
    """Each epoch's row into metrics.jsonl and metrics.csv, TensorBoard when installed, and one line on the console
    (main process)."""

    writer, logged = None, None  # logged: the epoch whose row was written last

    def before_train(self) -> None:
        self.writer = open_tensorboard(self.trainer.run_dir)

    def after_epoch(self) -> None:
        t = self.trainer
        log_epoch(t.run_dir, self.writer, t.row, t.step)
        self.logged = t.epoch

    def after_train(self) -> None:
        t = self.trainer
        # A stop that came as last.pt was written at an epoch's end (the checkpoint hook held it until then): the
        # resumed run starts the next epoch, so this epoch's row is written now or never.
        if t.stopped_by is not None and t.saved_epoch_end == t.epoch and self.logged != t.epoch:
            self.after_epoch()
        if self.writer is not None:
            self.writer.close()


def built_in_hooks(trainer: Trainer) -> tuple[list[Any], list[Any]]:
    """srforge's own hooks for ``trainer``'s config, as (those before the user's, those after)."""
    tcfg, main = trainer.cfg.train, trainer.processes.main
    before: list[Any] = [ProgressHook()] if main else []
    if tcfg.ema is not None:
        before.append(EMAHook(trainer.model, tcfg.ema))
    before.append(ValidationHook())
    if tcfg.early_stop is not None:
        before.append(EarlyStopHook(tcfg.early_stop["patience"], tcfg.early_stop.get("min_delta", 0.0)))
    return before, [CheckpointHook(), *([MetricsHook()] if main else [])]


def user_hooks(specs: list[dict]) -> list[tuple[str, Any]]:
    """(name, hook) of every ``train.hooks`` entry, built as ``Class(**args)``; the name (``train.hooks[i]
    module:Class``) keys its state in checkpoints, so that a state goes back only to the same class at the same
    place. A hook need not subclass :class:`Hook`: the events it lacks are not called."""
    hooks = []
    for i, spec in enumerate(specs):
        key = f"train.hooks[{i}]"
        cls = import_object(spec["class"], f"{key}.class")
        try:
            hook = cls(**(spec.get("args") or {}))
        except TypeError as exc:
            raise ConfigError(f"{key}: could not build {spec['class']} with args {spec.get('args') or {}}: {exc}")
        hooks.append((f"{key} {spec['class']}", hook))
    return hooks
