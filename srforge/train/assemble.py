"""The Trainer's parts assembled from a resolved config: what ``Trainer.from_config`` (and so srforge-train) runs."""

from __future__ import annotations

import functools
import math
from pathlib import Path

from srforge.config.schema import Config
from srforge.constants import UNET_CLASSES
from srforge.runtime.checkpoint import class_names_or_default
from srforge.runtime.distributed import Processes
from srforge.train.from_config import (
    build_data,
    build_loaders,
    build_model,
    build_optimization,
    build_self_training,
    crop_training_scans,
    scan_warnings,
    set_checkpointing,
    training_device,
)
from srforge.train.hooks import config_hooks
from srforge.train.losses import segmentation_loss
from srforge.train.pixel_budget import PixelBudget, plan_memory
from srforge.train.rng import seed_everything
from srforge.train.settings import TrainSettings


def trainer_parts(cfg: Config, processes: Processes, run_dir: Path, ckpt: dict | None) -> dict:
    """What :meth:`srforge.train.trainer.Trainer.from_config` hands the Trainer, built from a resolved config in
    the order each needs the last: the device and the seed, data, the model (its weights from ``ckpt`` later when
    resuming), the training crop, the memory plan, the loaders, the pixel budget (a checkpoint's before the schedule
    counts the epoch's batches, which the budget cuts), optimization, the facts a checkpoint records, self-training
    (its fixed teacher is checked against the model and those facts), and the config's hooks (EMA copies the model:
    before the Trainer compiles it)."""
    tcfg, dcfg, seed = cfg.train, cfg.data, cfg.run.seed
    device = training_device(processes, cfg.run.device, tcfg.precision)
    seed_everything(seed)
    depth = cfg.model.depth if cfg.model.class_ in UNET_CLASSES else None  # others' divisors come from them
    k, layout = cfg.model.num_classes, tcfg.channels_last
    data = build_data(
        dcfg, num_classes=k, seed=seed, run_dir=run_dir, depth=depth, channels_last=layout,
        class_names=cfg.model.class_names,
    )  # fmt: skip
    model, model_args = build_model(cfg.model, device, layout, load_weights=ckpt is None)
    set_checkpointing(model, cfg.model.checkpointing)
    crop_training_scans(data, dcfg.crop, model.size_divisor)
    if processes.main:
        for line in scan_warnings(data, model.size_divisor):
            print(f"srforge: warning: {line}")
    loss = functools.partial(
        segmentation_loss, ignore_index=dcfg.ignore_index, dice_weight=tcfg.dice_weight,
        skeleton_weight=tcfg.skeleton_weight,
    )  # fmt: skip
    data.train.tubes = bool(tcfg.skeleton_weight)  # each training scan's skeleton tube, made once (cached)
    memory, pixels = plan_memory(cfg, model, data, device, processes)
    loaders = build_loaders(
        dcfg, data, divisor=model.size_divisor, seed=seed, processes=processes, device=device, max_pixels=pixels,
        channels_last=layout, tubes=data.train.tubes,
    )  # fmt: skip
    budget = PixelBudget(pixels, loaders.sampler)
    if ckpt is not None:
        budget.load_state_dict(ckpt.get("memory"))
    optimizer, scheduler, scaler = build_optimization(
        model, device=device, lr=tcfg.lr, weight_decay=tcfg.weight_decay, warmup_steps=tcfg.warmup_steps,
        min_lr_ratio=tcfg.min_lr_ratio, total_steps=tcfg.epochs * math.ceil(len(loaders.sampler) / tcfg.accumulate),
        precision=tcfg.precision,
    )  # fmt: skip
    facts = {
        "model_class": cfg.model.class_, "model_args": model_args, "model_norm": cfg.model.norm,
        "class_names": class_names_or_default(cfg.model.class_names, k),
        "image_mode": getattr(data.train.dataset, "image_mode", "RGB"), "config": cfg.to_dict(),
    }  # fmt: skip
    self_training = build_self_training(
        cfg, data, model=model, facts=facts, processes=processes, device=device, max_pixels=pixels
    )
    return {
        "model": model, "train_loader": loaders, "val_loader": loaders.val, "optimizer": optimizer,
        "scheduler": scheduler, "scaler": scaler, "loss": loss, "hooks": config_hooks(tcfg, model),
        "settings": TrainSettings.from_config(cfg), "budget": budget, "memory": memory, "facts": facts,
        "self_training": self_training,
    }  # fmt: skip
