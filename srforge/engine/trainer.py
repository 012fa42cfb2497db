"""The training loop: one function a reader can hold in their head.

    cfg -> datasets (size-stratified split) -> size-grouped batches -> AlignedCollate(model.size_divisor)
        -> UNet(image, sizes) -> cross-entropy (+ Dice) on valid pixels -> AdamW, warm-up + cosine
        -> validation (confusion matrix over valid pixels) -> last.pt every epoch, best.pt by mean IoU

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
import io
import json
import math
import os
import random
import time
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch.utils.data import DataLoader
from tqdm import tqdm

from srforge.atomic import atomic_write_text
from srforge.config import dump, import_object
from srforge.data.adapter import FieldView
from srforge.data.augment import build_augmentation
from srforge.data.collate import AlignedCollate
from srforge.data.sampling import SizeGroupedBatchSampler, size_stratified_split
from srforge.data.sizes import dataset_sizes
from srforge.engine.checkpoint import (
    class_names_or_default,
    load_checkpoint,
    save_checkpoint,
)
from srforge.engine.device import autocast, resolve_device
from srforge.engine.losses import segmentation_loss
from srforge.engine.metrics import class_map, confusion_matrix, scores
from srforge.models import UNet


class NonFiniteLossError(RuntimeError):
    """The loss became NaN or infinite; the message names the step and the batch's samples."""


# -- set-up ----------------------------------------------------------------------------------------
def _distributed() -> tuple[int, int, torch.device | None]:
    """(rank, world size, device chosen by the launcher) -- (0, 1, None) without torchrun."""
    if "RANK" not in os.environ or "WORLD_SIZE" not in os.environ:
        return 0, 1, None
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local = int(os.environ.get("LOCAL_RANK", rank))
    use_cuda = torch.cuda.is_available()
    if not dist.is_initialized():
        dist.init_process_group("nccl" if use_cuda else "gloo")
    if use_cuda:
        torch.cuda.set_device(local)
        return rank, world, torch.device("cuda", local)
    return rank, world, torch.device("cpu")


def _cpu_has_native_bf16() -> bool:
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    return "avx512_bf16" in flags or "amx_bf16" in flags


def _seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def _rng_state() -> dict[str, Any]:
    # numpy's state holds an ndarray: stored as a tensor so that weights_only loading accepts it.
    kind, keys, pos, has_gauss, gauss = np.random.get_state()
    state = {
        "torch": torch.get_rng_state(),
        "numpy": {
            "kind": kind,
            "keys": torch.from_numpy(keys.astype(np.int64)),
            "pos": pos,
            "has_gauss": has_gauss,
            "gauss": gauss,
        },
        "python": list(random.getstate()[1]),
        "python_version": random.getstate()[0],
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def _set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    n = state["numpy"]
    np.random.set_state((n["kind"], n["keys"].numpy().astype(np.uint32), n["pos"], n["has_gauss"], n["gauss"]))
    random.setstate((state["python_version"], tuple(state["python"]), None))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def _maybe_generate_synthetic(cfg: dict, rank: int) -> None:
    syn = cfg["data"]["synthetic"]
    if syn["root"] is None:
        return
    root = Path(syn["root"])
    if rank == 0 and not (root / "images").is_dir():
        from srforge.data.synthetic import make_welllog_scans

        print(f"srforge: generating {syn['n']} synthetic well-log scans into {root} (scale {syn['scale']})")
        make_welllog_scans(root, syn["n"], scale=syn["scale"], seed=syn["seed"], classes=syn["classes"])
    if dist.is_initialized():
        dist.barrier()


def _build(spec: dict, key: str):
    cls = import_object(spec["class"], key)
    try:
        return cls(**spec["args"])
    except TypeError as exc:
        raise TypeError(f"{key}: could not build {spec['class']} with args {spec['args']}: {exc}") from None


def build_data(cfg: dict, run_dir: Path) -> tuple[FieldView, FieldView, list, list]:
    """(train view, val view, train sizes, val sizes) from the data section of the config."""
    data = cfg["data"]
    dataset = _build(data["dataset"], "data.dataset.class")
    key = json.dumps(data["dataset"], sort_keys=True)
    sizes = dataset_sizes(dataset, data["fields"], run_dir / "sizes_cache.json", key)
    augment = build_augmentation({**data["augment"], "ignore_index": data["ignore_index"]}) if data["augment"] else None
    seed = cfg["run"]["seed"]
    checks = {"num_classes": cfg["model"]["num_classes"], "ignore_index": data["ignore_index"]}
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


def _schedule(step: int, warmup: int, total: int, min_ratio: float) -> float:
    """LR multiplier: linear warm-up over ``warmup`` steps, then cosine down to ``min_ratio``."""
    if step < warmup:
        return (step + 1) / warmup
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    return min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * progress))


# -- the loop --------------------------------------------------------------------------------------
def _reduce(tensor: torch.Tensor) -> torch.Tensor:
    if dist.is_initialized():
        dist.all_reduce(tensor)
    return tensor


@torch.no_grad()
def evaluate(model, loader, device, cfg) -> dict[str, Any]:
    """Loss and per-class scores over valid pixels, summed across ranks."""
    model.eval()
    k, ignore = cfg["model"]["num_classes"], cfg["data"]["ignore_index"]
    confusion = torch.zeros(k, k, dtype=torch.int64, device=device)
    loss_sum = torch.zeros(2, dtype=torch.float64, device=device)  # (sum of per-pixel losses, valid pixels)
    for batch in loader:
        image, mask, sizes = batch.image.to(device), batch.mask.to(device).long(), batch.sizes.to(device)
        with autocast(device, cfg["train"]["precision"]):
            logits = model(image, sizes)
        valid = int((mask != ignore).sum())
        loss_sum += torch.tensor(
            [float(segmentation_loss(logits, mask, ignore)) * valid, valid], dtype=torch.float64, device=device
        )
        confusion += confusion_matrix(class_map(logits), mask, k, ignore)
    _reduce(confusion)
    _reduce(loss_sum)
    model.train()
    out = scores(confusion.cpu())
    out["loss"] = float(loss_sum[0] / loss_sum[1]) if loss_sum[1] else float("nan")
    return out


def _write_metrics(run_dir: Path, row: dict[str, Any]) -> None:
    """Append the epoch's row to metrics.jsonl, then rewrite metrics.csv from all rows (atomically).

    The CSV is rebuilt rather than appended so that its header covers every column, also when a later row
    gains validation columns (``train.val_every`` > 1) or a resumed run appends.
    """
    with open(run_dir / "metrics.jsonl", "a") as f:
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
    atomic_write_text(run_dir / "metrics.csv", text.getvalue())


def _all_finite(loss: torch.Tensor) -> bool:
    """Whether the loss is finite on every rank: all ranks must agree to step or to skip, or DDP hangs."""
    finite = torch.isfinite(loss.detach()).to(torch.float32)
    if dist.is_initialized():
        dist.all_reduce(finite, op=dist.ReduceOp.MIN)
    return bool(finite)


def _tensorboard(run_dir: Path):
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:  # tensorboard is optional
        return None
    return SummaryWriter(str(run_dir / "tensorboard"))


def train(cfg: dict, resume: str | os.PathLike | None = None) -> dict[str, Any]:
    """Train by ``cfg`` (a resolved config); returns a summary with the final validation scores."""
    rank, world, launched = _distributed()
    device = launched or resolve_device(cfg["run"]["device"])
    run_dir = Path(cfg["run"]["dir"])
    main = rank == 0
    tcfg, dcfg, mcfg = cfg["train"], cfg["data"], cfg["model"]
    if tcfg["precision"] == "bf16" and device.type == "cpu" and not _cpu_has_native_bf16():
        warnings.warn(
            "train.precision=bf16 on a CPU without native bf16 (no avx512_bf16/amx): "
            "expect it to run many times slower than fp32."
        )

    ckpt = None
    if resume is not None:
        path = Path(resume)
        ckpt = load_checkpoint(path / "last.pt" if path.is_dir() else path)
    if main:
        run_dir.mkdir(parents=True, exist_ok=True)
        atomic_write_text(run_dir / "config.yaml", dump(cfg))
    _seed_everything(cfg["run"]["seed"])
    _maybe_generate_synthetic(cfg, rank)
    train_view, val_view, train_sizes, val_sizes = build_data(cfg, run_dir)

    model_args = {
        k: mcfg[k] for k in ("in_channels", "num_classes", "base_channels", "depth", "max_channels", "padding_aware")
    }
    model = UNet(**model_args).to(device)
    if tcfg["channels_last"]:
        model = model.to(memory_format=torch.channels_last)
    class_names = class_names_or_default(mcfg["class_names"], mcfg["num_classes"])
    collate = AlignedCollate(model.size_divisor, pad={"image": 0, "mask": dcfg["ignore_index"]})
    sampler = SizeGroupedBatchSampler(
        train_sizes,
        batch_size=dcfg["batch_size"],
        max_pixels=dcfg["max_pixels"],
        divisor=model.size_divisor,
        shuffle=True,
        seed=cfg["run"]["seed"],
        num_replicas=world,
        rank=rank,
    )
    val_batches = list(
        SizeGroupedBatchSampler(
            val_sizes,
            batch_size=dcfg["batch_size"],
            max_pixels=dcfg["max_pixels"],
            divisor=model.size_divisor,
            shuffle=False,
        )
    )
    val_loader = DataLoader(
        val_view, batch_sampler=val_batches[rank::world], collate_fn=collate, num_workers=dcfg["num_workers"]
    )

    optimizer = torch.optim.AdamW(model.parameters(), lr=tcfg["lr"], weight_decay=tcfg["weight_decay"])
    total_steps = tcfg["epochs"] * len(sampler)
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: _schedule(s, tcfg["warmup_steps"], total_steps, tcfg["min_lr_ratio"])
    )
    scaler = torch.amp.GradScaler(device.type, enabled=tcfg["precision"] == "fp16")

    start_epoch, step, skip, best = 0, 0, 0, -math.inf
    if ckpt is not None:
        model.load_state_dict(ckpt["model"])
        optimizer.load_state_dict(ckpt["optimizer"])
        scheduler.load_state_dict(ckpt["scheduler"])
        scaler.load_state_dict(ckpt["scaler"])
        start_epoch, step, skip = ckpt["epoch"], ckpt["step"], ckpt.get("batches_done", 0)
        best = ckpt.get("best_metric", -math.inf)
        _set_rng_state(ckpt["rng"])
        if main:
            print(f"srforge: resuming {run_dir} at epoch {start_epoch + 1}, step {step}")

    net = model
    if tcfg["compile"]:
        net = torch.compile(net, dynamic=True)
    if world > 1:
        net = torch.nn.parallel.DistributedDataParallel(
            net, device_ids=[device.index] if device.type == "cuda" else None
        )

    def checkpoint(epoch: int, batches_done: int, metric: float) -> dict[str, Any]:
        return {
            "model": model.state_dict(),
            "model_args": model_args,
            "size_divisor": model.size_divisor,
            "class_names": class_names,
            "ignore_index": dcfg["ignore_index"],
            "config": cfg,
            "optimizer": optimizer.state_dict(),
            "scheduler": scheduler.state_dict(),
            "scaler": scaler.state_dict(),
            "epoch": epoch,
            "step": step,
            "batches_done": batches_done,
            "sampler": sampler.state_dict(),
            "rng": _rng_state(),
            "best_metric": metric,
        }

    writer = _tensorboard(run_dir) if main else None
    stop = tcfg["epochs"] if tcfg["stop_after"] is None else min(tcfg["epochs"], start_epoch + tcfg["stop_after"])
    ignore, k = dcfg["ignore_index"], mcfg["num_classes"]
    summary: dict[str, Any] = {"run_dir": str(run_dir), "best_mean_iou": best, "class_names": class_names}
    net.train()
    for epoch in range(start_epoch, stop):
        sampler.set_epoch(epoch)
        train_view.set_epoch(epoch)
        batches = list(sampler)[skip:]
        loader = DataLoader(
            train_view,
            batch_sampler=batches,
            collate_fn=collate,
            num_workers=dcfg["num_workers"],
            pin_memory=device.type == "cuda",
        )
        bar = tqdm(
            loader, total=len(batches), desc=f"epoch {epoch + 1}/{tcfg['epochs']}", disable=not main, leave=False
        )
        stats = torch.zeros(3, dtype=torch.float64, device=device)  # loss sum, batches, real pixels
        confusion = torch.zeros(k, k, dtype=torch.int64, device=device)
        started, done, epoch_saved = time.perf_counter(), skip, False
        try:
            for batch in bar:
                image = batch.image.to(device, non_blocking=True)  # uint8: the model normalises on the device
                mask = batch.mask.to(device, non_blocking=True).long()  # uint8 on the way, int64 for the loss
                sizes = batch.sizes.to(device, non_blocking=True)
                if tcfg["channels_last"]:
                    image = image.contiguous(memory_format=torch.channels_last)
                with autocast(device, tcfg["precision"]):
                    logits = net(image, sizes)
                loss = segmentation_loss(logits, mask, ignore, tcfg["dice_weight"])
                if not _all_finite(loss):
                    message = (
                        f"non-finite loss {loss.item()} at step {step + 1} (epoch {epoch + 1}) on samples {batch.name}"
                    )
                    if not tcfg["skip_nonfinite"]:
                        raise NonFiniteLossError(message + "; set train.skip_nonfinite=true to skip such batches.")
                    if main:
                        tqdm.write(f"srforge: skipped a batch with a {message}")
                    optimizer.zero_grad(set_to_none=True)
                    done += 1
                    continue
                optimizer.zero_grad(set_to_none=True)
                scaler.scale(loss).backward()
                if tcfg["grad_clip"]:
                    scaler.unscale_(optimizer)
                    torch.nn.utils.clip_grad_norm_(model.parameters(), tcfg["grad_clip"])
                scaler.step(optimizer)
                scaler.update()
                scheduler.step()
                step += 1
                done += 1
                with torch.no_grad():
                    confusion += confusion_matrix(class_map(logits), mask, k, ignore)
                stats += torch.tensor(
                    [loss.item(), 1, float(batch.sizes.prod(1).sum())], dtype=torch.float64, device=device
                )
                seconds = time.perf_counter() - started
                miou = scores(confusion.cpu())["mean_iou"]
                bar.set_postfix(
                    loss=f"{stats[0] / stats[1]:.4f}", mIoU=f"{miou:.3f}", px_s=f"{stats[2] * world / seconds:.3g}"
                )
            skip = 0
            seconds = time.perf_counter() - started
            _reduce(stats)
            row: dict[str, Any] = {
                "epoch": epoch + 1,
                "step": step,
                "lr": scheduler.get_last_lr()[0],
                "train_loss": float(stats[0] / max(stats[1], 1)),
                "train_mean_iou": scores(_reduce(confusion).cpu())["mean_iou"],
                "real_pixels_per_s": float(stats[2] / seconds),
                "seconds": seconds,
            }
            if (epoch + 1) % tcfg["val_every"] == 0 or epoch + 1 == tcfg["epochs"]:
                val = evaluate(model, val_loader, device, cfg)
                row.update(
                    {
                        "val_loss": val["loss"],
                        "val_mean_iou": val["mean_iou"],
                        "val_pixel_accuracy": val["pixel_accuracy"],
                        "val_iou": val["iou"],
                        "val_dice": val["dice"],
                    }
                )
                if math.isfinite(val["mean_iou"]) and val["mean_iou"] > best:
                    best = val["mean_iou"]
                    if main:
                        save_checkpoint(checkpoint(epoch + 1, 0, best), run_dir / "best.pt")
            if main:
                save_checkpoint(checkpoint(epoch + 1, 0, best), run_dir / "last.pt")
                epoch_saved = True
                _write_metrics(run_dir, row)
                if writer is not None:
                    for key, value in row.items():
                        if isinstance(value, float):
                            writer.add_scalar(key, value, step)
                shown = {
                    k: (round(v, 4) if isinstance(v, float) else v) for k, v in row.items() if not isinstance(v, list)
                }
                tqdm.write(f"srforge: {json.dumps(shown)}")
        except KeyboardInterrupt:
            # Anywhere in the epoch, validation and saving included: last.pt records how far it got.
            if main:
                if not epoch_saved:
                    save_checkpoint(checkpoint(epoch, done, best), run_dir / "last.pt")
                print(
                    f"\nsrforge: interrupted; wrote {run_dir / 'last.pt'} (epoch {epoch + 1}, {done} batches done). "
                    f"Continue with --resume {run_dir}"
                )
            raise
        summary.update(row)
    summary["best_mean_iou"] = best
    if writer is not None:
        writer.close()
    if dist.is_initialized():
        dist.barrier()
    return summary
