"""How fast does AlignedCollate write a padded batch, next to the memory-bandwidth reference?

For batches of 16 variable-size [3, H, W] scans (the well-log distribution at 1/4 scale: heights 120-160,
widths 800-3200), uint8 and float32, it measures bytes of batch written per second by

- ``AlignedCollate(divisor=32)``,
- ``torch.stack`` of 16 equal-size tensors writing the same number of bytes (the reference),
- per-sample ``F.pad`` to the batch size, then ``torch.stack`` (the obvious hand-written collate),

in the main process and inside a DataLoader worker (where outputs go to shared memory, as default_collate's
do). Inputs are prepared first; methods then run batch by batch in a rotating order, so that none always
meets the memory allocator in the state another left, and the median of each is reported with its ratio
to stack.

    python benchmarks/bench_collate.py [--batches 12] [--out benchmarks/results/bench_collate.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from srforge import AlignedCollate, Entry  # noqa: E402

BATCH = 16
DIVISOR = 32


def make_batch(index: int, dtype: torch.dtype) -> list[torch.Tensor]:
    """16 scans [3, H, W], H in 120-160, W in 800-3200, deterministic by index."""
    g = torch.Generator().manual_seed(index)
    sizes = [
        (int(torch.randint(120, 161, (), generator=g)), int(torch.randint(800, 3201, (), generator=g)))
        for _ in range(BATCH)
    ]
    if dtype == torch.uint8:
        return [torch.randint(0, 256, (3, h, w), dtype=torch.uint8, generator=g) for h, w in sizes]
    return [torch.rand(3, h, w, generator=g) for h, w in sizes]


def padded_shape(scans: list[torch.Tensor]) -> tuple[int, int]:
    hp = max(-(-s.shape[-2] // DIVISOR) * DIVISOR for s in scans)
    wp = max(-(-s.shape[-1] // DIVISOR) * DIVISOR for s in scans)
    return hp, wp


def aligned(entries):
    return AlignedCollate(divisor=DIVISOR, pad={"image": 0})(entries).image


def stack_reference(equal):
    # default_collate's tensor branch: torch.stack, into shared memory inside a worker.
    return torch.utils.data.default_collate(equal)


def pad_then_stack(scans):
    hp, wp = padded_shape(scans)
    return torch.utils.data.default_collate([F.pad(s, (0, wp - s.shape[-1], 0, hp - s.shape[-2])) for s in scans])


METHODS = {"AlignedCollate": aligned, "torch.stack (same bytes)": stack_reference, "F.pad + stack": pad_then_stack}


def inputs_for(name: str, scans: list[torch.Tensor]):
    if name == "torch.stack (same bytes)":
        hp, wp = padded_shape(scans)
        return [torch.ones(3, hp, wp, dtype=scans[0].dtype) for _ in scans]
    if name == "AlignedCollate":
        return [Entry(image=s) for s in scans]
    return scans


def time_one(name: str, inputs) -> tuple[float, int]:
    """(seconds, bytes written) of one method on one batch's prepared inputs."""
    start = time.perf_counter()
    out = METHODS[name](inputs)
    seconds = time.perf_counter() - start
    return seconds, out.numel() * out.element_size()


class Batches(Dataset):
    """Each item is one whole batch of scans, made inside the worker, then timed there."""

    def __init__(self, n: int, dtype: torch.dtype):
        self.n, self.dtype = n, dtype

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return make_batch(i, self.dtype), i


def time_all(scans, index: int = 0):
    """Every method on one batch: inputs prepared first, then timed in an order rotated by ``index``
    so that no method always meets the allocator in the state the previous one left."""
    inputs = {name: inputs_for(name, scans) for name in METHODS}
    names = list(METHODS)
    order = names[index % len(names) :] + names[: index % len(names)]
    return {name: time_one(name, inputs[name]) for name in order}


def run(context: str, dtype: torch.dtype, batches: int) -> dict[str, float]:
    """Median GB/s per method."""
    if context == "main":
        results = [time_all(make_batch(i, dtype), i) for i in range(batches)]
    else:
        loader = DataLoader(
            Batches(batches, dtype), batch_size=None, num_workers=1, collate_fn=lambda item: time_all(*item)
        )
        results = list(loader)
    return {name: statistics.median(r[name][1] / r[name][0] / 1e9 for r in results) for name in METHODS}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--batches", type=int, default=12, help="batches per dtype and context (first one is a warm-up)"
    )
    parser.add_argument(
        "--threads", type=int, default=1, help="torch threads (collation runs in one thread per worker)"
    )
    parser.add_argument("--out", default="benchmarks/results/bench_collate.json")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)

    report = {"machine": f"{os.cpu_count()} CPUs, torch {torch.__version__}", "batch": BATCH, "rows": []}
    print(f"{'context':8} {'dtype':8} {'method':26} {'GB/s':>7} {'vs stack':>9}")
    for context in ("main", "worker"):
        for dtype in (torch.uint8, torch.float32):
            rates = run(context, dtype, args.batches)
            ref = rates["torch.stack (same bytes)"]
            for name, rate in rates.items():
                print(f"{context:8} {str(dtype).removeprefix('torch.'):8} {name:26} {rate:7.2f} {rate / ref:8.2f}x")
                report["rows"].append(
                    {
                        "context": context,
                        "dtype": str(dtype),
                        "method": name,
                        "GBps": rate,
                        "ratio_to_stack": rate / ref,
                    }
                )
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
