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
from srforge.config.fields import Section, key, part
from srforge.constants import IGNORE_INDEX, PRECISIONS
from srforge.limits import class_names_problem

# The most stride-2 stages a config may ask for: a size divisor of 2**16 = 65,536 px, beyond the height and width
# of any scan; each stage deeper doubles the padding of every scan, and depth 30 would pad a scan to 2**30 px a
# side. The same number as srforge.geometry.MAX_DEPTH (UNet's bound), written twice because reading a config
# loads no torch, which geometry does. How deep the scans of a dataset allow is srforge.geometry's
# depth_problem, checked once their sizes are known.
MAX_DEPTH = 16


# -- single-key rules (each is given to its key below) -----------------------------------------------------
def positive(what: str):
    """A rule: the value is > 0; ``what`` is how the message names what was expected."""

    def rule(value: Any, path: str) -> None:
        if not value > 0:
            raise ConfigError(f"{path}: expected {what}, found {value}.")

    return rule


def fraction(value: Any, path: str) -> None:
    """A number strictly between 0 and 1."""
    if not 0 < value < 1:
        raise ConfigError(f"{path}: expected a number between 0 and 1, found {value}.")


def import_path(value: Any, path: str) -> None:
    """``"module.path:ClassName"`` (or null, where the key allows it)."""
    if value is not None and ":" not in value:
        raise ConfigError(f"{path}: expected 'module.path:ClassName', found {value!r}.")


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


class SyntheticSection(Section, path="data.synthetic"):
    root: str | None = key(None, "generate synthetic well-log scans into this folder when any is missing; null: none")
    n: int = key(48, "how many scans to generate")
    scale: float | int = key(0.0625, "scan size relative to a full-size well log (3,200-12,800 x 480-640 px)")
    classes: str = key(
        "binary",
        "binary (curve, background) or multiclass (one class per curve style)",
        choices=("binary", "multiclass"),
    )
    seed: int = key(0, "scan i depends only on (seed, i)")


class DataSection(Section, path="data"):
    dataset: DatasetSection = part("the training Dataset: an import path and its arguments")
    val_dataset: ValDatasetSection = part("a separate validation Dataset (optional)")
    val_fraction: float | int = key(
        0.2, "share of data.dataset held out for validation (split by size) when val_dataset is null", rule=fraction
    )
    fields: dict = key({}, "where the Dataset keeps each canonical field: {image: scan, mask: labels, name: id}")
    synthetic: SyntheticSection = part("synthetic well-log scans generated for the quickstart")
    batch_size: int | None = key(4, "scans per batch (set this or max_pixels, the other null)", minimum=1)
    max_pixels: int | None = key(None, "padded pixels per batch, a budget instead of batch_size", minimum=1)
    num_workers: int = key(0, "DataLoader worker processes (0: load in the training process)", minimum=0)
    augment: dict = key(
        {}, "per-scan augmentation: hflip, vflip, affine, color_jitter, noise, crop", rule=augment_recipe
    )
    ignore_index: int = key(
        IGNORE_INDEX, "the mask value no loss or metric counts (not a class id); padding is filled with it"
    )


class ModelSection(Section, path="model"):
    in_channels: int = key(3, "image channels", minimum=1)
    num_classes: int = key(2, "classes the model predicts; mask values must be below it (or ignore_index)", minimum=1)
    base_channels: int = key(16, "channels of the first level, doubled at each level down", minimum=1)
    depth: int = key(
        5,
        f"stride-2 stages; the size divisor is 2**depth, at most 2**{MAX_DEPTH} = {2**MAX_DEPTH:,} px, beyond any scan",
        minimum=1,
        maximum=MAX_DEPTH,
    )
    max_channels: int = key(512, "the most channels any level has")
    padding_aware: bool = key(True, "normalise over valid pixels only: a scan's logits ignore its batch-mates")
    class_names: list | None = key(
        None, "one name per class, for reports and checkpoints (null: class_0, class_1, ...)", rule=class_names
    )


class TrainSection(Section, path="train"):
    epochs: int = key(10, "passes over the training data", minimum=1)
    stop_after: int | None = key(
        None, "end this invocation after N epochs (time-limited jobs); null: run them all", minimum=1
    )
    lr: float | int = key(1e-3, "AdamW's peak learning rate, reached after warmup", rule=positive("a positive number"))
    weight_decay: float | int = key(1e-4, "AdamW's weight decay")
    warmup_steps: int = key(10, "steps of linear warm-up before the cosine decay")
    min_lr_ratio: float | int = key(0.01, "the cosine decay's final learning rate, as a fraction of lr")
    grad_clip: float | int | None = key(1.0, "bound on the gradient norm (null or 0: no clipping)")
    precision: str = key("fp32", "fp32 | bf16 | fp16 (autocast; fp16 with a gradient scaler)", choices=PRECISIONS)
    channels_last: bool = key(False, "the channels-last memory format for images and weights")
    compile: bool = key(False, "torch.compile the model (dynamic shapes)")
    dice_weight: float | int = key(0.0, "weight of the Dice loss added to the cross-entropy")
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


class Config(Section):
    """A resolved training config: ``cfg.train.lr`` or ``cfg["train"]["lr"]``; ``to_dict()`` for plain data."""

    run: RunSection = part("where the run writes, its seed and its device")
    data: DataSection = part("datasets, batching, augmentation")
    model: ModelSection = part("the U-Net")
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


JOINT_RULES = (one_batch_rule, one_name_per_class, ignore_index_is_no_class)


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
