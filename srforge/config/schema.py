"""Every config key in one place: its type, default, choices, minimum, other rules and a one-line doc.

One class per section (the mechanics are in ``srforge.config.fields``); ``Config`` is the whole config. The
rules that join several keys, and the one that covers every number, follow the sections. ``SCHEMA`` is the
same as plain data, nested like the config: each key's :class:`~srforge.config.fields.Key` under its name.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

from srforge.config.errors import ConfigError
from srforge.config.fields import Section, key, part, yaml11_float
from srforge.constants import (
    IGNORE_INDEX,
    MAX_DEPTH,
    NORMS,
    PRECISIONS,
    TTA_MODES,
    UNET_CLASS,
    UNET_CLASSES,
    UNET_KEYS,
    WEIGHTS_INTO,
)
from srforge.limits import class_names_problem


# -- single-key rules (each is given to its key below) -----------------------------------------------------
def positive(what: str):
    """A rule: the value is > 0; ``what`` is how the message names what was expected."""

    def rule(value: Any, path: str) -> None:
        if not value > 0:
            raise ConfigError(f"{path}: expected {what}, found {value}.")

    return rule


def fraction(value: Any, path: str) -> None:
    """A number strictly between 0 and 1 (or null, where the key allows it)."""
    if value is not None and not 0 < value < 1:
        raise ConfigError(f"{path}: expected a number between 0 and 1, found {value}.")


def import_path(value: Any, path: str) -> None:
    """``"module.path:ClassName"`` (or null, where the key allows it)."""
    if value is not None and ":" not in value:
        raise ConfigError(f"{path}: expected 'module.path:ClassName', found {value!r}.")


def early_stop_spec(value: Any, path: str) -> None:
    """``{patience: N >= 1, min_delta: x >= 0}`` (min_delta optional), or null."""
    if value is None:
        return
    unknown = sorted(set(value) - {"patience", "min_delta"})
    if unknown or "patience" not in value:
        found = f"the key {unknown[0]!r}" if unknown else "no patience"
        raise ConfigError(f"{path}: expected {{patience: N, min_delta: x}} (min_delta optional), found {found}.")
    patience, delta = value["patience"], value.get("min_delta", 0.0)
    if isinstance(patience, bool) or not isinstance(patience, int) or patience < 1:
        raise ConfigError(f"{path}.patience: expected an integer >= 1 (validations without improvement), found "
                          f"{patience!r}.")  # fmt: skip
    if isinstance(delta, bool) or not isinstance(delta, (int, float)) or not 0 <= delta < 1:
        raise ConfigError(f"{path}.min_delta: expected a number from 0 to below 1 (of mean IoU), found {delta!r}.")


def hook_specs(value: Any, path: str) -> None:
    """A list of ``{class: "module.path:Class", args: {...}}`` (args optional)."""
    for i, spec in enumerate(value):
        where = f"{path}[{i}]"
        if not isinstance(spec, Mapping) or "class" not in spec or set(spec) - {"class", "args"}:
            raise ConfigError(f"{where}: expected {{class: 'module.path:Class', args: {{...}}}}, found {spec!r:.120}.")
        if not isinstance(spec["class"], str):
            raise ConfigError(f"{where}.class: expected 'module.path:Class', found {spec['class']!r:.120}.")
        import_path(spec["class"], f"{where}.class")
        if not isinstance(spec.get("args") or {}, Mapping):
            raise ConfigError(f"{where}.args: expected a mapping of keyword arguments, found {spec['args']!r:.120}.")


def class_names(value: Any, path: str) -> None:
    """Short strings, not too many (``srforge.limits``)."""
    problem = None if value is None else class_names_problem(value)
    if problem:
        raise ConfigError(f"{path}: {problem}.")


def augment_recipe(value: Any, path: str) -> None:
    """Keys that ``srforge.data.augment`` knows, checked by the function the augmentation builder uses too."""
    if not value:
        return
    from srforge.data.augment import check_recipe  # loads torch and torchvision: only when there is a recipe

    try:
        check_recipe(value, where=path)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None


def unlabelled_paths(value: Any, path: str) -> None:
    """null, a path, or a non-empty list of paths (non-empty strings)."""
    items = [value] if isinstance(value, str) else value
    if items is not None and (not items or not all(isinstance(v, str) and v.strip() for v in items)):
        raise ConfigError(f"{path}: expected a folder or archive path, or a list of them, found {value!r}.")


SELF_TRAINING = {
    "weight": 1.0, "confidence": 0.9, "start_epoch": 1, "augment": {"hflip": 0.5}, "balance": False, "mix": False,
    "tta": "none", "teacher": None, "skeleton": 0.0,
}  # fmt: skip
# train.self_training.mix's named modes, beside false and true (= labelled): ClassMix from the update's labelled scans,
# or from each unlabelled scan's own confident pixels, mirrored
MIX_MODES = ("labelled", "mirror")


def mix_mode(mix: Any) -> str | None:
    """train.self_training.mix's value as its mode: None (false), "labelled" (true or "labelled") or "mirror"; a
    ValueError for anything else (1 and 0 too, which Python would read as true and false)."""
    if isinstance(mix, bool):
        return "labelled" if mix else None
    if isinstance(mix, str) and mix in MIX_MODES:
        return mix
    raise ValueError(f"train.self_training.mix: expected false, true, labelled or mirror, found {mix!r}.")


def self_training_spec(value: Any, path: str) -> None:
    """null, or a mapping of SELF_TRAINING's keys (each optional): weight > 0, confidence in [0, 1) (or a list of
    them, one a class), start_epoch >= 1, augment a recipe of data.augment's keys without ``scale`` (a student's
    view keeps the teacher's size), balance true or false, mix true, false or one of MIX_MODES, tta "none" or "flip"
    (the teacher's views, as predict.py's --tta), teacher null (the EMA of the weights) or a checkpoint's path (a
    fixed teacher: an earlier run's model), skeleton >= 0 (the skeleton recall loss's weight on the pseudo-labels;
    0: off)."""
    if value is None:
        return
    if not isinstance(value, Mapping):
        raise ConfigError(
            f"{path}: expected {{weight, confidence, start_epoch, augment, balance, mix, tta, teacher, skeleton}} or "
            f"null, found {value!r}."
        )
    unknown = sorted(set(value) - set(SELF_TRAINING))
    if unknown:
        raise ConfigError(f"{path}: unknown key {unknown[0]!r}; expected {', '.join(SELF_TRAINING)}.")
    number = lambda v: isinstance(v, (int, float)) and not isinstance(v, bool)  # noqa: E731
    weight, confidence = value.get("weight", 1.0), value.get("confidence", 0.9)
    if not number(weight) or not weight > 0:
        raise ConfigError(f"{path}.weight: expected a number > 0 (the unlabelled loss's weight), found {weight!r}.")
    listed = isinstance(confidence, list) and bool(confidence)
    thresholds = confidence if listed else [confidence]
    bad = next((i for i, c in enumerate(thresholds) if not (number(c) and 0 <= c < 1)), None)
    if bad is not None:
        raise ConfigError(
            f"{path}.confidence{f'[{bad}]' if listed else ''}: expected a probability from 0 to below 1, or a list "
            f"of them (one a class), found {thresholds[bad]!r}."
        )
    skeleton = value.get("skeleton", 0.0)
    if not number(skeleton) or not skeleton >= 0:
        raise ConfigError(
            f"{path}.skeleton: expected a number >= 0 (the skeleton recall loss's weight on the pseudo-labels; 0: "
            f"off), found {skeleton!r}."
        )
    start = value.get("start_epoch", 1)
    if isinstance(start, bool) or not isinstance(start, int) or start < 1:
        raise ConfigError(f"{path}.start_epoch: expected an epoch number >= 1, found {start!r}.")
    recipe = value.get("augment") or {}
    if "scale" in recipe:
        raise ConfigError(
            f"{path}.augment.scale: the student must see each scan at the teacher's size; rescaling is not "
            "allowed here (flips, affine, color_jitter and noise are)."
        )
    augment_recipe(recipe, f"{path}.augment")
    self_training_choices(value, path)


def self_training_choices(value: Mapping, path: str) -> None:
    """train.self_training's choices among named ways (:func:`self_training_spec`): balance, mix, tta, teacher."""
    if not isinstance(value.get("balance", False), bool):
        raise ConfigError(f"{path}.balance: expected true or false, found {value['balance']!r}.")
    try:
        mix_mode(value.get("mix", False))
    except ValueError:
        raise ConfigError(
            f"{path}.mix: expected false, true or labelled (the update's labelled curves pasted into the student's "
            f"view) or mirror (each unlabelled scan's own confident curves, mirrored, pasted over it), found "
            f"{value['mix']!r}."
        ) from None
    if value.get("tta", "none") not in TTA_MODES:
        raise ConfigError(
            f"{path}.tta: expected none (the teacher sees each scan once) or flip (it averages the scan and its "
            f"three mirror images), found {value['tta']!r}."
        )
    teacher = value.get("teacher")
    if teacher is not None and not (isinstance(teacher, str) and teacher.strip()):
        raise ConfigError(
            f"{path}.teacher: expected null (the teacher is the EMA of the weights, train.ema) or the path of an "
            f"srforge checkpoint (e.g. an earlier run's best.pt), found {teacher!r}."
        )


def pixel_budget(value: Any, path: str) -> None:
    """An int >= 1, "auto" or null."""
    if isinstance(value, str) and value != "auto":
        raise ConfigError(f"{path}: expected an int >= 1, auto or null, found {value!r}.")
    if isinstance(value, int) and value < 1:
        raise ConfigError(f"{path}: expected an integer >= 1 (or auto), found {value}.")


def crop_size(value: Any, path: str) -> None:
    """null, an int >= 1, or [H, W] of them."""
    pair = [value, value] if isinstance(value, int) else value
    if pair is not None and (
        len(pair) != 2 or not all(isinstance(n, int) and not isinstance(n, bool) and n >= 1 for n in pair)
    ):
        raise ConfigError(f"{path}: expected an int >= 1 or [H, W] of them (e.g. [512, 4096]), found {value!r}.")


def scale_or_range(value: Any, path: str) -> None:
    """A positive number, or [lo, hi] of them with lo <= hi (non-finite numbers are refused for every key)."""

    def positive_number(v: Any) -> bool:
        return isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0

    if positive_number(value):
        return
    if isinstance(value, list) and len(value) == 2 and all(map(positive_number, value)):
        if value[0] <= value[1]:
            return
        raise ConfigError(f"{path}: expected [lo, hi] with lo <= hi, found {value!r}; swap them.")
    # PyYAML (YAML 1.1) reads 3e-2 as text; fields.yaml11_float converts a key's own value, not a list's items.
    items = value if isinstance(value, list) else []
    texts = [v for v in items if isinstance(v, str) and isinstance(yaml11_float(v, (float,)), float)]
    hint = f" YAML reads {texts[0]} as text: write it with a dot (3.0e-2) or in full (0.03)." if texts else ""
    raise ConfigError(
        f"{path}: expected a positive number or [lo, hi] of them with lo <= hi (e.g. [0.03, 0.0625]), "
        f"found {value!r}.{hint}"
    )


# -- the sections ------------------------------------------------------------------------------------------
class RunSection(Section, path="run"):
    dir: str = key("runs/quickstart", "the run folder: checkpoints, metrics.jsonl, config.yaml")
    seed: int = key(0, "seeds the split, the sampler, augmentation and the model's initial weights")
    device: str = key("auto", "auto | cpu | cuda | cuda:N (auto: the GPU when there is one)")


class DatasetSection(Section, path="data.dataset"):
    class_: str = key(
        "srforge.data.datasets:SegmentationFolder",
        "the Dataset class, 'module.path:ClassName'",
        name="class",
        rule=import_path,
    )
    args: dict = key({}, "the keyword arguments the Dataset class is built with")


class ValDatasetSection(Section, path="data.val_dataset"):
    class_: str | None = key(
        None,
        "a separate validation Dataset, 'module.path:ClassName'; null: split data.dataset by val_fraction",
        name="class",
        rule=import_path,
    )
    args: dict = key({}, "the keyword arguments the validation Dataset class is built with")


def las_paths(value: Any, path: str) -> None:
    """null, a path or glob, or a list of them (non-empty strings)."""
    items = [value] if isinstance(value, str) else value or []
    if not all(isinstance(v, str) and v.strip() for v in items):
        raise ConfigError(f"{path}: expected a LAS path or glob, or a list of them, found {value!r}.")


class SyntheticSection(Section, path="data.synthetic"):
    root: str | None = key(None, "generate synthetic well-log scans into this folder when any is missing; null: none")
    n: int = key(48, "how many scans to generate")
    scale: float | int | list = key(
        0.0625,
        "scan size relative to a full-size well log (3,200-12,800 x 480-640 px); [lo, hi]: each scan its own, "
        "drawn log-uniformly from the range (scan i's depends only on (seed, i)), as an archive scanned at "
        "several resolutions",
        rule=scale_or_range,
    )
    classes: str = key(
        "binary",
        "binary (curve, background) or multiclass (one class per curve style)",
        choices=("binary", "multiclass"),
    )
    seed: int = key(0, "scan i depends only on (seed, i)")
    las: list | str | None = key(
        None,
        "LAS files (paths or globs, read with lasio: the las extra) the scans' curves come from; null or []: "
        "srforge's own log-like curves",
        rule=las_paths,
    )
    randomise: bool = key(
        False,
        "draw paper, grid, tracks, inks, line widths, dashes, text and the scanner (blur, skew, illumination, "
        "stains, folds, JPEG) from the wide ranges archives vary over (for models meant for real scans); false: "
        "srforge's classic look (the quickstart's)",
    )


class DataSection(Section, path="data"):
    dataset: DatasetSection = part("the training Dataset: an import path and its arguments")
    val_dataset: ValDatasetSection = part("a separate validation Dataset (optional)")
    val_fraction: float | int = key(
        0.2, "share of data.dataset held out for validation (split by size) when val_dataset is null", rule=fraction
    )
    fields: dict = key({}, "where the Dataset keeps each canonical field: {image: scan, mask: labels, name: id}")
    synthetic: SyntheticSection = part("synthetic well-log scans generated for the quickstart")
    batch_size: int | None = key(4, "scans per batch (set this or max_pixels, the other null)", minimum=1)
    max_pixels: int | str | None = key(
        None,
        "padded pixels per batch, a budget instead of batch_size; auto: the most whose training step fits the "
        "device, from the step's measured bytes per pixel and the free memory",
        rule=pixel_budget,
    )
    crop: int | list | None = key(
        None,
        "train on random crops of at most [H, W] (or N x N) px, rounded down to the model's size divisor, of every "
        "scan larger than that; smaller scans, validation and prediction stay whole",
        rule=crop_size,
    )
    num_workers: int = key(0, "DataLoader worker processes (0: load in the training process)", minimum=0)
    cache: str | None = key(
        None,
        "a folder for the decoded-scan cache: each scan decoded once, read at memory speed in later epochs and runs "
        "(srforge-check-data --cache fills it up front); null: decode every read",
    )
    cache_max_gb: float | int | None = key(
        None,
        "the most GB data.cache may hold: past it no scan is added (said once; training goes on); null: no budget",
        rule=lambda value, path: (
            None if value is None else positive("a size in GB > 0, or null for no budget")(value, path)
        ),
    )
    augment: dict = key(
        {},
        "per-scan augmentation: scale (rescaling, [lo, hi]), hflip, vflip, affine, color_jitter, noise",
        rule=augment_recipe,
    )
    unlabelled: str | list | None = key(
        None,
        "scans without masks (folders, .zip, .tar[.gz], or a list of them; read like predict.py's inputs) that "
        "train.self_training learns from; null: none",
        rule=unlabelled_paths,
    )
    ignore_index: int = key(
        IGNORE_INDEX, "the mask value no loss or metric counts (not a class id); padding is filled with it"
    )


class ModelSection(Section, path="model"):
    class_: str = key(
        UNET_CLASS,
        "the model class, 'module.path:ClassName': an nn.Module meeting srforge.models.contract, built as "
        "Class(in_channels=, num_classes=, **args) (srforge's UNet also takes the UNet keys below)",
        name="class",
        rule=import_path,
    )
    args: dict = key({}, "further keyword arguments of the model class (not in_channels or num_classes)")
    in_channels: int = key(3, "image channels", minimum=1)
    num_classes: int = key(2, "classes the model predicts; mask values must be below it (or ignore_index)", minimum=1)
    base_channels: int = key(16, "UNet only: channels of the first level, doubled at each level down", minimum=1)
    depth: int = key(
        5,
        f"UNet only: stride-2 stages; the size divisor is 2**depth, at most 2**{MAX_DEPTH} = {2**MAX_DEPTH:,} px, "
        "beyond any scan",
        minimum=1,
        maximum=MAX_DEPTH,
    )
    max_channels: int = key(512, "UNet only: the most channels any level has")
    padding_aware: bool = key(
        True, "UNet only: normalise over valid pixels only: a scan's logits ignore its batch-mates"
    )
    norm: str = key(
        "keep",
        "the model's normalisation layers: keep | group (BatchNorm -> GroupNorm) | frozen (BatchNorm with fixed "
        "statistics) | masked (padding-aware, statistics over valid pixels only)",
        choices=NORMS,
    )
    weights: str | None = key(
        None,
        "a state-dict file (.pt, .pth, .safetensors) loaded at the start of a fresh run (not on resume); null: none",
    )
    weights_into: str = key(
        "model",
        "what model.weights loads into: the whole model, or its encoder attribute",
        choices=WEIGHTS_INTO,
    )
    weights_strict: bool = key(
        True, "every tensor of model.weights must fit (false: load those that fit and report the rest)"
    )
    class_names: list | None = key(
        None, "one name per class, for reports and checkpoints (null: class_0, class_1, ...)", rule=class_names
    )
    checkpointing: bool = key(
        False,
        "activation checkpointing: recompute each level's activations in backward (fewer bytes per padded pixel, "
        "a slower step); srforge's UNet, or any model with a checkpointing attribute",
    )


class TrainSection(Section, path="train"):
    epochs: int = key(10, "passes over the training data", minimum=1)
    stop_after: int | None = key(
        None, "end this invocation after N epochs (time-limited jobs); null: run them all", minimum=1
    )
    lr: float | int = key(1e-3, "AdamW's peak learning rate, reached after warmup", rule=positive("a positive number"))
    weight_decay: float | int = key(1e-4, "AdamW's weight decay")
    warmup_steps: int = key(10, "optimizer steps of linear warm-up before the cosine decay")
    accumulate: int = key(
        1,
        "batches per optimizer step (gradient accumulation): the step's gradients are those of one batch of them "
        "all, its pixels weighted alike; the LR schedule counts optimizer steps",
        minimum=1,
    )
    min_lr_ratio: float | int = key(0.01, "the cosine decay's final learning rate, as a fraction of lr")
    grad_clip: float | int | None = key(1.0, "bound on the gradient norm (null or 0: no clipping)")
    precision: str = key("fp32", "fp32 | bf16 | fp16 (autocast; fp16 with a gradient scaler)", choices=PRECISIONS)
    channels_last: bool = key(False, "the channels-last memory format for images and weights")
    compile: bool = key(False, "torch.compile the model (dynamic shapes)")
    dice_weight: float | int = key(0.0, "weight of the Dice loss added to the cross-entropy")
    skeleton_weight: float | int = key(
        0.0,
        "weight of the thin-structure loss added to the cross-entropy: 1 - the recall of a tube around each class's "
        "skeleton, per scan and class on its true extent (Skeleton Recall); 0: off",
        minimum=0,
    )
    val_every: int = key(1, "validate every N epochs (and after the last)", minimum=1)
    skip_nonfinite: bool = key(False, "skip a batch whose loss is NaN or infinite, instead of stopping the run")
    # The progress bar's numbers are read from the device in the same transfer as the step's finiteness check
    # (the one read a step makes), so N sets how often the bar is redrawn.
    log_every: int = key(2, "read the progress bar's loss, mean IoU and px/s every N steps", minimum=1)
    dist_timeout_s: float | int = key(
        1800,
        "under torchrun, how long a rank waits for the others (seconds)",
        rule=positive("a positive number of seconds"),
    )
    ema: float | None = key(
        None,
        "an exponential moving average of the weights with this decay (e.g. 0.999), used by validation and "
        "best.pt; null: off",
        rule=fraction,
    )
    early_stop: dict | None = key(
        None,
        "{patience: N, min_delta: x}: stop once N validations in a row have not raised the validation mean IoU by "
        "more than x (default 0); null: off",
        rule=early_stop_spec,
    )
    self_training: dict | None = key(
        None,
        "{weight, confidence, start_epoch, augment, balance, mix, tta, teacher, skeleton}: learn from "
        "data.unlabelled's scans through the teacher's confident predictions, the EMA of the weights (train.ema) or "
        "teacher's checkpoint (needs data.unlabelled); confidence one threshold or a list of one a class "
        "(train.self_training.confidence=[0.9,0.97]); null: off",
        rule=self_training_spec,
    )
    hooks: list = key(
        [],
        "your own hooks, [{class: 'module.path:Class', args: {...}}, ...], called around every step and epoch "
        "(srforge.train.hooks)",
        rule=hook_specs,
    )


class Config(Section):
    """A resolved training config: ``cfg.train.lr`` or ``cfg["train"]["lr"]``; ``to_dict()`` for plain data."""

    run: RunSection = part("where the run writes, its seed and its device")
    data: DataSection = part("datasets, batching, augmentation")
    model: ModelSection = part("the model: srforge's UNet, or any nn.Module class by import path")
    train: TrainSection = part("optimisation and the training loop")

    def check(self) -> None:
        """Every value rule: numbers finite everywhere, then each key's own rules, then the rules joining keys.
        Raises ConfigError naming the key path."""
        for path, value in leaves(self):
            if isinstance(value, float) and not math.isfinite(value):
                raise ConfigError(f"{path}: expected a finite number, found {value}.", keys=(path,))
        for path, field, value in self.walk():
            try:
                field.check(value, path)
            except ConfigError as exc:
                exc.keys = exc.keys or (path,)
                raise
        for rule in JOINT_RULES:
            rule(self)


# -- rules that join keys (each ConfigError carries the keys it joins) -------------------------------------
def one_batch_rule(cfg: Config) -> None:
    if (cfg.data.batch_size is None) == (cfg.data.max_pixels is None):
        raise ConfigError(
            "data.batch_size and data.max_pixels: set exactly one (the other to null).",
            keys=("data.batch_size", "data.max_pixels"),
        )


def one_name_per_class(cfg: Config) -> None:
    names, count = cfg.model.class_names, cfg.model.num_classes
    if names is not None and len(names) != count:
        raise ConfigError(
            f"model.class_names: expected {count} names (model.num_classes), found {len(names)}.",
            keys=("model.class_names", "model.num_classes"),
        )


def ignore_index_is_no_class(cfg: Config) -> None:
    """The ignore index must not be a class id: the loss and every metric skip its pixels, so that class would
    never be learned nor scored. The default IGNORE_INDEX is let through: with more than 255 classes it is a class
    id too, but masks of that many classes do not fit the uint8 that the default is chosen for."""
    index, count = cfg.data.ignore_index, cfg.model.num_classes
    if 0 <= index < count and index != IGNORE_INDEX:
        raise ConfigError(
            f"data.ignore_index and model.num_classes: expected an ignore index that is no class id (classes are 0 "
            f"to {count - 1}), found data.ignore_index {index}, so class {index} would never be learned nor "
            f"scored. Set data.ignore_index to {IGNORE_INDEX} (the default) or another value outside 0 to "
            f"{count - 1}, or model.num_classes to the number of real classes.",
            keys=("data.ignore_index", "model.num_classes"),
        )


def unet_keys_for_the_unet(cfg: Config) -> None:
    """The UNet keys configure srforge's UNet only: set to other than their defaults for another model.class, they
    would be ignored without a word, so that is an error saying where that class's arguments go."""
    model = cfg.model
    if model.class_ in UNET_CLASSES:
        return
    changed = [name for name in UNET_KEYS if model[name] != ModelSection.__dict__[name].default]
    if changed:
        keys = tuple(f"model.{name}" for name in changed)
        found = ", ".join(f"{k}={model[n]!r}" for k, n in zip(keys, changed))
        raise ConfigError(
            f"{found}: {'these keys configure' if len(changed) > 1 else 'this key configures'} srforge's UNet only, "
            f"but model.class is {model.class_}. Remove {' and '.join(keys)} (or set the defaults), and give "
            f"{model.class_} its own arguments under model.args.",
            keys=("model.class", *keys),
        )


def self_training_needs_its_parts(cfg: Config) -> None:
    """train.self_training learns from data.unlabelled through a teacher, train.ema's unless it names a checkpoint
    of its own: each needs the others."""
    spec, scans, ema = cfg.train.self_training, cfg.data.unlabelled, cfg.train.ema
    if spec is not None and scans is None:
        raise ConfigError(
            "train.self_training is set but data.unlabelled is null: give the scans it learns from (a folder, "
            ".zip or .tar of scans without masks), or set train.self_training=null.",
            keys=("train.self_training", "data.unlabelled"),
        )
    if spec is not None and ema is None and spec.get("teacher") is None:
        raise ConfigError(
            "train.self_training: the teacher is the EMA of the weights, but train.ema is null; set train.ema "
            "(e.g. 0.99), give train.self_training.teacher a checkpoint (an earlier run's best.pt), or set "
            "train.self_training=null.",
            keys=("train.self_training", "train.ema"),
        )
    confidence = (spec or {}).get("confidence")
    if isinstance(confidence, list) and len(confidence) != cfg.model.num_classes:
        raise ConfigError(
            f"train.self_training.confidence: expected one threshold a class, {cfg.model.num_classes} "
            f"(model.num_classes), found {len(confidence)}: {confidence!r}.",
            keys=("train.self_training.confidence", "model.num_classes"),
        )
    if scans is not None and spec is None:
        raise ConfigError(
            "data.unlabelled is set but train.self_training is null, so nothing would read those scans; set "
            "train.self_training (e.g. {weight: 1.0, confidence: 0.9}) or data.unlabelled=null.",
            keys=("data.unlabelled", "train.self_training"),
        )


JOINT_RULES = (
    one_batch_rule,
    one_name_per_class,
    ignore_index_is_no_class,
    unet_keys_for_the_unet,
    self_training_needs_its_parts,
)


def leaves(node: Any, path: str = "") -> Iterable[tuple[str, Any]]:
    """(dotted path, value) for every leaf of a nested config, free-form parts included (``args.sizes[1]``)."""
    if isinstance(node, Mapping):
        for name, value in node.items():
            yield from leaves(value, f"{path}.{name}" if path else str(name))
    elif isinstance(node, (list, tuple)):
        for i, value in enumerate(node):
            yield from leaves(value, f"{path}[{i}]")
    else:
        yield path, node


SCHEMA: dict[str, Any] = Config.schema()
