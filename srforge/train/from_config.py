"""What a run is built from, each from its section of the config: device, data, model, optimization, batches.

    data      -> datasets, split by size (train_val_indices), FieldViews with per-sample augmentation (and
                 rescaling, data.augment.scale, on the training side)
    model     -> model.class (srforge's UNet by default) on the device, and the arguments that rebuild it
                 (checkpoints keep them), through the one builder srforge.models.create.create_model
    train     -> AdamW, warm-up + cosine LambdaLR, GradScaler (fp16)
    batches   -> training_sampler (size-grouped, shuffled by seed and epoch, this rank's share), validation loader
    self-training -> data.unlabelled's scans as an endless stream of this rank's batches, and the teacher's step

The split and the training sampler come from :mod:`srforge.data.sampling`, the functions the batch-layout
picture calls too, so the picture shows exactly the batches training draws.
"""

from __future__ import annotations

import inspect
import json
import math
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from torch.utils.data import DataLoader

from srforge.config import ConfigError, import_object
from srforge.config.schema import Config, DataSection, ModelSection
from srforge.constants import UNET_CLASSES, UNET_KEYS
from srforge.data.cache import open_cache
from srforge.data.collate import AlignedCollate
from srforge.data.crop import crop_shape, crop_sizes
from srforge.data.field_view import FieldView
from srforge.data.loader import DataLoaderFactory
from srforge.data.sampling import SizeGroupedBatchSampler, train_val_indices, training_sampler
from srforge.data.sizes import dataset_sizes
from srforge.data.unlabelled import UnlabelledScans, UnlabelledStream
from srforge.geometry import aligned_size, depth_problem
from srforge.models.create import create_model
from srforge.models.weights import WeightsFile
from srforge.runtime.device import cpu_has_native_bf16, resolve_device
from srforge.runtime.distributed import Processes, environment
from srforge.train.self_training import SelfTraining
from srforge.train.teacher import load_teacher

# The keys srforge's UNet is built with; any other model.class takes the first two and model.args.
MODEL_ARGS = ("in_channels", "num_classes", *UNET_KEYS)


def single_process_device(name: str) -> torch.device:
    """``run.device`` resolved for a single process; ``cuda:N`` also binds this process to GPU N."""
    device = resolve_device(name)
    if device.type == "cuda" and device.index is not None:
        torch.cuda.set_device(device)  # cuda:N: kernels and allocations of this process go to GPU N
    return device


def training_device(processes: Processes, name: str, precision: str) -> torch.device:
    """This process's device: the one :func:`srforge.runtime.distributed.start` bound under torchrun, else
    ``run.device``. bf16 on a CPU that emulates it is a warning: it runs many times slower than fp32."""
    device = processes.device or single_process_device(name)
    if precision == "bf16" and device.type == "cpu" and not cpu_has_native_bf16():
        warnings.warn(
            "train.precision=bf16 on a CPU without native bf16 (no avx512_bf16/amx): "
            "expect it to run many times slower than fp32."
        )
    return device


def _build(spec: dict, key: str, class_names: list | None = None):
    """``Class(**args)`` of a dataset spec. A class that takes ``classes`` (the annotation exports: label names in
    class-id order) and is not given them gets ``class_names`` (model.class_names), or an error saying to give one."""
    cls = import_object(spec["class"], key)
    args = dict(spec["args"])
    if "classes" not in args and _required(cls, "classes"):
        if class_names is None:
            where = key.rsplit(".", 1)[0]
            raise ConfigError(
                f"{where}.args.classes: {spec['class']} maps its labels to class ids by a list of class names, and "
                f"none is given; set {where}.args.classes (e.g. [background, curve]) or model.class_names."
            )
        args["classes"] = list(class_names)
    try:
        return cls(**args)
    except TypeError as exc:
        raise TypeError(f"{key}: could not build {spec['class']} with args {args}: {exc}") from None


def _required(cls, name: str) -> bool:
    """Whether ``cls`` takes ``name`` without a default (an optional one is the class's to fill)."""
    try:
        parameter = inspect.signature(cls).parameters.get(name)
    except (TypeError, ValueError):  # a class whose signature Python cannot read takes what it is given
        return False
    return parameter is not None and parameter.default is inspect.Parameter.empty


def _sizes(dataset, data: DataSection, key: str, cache: Path) -> list:
    """[(H, W), ...] of ``dataset``, cached in ``cache`` under the config of ``data[key]``."""
    return dataset_sizes(dataset, data.fields, cache, json.dumps(data[key], sort_keys=True))


@dataclass
class Data:
    """The training and validation sides: their views and their sizes [(H, W), ...], index for index.

    ``train_sizes`` are the largest the training scans can be -- their true sizes, or with ``data.augment.scale``
    those sizes rescaled by its upper bound -- so that memory planning allows for the largest scan any epoch draws;
    ``train_true_sizes`` are the true sizes (None: ``train_sizes`` are), from which the sampler works out each
    epoch's rescaled sizes (:func:`training_epoch_sizes`).
    """

    train: FieldView
    val: FieldView
    train_sizes: list
    val_sizes: list
    train_true_sizes: list | None = None


def build_data(
    data: DataSection,
    *,
    num_classes: int,
    seed: int,
    run_dir: Path,
    depth: int | None = None,
    channels_last: bool = False,
    class_names: list | None = None,
) -> Data:
    """Both sides from the config's ``data`` section: a separate ``val_dataset``, or ``dataset`` split by size.

    Sizes are read once (file headers, or measured and cached in the run folder). Only the training side is
    augmented, and rescaled by ``data.augment.scale`` (the view's ``scale``; the torchvision steps are built from
    the rest of the recipe); both check every mask against ``num_classes`` and the ignore index. A model ``depth``
    whose divisor outgrows every scan (:func:`srforge.geometry.depth_problem`) is a ConfigError before any model
    exists. ``channels_last`` (train.channels_last) is the layout the decoded-scan cache stores images in.
    ``class_names`` (model.class_names) are the ``classes`` of a Dataset that takes them and is given none (the
    annotation exports).
    """
    dataset = _build(data.dataset, "data.dataset.class", class_names)
    sizes = _sizes(dataset, data, "dataset", run_dir / "sizes_cache.json")
    problem = depth_problem(sizes, depth) if depth is not None else None
    if problem:
        raise ConfigError(f"model.depth: {problem}")
    recipe = dict(data.augment or {})
    if recipe:  # torchvision's transforms cost a process about a second to import: only a recipe loads them
        from srforge.data.augment import build_augmentation, scale_range
    scale = scale_range(recipe.pop("scale")) if "scale" in recipe else None
    augment = build_augmentation(recipe, ignore_index=data.ignore_index) if recipe else None
    checks = {"num_classes": num_classes, "ignore_index": data.ignore_index}
    # data.cache: every view reads through it, its images stored in the layout of the batch (train.channels_last)
    checks["cache"] = open_cache(data.cache, data.cache_max_gb, channels_last)
    separate = data.val_dataset.class_ is not None
    train_idx, val_idx = train_val_indices(sizes, None if separate else data.val_fraction, seed)
    train = FieldView(dataset, data.fields, train_idx, augment=augment, seed=seed, **checks)
    train.sizing.scale = scale
    true = train.sizes_of(sizes)
    largest = train.sizing.largest(true)
    if separate:
        val_set = _build(data.val_dataset, "data.val_dataset.class", class_names)
        val_sizes = _sizes(val_set, data, "val_dataset", run_dir / "val_sizes_cache.json")
        return Data(train, FieldView(val_set, data.fields, **checks), largest, val_sizes, true)
    val = FieldView(dataset, data.fields, val_idx, **checks)
    return Data(train, val, largest, val.sizes_of(sizes), true)


def model_kwargs(model_cfg: ModelSection) -> dict:
    """The keyword arguments ``model.class`` is built with: ``in_channels``, ``num_classes`` and ``model.args``;
    srforge's UNet (the default class) also takes ``base_channels``, ``depth``, ``max_channels`` and
    ``padding_aware``. A key given twice (``model.args.num_classes``) is a ConfigError: data checks, class names
    and the loss read the section's own key, so it alone says what the model is."""
    own = ("in_channels", "num_classes", *(UNET_KEYS if model_cfg.class_ in UNET_CLASSES else ()))
    args = dict(model_cfg.args)
    twice = [name for name in own if name in args]
    if twice:
        raise ConfigError(
            f"model.args.{twice[0]}: the model's {twice[0]} is model.{twice[0]}, which srforge passes to the class "
            f"itself; remove it from model.args and set model.{twice[0]}={args[twice[0]]!r} instead.",
            keys=(f"model.args.{twice[0]}",),
        )
    return {**{name: model_cfg[name] for name in own}, **args}


def weights_file(model_cfg: ModelSection) -> WeightsFile | None:
    """The ``model.weights`` file to load and how, or None when the key is null (or absent)."""
    if model_cfg.weights is None:
        return None
    return WeightsFile(model_cfg.weights, model_cfg.weights_into, model_cfg.weights_strict)


def report_weights(line: str) -> None:
    """The weights report on the console, once: by the main process."""
    if environment().main:
        print(f"srforge: {line}")


def build_model(
    model_cfg: ModelSection, device: torch.device, channels_last: bool, *, load_weights: bool = True
) -> tuple[torch.nn.Module, dict]:
    """The model the config's ``model`` section describes, on ``device``, and the keyword arguments that rebuild it
    (checkpoints keep them, with the class path and the norm option): ``model.class`` built by
    :func:`srforge.models.create.create_model` with :func:`model_kwargs`, ``model.weights`` loaded when
    ``load_weights`` (a resumed run's weights come from its checkpoint instead), ``model.norm`` applied, checked
    against srforge.models.contract. A model whose in_channels or num_classes differ from the section's is a
    ConfigError."""
    path = model_cfg.class_
    kwargs = model_kwargs(model_cfg)
    model = create_model(
        path,
        kwargs,
        norm=model_cfg.norm,
        weights=weights_file(model_cfg) if load_weights else None,
        resolve=lambda spec: import_object(spec, "model.class"),
        report=report_weights,
    )
    for name in ("in_channels", "num_classes"):
        if getattr(model, name) != kwargs[name]:
            raise ConfigError(
                f"model.{name}: {path} was built with {name}={kwargs[name]} but reports {name}="
                f"{getattr(model, name)}; it must set self.{name} from its {name} argument."
            )
    model = model.to(device)
    if channels_last:
        model = model.to(memory_format=torch.channels_last)
    return model, kwargs


def _schedule(step: int, warmup: int, total: int, min_ratio: float) -> float:
    """LR multiplier: linear warm-up over ``warmup`` steps, then cosine down to ``min_ratio``."""
    if step < warmup:
        return (step + 1) / warmup
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    return min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * progress))


def build_optimization(
    model: torch.nn.Module,
    *,
    device: torch.device,
    lr: float,
    weight_decay: float,
    warmup_steps: int,
    min_lr_ratio: float,
    total_steps: int,
    precision: str,
):
    """(AdamW, warm-up + cosine LambdaLR, GradScaler enabled for fp16 only).

    On CUDA AdamW is the fused kernel: one launch for all parameters, and under fp16 the scaler hands it the
    found-inf flag on the device instead of reading it back (which would be a second host sync per step).
    """
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=weight_decay, fused=device.type == "cuda")
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: _schedule(s, warmup_steps, total_steps, min_lr_ratio)
    )
    scaler = torch.amp.GradScaler(device.type, enabled=precision == "fp16")
    return optimizer, scheduler, scaler


@dataclass
class Loaders:
    """Where the batches come from: the training view and its sampler (one DataLoader per epoch, from
    :meth:`epoch`), and the validation loader (this rank's share of size-grouped batches, in a fixed order)."""

    train: FieldView
    sampler: SizeGroupedBatchSampler
    collate: AlignedCollate
    num_workers: int
    pin_memory: bool
    val: DataLoader

    def state_dict(self) -> dict:
        return self.sampler.state_dict()

    def epoch(self, epoch: int, skip: int = 0) -> DataLoader:
        """This rank's training batches of ``epoch`` (fixed by the seed and the epoch), less the first ``skip``."""
        self.sampler.set_epoch(epoch)
        self.train.set_epoch(epoch)
        return DataLoaderFactory(
            self.train,
            batch_sampler=list(self.sampler)[skip:],
            collate_fn=self.collate,
            num_workers=self.num_workers,
            pin_memory=self.pin_memory,
        ).get_loader()


def training_epoch_sizes(data: Data) -> Callable[[int], list] | None:
    """epoch -> [(H, W), ...]: the sizes the training view's SizePolicy gives its scans in that epoch; None when
    they never change (no rescaling). The sampler and the view ask the same policy object."""
    view = data.train
    if not view.sizing.varies:
        return None
    if data.train_true_sizes is None:  # train_sizes may already be rescaled by hi and cropped: never guess
        raise ValueError("training_epoch_sizes: a rescaling training view needs Data.train_true_sizes")
    true, policy, indices = data.train_true_sizes, view.sizing, view.indices
    return lambda epoch: policy.epoch_sizes(true, indices, epoch)


def batch_budget(data_cfg: DataSection, max_pixels: int | None) -> int | None:
    """The pixels a training batch may hold: ``max_pixels`` (what data.max_pixels resolved to) or data.max_pixels
    itself; None with data.batch_size. data.max_pixels: auto unresolved is a ValueError."""
    budget = None if data_cfg.max_pixels is None else max_pixels or data_cfg.max_pixels
    if budget == "auto":
        raise ValueError("data.max_pixels is auto; pass the budget it resolved to as max_pixels")
    return budget


def build_loaders(
    data_cfg: DataSection,
    data: Data,
    *,
    divisor: int,
    seed: int,
    processes: Processes,
    device: torch.device,
    max_pixels: int | None = None,
    channels_last: bool = False,
    tubes: bool = False,
) -> Loaders:
    """Batches of alike sizes padded to ``divisor`` (the model's) by AlignedCollate, masks with the ignore index;
    the training batches dealt to ranks by :func:`srforge.data.sampling.training_sampler`, grouped by each
    epoch's sizes when the training view rescales (:func:`training_epoch_sizes`). ``max_pixels`` is the pixel
    budget ``data.max_pixels`` resolved to (needed for ``auto``; ignored with ``data.batch_size``); ``channels_last``
    (train.channels_last) collates the images channels-last, one copy from the decoded [H, W, C] pixels; ``tubes``
    (train.skeleton_weight): the training batches also carry each scan's skeleton ``tube``, padded with 0."""
    pad = {"image": 0, "mask": data_cfg.ignore_index}
    collate = AlignedCollate(divisor, pad=pad, channels_last=channels_last)
    train_collate = AlignedCollate(divisor, pad={**pad, "tube": 0}, channels_last=channels_last) if tubes else collate
    budget = batch_budget(data_cfg, max_pixels)
    grouping = {"batch_size": data_cfg.batch_size, "max_pixels": budget, "divisor": divisor}
    sampler = training_sampler(
        data.train_sizes,
        seed=seed,
        **grouping,
        epoch_sizes=training_epoch_sizes(data),
        num_replicas=processes.world,
        rank=processes.rank,
    )
    val_batches = list(SizeGroupedBatchSampler(data.val_sizes, **grouping, shuffle=False))
    pin_memory = device.type == "cuda"
    val = DataLoaderFactory(
        data.val,
        batch_sampler=val_batches[processes.rank :: processes.world],
        collate_fn=collate,
        num_workers=data_cfg.num_workers,
        pin_memory=pin_memory,
    ).get_loader()
    return Loaders(data.train, sampler, train_collate, data_cfg.num_workers, pin_memory, val)


def build_self_training(
    cfg: Config,
    data: Data,
    *,
    model: torch.nn.Module,
    facts: dict,
    processes: Processes,
    device: torch.device,
    max_pixels: int | None,
) -> SelfTraining | None:
    """train.self_training over data.unlabelled's scans (None when off): their stream batched like the labelled
    scans (``max_pixels``, the resolved budget, or data.batch_size), read through data.cache in the training
    view's image mode, dealt to ranks; members refused are said once (main process), as predict.py lists them.
    Its ``teacher`` checkpoint, if any, is loaded onto ``device``, checked against ``model`` and the run's
    ``facts`` (:func:`srforge.train.teacher.load_teacher`)."""
    dcfg, spec = cfg.data, cfg.train.self_training
    if spec is None:
        return None
    teacher = None
    if spec.get("teacher") is not None:
        loaded, path, digest = load_teacher(spec["teacher"], facts, model, cfg.run.dir)
        layout = torch.channels_last if cfg.train.channels_last else torch.contiguous_format
        teacher = (loaded.to(device, memory_format=layout), path, digest)
        if processes.main:
            print(f"srforge: self-training's teacher: {spec['teacher']} (fixed; sha256 {digest[:12]})")
    divisor = model.size_divisor
    paths = [dcfg.unlabelled] if isinstance(dcfg.unlabelled, str) else list(dcfg.unlabelled)
    scans = UnlabelledScans(paths, cache=data.train.cache, image_mode=getattr(data.train.dataset, "image_mode", "RGB"))
    budget = batch_budget(dcfg, max_pixels)
    if budget is not None:  # a scan the budget cannot hold alone would run out of memory: left out, said
        scans.leave_out(lambda h, w: math.prod(aligned_size(h, w, divisor)) > budget,
                        f"larger than the pixel budget of {budget:,} px alone (data.max_pixels)")  # fmt: skip
    if processes.main:
        for where, why in scans.rejected:
            print(f"srforge: warning: data.unlabelled: left out {where}: {why}")
        print(f"srforge: self-training on {len(scans):,} unlabelled scan(s) from {', '.join(paths)}")
    stream = UnlabelledStream(
        scans, divisor=divisor, seed=cfg.run.seed,
        batch_size=dcfg.batch_size if budget is None else None, max_pixels=budget,
        num_replicas=processes.world, rank=processes.rank, num_workers=dcfg.num_workers,
        pin_memory=device.type == "cuda", channels_last=cfg.train.channels_last,
    )  # fmt: skip
    return SelfTraining.from_config(spec, stream, ignore_index=dcfg.ignore_index, seed=cfg.run.seed, teacher=teacher)


def wrap_for_training(model: torch.nn.Module, *, compile: bool, world: int, device: torch.device) -> torch.nn.Module:
    """The module a training step calls: ``model`` itself in one process, its DDP wrapper under torchrun.

    ``model`` stays the bare model -- its state_dict is what checkpoints hold, and validation calls it directly,
    since no gradients need averaging there. ``train.compile`` compiles ``model`` in place (``Module.compile``,
    so its state_dict keys keep their names) before DDP wraps it, as PyTorch's documentation recommends: DDP's
    own hooks then run outside the compiled graph. The training step runs the wrapper in ``no_sync`` mode and
    averages the gradients itself once per optimizer update (:mod:`srforge.train.update`), so that a rank that runs
    out of memory can redo its batch in parts without leaving the others inside a collective.
    Buffers are not synchronised before each forward: the only ones are the normalisation mean/std, which never
    change (``forward_sync_buffers=False`` where torch has it, ``broadcast_buffers=False`` before).
    """
    if compile:
        model.compile(dynamic=True)
    if world == 1:
        return model
    ddp = torch.nn.parallel.DistributedDataParallel
    no_sync = (
        "forward_sync_buffers" if "forward_sync_buffers" in inspect.signature(ddp).parameters else "broadcast_buffers"
    )
    return ddp(model, device_ids=[device.index] if device.type == "cuda" else None, **{no_sync: False})


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
    data.train.sizing.crop = shape
    data.train_sizes = crop_sizes(data.train_sizes, shape)


def scan_warnings(data: Data, divisor: int) -> list[str]:
    """Lines for a training set that will train poorly without an error: a size divisor that more than doubles the
    scans' pixels with padding (a deep model on small scans), and a rescaling range that shrinks every scan to a few
    pixels on its shorter side (``data.augment.scale`` far below 1)."""
    lines = []
    true = sum(h * w for h, w in data.train_sizes)
    aligned = [aligned_size(h, w, divisor) for h, w in data.train_sizes]
    padded = sum(h * w for h, w in aligned)
    if true and padded > 2 * true:
        (h, w), (ha, wa) = data.train_sizes[0], aligned[0]
        lines.append(
            f"the model's size divisor {divisor} pads the training scans to {padded / true:.1f}x their pixels (e.g. "
            f"{h} x {w} -> {ha} x {wa}), which costs memory and time; a model with fewer stride-2 stages (a smaller "
            "size_divisor) pads less"
        )
    scale = data.train.scale
    shortest = max((min(h, w) for h, w in data.train_sizes), default=0)
    if scale is not None and shortest < 8:
        lines.append(
            f"data.augment.scale={list(scale)} shrinks every training scan to at most {shortest} px on its shorter "
            "side: too few pixels to learn from; a range nearer 1 (e.g. [0.5, 2]) keeps the curves"
        )
    return lines
