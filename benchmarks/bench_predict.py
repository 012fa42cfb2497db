"""Does the pipelined predictor beat the serial loop it replaced, on full-scale scans?

Writes full-scale synthetic multiclass well-log scans (640 x 12,800 px at most, 4 classes) into a stored .zip,
then predicts the archive into a fresh folder in three modes, each run in its own subprocess (so peak memory is
that mode's alone), side by side for each model:

    serial     the loop predict_archive ran before the pipeline: decode, model, softmax, float32 probabilities
               to the host, class map there, PNG encode, one batch after another on one thread
    inline     predict_archive(workers=0): class map on the device from the logits, no softmax, uint8 masks
               to the host, every stage in turn on one thread
    pipeline   predict_archive(workers=default): decoding in worker processes, writing in threads

Models: a 1x1 convolution (a stand-in for a GPU: almost no model cost, so the figure is the host's ceiling) and
a real UNet (base 8 on CPU, base 32 on CUDA, depth 5). It reports scans/s, the device's busy fraction (time in
model calls, CUDA events on a GPU, over wall time), peak memory, and the per-scan cost of decoding and of
writing a mask. Goals: on CPU, pipeline >= 3x serial with the stand-in and no slower with the UNet; on CUDA,
pipeline >= 5x serial with the base-32 UNet. Exits non-zero when a run fails or predicts the wrong count.

    python benchmarks/bench_predict.py                  # CPU: 16 scans (4 for the UNet), several minutes
    python benchmarks/bench_predict.py --device cuda    # a GPU: 24 scans, both models, base-32 UNet

``--tiny N`` measures the per-scan overhead instead: N random tiny scans (4-20 x 4-40 px) in a stored .zip and a
random base-4 depth-3 UNet checkpoint, predicted by the real CLI (scripts/predict.py, default workers), against the
bare forward over the same decoded scans: one scan a call, and in the batches the Predictor plans. ``--old PATH``
(a checkout of another revision, e.g. ``git worktree add /tmp/old HEAD~1``) runs the same next to this checkout,
alternating, so both see the same machine state:

    python benchmarks/bench_predict.py --tiny 3000 --old /tmp/old --repeats 2
"""

from __future__ import annotations

import argparse
import io
import itertools
import json
import os
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

# Run from a checkout without installing; a --tiny child of another checkout (--old) imports that one instead.
sys.path.insert(0, os.environ.get("BENCH_PREDICT_TREE") or str(Path(__file__).resolve().parents[1]))

from srforge.data.archive import ScanArchive  # noqa: E402
from srforge.data.images import read_image  # noqa: E402
from srforge.geometry import crop_to_sizes  # noqa: E402
from srforge.models import UNet  # noqa: E402
from srforge.models.class_map import class_map  # noqa: E402
from srforge.predict.background import default_workers  # noqa: E402
from srforge.predict.outputs import class_fractions, output_paths, write_png, write_scan  # noqa: E402
from srforge.predict.pipeline import predict_archive  # noqa: E402
from srforge.predict.predictor import Predictor  # noqa: E402
from srforge.predict.tiling import predict_tiled, tile_shape  # noqa: E402
from srforge.runtime.device import autocast, resolve_device  # noqa: E402

NUM_CLASSES = 4  # multiclass synthetic scans: background, solid, dashed, dotted
SCANS_IN_AN_HOUR = 136_771  # the user's archive


class PointwiseStandIn(torch.nn.Module):
    """A 1x1 convolution with a UNet's interface: [B, C, H, W] uint8 -> logits [B, K, H, W]; almost free."""

    def __init__(self, in_channels: int = 3, num_classes: int = NUM_CLASSES, size_divisor: int = 32):
        super().__init__()
        self.in_channels, self.num_classes, self.size_divisor = in_channels, num_classes, size_divisor
        self.conv = torch.nn.Conv2d(in_channels, num_classes, 1)

    def forward(self, image: torch.Tensor, sizes: torch.Tensor | None = None) -> torch.Tensor:
        # As a matrix product: torch's CPU conv2d takes a slow path for a 1x1 kernel over 3 channels.
        b, c, h, w = image.shape
        x = image.to(torch.float32).div_(255).view(b, c, h * w)
        weight = self.conv.weight.view(self.num_classes, c)
        return torch.baddbmm(self.conv.bias.view(1, -1, 1).expand(b, -1, 1), weight.expand(b, -1, -1), x).view(
            b, self.num_classes, h, w
        )


def build_model(name: str, base: int) -> torch.nn.Module:
    torch.manual_seed(0)
    if name == "1x1 conv":
        return PointwiseStandIn()
    return UNet(in_channels=3, num_classes=NUM_CLASSES, base_channels=base, depth=5)


def _serial_probabilities(predictor: Predictor, images: list[torch.Tensor]) -> list[torch.Tensor]:
    """The old Predictor.outputs: one padded batch (or one scan in tiles) -> float32 probabilities on the host."""

    @torch.inference_mode()
    def run(batch_images: list[torch.Tensor]) -> list[tuple[torch.Tensor]]:
        batch = predictor.collate([{"image": image} for image in batch_images])
        image, sizes = batch["image"].to(predictor.device), batch["sizes"].to(predictor.device)
        with predictor.timed():
            with autocast(predictor.device, predictor.precision):
                logits = predictor.model(image, sizes)
            probs = logits.float().softmax(1).cpu()
        return [(p,) for p in crop_to_sizes(probs, sizes.cpu())]

    if len(images) == 1 and predictor.aligned_area(tuple(images[0].shape[-2:])) > predictor.max_pixels:
        tile = tile_shape(*images[0].shape[-2:], predictor.max_pixels, predictor.divisor)
        per_batch = max(1, predictor.max_pixels // (tile[0] * tile[1]))
        return [predict_tiled(run, images[0], tile, predictor.overlap, predictor.divisor, per_batch)[0]]
    return [p for (p,) in run(images)]


def serial_loop(predictor: Predictor, archive: ScanArchive, out: Path) -> int:
    """The loop predict_archive ran before the pipeline, one planned batch after another on one thread: decode,
    model + softmax, float32 probabilities to the host, class map there, encode. Returns the scans written."""
    sizes = [archive.size(i) for i in range(len(archive))]
    done = 0
    for batch in predictor.plan(sizes):
        images = [archive.read(i, predictor.image_mode) for i in batch]
        for i, probs in zip(batch, _serial_probabilities(predictor, images)):
            mask = class_map(probs, dim=0).to(torch.uint8).numpy()
            write_png(output_paths(out, archive.names[i])["mask"], mask, "L")
            class_fractions(mask, predictor.num_classes)
            done += 1
    return done


def child(spec: dict) -> dict:
    """One timed run of ``spec["mode"]`` after a one-scan warm-up: scans/s, busy fraction, peak memory."""
    torch.manual_seed(0)
    model = build_model(spec["model"], spec["base"])
    predictor = Predictor(model, device=spec["device"])
    out = Path(spec["out"])
    with ScanArchive(spec["archive"]) as archive:
        predictor.predict([archive.read(0, predictor.image_mode)])  # warm-up: allocator, kernels, cuDNN
        cuda = predictor.device.type == "cuda"
        if cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        predictor.timings = []
        start = time.perf_counter()
        if spec["mode"] == "serial":
            done = serial_loop(predictor, archive, out)
        else:
            workers = 0 if spec["mode"] == "inline" else spec["workers"]
            done = predict_archive(predictor, archive, out, progress=False, workers=workers)["ok"]
        busy = predictor.busy_seconds()
        seconds = time.perf_counter() - start
        if done != len(archive):
            raise SystemExit(f"{spec['mode']}: {done} of {len(archive)} scans predicted")
    result = {
        **spec,
        "scans": done,
        "seconds": seconds,
        "scans_per_second": done / seconds,
        "busy_fraction": busy / seconds,
        "max_pixels": predictor.max_pixels,
        "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }
    if cuda:
        result["peak_cuda_mib"] = torch.cuda.max_memory_allocated() / 2**20
    return result


def stage_costs(archive_path: Path, scans: int) -> dict:
    """Milliseconds per scan on one thread: decoding a member, and writing its mask (encode + report fractions)."""
    decode = write = 0.0
    with ScanArchive(archive_path) as archive, tempfile.TemporaryDirectory() as tmp:
        n = min(scans, len(archive))
        for i in range(n):
            data = archive.read_bytes([i])[i]
            start = time.perf_counter()
            image = read_image(io.BytesIO(data), "RGB")
            decode += time.perf_counter() - start
            mask = (image[0] // 64).numpy()  # a class map of the scan's size with some structure to encode
            start = time.perf_counter()
            write_scan(output_paths(Path(tmp), archive.names[i]), mask, NUM_CLASSES)
            write += time.perf_counter() - start
    return {"decode_ms": 1000 * decode / n, "write_ms": 1000 * write / n, "scans": n}


def tiled_vs_whole(archive_path: Path, base: int, device: str, scans: int) -> dict:
    """Fraction of pixels where tiled prediction (budget: a third of each scan) differs from whole-scan."""
    model = build_model("unet", base)
    whole = Predictor(model, device=device, max_pixels=2**31)
    differ = total = 0
    with ScanArchive(archive_path) as archive:
        for i in range(min(scans, len(archive))):
            image = archive.read(i, whole.image_mode)
            budget = max(4 * whole.divisor**2, image.shape[1] * image.shape[2] // 3)
            tiled = Predictor(model, device=device, max_pixels=budget)
            a, b = whole.predict([image])[0], tiled.predict([image])[0]
            differ, total = differ + int((a != b).sum()), total + a.numel()
    return {"scans": min(scans, len(archive)), "pixels": total, "fraction_differing": differ / total}


def make_archives(work: Path, counts: list[int], scale: float) -> dict[int, Path]:
    """{n: a stored .zip of the first n of max(counts) synthetic scans} (PNGs are compressed already)."""
    from srforge.synthetic import make_welllog_scans

    paths = make_welllog_scans(
        work / "scans", max(counts), scale=scale, seed=0, classes="multiclass", workers=default_workers()
    )
    archives = {}
    for n in sorted(set(counts)):
        archives[n] = work / f"scans_{n}.zip"
        with zipfile.ZipFile(archives[n], "w") as zf:
            for path in paths[:n]:
                zf.write(path, path.name)
    return archives


# -- --tiny: the per-scan overhead ----------------------------------------------------------------------------
TINY_SIZES = ((4, 20), (4, 40))  # (lo, hi) of height and width, inclusive, as in the archive


def make_tiny(work: Path, n: int) -> tuple[Path, Path]:
    """(a stored .zip of ``n`` random RGB PNG scans of TINY_SIZES, a random base-4 depth-3 UNet checkpoint)."""
    import numpy as np
    from PIL import Image

    from srforge.runtime.checkpoint import save_checkpoint

    rng = np.random.default_rng(0)
    archive = work / "tiny.zip"
    with zipfile.ZipFile(archive, "w") as zf:
        for i in range(n):
            (hl, hh), (wl, wh) = TINY_SIZES
            pixels = rng.integers(0, 256, (int(rng.integers(hl, hh + 1)), int(rng.integers(wl, wh + 1)), 3))
            buffer = io.BytesIO()
            Image.fromarray(pixels.astype(np.uint8)).save(buffer, format="PNG")
            zf.writestr(f"scan_{i:05d}.png", buffer.getvalue())
    torch.manual_seed(0)
    args = {"in_channels": 3, "num_classes": 3, "base_channels": 4, "depth": 3}
    model = UNet(**args)
    payload = {"model": model.state_dict(), "model_args": args, "size_divisor": model.size_divisor}
    checkpoint = work / "tiny.pt"
    save_checkpoint({**payload, "class_names": ["a", "b", "c"], "ignore_index": 255, "config": {}}, checkpoint)
    return archive, checkpoint


def tiny_forward(spec: dict) -> dict:
    """ms a scan of the bare model over the archive's scans, decoded beforehand: one scan a call, and in the
    batches this tree's Predictor plans (no reading, no writing, no report)."""
    predictor = Predictor.from_checkpoint(spec["checkpoint"], device="cpu")
    with ScanArchive(spec["archive"]) as archive:
        images = [archive.read(i, predictor.image_mode) for i in range(len(archive))]
    plan = predictor.plan([tuple(image.shape[-2:]) for image in images])
    out = {"scans": len(images), "batches": len(plan)}
    with torch.inference_mode():
        predictor.predict(images[:1])  # warm-up
        for key, batches in (("alone_ms", [[i] for i in range(len(images))]), ("planned_ms", plan)):
            predictor.timings = []
            for batch in batches:
                predictor.infer([images[i] for i in batch])
            out[key] = 1000 * predictor.busy_seconds() / len(images)
    return out


def tiny_pipeline(tree: Path, archive: Path, checkpoint: Path, out: Path) -> dict:
    """The real CLI of checkout ``tree`` over the archive -> its report's seconds and scans/s, and the wall time."""
    command = [sys.executable, str(tree / "scripts" / "predict.py"), "--checkpoint", str(checkpoint)]
    start = time.perf_counter()
    done = subprocess.run([*command, "--input", str(archive), "--output", str(out), "--no-progress"], text=True,
                          capture_output=True)  # fmt: skip
    if done.returncode != 0:
        raise SystemExit(f"bench_predict: {tree}: predict.py failed:\n{done.stderr[-3000:]}")
    summary = json.loads((out / "report.json").read_text())["summary"]
    return {"seconds": summary["seconds"], "scans_per_second": summary["scans_per_second"],
            "wall": time.perf_counter() - start, "ok": summary["ok"]}  # fmt: skip


def tiny_main(n: int, trees: dict[str, Path], repeats: int, out_json: str) -> int:
    """--tiny: the pipeline against the bare forward, for each checkout in ``trees``, alternating."""
    runs: dict[str, list[dict]] = {label: [] for label in trees}
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        archive, checkpoint = make_tiny(work, n)
        for repeat, (label, tree) in itertools.product(range(repeats), trees.items()):
            row = tiny_pipeline(tree, archive, checkpoint, work / f"out_{label}_{repeat}")
            spec = json.dumps({"checkpoint": str(checkpoint), "archive": str(archive)})
            env = {**os.environ, "BENCH_PREDICT_TREE": str(tree)}
            done = subprocess.run([sys.executable, __file__, "--tiny-child", spec], capture_output=True, text=True,
                                  env=env)  # fmt: skip
            if done.returncode != 0:
                raise SystemExit(f"bench_predict: {tree}: bare forward failed:\n{done.stderr[-3000:]}")
            row |= json.loads(done.stdout.strip().splitlines()[-1])
            if row["ok"] != n:
                raise SystemExit(f"bench_predict: {tree}: {row['ok']} of {n} scans predicted")
            runs[label].append(row)
            print(f"  {label:<6} run {repeat + 1}: {row['scans_per_second']:8.1f} scans/s", flush=True)
    print(f"\n{n} tiny scans (4-20 x 4-40 px), random UNet base 4 depth 3, CPU, {torch.get_num_threads()} threads, "
          f"predict.py default workers ({default_workers()}); medians of {repeats}")  # fmt: skip
    header = f"{'tree':<7}{'scans/s':>9}{'ms/scan':>9}{'forward alone':>15}{'in batches':>12}{'batches':>9}"
    print(header + f"{'pipeline / forward alone':>26}")
    for label, rows in runs.items():
        med = {key: statistics.median(r[key] for r in rows) for key in rows[0] if key not in ("ok", "scans")}
        ms = 1000 * med["seconds"] / n
        print(
            f"{label:<7}{med['scans_per_second']:>9.1f}{ms:>9.2f}{med['alone_ms']:>12.2f} ms"
            f"{med['planned_ms']:>9.2f} ms{med['batches']:>9.0f}{ms / med['alone_ms']:>25.2f}x"
        )
    Path(out_json).parent.mkdir(parents=True, exist_ok=True)
    Path(out_json).write_text(json.dumps({"n": n, "trees": {k: str(v) for k, v in trees.items()}, "runs": runs}))
    print(f"wrote {out_json}")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="auto", help="auto, cpu or cuda (default auto)")
    parser.add_argument("--n", type=int, default=None, help="scans (default 16 on CPU, 24 on CUDA)")
    parser.add_argument("--scale", type=float, default=1.0, help="scan size factor (default 1: full scale)")
    parser.add_argument("--base", type=int, default=None, help="UNet base channels (default 8 on CPU, 32 on CUDA)")
    parser.add_argument("--unet-n", type=int, default=None, help="scans for the UNet (default 4 on CPU, --n on CUDA)")
    parser.add_argument("--workers", type=int, default=default_workers(), help="pipeline decoders (default: CPUs)")
    parser.add_argument("--models", default="1x1 conv,unet", help="comma-separated: '1x1 conv', unet")
    parser.add_argument("--repeats", type=int, default=1, help="runs of each mode, alternating; medians (default 1)")
    parser.add_argument(
        "--tile-check", type=int, default=0, help="also: pixels where tiled and whole-scan UNet masks differ, N scans"
    )
    parser.add_argument("--tiny", type=int, default=0, help="N tiny scans: the per-scan overhead (see above)")
    parser.add_argument("--old", type=Path, default=None, help="with --tiny: another checkout, run alongside")
    parser.add_argument("--out", default="benchmarks/results/bench_predict.json")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--tiny-child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(json.loads(args.child))))
        return 0
    if args.tiny_child:
        print(json.dumps(tiny_forward(json.loads(args.tiny_child))))
        return 0
    if args.tiny:
        trees = {"new": Path(__file__).resolve().parents[1]} | ({"old": args.old.resolve()} if args.old else {})
        out = args.out if args.out != parser.get_default("out") else "benchmarks/results/bench_predict_tiny.json"
        return tiny_main(args.tiny, trees, args.repeats, out)

    try:
        device = str(resolve_device(args.device))  # auto, or a CUDA device with its index; a ValueError names those
    except ValueError as exc:
        print(f"bench_predict: --device: {exc}", file=sys.stderr)
        return 1
    gpu = device.startswith("cuda")
    n = args.n or (24 if gpu else 16)
    base = args.base or (32 if gpu else 8)
    unet_n = args.unet_n or (n if gpu else min(n, 4))
    models = [m.strip() for m in args.models.split(",") if m.strip()]
    results: list[dict] = []
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        start = time.perf_counter()
        archives = make_archives(work, [n, unet_n], args.scale)
        print(f"{n} synthetic scans at scale {args.scale} written in {time.perf_counter() - start:.0f} s", flush=True)
        costs = stage_costs(archives[n], 4)
        for model, repeat, mode in itertools.product(models, range(args.repeats), ("serial", "inline", "pipeline")):
            archive = archives[unet_n if model == "unet" else n]
            spec = {
                "mode": mode,
                "model": model,
                "base": base,
                "device": device,
                "workers": args.workers,
                "archive": str(archive),
                "out": str(work / f"out_{model}_{mode}_{repeat}".replace(" ", "_")),
            }
            done = subprocess.run(
                [sys.executable, __file__, "--child", json.dumps(spec)], capture_output=True, text=True
            )
            if done.returncode != 0:
                print(f"bench_predict: {model} / {mode} failed:\n{done.stderr[-3000:]}", file=sys.stderr)
                return 1
            results.append(json.loads(done.stdout.strip().splitlines()[-1]))
            r = results[-1]
            print(f"  {model:<9}{mode:<9}{r['scans_per_second']:>7.2f} scans/s", flush=True)
        tiling = tiled_vs_whole(archives[unet_n], base, device, args.tile_check) if args.tile_check else None

    name = {"1x1 conv": "1x1 conv (stand-in)", "unet": f"UNet base {base}, depth 5"}
    memory = "peak CUDA MiB" if gpu else "peak RSS MiB"
    print(
        f"\n{n} scans ({unet_n} for the UNet) at scale {args.scale}",
        f"on {device}, pipeline workers {args.workers}; decode {costs['decode_ms']:.0f} ms/scan, "
        f"mask write {costs['write_ms']:.0f} ms/scan (one thread)",
    )
    print(f"{'model':<24}{'mode':<10}{'scans':>6}{'scans/s':>9}{'vs serial':>11}{'device busy':>13}{memory:>15}")
    medians = {}
    for model, mode in itertools.product(models, ("serial", "inline", "pipeline")):
        runs = [r for r in results if r["model"] == model and r["mode"] == mode]
        medians[(model, mode)] = {
            key: statistics.median(r.get(key) or 0 for r in runs)
            for key in ("scans", "scans_per_second", "busy_fraction", "peak_rss_mib", "peak_cuda_mib")
        }
    ratios = {}
    for (model, mode), r in medians.items():
        ratio = ratios[(model, mode)] = r["scans_per_second"] / medians[(model, "serial")]["scans_per_second"]
        mem = r["peak_cuda_mib"] if gpu else r["peak_rss_mib"]
        print(
            f"{name[model]:<24}{mode:<10}{r['scans']:>6.0f}{r['scans_per_second']:>9.2f}{ratio:>10.2f}x"
            f"{r['busy_fraction']:>12.0%}{mem:>15,.0f}"
        )
    goals = {"1x1 conv": 5.0 if gpu else 3.0, "unet": 5.0 if gpu else 1.0}
    for model in models:
        ratio = ratios[(model, "pipeline")]
        verdict = "met" if ratio >= goals[model] else "NOT met"
        print(f"{name[model]}: pipeline / serial {ratio:.2f}x (goal >= {goals[model]}x: {verdict})")
    if tiling:
        print(
            f"tiled vs whole: {tiling['fraction_differing']:.4%} of {tiling['pixels']:,} pixels differ "
            f"({tiling['scans']} scans, budget a third of each scan, random UNet base {base})"
        )
    best = max(r["scans_per_second"] for (_, mode), r in medians.items() if mode == "pipeline")
    print(
        f"{SCANS_IN_AN_HOUR:,} scans in an hour need {SCANS_IN_AN_HOUR / 3600:.1f} scans/s; "
        f"the fastest pipeline here: {best:.2f} scans/s ({SCANS_IN_AN_HOUR / best / 3600:.1f} h for the archive)"
    )
    result = {
        "config": {k: v for k, v in vars(args).items() if k != "child"}
        | {"n": n, "unet_n": unet_n, "base": base, "device": device},
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "torch": torch.__version__,
        "gpu": torch.cuda.get_device_name() if gpu else None,
        "stage_costs": costs,
        "runs": results,
        "medians": {f"{model} / {mode}": r for (model, mode), r in medians.items()},
        "tiled_vs_whole": tiling,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
