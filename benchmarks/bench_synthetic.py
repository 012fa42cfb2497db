"""How fast are synthetic well-log scans made (generated and written as PNG image + mask)?

Two measurements: scans per second at each scale (one process, for ``--seconds``), and the goal of issue 30 --
1,000 scans at 1/8 scale in under a minute on 2 cores -- timed as make_welllog_scans writes them with 2 worker
processes, for the classic and the randomised look, with srforge's own curves and with curves from a LAS file
(``--las``; by default one written here with lasio: 20,000 samples of six log-like curves).

python benchmarks/bench_synthetic.py [--scales 1 0.125] [--seconds 10] [--n 1000] [--workers 2] [--las FILE]
    [--out benchmarks/results/bench_synthetic.json]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from srforge.synthetic import make_welllog_scans, welllog_scan  # noqa: E402
from srforge.synthetic.curves import formation, log_curve  # noqa: E402


def write_las(path: Path, samples: int = 20000) -> Path:
    """A LAS file of six log-like curves (two resistivity-like), written with lasio."""
    import lasio

    rng = np.random.default_rng(0)
    latent = formation(rng, samples)
    las = lasio.LASFile()
    las.append_curve("DEPT", 1000 + 0.5 * np.arange(samples), unit="FT")
    for k, name in enumerate(("GR", "SP", "RHOB", "NPHI", "ILD", "LLS")):
        las.append_curve(name, log_curve(rng, latent, positive=k >= 4))
    las.write(str(path), version=2.0)
    return path


def rates(scales, seconds: float) -> list[dict]:
    rows = []
    for scale in scales:
        with tempfile.TemporaryDirectory() as tmp:
            start, n = time.perf_counter(), 0
            while n < 2 or time.perf_counter() - start < seconds:
                make_welllog_scans(Path(tmp) / "run", 1, scale=scale, seed=n)  # seed n: a new scan each time
                n += 1
            total = time.perf_counter() - start
            start = time.perf_counter()
            for i in range(n):
                welllog_scan(i, scale=scale)
            generate = time.perf_counter() - start
        rows.append({"scale": scale, "scans": n, "scans_per_s": n / total, "generate_only_scans_per_s": n / generate})
        print(f"scale {scale:g}: {n / total:7.2f} scans/s written (generation alone {n / generate:7.2f} scans/s)")
    return rows


def goal(n: int, workers: int, las: str) -> list[dict]:
    rows = []
    for randomise in (False, True):
        for curves in (None, las):
            with tempfile.TemporaryDirectory() as tmp:
                start = time.perf_counter()
                make_welllog_scans(Path(tmp), n, scale=0.125, workers=workers, las=curves, randomise=randomise)
                seconds = time.perf_counter() - start
            look = "randomised" if randomise else "classic"
            source = "LAS curves" if curves else "own curves"
            rows.append({"look": look, "curves": source, "n": n, "workers": workers, "seconds": seconds})
            print(f"{n} scans at 1/8, {workers} workers, {look}, {source}: {seconds:5.1f} s (goal < 60 s)")
    return rows


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scales", type=float, nargs="*", default=[1.0, 0.125])
    parser.add_argument("--seconds", type=float, default=10.0, help="time budget per scale")
    parser.add_argument("--n", type=int, default=1000, help="scans of the goal measurement (0: skip it)")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--las", help="a LAS file for the LAS rows (default: one written with lasio)")
    parser.add_argument("--out", default="benchmarks/results/bench_synthetic.json")
    args = parser.parse_args(argv)
    rows = rates(args.scales, args.seconds)
    with tempfile.TemporaryDirectory() as tmp:
        las = args.las or str(write_las(Path(tmp) / "bench.las"))
        goal_rows = goal(args.n, args.workers, las) if args.n else []
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    tmp.write_text(json.dumps({"rows": rows, "goal": goal_rows, "cpus": os.cpu_count()}, indent=2))
    os.replace(tmp, out)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
