"""Training throughput in real (unpadded) pixels per second, every batching strategy side by side, on one device.

On synthetic well-log scans at 1/8 scale (heights 60-80, widths 400-1,600), one run measures on ``--device``:

- batch 1, each scan padded only to its own multiple of 32 (the only option before srforge);
- batch 16 in random order; batch 16 size-grouped; a pixel budget (size-grouped);
- the share of step time spent waiting for data with 2 loader workers (pixel-budget batches);
- the trainer itself (``srforge.train.train``, batch 1, on the same device) against the bare model's
  forward+backward at batch 1 on the same scans with no loader: the framework's own cost (goal >= 0.97x on CPU,
  >= 0.9x on CUDA). On CUDA the trainer runs 2 epochs and its second (every shape already seen) is reported;
- on CUDA, one training step at configs/welllog.yaml's budget (its data.max_pixels of 640 x 4,800 scans, its
  model and precision), with the peak GPU memory;
- what the thin-structure loss (``train.skeleton_weight``) and self-training (``train.self_training`` on the
  quickstart's own images as unlabelled scans, without and with its ``skeleton`` term) cost: configs/quickstart.yaml
  trained 2 epochs with data.cache, each setting run twice in turns, the second epoch's seconds (tubes and decoded
  scans cached) against the plain run's (goal for the skeleton loss <= 1.15x); the first epoch's too, which makes
  the tubes.

Every strategy runs the same optimizer (AdamW) and loss on the same scans, one epoch each, after a warm-up step on
every batch shape it will meet on CUDA (kernel selection and allocator blocks are per shape there; on the CPU one
warm-up step on the largest batch). Timers synchronise with the GPU before they read the clock. Peak memory:
torch.cuda.max_memory_allocated per strategy on CUDA, the process's peak RSS on the CPU.

    python benchmarks/bench_train.py [--device cpu|cuda] [--scans 32] [--base-channels 16] [--out FILE.json]
                                     [--only-extras]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import sys
import tempfile
import time
from pathlib import Path

import torch
import yaml
from torch.utils.data import DataLoader

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from srforge.config import load_config, resolve  # noqa: E402
from srforge.data.collate import AlignedCollate  # noqa: E402
from srforge.data.datasets import SegmentationFolder  # noqa: E402
from srforge.data.sampling import SizeGroupedBatchSampler  # noqa: E402
from srforge.models import UNet  # noqa: E402
from srforge.runtime.device import autocast, resolve_device  # noqa: E402
from srforge.synthetic import make_welllog_scans  # noqa: E402
from srforge.train import train  # noqa: E402
from srforge.train.losses import segmentation_loss  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def on_device(batch, device: torch.device):
    """(image, mask int64, sizes) of a collated batch on ``device``, as the trainer hands them to the model."""
    return (
        batch.image.to(device, non_blocking=True),
        batch.mask.to(device, non_blocking=True).long(),
        batch.sizes.to(device, non_blocking=True),
    )


def step(model, optimizer, image, mask, sizes) -> None:
    loss = segmentation_loss(model(image, sizes), mask)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()


def warm_up(model, optimizer, batches: list[list[int]], dataset, collate, device: torch.device) -> None:
    """One step per distinct padded batch shape on CUDA; one step on the largest batch on the CPU."""
    shapes: dict = {}
    for indices in batches:
        batch = collate([dataset[i] for i in indices])
        shapes.setdefault(tuple(batch.image.shape), batch)
    chosen = list(shapes.values()) if device.type == "cuda" else [max(shapes.values(), key=lambda b: b.image.numel())]
    for batch in chosen:
        step(model, optimizer, *on_device(batch, device))
    sync(device)


def epoch(model, loader, device: torch.device, warm: tuple, data_wait: list | None = None) -> float:
    """Real pixels per second of one epoch of AdamW steps over ``loader``, after ``warm_up(*warm)``."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    warm_up(model, optimizer, *warm, device)
    pixels, seconds = 0, 0.0
    it = iter(loader)
    while True:
        sync(device)
        t0 = time.perf_counter()
        try:
            batch = next(it)
        except StopIteration:
            break
        t1 = time.perf_counter()
        step(model, optimizer, *on_device(batch, device))
        sync(device)
        t2 = time.perf_counter()
        pixels += int(batch.sizes.prod(1).sum())
        seconds += t2 - t0
        if data_wait is not None:
            data_wait.append((t1 - t0, t2 - t0))
    return pixels / seconds


def peak_memory_mib(device: torch.device) -> float:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux: the process so far


def reset_peak(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


def welllog_budget_step(device: torch.device, repeats: int = 3) -> dict:
    """Seconds per training step and peak GiB at configs/welllog.yaml's budget: as many 640 x 4,800 scans as its
    data.max_pixels holds (the first full size, the others a little smaller), its model, precision and layout."""
    cfg = resolve(yaml.safe_load((ROOT / "configs" / "welllog.yaml").read_text()))
    data, mcfg, tcfg = cfg["data"], cfg["model"], cfg["train"]
    height, width = 640, 4800
    model = UNet(**{k: mcfg[k] for k in ("in_channels", "num_classes", "base_channels", "depth", "max_channels")})
    model = model.to(device)
    budget = data["max_pixels"]
    if budget == "auto":  # what the trainer derives on this device: the probe, then the free memory's share
        from srforge.runtime.device_memory import auto_budget, free_memory, planning_share
        from srforge.train.pixel_budget import probe_memory

        def loss(logits, mask):
            return segmentation_loss(logits, mask, data["ignore_index"], tcfg["dice_weight"])

        memory = probe_memory(model, device, tcfg["precision"], loss, channels_last=tcfg["channels_last"])
        share = planning_share(free_memory(device), device.type)
        budget = auto_budget(memory, share, device.type, model.size_divisor)[0]
    count = max(1, budget // (height * width)) if budget else data["batch_size"]
    if tcfg["channels_last"]:
        model = model.to(memory_format=torch.channels_last)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    g = torch.Generator(device="cpu").manual_seed(0)
    image = torch.randint(0, 256, (count, 3, height, width), dtype=torch.uint8, generator=g).to(device)
    if tcfg["channels_last"]:
        image = image.contiguous(memory_format=torch.channels_last)
    mask = torch.randint(0, mcfg["num_classes"], (count, height, width), generator=g).to(device)
    sizes = torch.tensor([[height, width]] + [[height - 40, width - 800]] * (count - 1), device=device)
    times = []
    reset_peak(device)
    for i in range(repeats + 1):  # the first is the warm-up
        sync(device)
        t0 = time.perf_counter()
        with autocast(device, tcfg["precision"]):
            logits = model(image, sizes)
        loss = segmentation_loss(logits, mask, data["ignore_index"], tcfg["dice_weight"])
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        sync(device)
        if i:
            times.append(time.perf_counter() - t0)
    real = int(sizes.prod(1).sum())
    return {
        "scans": count,
        "padded_pixels": count * height * width,
        "real_pixels": real,
        "base_channels": mcfg["base_channels"],
        "precision": tcfg["precision"],
        "channels_last": tcfg["channels_last"],
        "seconds_per_step": min(times),
        "real_px_per_s": real / min(times),
        "peak_gib": peak_memory_mib(device) / 1024,
    }


def extras_cost(tmp: Path, device: torch.device, rounds: int = 2) -> dict:
    """{setting: (epoch-1 seconds, epoch-2 seconds), mean over ``rounds`` turns} for the quickstart trained plain,
    with ``train.skeleton_weight=1``, with self-training on its own images and with that and the skeleton recall
    loss on its pseudo-labels (``skeleton``: tubes made each update); the ratios against plain."""
    data = tmp / "quickstart"
    common = [f"data.synthetic.root={data}", f"data.dataset.args.root={data}", f"data.cache={tmp / 'cache'}",
              f"run.device={device}", "train.epochs=2"]  # fmt: skip
    settings = {
        "plain": [],
        "skeleton loss": ["train.skeleton_weight=1.0"],
        "self-training": [f"data.unlabelled={data / 'images'}", "train.ema=0.99",
                          "train.self_training={weight: 1.0, confidence: 0.9, start_epoch: 1}"],
        "+ its skeleton": [f"data.unlabelled={data / 'images'}", "train.ema=0.99",
                           "train.self_training={weight: 1.0, confidence: 0.9, start_epoch: 1, skeleton: 1.0}"],
    }  # fmt: skip
    seconds: dict[str, list] = {name: [] for name in settings}
    for turn in range(rounds + 1):  # turn 0 fills the cache (decoded scans, tubes) and is not counted
        for name, extra in settings.items():
            run_dir = tmp / f"extras_{name.replace(' ', '_')}"
            cfg = load_config(ROOT / "configs" / "quickstart.yaml", [f"run.dir={run_dir}", *common, *extra])
            train(cfg, overwrite=True)
            rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
            if turn:
                seconds[name].append((rows[0]["seconds"], rows[1]["seconds"]))
    out = {name: [sum(s[i] for s in runs) / len(runs) for i in (0, 1)] for name, runs in seconds.items()}
    return {"seconds": out, "vs_plain": {name: out[name][1] / out["plain"][1] for name in out}}


def print_extras(extras: dict) -> None:
    for name, (first, second) in extras["seconds"].items():
        print(f"quickstart, {name:14} epoch 1 {first:6.2f} s, epoch 2 {second:6.2f} s: {extras['vs_plain'][name]:.2f}x "
              "the plain run's epoch 2" + (" (goal <= 1.15x)" if name == "skeleton loss" else ""))  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu", help="cpu or cuda (cuda:N); everything runs there")
    parser.add_argument("--scans", type=int, default=32)
    parser.add_argument("--base-channels", type=int, default=16)
    parser.add_argument("--max-pixels", type=int, default=400_000, help="pixel budget per batch")
    parser.add_argument("--data", default=None, help="folder for the synthetic scans (default: a temporary one)")
    parser.add_argument("--no-welllog", action="store_true", help="skip the welllog-budget step on CUDA")
    parser.add_argument("--out", default="benchmarks/results/bench_train.json")
    parser.add_argument("--only-extras", action="store_true", help="measure only the skeleton loss and self-training")
    args = parser.parse_args(argv)
    try:
        device = resolve_device(args.device)  # a CUDA device with its index, or a ValueError naming those there are
    except ValueError as exc:
        print(f"bench_train: --device: {exc}", file=sys.stderr)
        return 2
    if device.type == "cuda":
        torch.cuda.set_device(device)
    torch.manual_seed(0)
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")

    if args.only_extras:
        with tempfile.TemporaryDirectory() as tmp:
            print_extras(extras_cost(Path(tmp), device))
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(args.data or Path(tmp) / "scans")
        if not (root / "images").is_dir():
            make_welllog_scans(root, args.scans, scale=0.125, seed=0)
        dataset = SegmentationFolder(root, num_classes=2)
        sizes = dataset.sizes()
        model = UNet(base_channels=args.base_channels, depth=5).to(device)
        collate = AlignedCollate(model.size_divisor, pad={"image": 0, "mask": 255})
        real = sum(h * w for h, w in sizes)
        pin = device.type == "cuda"

        g = torch.Generator().manual_seed(0)
        random16 = [p.tolist() for p in torch.randperm(len(sizes), generator=g).split(16)]
        strategies = {
            "batch 1 (own multiple of 32)": [[i] for i in range(len(sizes))],
            "batch 16, random order": random16,
            "batch 16, size-grouped": list(SizeGroupedBatchSampler(sizes, batch_size=16, seed=0)),
            f"pixel budget {args.max_pixels:,}": list(
                SizeGroupedBatchSampler(sizes, max_pixels=args.max_pixels, seed=0)
            ),
        }
        rows = []

        def loader(batch_sampler, workers=0):
            return DataLoader(
                dataset, batch_sampler=batch_sampler, collate_fn=collate, num_workers=workers, pin_memory=pin
            )

        for name, batches in strategies.items():
            padded = sum(
                len(b) * max(-(-sizes[i][0] // 32) * 32 for i in b) * max(-(-sizes[i][1] // 32) * 32 for i in b)
                for b in batches
            )
            reset_peak(device)
            rate = epoch(model, loader(batches), device, (batches, dataset, collate))
            row = {
                "strategy": name,
                "batches": len(batches),
                "padding_waste": padded / real - 1,
                "real_px_per_s": rate,
                "peak_mib": peak_memory_mib(device),
            }
            rows.append(row)
            print(
                f"{name:32} {len(batches):4d} batches  waste {row['padding_waste']:6.1%}  {rate:12,.0f} real px/s  "
                f"peak {row['peak_mib']:8,.0f} MiB",
                flush=True,
            )
        base = rows[0]["real_px_per_s"]
        for row in rows:
            row["vs_batch1"] = row["real_px_per_s"] / base

        budget = strategies[f"pixel budget {args.max_pixels:,}"]
        waits: list = []
        epoch(model, loader(budget, workers=2), device, (budget, dataset, collate), data_wait=waits)
        wait_share = sum(w for w, _ in waits) / sum(t for _, t in waits)

        bare_batches = [collate([dataset[i]]) for i in range(len(dataset))]
        bare_on_device = [on_device(b, device) for b in bare_batches]
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
        warm_up(model, optimizer, [[i] for i in range(len(dataset))], dataset, collate, device)
        pixels, seconds = 0, 0.0
        for batch, tensors in zip(bare_batches, bare_on_device):
            sync(device)
            t0 = time.perf_counter()
            step(model, optimizer, *tensors)
            sync(device)
            seconds += time.perf_counter() - t0
            pixels += int(batch.sizes.prod(1).sum())
        bare = pixels / seconds

        cfg = resolve(
            {
                "run": {"dir": str(Path(tmp) / "run"), "seed": 0, "device": str(device)},
                "data": {
                    "dataset": {"args": {"root": str(root), "num_classes": 2}},
                    "batch_size": 1,
                    "val_fraction": 0.1,
                },
                "model": {"base_channels": args.base_channels, "depth": 5},
                "train": {"epochs": 2 if device.type == "cuda" else 1, "lr": 1e-4, "warmup_steps": 1},
            }
        )
        trainer = train(cfg)["real_pixels_per_s"]
        extras = extras_cost(Path(tmp), device)
        welllog = None
        if device.type == "cuda" and not args.no_welllog:
            del model, bare_on_device
            torch.cuda.empty_cache()
            welllog = welllog_budget_step(device)

    goal_trainer = 0.9 if device.type == "cuda" else 0.97
    grouped = next(r for r in rows if r["strategy"] == "batch 16, size-grouped")
    print()
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else (platform.processor() or "CPU")
    print(f"device {device} ({name}); load average {load:.2f} at start")
    print(f"{'strategy':32} {'real px/s':>12} {'vs batch 1':>11} {'padding waste':>14}")
    for row in rows:
        print(
            f"{row['strategy']:32} {row['real_px_per_s']:12,.0f} {row['vs_batch1']:10.2f}x {row['padding_waste']:13.1%}"
        )
    print(f"data wait with 2 workers (pixel budget): {wait_share:.1%} of step time")
    print(
        f"trainer (batch 1) {trainer:,.0f} real px/s vs bare model batch 1 {bare:,.0f}: {trainer / bare:.2f}x "
        f"(goal >= {goal_trainer}x)"
    )
    if device.type == "cuda":
        print(f"batch 16 size-grouped vs batch 1: {grouped['vs_batch1']:.2f}x (goal >= 3x)")
    if welllog is not None:
        print(
            f"welllog budget step: {welllog['scans']} scans of 640 x 4,800 (base {welllog['base_channels']}, "
            f"{welllog['precision']}, channels_last {welllog['channels_last']}): {welllog['seconds_per_step']:.3f} "
            f"s/step, {welllog['real_px_per_s']:,.0f} real px/s, peak {welllog['peak_gib']:.1f} GiB"
        )
    print_extras(extras)
    report = {
        "extras": extras,
        "device": str(device),
        "device_name": name,
        "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, torch {torch.__version__}",
        "load_average_at_start": load,
        "scans": len(sizes),
        "base_channels": args.base_channels,
        "rows": rows,
        "data_wait_share_2_workers": wait_share,
        "trainer_real_px_per_s": trainer,
        "bare_batch1_real_px_per_s": bare,
        "trainer_vs_bare": trainer / bare,
        "trainer_goal": goal_trainer,
        "grouped16_vs_batch1": grouped["vs_batch1"],
        "welllog_budget_step": welllog,
        "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
