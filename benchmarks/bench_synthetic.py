"""How fast are synthetic well-log scans made (generated and written as PNG image + mask)?

python benchmarks/bench_synthetic.py [--scales 1 0.125] [--seconds 10] [--out benchmarks/results/bench_synthetic.json]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from srforge.data.synthetic import make_welllog_scans, welllog_scan  # noqa: E402


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scales", type=float, nargs="+", default=[1.0, 0.125])
    parser.add_argument("--seconds", type=float, default=10.0, help="time budget per scale")
    parser.add_argument("--out", default="benchmarks/results/bench_synthetic.json")
    args = parser.parse_args(argv)
    rows = []
    for scale in args.scales:
        with tempfile.TemporaryDirectory() as tmp:
            start, n = time.perf_counter(), 0
            while n < 2 or time.perf_counter() - start < args.seconds:
                make_welllog_scans(Path(tmp) / "run", 1, scale=scale, seed=n)  # seed n: a new scan each time
                n += 1
            total = time.perf_counter() - start
            start = time.perf_counter()
            for i in range(n):
                welllog_scan(i, scale=scale)
            generate = time.perf_counter() - start
        rows.append({"scale": scale, "scans": n, "scans_per_s": n / total, "generate_only_scans_per_s": n / generate})
        print(
            f"scale {scale:g}: {n / total:7.2f} scans/s written "
            f"(generation alone {n / generate:7.2f} scans/s), {n} scans"
        )
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    tmp.write_text(json.dumps({"rows": rows}, indent=2))
    os.replace(tmp, out)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
