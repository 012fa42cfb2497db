"""Does size-grouped prediction under a pixel budget beat a batch-1 loop, and what does tiling change?

Writes an archive (.zip) of synthetic well-log scans and a checkpoint of a randomly initialised UNet (or takes
--checkpoint), then predicts the archive into a fresh folder in three modes, each run in its own subprocess so
that peak memory (ru_maxrss; on CUDA torch.cuda.max_memory_allocated) is that mode's alone:

    loop      one scan at a time: decode, Predictor.probabilities([scan]), write the mask
    grouped   predict_archive with the defaults: size-grouped batches under the device's pixel budget (or
              --max-pixels) and the device's cap on scans per batch (1 on CPU)
    batched   the same without the cap: several scans per batch, as far as the budget allows

Runs alternate (loop, grouped, batched, loop, ...) so load from other processes hits both alike; the
ratio is of median scans per second (goal: >= 0.95x on CPU, >= 3x on CUDA). Then, on the first scans,
the fraction of pixels where tiled inference (budget = a third of the scan) differs from whole-scan
prediction.

    python benchmarks/bench_predict.py                          # ~2 min on 2 CPU cores
    python benchmarks/bench_predict.py --device cuda --n 200 --scale 0.5 --out /tmp/bench.json
"""

import argparse
import json
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

import torch

from srforge.data.archive import ScanArchive
from srforge.engine.checkpoint import save_checkpoint
from srforge.engine.metrics import class_map
from srforge.engine.predictor import (
    Predictor,
    _save_png,
    atomic_write,
    output_paths,
    predict_archive,
)
from srforge.models import UNet


def make_inputs(work: Path, n: int, scale: float, base_channels: int, depth: int) -> tuple[Path, Path]:
    """(archive of n synthetic scans, checkpoint of a random UNet) under work."""
    from srforge.data.synthetic import make_welllog_scans

    paths = make_welllog_scans(work / "scans", n, scale=scale, seed=0)
    archive = work / "scans.zip"
    with zipfile.ZipFile(archive, "w") as zf:  # stored: PNGs are compressed already
        for path in paths:
            zf.write(path, path.name)
    torch.manual_seed(0)
    args = {"in_channels": 3, "num_classes": 2, "base_channels": base_channels, "depth": depth}
    model = UNet(**args)
    ckpt = save_checkpoint(
        {
            "model": model.state_dict(),
            "model_args": args,
            "size_divisor": model.size_divisor,
            "class_names": ["background", "curve"],
            "ignore_index": 255,
            "config": {},
        },
        work / "random.pt",
    )
    return archive, ckpt


def child(mode: str, archive_path: str, ckpt: str, device: str, max_pixels: int | None, out: str) -> dict:
    """One timed run of ``mode`` (after a one-scan warm-up); returns scans/s and peak memory."""
    # "grouped" is the default (on CPU at most one scan a batch); "batched" lifts the cap to show why.
    predictor = Predictor.from_checkpoint(
        ckpt, device=device, max_pixels=max_pixels, max_batch=None if mode == "batched" else "auto"
    )
    with ScanArchive(archive_path) as archive:
        predictor.probabilities([archive.read(0, predictor.image_mode)])  # warm-up: allocator, kernels
        if predictor.device.type == "cuda":
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        start = time.perf_counter()
        if mode == "loop":
            for i, name in enumerate(archive.names):
                mask = class_map(predictor.probabilities([archive.read(i, predictor.image_mode)])[0], dim=0)
                atomic_write(output_paths(Path(out), name)["mask"], _save_png(mask.to(torch.uint8).numpy(), "L"))
        else:
            summary = predict_archive(predictor, archive, out, progress=False)
            assert summary["ok"] == len(archive), summary
        seconds = time.perf_counter() - start
        n = len(archive)
    result = {
        "mode": mode,
        "scans": n,
        "seconds": seconds,
        "scans_per_second": n / seconds,
        "max_pixels": predictor.max_pixels,
        "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }
    if predictor.device.type == "cuda":
        result["peak_cuda_mib"] = torch.cuda.max_memory_allocated() / 2**20
    return result


def tiled_vs_whole(archive_path: Path, ckpt: Path, device: str, scans: int) -> dict:
    """Fraction of pixels where tiled prediction (budget: a third of each scan) differs from whole-scan."""
    whole = Predictor.from_checkpoint(ckpt, device=device, max_pixels=2**30)
    differ = total = 0
    with ScanArchive(archive_path) as archive:
        for i in range(min(scans, len(archive))):
            image = archive.read(i, whole.image_mode)
            budget = max(4 * whole.divisor**2, image.shape[1] * image.shape[2] // 3)
            tiled = Predictor.from_checkpoint(ckpt, device=device, max_pixels=budget)
            a, b = whole.predict([image])[0], tiled.predict([image])[0]
            differ, total = differ + int((a != b).sum()), total + a.numel()
    return {"scans": min(scans, len(archive)), "pixels": total, "fraction_differing": differ / total}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=40, help="synthetic scans (default 40)")
    parser.add_argument("--scale", type=float, default=0.125, help="scan size factor (default 1/8)")
    parser.add_argument("--base-channels", type=int, default=16)
    parser.add_argument("--depth", type=int, default=5)
    parser.add_argument("--checkpoint", help="a trained checkpoint instead of a random UNet")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--max-pixels", type=int, default=None, help="grouped mode's budget (default: the device's)")
    parser.add_argument("--repeats", type=int, default=2, help="runs of each mode (default 2)")
    parser.add_argument("--tile-scans", type=int, default=4, help="scans for the tiled-vs-whole figure")
    parser.add_argument("--out", default="benchmarks/results/bench_predict.json")
    parser.add_argument("--child", nargs=4, metavar=("MODE", "ARCHIVE", "CKPT", "OUT"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        mode, archive, ckpt, out = args.child
        print(json.dumps(child(mode, archive, ckpt, args.device, args.max_pixels, out)))
        return

    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        archive, ckpt = make_inputs(work, args.n, args.scale, args.base_channels, args.depth)
        ckpt = Path(args.checkpoint) if args.checkpoint else ckpt
        runs: dict[str, list[dict]] = {"loop": [], "grouped": [], "batched": []}
        for r in range(args.repeats):
            for mode in runs:
                cmd = [
                    sys.executable,
                    __file__,
                    "--device",
                    args.device,
                    "--child",
                    mode,
                    str(archive),
                    str(ckpt),
                    str(work / f"out_{mode}_{r}"),
                ]
                cmd += ["--max-pixels", str(args.max_pixels)] if args.max_pixels and mode != "loop" else []
                done = subprocess.run(cmd, capture_output=True, text=True, check=True)
                runs[mode].append(json.loads(done.stdout.strip().splitlines()[-1]))
        tiling = tiled_vs_whole(archive, ckpt, args.device, args.tile_scans)

    speed = {m: statistics.median(r["scans_per_second"] for r in rs) for m, rs in runs.items()}
    rss = {m: max(r["peak_rss_mib"] for r in rs) for m, rs in runs.items()}
    cuda = {m: max(r.get("peak_cuda_mib", 0) for r in rs) for m, rs in runs.items()}
    device = "cuda" if "peak_cuda_mib" in runs["loop"][0] else "cpu"
    model = (
        f"checkpoint {args.checkpoint}"
        if args.checkpoint
        else f"random UNet base {args.base_channels} depth {args.depth}"
    )
    print(
        f"{args.n} scans at scale {args.scale}, {model}, {device}, "
        f"grouped budget {runs['grouped'][0]['max_pixels']:,} px, median of {args.repeats}"
    )
    print(f"{'mode':<9}{'scans/s':>10}{'peak RSS MiB':>14}" + (f"{'peak CUDA MiB':>15}" if device == "cuda" else ""))
    for m in runs:
        print(f"{m:<9}{speed[m]:>10.2f}{rss[m]:>14.0f}" + (f"{cuda[m]:>15.0f}" if device == "cuda" else ""))
    ratio = speed["grouped"] / speed["loop"]
    goal = 3.0 if device == "cuda" else 0.95
    print(
        f"grouped (default) / loop: {ratio:.2f}x scans/s (goal >= {goal}x: {'met' if ratio >= goal else 'NOT met'}); "
        f"memory {rss['grouped'] / rss['loop']:.2f}x"
    )
    print(
        f"batched (no cap on scans per batch) / loop: {speed['batched'] / speed['loop']:.2f}x scans/s; "
        f"memory {rss['batched'] / rss['loop']:.2f}x"
    )
    print(
        f"tiled vs whole: {tiling['fraction_differing']:.4%} of {tiling['pixels']:,} pixels differ "
        f"({tiling['scans']} scans, budget a third of each scan{', random weights' if not args.checkpoint else ''})"
    )
    result = {
        "config": {k: v for k, v in vars(args).items() if k != "child"},
        "device": device,
        "platform": platform.platform(),
        "torch": torch.__version__,
        "runs": runs,
        "scans_per_second": speed,
        "peak_rss_mib": rss,
        "peak_cuda_mib": cuda if device == "cuda" else None,
        "ratio": ratio,
        "goal": goal,
        "tiled_vs_whole": tiling,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
