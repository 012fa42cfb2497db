"""How many padded pixels does each batching strategy cost on well-log sizes?

Waste = padded pixels / real pixels - 1, where a batch pads every scan to the batch maxima of sizes
rounded up to the divisor (as AlignedCollate does). The floor is alignment alone (each scan padded to its
own multiple of 32). "pair repeat" is the share of scan pairs batched together in epoch 0 that are batched
together again in epoch 1: how much the batches stay the same from epoch to epoch.

    python benchmarks/bench_padding.py [--n 4000] [--batch-size 16] [--out benchmarks/results/bench_padding.json]
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from srforge.data import layout_plot  # noqa: E402
from srforge.data.sampling import SizeGroupedBatchSampler  # noqa: E402


def waste(batches, sizes: np.ndarray, divisor: int) -> float:
    """Padded pixels / real pixels - 1 of ``batches`` (index lists into ``sizes``), as the layout picture counts."""
    return layout_plot.waste([layout_plot.measure(sizes[b], divisor) for b in batches])


def pair_repeat(first, second) -> float:
    def pairs(batches):
        return {p for b in batches for p in itertools.combinations(sorted(b), 2)}

    a = pairs(first)
    return len(a & pairs(second)) / max(1, len(a))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=4000)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--divisor", type=int, default=32)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default="benchmarks/results/bench_padding.json")
    args = parser.parse_args(argv)

    rng = np.random.default_rng(args.seed)
    sizes = np.stack([rng.integers(480, 641, args.n), rng.integers(3200, 12801, args.n)], axis=1)
    d, bs = args.divisor, args.batch_size
    rows = [{"strategy": "alignment only (floor)", "waste": waste([[i] for i in range(args.n)], sizes, d)}]

    def random_batches(epoch):
        order = np.random.default_rng([args.seed, epoch]).permutation(args.n)
        return [order[i : i + bs].tolist() for i in range(0, args.n, bs)]

    rows.append(
        {
            "strategy": "random batches",
            "waste": waste(random_batches(0), sizes, d),
            "pair_repeat": pair_repeat(random_batches(0), random_batches(1)),
        }
    )

    # A budget of batch_size times the mean aligned scan gives ~batch_size scans per batch.
    budget = int(bs * (-(-sizes // d) * d).prod(axis=1).mean())
    for label, kwargs in [
        (f"grouped, pool {p}", {"batch_size": bs, "pool_size": p}) for p in (256, 1024, 2048, 4096)
    ] + [(f"pixel budget {budget / 1e6:.0f} Mpx, pool 4096", {"max_pixels": budget})]:
        sampler = SizeGroupedBatchSampler(sizes.tolist(), divisor=d, seed=args.seed, **kwargs)
        epoch0 = list(sampler)
        sampler.set_epoch(1)
        rows.append(
            {
                "strategy": label,
                "waste": waste(epoch0, sizes, d),
                "pair_repeat": pair_repeat(epoch0, list(sampler)),
                "mean_batch": float(np.mean([len(b) for b in epoch0])),
            }
        )

    floor = rows[0]["waste"]
    print(f"{args.n} sizes, H 480-640, W 3200-12800, batch {bs}, divisor {d}")
    print(f"{'strategy':34s} {'waste':>7s} {'vs floor':>9s} {'pair repeat':>12s} {'mean batch':>11s}")
    for r in rows:
        repeat = f"{r['pair_repeat'] * 100:11.1f}%" if "pair_repeat" in r else f"{'':12s}"
        mean = f"{r.get('mean_batch', bs if 'random' in r['strategy'] else 1):11.1f}"
        print(f"{r['strategy']:34s} {r['waste'] * 100:6.1f}% {(r['waste'] - floor) * 100:+8.1f}pp {repeat} {mean}")

    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    tmp.write_text(
        json.dumps({"n": args.n, "batch_size": bs, "divisor": d, "max_pixels": budget, "rows": rows}, indent=2)
    )
    os.replace(tmp, out)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
