"""Hooks: what a run does around its training steps, each a small object the Trainer calls at five points.

    before_train   before the first epoch of this call (after a resume's states are restored)
    before_epoch   the epoch's batches are cut; before its first step
    after_step     after each optimizer update (``trainer.stepped``: whether it was taken; a non-finite one is not)
    after_epoch    after the epoch's training pass; ``trainer.row`` holds its metrics, hooks add to it
    after_train    at the end, whatever happened (``trainer.stopped_by`` says why a run stopped)

A hook reads the trainer through the attributes the Trainer's docstring lists and changes it only through its
calls: ``request_stop()``, ``add_to_row(values)``, ``add_to_summary(values)``, ``use_averaged(model)`` and
``save(name, ...)``. The trainer alone writes last.pt when a run is stopped.

The order they run in (:func:`named_hooks`): the progress bar, validation, the hooks given to the Trainer (from a
config: EMA of the weights ``train.ema``, early stopping ``train.early_stop``, the user's own ``train.hooks``),
then the checkpoints at an epoch's end (best.pt, last.pt) and the metrics files, TensorBoard and the console. The
given hooks run before the checkpoints, so that what they change at the end of an epoch is in that epoch's last.pt.

A hook with ``state_dict()`` / ``load_state_dict(state)`` has its state saved in every checkpoint under its
name, and given back on resume. A user's hook is built from the config, ``train.hooks: [{class:
"my_pkg.hooks:MyHook", args: {...}}]``, under the same trust rule as ``model.class``
(srforge.config.trust): a checkpoint's embedded config names no class srforge imports unless the user's own config
names it too, and a checkpoint's hook states never name code: they only go to the hooks configured.
"""

from __future__ import annotations

import collections
import copy
import math
import sys
import time
from typing import TYPE_CHECKING, Any

import torch
from tqdm import tqdm

from srforge.config import ConfigError, import_object
from srforge.limits import expanded_size, object_parts, object_weight
from srforge.train.log import log_epoch, open_tensorboard
from srforge.train.metrics import scores
from srforge.train.stop import interrupts_held

if TYPE_CHECKING:
    from srforge.train.trainer import Trainer

EVENTS = ("before_train", "before_epoch", "after_step", "after_epoch", "after_train")
# The most a hook's state may hold besides tensors, in units of one per object plus one per character of a string
# (srforge.limits.object_weight): a checkpoint's plain data is bounded when it is read, so a state past this would
# make every checkpoint unreadable.
MAX_HOOK_STATE = 1_000_000
# What a hook's state may be made of: what torch.load(weights_only=True), which reads every checkpoint, reads back
# on every torch srforge supports. Exact types: a numpy float64 is a float subclass that the loader refuses.
STATE_LEAVES = (bool, int, float, str, bytes, type(None))
STATE_OBJECTS = (torch.Tensor, torch.dtype, torch.device)
STATE_MAPPINGS = (dict, collections.OrderedDict)


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
            desc=f"epoch {t.epoch + 1}/{t.settings.epochs}",
            leave=False,
            disable=not sys.stderr.isatty(),  # a log file gets the epoch's line, not a frame per update
        )

    def after_step(self) -> None:
        t = self.trainer
        self.bar.update(t.update_batches)
        shown = t.progress
        if shown is not None and shown.batches:
            seconds = max(1e-9, time.perf_counter() - t.started)
            self.bar.set_postfix(
                loss=f"{shown.loss_sum / shown.batches:.4f}",
                mIoU=f"{scores(shown.confusion)['mean_iou']:.3f}",
                px_s=f"{shown.pixels * t.processes.world / seconds:.3g}",
            )

    def after_epoch(self) -> None:
        self.bar.close()

    def after_train(self) -> None:
        if self.bar is not None:
            self.bar.close()


class EMAHook(Hook):
    """``train.ema: DECAY``: an exponential moving average of the weights, updated after every optimizer step
    taken; validation and best.pt use it (``trainer.use_averaged``), last.pt keeps it with the training state.

    The decay warms up as ``min(DECAY, (1 + n) / (10 + n))`` after n updates, so that in a short run the average
    is not dominated by the initial weights. Buffers (normalisation statistics) are copied, not averaged.
    """

    name = "ema"

    def __init__(self, model: torch.nn.Module, decay: float):
        self.decay, self.updates = decay, 0
        self.model = copy.deepcopy(model).requires_grad_(False)

    def before_train(self) -> None:
        self.trainer.use_averaged(self.model)

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
        epoch, every = t.epoch + 1, t.settings.val_every
        if epoch % every and epoch != t.settings.epochs:
            return
        val = t.validate()
        t.add_to_row({f"val_{k}": val[k] for k in ("loss", "mean_iou", "pixel_accuracy", "iou", "dice")})


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
            self.trainer.request_stop()
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
            self.stopped = True
            t.request_stop()
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
    """best.pt when validation improved, then last.pt, after every epoch (main process, through
    :meth:`Trainer.save`). When a run is stopped, the trainer itself writes last.pt at the batch reached.

    ``best`` (the best validation mean IoU) is recorded in last.pt only once best.pt holds its weights: a Ctrl-C
    while best.pt is written leaves last.pt at the previous best, so the resumed run validates that epoch again.
    While the checkpoints are written, Ctrl-C and SIGTERM are held and delivered after.
    """

    name = "checkpoint"

    def __init__(self):
        self.best = -math.inf

    def after_epoch(self) -> None:
        t = self.trainer
        score = t.row.get("val_mean_iou")
        # A Ctrl-C or SIGTERM inside torch.save would surface as its zip writer's RuntimeError, not as the
        # interrupt: both files are written first, then the signal acts (the run stops at this epoch's end).
        with interrupts_held():
            if score is not None and math.isfinite(score) and score > self.best:
                previous, self.best = self.best, score
                try:
                    t.save("best.pt", weights=t.averaged, best=score)
                except BaseException:
                    self.best = previous
                    raise
            t.save("last.pt", best=self.best)
        t.add_to_summary({"best_mean_iou": self.best})

    def after_train(self) -> None:
        self.trainer.add_to_summary({"best_mean_iou": self.best})

    def state_dict(self) -> dict[str, Any]:
        return {"best": self.best}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.best = float(state["best"])


class MetricsHook(Hook):
    """Each epoch's row into metrics.jsonl and metrics.csv, TensorBoard when installed, and one line on the console
    (main process)."""

    writer = None

    def before_train(self) -> None:
        self.writer = open_tensorboard(self.trainer.run_dir)

    def after_epoch(self) -> None:
        t = self.trainer
        log_epoch(t.run_dir, self.writer, t.row, t.step)

    def after_train(self) -> None:
        if self.writer is not None:
            self.writer.close()


def check_hook_state(name: str, state: Any) -> None:
    """A ConfigError naming the hook ``name`` when its ``state`` holds what a checkpoint cannot be read back with
    (anything but tensors, numbers, strings, bytes, None, and lists, tuples and dicts of them), or more than
    MAX_HOOK_STATE: it is refused when it is saved, never written into a checkpoint that then cannot be loaded."""
    if expanded_size(state, object_parts, object_weight, MAX_HOOK_STATE) is None:
        raise ConfigError(
            f"hook {name!r}: its state_dict() holds more than {MAX_HOOK_STATE:,} objects and characters besides "
            "tensors (or a part that contains itself); keep large data in tensors or in files of the hook's own."
        )
    stack: list[tuple[Any, str]] = [(state, "")]
    seen: set[int] = set()
    while stack:
        value, where = stack.pop()
        if id(value) in seen:
            continue
        seen.add(id(value))
        if type(value) in STATE_LEAVES or isinstance(value, STATE_OBJECTS):
            continue
        if type(value) in STATE_MAPPINGS:
            stack += [(k, f"{where} key") for k in value] + [(v, f"{where}[{k!r}]") for k, v in value.items()]
        elif type(value) in (list, tuple):
            stack += [(v, f"{where}[{i}]") for i, v in enumerate(value)]
        else:
            raise ConfigError(
                f"hook {name!r}: its state_dict() holds a {type(value).__module__}.{type(value).__qualname__} at "
                f"state{where}, which checkpoints cannot hold (they are read with torch.load(weights_only=True)): "
                "return tensors, numbers, strings, None, and lists, tuples and dicts of them (e.g. float(x) for a "
                "numpy scalar, sorted(s) for a set)."
            )


def config_hooks(train_cfg, model: torch.nn.Module) -> list[Any]:
    """The hooks the ``train`` section asks for, in order: EMA (``train.ema``; it copies ``model``, so before the
    model is compiled), early stopping (``train.early_stop``), the user's own (``train.hooks``, as (name, hook))."""
    hooks: list[Any] = [] if train_cfg.ema is None else [EMAHook(model, train_cfg.ema)]
    if train_cfg.early_stop is not None:
        stop = train_cfg.early_stop
        hooks.append(EarlyStopHook(stop["patience"], stop.get("min_delta", 0.0)))
    return [*hooks, *user_hooks(train_cfg.hooks)]


def named_hooks(trainer: Trainer, given) -> tuple[list[str], list[Any]]:
    """(names, hooks) a Trainer runs, each told its ``trainer``: the progress bar (main process), validation (with
    a validation loader), the ``given`` hooks (objects, or (name, hook) pairs; a hook's name keys its state in
    checkpoints, default its ``name`` attribute), the checkpoints and the metrics files (with a run folder)."""
    main, writes = trainer.processes.main, trainer.run_dir is not None
    before = [ProgressHook()] if main else []
    if trainer.val_loader is not None:
        before.append(ValidationHook())
    after = [CheckpointHook()] if writes else []
    after += [MetricsHook()] if writes and main else []
    named = [(h.name, h) for h in before]
    named += [item if isinstance(item, tuple) else (getattr(item, "name", ""), item) for item in given]
    named += [(h.name, h) for h in after]
    for _, hook in named:
        hook.trainer = trainer
    return [name for name, _ in named], [hook for _, hook in named]


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
        if not any(callable(getattr(hook, event, None)) for event in EVENTS):
            raise ConfigError(
                f"{key}.class: {spec['class']} built {type(hook).__name__} {str(hook)[:80]!r}, not a hook: a hook "
                f"is an instance of a class with at least one of the methods {', '.join(EVENTS)} "
                "(srforge.train.Hook is one to subclass)."
            )
        hooks.append((f"{key} {spec['class']}", hook))
    return hooks
