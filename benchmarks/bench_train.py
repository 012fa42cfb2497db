"""Training throughput in real (unpadded) pixels per second, every batching strategy side by side.

On synthetic well-log scans at 1/8 scale (heights 60-80, widths 400-1,600), one run measures:

- batch 1, each scan padded only to its own multiple of 32 (the only option before srforge);
- batch 16 in random order; batch 16 size-grouped; a pixel budget (size-grouped);
- the share of step time spent waiting for data with 2 loader workers (pixel-budget batches);
- the trainer itself (``srforge.engine.trainer.train``, batch 1) against the bare model's forward+backward
  at batch 1 on the same scans with no loader: the framework's own cost (goal >= 0.85x).

Every strategy runs the same optimizer (AdamW) and loss on the same scans, one epoch each, after one
warm-up step.

    python benchmarks/bench_train.py [--scans 32] [--base-channels 16] [--out benchmarks/results/bench_train.json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

import torch
from torch.utils.data import DataLoader

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from srforge.config import resolve  # noqa: E402
from srforge.data.collate import AlignedCollate  # noqa: E402
from srforge.data.datasets import SegmentationFolder  # noqa: E402
from srforge.data.sampling import SizeGroupedBatchSampler  # noqa: E402
from srforge.data.synthetic import make_welllog_scans  # noqa: E402
from srforge.engine.losses import segmentation_loss  # noqa: E402
from srforge.engine.trainer import train  # noqa: E402
from srforge.models import UNet  # noqa: E402


def step(model, optimizer, batch) -> None:
    loss = segmentation_loss(model(batch.image, batch.sizes), batch.mask)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()


def epoch(model, loader, data_wait: list | None = None) -> float:
    """Real pixels per second of one epoch of AdamW steps over ``loader``."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    pixels, seconds = 0, 0.0
    it = iter(loader)
    while True:
        t0 = time.perf_counter()
        try:
            batch = next(it)
        except StopIteration:
            break
        t1 = time.perf_counter()
        step(model, optimizer, batch)
        t2 = time.perf_counter()
        pixels += int(batch.sizes.prod(1).sum())
        seconds += t2 - t0
        if data_wait is not None:
            data_wait.append((t1 - t0, t2 - t0))
    return pixels / seconds


def bare_batch1(model, dataset) -> float:
    """The model alone: each scan padded to its own multiple of the divisor, forward+backward, no loader."""
    collate = AlignedCollate(model.size_divisor, pad={"image": 0, "mask": 255})
    batches = [collate([dataset[i]]) for i in range(len(dataset))]
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    pixels, seconds = 0, 0.0
    for batch in batches:
        t0 = time.perf_counter()
        step(model, optimizer, batch)
        pixels += int(batch.sizes.prod(1).sum())
        seconds += time.perf_counter() - t0
    return pixels / seconds


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scans", type=int, default=32)
    parser.add_argument("--base-channels", type=int, default=16)
    parser.add_argument("--max-pixels", type=int, default=400_000, help="pixel budget per batch")
    parser.add_argument("--data", default=None, help="folder for the synthetic scans (default: a temporary one)")
    parser.add_argument("--out", default="benchmarks/results/bench_train.json")
    args = parser.parse_args(argv)
    torch.manual_seed(0)

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(args.data or Path(tmp) / "scans")
        if not (root / "images").is_dir():
            make_welllog_scans(root, args.scans, scale=0.125, seed=0)
        dataset = SegmentationFolder(root, num_classes=2)
        sizes = dataset.sizes()
        model = UNet(base_channels=args.base_channels, depth=5)
        collate = AlignedCollate(model.size_divisor, pad={"image": 0, "mask": 255})
        real = sum(h * w for h, w in sizes)

        def loader(batch_sampler, workers=0):
            return DataLoader(dataset, batch_sampler=batch_sampler, collate_fn=collate, num_workers=workers)

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
        # Warm-up (allocator, first touch of the weights) on the largest batch any strategy will see.
        warm = torch.optim.AdamW(model.parameters(), lr=1e-4)
        step(model, warm, collate([dataset[i] for i in strategies["batch 16, random order"][0]]))
        rows = []
        for name, batches in strategies.items():
            padded = sum(
                len(b) * max(-(-sizes[i][0] // 32) * 32 for i in b) * max(-(-sizes[i][1] // 32) * 32 for i in b)
                for b in batches
            )
            rate = epoch(model, loader(batches))
            rows.append(
                {"strategy": name, "batches": len(batches), "padding_waste": padded / real - 1, "real_px_per_s": rate}
            )
            print(
                f"{name:32} {len(batches):4d} batches  waste {padded / real - 1:6.1%}  {rate:10,.0f} real px/s",
                flush=True,
            )
        base = rows[0]["real_px_per_s"]
        for row in rows:
            row["vs_batch1"] = row["real_px_per_s"] / base

        waits: list = []
        epoch(model, loader(strategies[f"pixel budget {args.max_pixels:,}"], workers=2), waits)
        wait_share = sum(w for w, _ in waits) / sum(t for _, t in waits)

        bare = bare_batch1(model, dataset)
        cfg = resolve(
            {
                "run": {"dir": str(Path(tmp) / "run"), "seed": 0},
                "data": {
                    "dataset": {"args": {"root": str(root), "num_classes": 2}},
                    "batch_size": 1,
                    "val_fraction": 0.1,
                },
                "model": {"base_channels": args.base_channels, "depth": 5},
                "train": {"epochs": 1, "lr": 1e-4, "warmup_steps": 1},
            }
        )
        trainer = train(cfg)["real_pixels_per_s"]

    print()
    print(f"{'strategy':32} {'real px/s':>12} {'vs batch 1':>11} {'padding waste':>14}")
    for row in rows:
        print(
            f"{row['strategy']:32} {row['real_px_per_s']:12,.0f} {row['vs_batch1']:10.2f}x {row['padding_waste']:13.1%}"
        )
    print(f"data wait with 2 workers (pixel budget): {wait_share:.1%} of step time")
    print(f"trainer (batch 1) {trainer:,.0f} real px/s vs bare model batch 1 {bare:,.0f}: {trainer / bare:.2f}x")
    report = {
        "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, torch {torch.__version__}",
        "scans": len(sizes),
        "base_channels": args.base_channels,
        "rows": rows,
        "data_wait_share_2_workers": wait_share,
        "trainer_real_px_per_s": trainer,
        "bare_batch1_real_px_per_s": bare,
        "trainer_vs_bare": trainer / bare,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
