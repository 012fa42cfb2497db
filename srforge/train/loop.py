"""Training, read top to bottom: :func:`train` checks and prepares, then runs epoch after epoch.

    cfg -> datasets (size-stratified split) -> size-grouped batches -> AlignedCollate(model.size_divisor)
        -> UNet(image, sizes) -> cross-entropy (+ Dice) on valid pixels -> AdamW, warm-up + cosine
        -> validation (confusion matrix over valid pixels) -> last.pt every epoch, best.pt by mean IoU

In order: :func:`read_resume_checkpoint` (before anything is written), :func:`prepare_run_dir`,
:func:`prepare_synthetic_data` (before the process group starts), then :func:`build_data`, :func:`build_model`,
:func:`build_optimization`, :func:`restore`, :func:`wrap_for_training`, and per epoch :func:`run_epoch`:
:func:`srforge.train.step.train_epoch`, :func:`srforge.train.step.evaluate` and :func:`save_epoch`.

Exact resume: the batch order depends only on (seed, epoch), augmentation on (seed, epoch, sample), and the
checkpoint holds model, optimizer, scheduler, scaler, step and RNG states, so on the CPU a run stopped after
epoch 2 and resumed to epoch 4 ends with the same bits as one that ran 4 epochs straight. A Ctrl-C writes
``last.pt`` at the batch it reached, and the resumed run skips the batches already done: bit-identical too.

Distributed: under ``torchrun`` each process takes its rank's batches (gloo on CPU, nccl on CUDA), gradients
are averaged by DistributedDataParallel, losses and confusion matrices are summed across ranks, and only rank
0 writes files and shows the progress bar.
"""

from __future__ import annotations

import csv
import inspect
import io
import json
import math
import os
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import DataLoader
from tqdm import tqdm

from srforge.atomic import DiskFullError, atomic_write_text, disk_full_names, remove_stale_temporaries
from srforge.config import ConfigError, dump, import_object
from srforge.data.adapter import FieldView
from srforge.data.augment import build_augmentation
from srforge.data.collate import AlignedCollate
from srforge.data.sampling import SizeGroupedBatchSampler, size_stratified_split
from srforge.data.sizes import dataset_sizes
from srforge.models import UNet
from srforge.runtime import distributed
from srforge.runtime.checkpoint import class_names_or_default, load_checkpoint, save_checkpoint
from srforge.runtime.device import resolve_device
from srforge.runtime.distributed import Processes
from srforge.train.metrics import scores
from srforge.train.rng import rng_state, seed_everything, set_rng_state
from srforge.train.step import NonFiniteLossError, Progress, evaluate, train_epoch

__all__ = ["train", "build_data", "evaluate", "NonFiniteLossError", "DiskFullError"]

MODEL_ARGS = ("in_channels", "num_classes", "base_channels", "depth", "max_channels", "padding_aware")


# -- before anything is written -------------------------------------------------------------------
def read_resume_checkpoint(resume: str | os.PathLike | None, model_cfg: dict) -> dict[str, Any] | None:
    """The checkpoint to resume from (RUN_DIR/last.pt or a file), checked against the config's model.

    A resumed run keeps its model: any model argument that differs (``model.num_classes`` above all) is a
    ConfigError here, before the run folder is touched.
    """
    if resume is None:
        return None
    path = Path(resume)
    path = path / "last.pt" if path.is_dir() else path
    ckpt = load_checkpoint(path)
    saved = ckpt["model_args"]
    differ = [k for k in MODEL_ARGS if k in saved and saved[k] != model_cfg[k]]
    if differ:
        found = ", ".join(f"model.{k}={model_cfg[k]!r} (the checkpoint has {saved[k]!r})" for k in differ)
        raise ConfigError(
            f"--resume {path}: the config asks for {found}. A resumed run keeps its model: drop these overrides, "
            "or start a new run in another run.dir without --resume."
        )
    return ckpt


def prepare_run_dir(run_dir: Path, cfg: dict) -> None:
    """Create the run folder, sweep temporary files a killed run left there, write config.yaml.

    A folder that cannot be written is a ConfigError naming it (rather than a traceback at the first checkpoint).
    Only the main process calls this, before any other process can write into the folder.
    """
    try:
        with disk_full_names(run_dir / "config.yaml"):
            run_dir.mkdir(parents=True, exist_ok=True)
            remove_stale_temporaries(run_dir)
            atomic_write_text(run_dir / "config.yaml", dump(cfg))
    except DiskFullError:
        raise
    except OSError as exc:
        raise ConfigError(
            f"run.dir: cannot write into {run_dir} ({exc.strerror or exc}); set run.dir to a folder you can write."
        ) from None


def prepare_synthetic_data(synthetic: dict, processes: Processes, poll_s: float = 0.5) -> None:
    """Generate the synthetic scans ``data.synthetic`` asks for, when any is missing, before the group starts.

    One process per machine (local rank 0) generates, in parallel processes; the others poll the folder until
    every scan is there. No collective waits meanwhile, so generation may take longer than
    ``train.dist_timeout_s``. Files are written to temporary names and renamed, so a scan present is complete,
    and scan i depends only on (seed, i): a rerun after a kill completes the set, and machines sharing a
    filesystem may both write a scan (the same bytes).
    """
    if synthetic["root"] is None:
        return
    from srforge.data import synthetic as generator  # looked up here, so that tests can slow it down

    root = Path(synthetic["root"])
    if not generator.missing_scans(root, synthetic["n"]):
        return
    if processes.local_rank == 0:
        print(f"srforge: generating {synthetic['n']} synthetic well-log scans into {root} (scale {synthetic['scale']})")
        generator.make_welllog_scans(
            root,
            synthetic["n"],
            scale=synthetic["scale"],
            seed=synthetic["seed"],
            classes=synthetic["classes"],
            workers=None,
            only_missing=True,
        )
        return
    while generator.missing_scans(root, synthetic["n"]):
        time.sleep(poll_s)


# -- building --------------------------------------------------------------------------------------
def _build(spec: dict, key: str):
    cls = import_object(spec["class"], key)
    try:
        return cls(**spec["args"])
    except TypeError as exc:
        raise TypeError(f"{key}: could not build {spec['class']} with args {spec['args']}: {exc}") from None


def build_data(data: dict, *, num_classes: int, seed: int, run_dir: Path) -> tuple[FieldView, FieldView, list, list]:
    """(train view, val view, train sizes, val sizes) from the config's ``data`` section."""
    dataset = _build(data["dataset"], "data.dataset.class")
    key = json.dumps(data["dataset"], sort_keys=True)
    sizes = dataset_sizes(dataset, data["fields"], run_dir / "sizes_cache.json", key)
    augment = build_augmentation(data["augment"], ignore_index=data["ignore_index"]) if data["augment"] else None
    checks = {"num_classes": num_classes, "ignore_index": data["ignore_index"]}
    if data["val_dataset"]["class"] is not None:
        val_set = _build(data["val_dataset"], "data.val_dataset.class")
        val_key = json.dumps(data["val_dataset"], sort_keys=True)
        val_sizes = dataset_sizes(val_set, data["fields"], run_dir / "val_sizes_cache.json", val_key)
        train = FieldView(dataset, data["fields"], augment=augment, seed=seed, **checks)
        val = FieldView(val_set, data["fields"], **checks)
        return train, val, sizes, val_sizes
    train_idx, val_idx = size_stratified_split(sizes, data["val_fraction"], seed=seed)
    train = FieldView(dataset, data["fields"], train_idx, augment=augment, seed=seed, **checks)
    val = FieldView(dataset, data["fields"], val_idx, **checks)
    return train, val, train.sizes_of(sizes), val.sizes_of(sizes)


def build_model(model_cfg: dict, device: torch.device, channels_last: bool) -> tuple[UNet, dict]:
    """The UNet the config describes, on ``device``, and the arguments that rebuild it (kept in checkpoints)."""
    model_args = {k: model_cfg[k] for k in MODEL_ARGS}
    model = UNet(**model_args).to(device)
    if channels_last:
        model = model.to(memory_format=torch.channels_last)
    return model, model_args


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


def wrap_for_training(model: torch.nn.Module, *, compile: bool, world: int, device: torch.device) -> torch.nn.Module:
    """The module a training step calls: ``model`` itself in one process, its DDP wrapper under torchrun.

    ``model`` stays the bare UNet -- its state_dict is what checkpoints hold, and validation calls it directly,
    since no gradients need averaging there. ``train.compile`` compiles ``model`` in place (``Module.compile``,
    so its state_dict keys keep their names) before DDP wraps it, as PyTorch's documentation recommends: DDP's
    own hooks then run outside the compiled graph and overlap the gradient all-reduce with the backward pass.
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


# -- checkpoints and metrics -----------------------------------------------------------------------
@dataclass
class Run:
    """What a checkpoint is made of, in one place: the bare model, the optimization state, the run's facts."""

    model: UNet
    model_args: dict
    optimizer: torch.optim.Optimizer
    scheduler: Any
    scaler: torch.amp.GradScaler
    sampler: SizeGroupedBatchSampler
    cfg: dict
    class_names: list[str]
    image_mode: str

    def checkpoint(self, epoch: int, progress: Progress, best: float) -> dict[str, Any]:
        return {
            "model": self.model.state_dict(),
            "model_args": self.model_args,
            "size_divisor": self.model.size_divisor,
            "class_names": self.class_names,
            "ignore_index": self.cfg["data"]["ignore_index"],
            "image_mode": self.image_mode,
            "config": self.cfg,
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "scaler": self.scaler.state_dict(),
            "epoch": epoch,
            "step": progress.step,
            "batches_done": progress.batches_done,
            "sampler": self.sampler.state_dict(),
            "rng": rng_state(),
            "best_metric": best,
        }

    def save(self, path: Path, epoch: int, progress: Progress, best: float) -> None:
        with disk_full_names(path):
            save_checkpoint(self.checkpoint(epoch, progress, best), path)


def restore(run: Run, ckpt: dict[str, Any]) -> tuple[int, Progress, float]:
    """Load a checkpoint's states into ``run``; returns (epoch to start at, progress within it, best score)."""
    run.model.load_state_dict(ckpt["model"])
    run.optimizer.load_state_dict(ckpt["optimizer"])
    run.scheduler.load_state_dict(ckpt["scheduler"])
    if ckpt["scaler"]:  # empty when the checkpoint was not trained in fp16: a resume in fp16 starts a fresh scale
        run.scaler.load_state_dict(ckpt["scaler"])
    set_rng_state(ckpt["rng"])
    progress = Progress(step=ckpt["step"], batches_done=ckpt.get("batches_done", 0))
    return ckpt["epoch"], progress, ckpt.get("best_metric", -math.inf)


def _write_metrics(run_dir: Path, row: dict[str, Any]) -> None:
    """Append the epoch's row to metrics.jsonl, then rewrite metrics.csv from all rows (atomically).

    The CSV is rebuilt rather than appended so that its header covers every column, also when a later row
    gains validation columns (``train.val_every`` > 1) or a resumed run appends.
    """
    with disk_full_names(run_dir / "metrics.jsonl"), open(run_dir / "metrics.jsonl", "a") as f:
        f.write(json.dumps(row) + "\n")
    rows = []
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        record = json.loads(line)
        flat = {k: v for k, v in record.items() if not isinstance(v, list)}
        for name in ("iou", "dice"):
            for c, value in enumerate(record.get(f"val_{name}", [])):
                flat[f"val_{name}_{c}"] = value
        rows.append(flat)
    columns = list(dict.fromkeys(k for r in rows for k in r))
    text = io.StringIO()
    writer = csv.DictWriter(text, fieldnames=columns)
    writer.writeheader()
    writer.writerows(rows)
    with disk_full_names(run_dir / "metrics.csv"):
        atomic_write_text(run_dir / "metrics.csv", text.getvalue())


def save_epoch(run: Run, run_dir: Path, epoch: int, progress: Progress, best: float, improved: bool) -> None:
    """After a complete epoch (main process): best.pt when validation improved, then last.pt.

    ``best`` is recorded in last.pt only once best.pt holds its weights: a Ctrl-C while best.pt is written
    leaves last.pt at the previous best, so the resumed run validates this epoch again and writes best.pt then.
    """
    if improved:
        run.save(run_dir / "best.pt", epoch, progress, best)
    run.save(run_dir / "last.pt", epoch, progress, best)


def _tensorboard(run_dir: Path):
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:  # tensorboard is optional
        return None
    return SummaryWriter(str(run_dir / "tensorboard"))


def _cpu_has_native_bf16() -> bool:
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    return "avx512_bf16" in flags or "amx_bf16" in flags


def single_process_device(name: str) -> torch.device:
    device = resolve_device(name)
    if device.type == "cuda" and device.index is not None:
        torch.cuda.set_device(device)  # cuda:N: kernels and allocations of this process go to GPU N
    return device


# -- the entry point -------------------------------------------------------------------------------
def train(cfg: dict, resume: str | os.PathLike | None = None) -> dict[str, Any]:
    """Train by ``cfg`` (a resolved config); returns a summary with the final validation scores."""
    processes = distributed.environment()
    ckpt = read_resume_checkpoint(resume, cfg["model"])
    run_dir = Path(cfg["run"]["dir"])
    if processes.main:
        prepare_run_dir(run_dir, cfg)
    prepare_synthetic_data(cfg["data"]["synthetic"], processes)
    processes = distributed.start(processes, cfg["train"]["dist_timeout_s"], cfg["run"]["device"])
    try:
        with disk_full_names(run_dir):  # a full disk anywhere else (size caches, TensorBoard): the run folder is named
            return _train(cfg, ckpt, processes, run_dir)
    finally:
        if processes.owns_group:
            distributed.stop()


def _train(cfg: dict, ckpt: dict[str, Any] | None, processes: Processes, run_dir: Path) -> dict[str, Any]:
    tcfg, dcfg, mcfg = cfg["train"], cfg["data"], cfg["model"]
    device = processes.device or single_process_device(cfg["run"]["device"])
    if tcfg["precision"] == "bf16" and device.type == "cpu" and not _cpu_has_native_bf16():
        warnings.warn(
            "train.precision=bf16 on a CPU without native bf16 (no avx512_bf16/amx): "
            "expect it to run many times slower than fp32."
        )
    seed = cfg["run"]["seed"]
    seed_everything(seed)
    train_view, val_view, train_sizes, val_sizes = build_data(
        dcfg, num_classes=mcfg["num_classes"], seed=seed, run_dir=run_dir
    )
    model, model_args = build_model(mcfg, device, tcfg["channels_last"])
    collate = AlignedCollate(model.size_divisor, pad={"image": 0, "mask": dcfg["ignore_index"]})
    grouping = {"batch_size": dcfg["batch_size"], "max_pixels": dcfg["max_pixels"], "divisor": model.size_divisor}
    sampler = SizeGroupedBatchSampler(
        train_sizes, **grouping, shuffle=True, seed=seed, num_replicas=processes.world, rank=processes.rank
    )
    val_batches = list(SizeGroupedBatchSampler(val_sizes, **grouping, shuffle=False))
    val_loader = DataLoader(
        val_view,
        batch_sampler=val_batches[processes.rank :: processes.world],
        collate_fn=collate,
        num_workers=dcfg["num_workers"],
        pin_memory=device.type == "cuda",
    )
    optimizer, scheduler, scaler = build_optimization(
        model,
        device=device,
        lr=tcfg["lr"],
        weight_decay=tcfg["weight_decay"],
        warmup_steps=tcfg["warmup_steps"],
        min_lr_ratio=tcfg["min_lr_ratio"],
        total_steps=tcfg["epochs"] * len(sampler),
        precision=tcfg["precision"],
    )
    run = Run(
        model,
        model_args,
        optimizer,
        scheduler,
        scaler,
        sampler,
        cfg,
        class_names_or_default(mcfg["class_names"], mcfg["num_classes"]),
        getattr(train_view.dataset, "image_mode", "RGB"),
    )
    start_epoch, progress, best = 0, Progress(), -math.inf
    if ckpt is not None:
        start_epoch, progress, best = restore(run, ckpt)
        if processes.main:
            print(f"srforge: resuming {run_dir} at epoch {start_epoch + 1}, step {progress.step}")
    net = wrap_for_training(model, compile=tcfg["compile"], world=processes.world, device=device)

    shared = {  # what both the training pass and validation need to know
        "device": device,
        "precision": tcfg["precision"],
        "channels_last": tcfg["channels_last"],
        "num_classes": mcfg["num_classes"],
        "ignore_index": dcfg["ignore_index"],
        "dice_weight": tcfg["dice_weight"],
    }
    step_options = {
        "grad_clip": tcfg["grad_clip"],
        "skip_nonfinite": tcfg["skip_nonfinite"],
        "log_every": tcfg["log_every"],
    }
    writer = _tensorboard(run_dir) if processes.main else None
    stop = tcfg["epochs"] if tcfg["stop_after"] is None else min(tcfg["epochs"], start_epoch + tcfg["stop_after"])
    summary: dict[str, Any] = {"run_dir": str(run_dir), "best_mean_iou": best, "class_names": run.class_names}
    net.train()
    for epoch in range(start_epoch, stop):
        sampler.set_epoch(epoch)
        train_view.set_epoch(epoch)
        loader = DataLoader(
            train_view,
            batch_sampler=list(sampler)[progress.batches_done :],  # a resumed epoch skips the batches done
            collate_fn=collate,
            num_workers=dcfg["num_workers"],
            pin_memory=device.type == "cuda",
        )
        row, best = run_epoch(
            run,
            net,
            loader,
            val_loader,
            epoch,
            progress,
            best,
            epochs=tcfg["epochs"],
            validate=(epoch + 1) % tcfg["val_every"] == 0 or epoch + 1 == tcfg["epochs"],
            processes=processes,
            run_dir=run_dir,
            writer=writer,
            shared=shared,
            step_options=step_options,
        )
        summary.update(row)
    summary["best_mean_iou"] = best
    if writer is not None:
        writer.close()
    distributed.barrier()
    return summary


def run_epoch(
    run: Run,
    net: torch.nn.Module,
    loader: DataLoader,
    val_loader: DataLoader,
    epoch: int,
    progress: Progress,
    best: float,
    *,
    epochs: int,
    validate: bool,
    processes: Processes,
    run_dir: Path,
    writer,
    shared: dict[str, Any],
    step_options: dict[str, Any],
) -> tuple[dict[str, Any], float]:
    """One epoch: the training pass, validation when due, best.pt / last.pt, the metrics row.

    Returns (the epoch's metrics row, the best validation mean IoU so far). A Ctrl-C anywhere in it -- validation
    and saving included -- writes last.pt at the batch reached, then propagates.
    """
    main = processes.main
    bar = tqdm(loader, desc=f"epoch {epoch + 1}/{epochs}", disable=not main, leave=False)
    epoch_saved = False
    try:
        totals, confusion, seconds = train_epoch(
            net,
            bar,
            run.optimizer,
            run.scheduler,
            run.scaler,
            progress,
            **shared,
            **step_options,
            world=processes.world,
            bar=bar if main else None,
            epoch=epoch,
        )
        bar.close()
        loss_sum, batches_stepped, pixels = distributed.reduce_sum(totals).tolist()
        row: dict[str, Any] = {
            "epoch": epoch + 1,
            "step": progress.step,
            "lr": run.scheduler.get_last_lr()[0],
            "train_loss": loss_sum / max(batches_stepped, 1),
            "train_mean_iou": scores(distributed.reduce_sum(confusion).cpu())["mean_iou"],
            "real_pixels_per_s": pixels / seconds,
            "seconds": seconds,
        }
        improved = False
        if validate:
            val = evaluate(run.model, val_loader, **shared)  # the bare model: no gradients to average
            row.update({f"val_{k}": val[k] for k in ("loss", "mean_iou", "pixel_accuracy", "iou", "dice")})
            improved = math.isfinite(val["mean_iou"]) and val["mean_iou"] > best
        if main:
            save_epoch(
                run, run_dir, epoch + 1, Progress(progress.step, 0), row["val_mean_iou"] if improved else best, improved
            )
            epoch_saved = True
        best = row["val_mean_iou"] if improved else best
        progress.batches_done = 0
        if main:
            _write_metrics(run_dir, row)
            _log_row(writer, row, progress.step)
    except KeyboardInterrupt:
        if main:
            if not epoch_saved:
                run.save(run_dir / "last.pt", epoch, progress, best)
            print(
                f"\nsrforge: interrupted; wrote {run_dir / 'last.pt'} (epoch {epoch + 1}, "
                f"{progress.batches_done} batches done). Continue with --resume {run_dir}"
            )
        raise
    return row, best


def _log_row(writer, row: dict[str, Any], step: int) -> None:
    """TensorBoard scalars and one JSON line on the console for the epoch's row."""
    if writer is not None:
        for key, value in row.items():
            if isinstance(value, float):
                writer.add_scalar(key, value, step)
    shown = {k: (round(v, 4) if isinstance(v, float) else v) for k, v in row.items() if not isinstance(v, list)}
    tqdm.write(f"srforge: {json.dumps(shown)}")
