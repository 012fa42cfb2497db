"""Does predicting through ONNX Runtime beat PyTorch eager on the CPU, with the same masks?

One checkpoint of configs/welllog.yaml's model (UNet depth 5, base 32, 4 classes; random weights: speed does not
depend on them) is exported with srforge-export (timed), then ``scripts/predict.py`` predicts the same folder of
full-size scans (3,200 x 544 and 12,800 x 640 px, drawn by srforge's generator) once with ``--checkpoint
best.pt`` (PyTorch eager) and once with ``--checkpoint model.onnx`` (ONNX Runtime's CPU provider), each in its own
process so that its peak memory is its own: decoding, tiling (the wide scan exceeds the CPU's pixel budget) and
writing are included, as a user runs it. Then the quickstart's model (depth 3, base 8) on 40 scans of the
quickstart's size. It prints scans/s, the ratio, peak RSS, the share of mask pixels that agree, and the largest
|logit difference| on one full-size scan; the archive's cost on CPUs follows from the measured rate.

With ``--train-epochs N`` each model is first trained for N epochs on generator scans (the quickstart's recipe;
welllog's model on 1/8-scale multiclass scans, since full-size training is a GPU's job): the masks of a trained
model, whose decisions are rarely near-ties, are what a user's agreement figures are about; speed does not change.

With ``--int8`` each model is also exported as a static int8 model (``srforge-export --quantize int8``), calibrated
on scans drawn apart from the predicted ones (other generator seeds, the same sizes), and predicted in the same way:
its speed, and how many of its mask pixels agree with eager's.

With ``--memory-pattern`` it measures instead what ONNX Runtime's per-shape memory pattern costs: welllog's model
(random weights) in one session as srforge.predict.onnx_model opens it (no pattern) and in one with the pattern on,
each in a process of its own, over the shapes predict.py gives the full-size scans (the 544 x 3,200 scan, then the
wide scan's 640 x 6,528 tiles three times): each run's seconds, the kernel's seconds and its page faults.

    python benchmarks/bench_onnx.py [--repeats 1] [--int8] [--train-epochs N] [--out FILE.json]
    python benchmarks/bench_onnx.py --memory-pattern
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from PIL import Image

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from srforge.cli import main_export  # noqa: E402
from srforge.config import load_config  # noqa: E402
from srforge.models.unet import UNet  # noqa: E402
from srforge.predict import Predictor  # noqa: E402
from srforge.runtime.checkpoint import save_checkpoint  # noqa: E402
from srforge.runtime.distributed import Processes  # noqa: E402
from srforge.synthetic import welllog_scan  # noqa: E402
from srforge.synthetic.prepare import prepare_synthetic_data  # noqa: E402
from srforge.train import train  # noqa: E402

FULL_SIZES = [(544, 3200), (640, 12_800)]  # (H, W)
ARCHIVE_SCANS, ARCHIVE_PIXELS = 136_771, 560 * 8_000  # the seed's archive: its count and mean scan


def checkpoint(path: Path, base: int, depth: int, classes: int) -> Path:
    torch.manual_seed(0)
    args = {"in_channels": 3, "num_classes": classes, "base_channels": base, "depth": depth}
    model = UNet(**args)
    names = [f"class_{c}" for c in range(classes)]
    payload = {"model": model.state_dict(), "model_args": args, "size_divisor": model.size_divisor}
    return save_checkpoint({**payload, "class_names": names, "ignore_index": 255, "config": {}}, path)


def trained(work: Path, name: str, base: int, depth: int, classes: int, epochs: int) -> Path:
    """best.pt of the model shape trained by srforge for ``epochs`` on 40 generator scans: configs/quickstart.yaml's
    recipe, welllog's shape (4 classes) on multiclass scans at 1/8 scale under a budget that holds the widest."""
    root = work / f"train-{name}"
    overrides = [
        f"run.dir={root / 'run'}", f"data.synthetic.root={root / 'data'}", f"data.dataset.args.root={root / 'data'}",
        f"model.base_channels={base}", f"model.depth={depth}", f"model.num_classes={classes}", f"train.epochs={epochs}",
    ]  # fmt: skip
    if classes > 2:
        overrides += ["data.synthetic.classes=multiclass", "data.synthetic.scale=0.125", "data.max_pixels=160000",
                      "model.class_names=[background, solid, dashed, dotted]"]  # fmt: skip
    cfg = load_config(ROOT / "configs" / "quickstart.yaml", overrides)
    prepare_synthetic_data(cfg.data.synthetic, Processes())
    start = time.perf_counter()
    train(cfg)
    print(f"{name}: trained {epochs} epochs in {time.perf_counter() - start:.0f} s")
    return root / "run" / "best.pt"


def full_size_scans(folder: Path, seed: int = 0) -> list[Path]:
    """Generator scans cut (or tiled side by side) to FULL_SIZES."""
    paths = []
    for i, (h, w) in enumerate(FULL_SIZES):
        image, _ = welllog_scan(i, seed=seed, scale=1.0)
        reps = -(-w // image.shape[1])
        wide = np.concatenate([image] * reps, axis=1)[:h, :w]
        if wide.shape[0] < h:
            wide = np.concatenate([wide, np.full((h - wide.shape[0], w, 3), 255, np.uint8)], axis=0)
        paths.append(folder / f"full_{h}x{w}.png")
        folder.mkdir(parents=True, exist_ok=True)
        Image.fromarray(wide).save(paths[-1])
    return paths


def tiny_scans(folder: Path, n: int = 40, seed: int = 1) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for i in range(n):
        image, _ = welllog_scan(i, seed=seed, scale=0.0625)
        Image.fromarray(image).save(folder / f"tiny_{i:03d}.png")


def child(spec: str) -> None:
    """In a process of its own: predict.py over the folder; prints seconds and peak RSS as JSON."""
    from srforge.cli import main_predict

    args = json.loads(spec)
    start = time.perf_counter()
    code = main_predict(args + ["--no-progress"])
    seconds = time.perf_counter() - start
    print(json.dumps({"code": code, "seconds": seconds, "peak_bytes": peak_rss()}))


def pattern_child(spec: str) -> None:
    """In a process of its own: ``spec`` = {"model", "pattern", "shapes"}; runs srforge's session (its memory
    pattern set as asked) once per shape in turn and prints each run's seconds, kernel seconds and page faults."""
    import onnxruntime

    from srforge.predict.onnx_model import OnnxModel

    args = json.loads(spec)
    options = OnnxModel(args["model"]).session.get_session_options()  # srforge's own, the pattern aside
    options.enable_mem_pattern = args["pattern"]
    session = onnxruntime.InferenceSession(args["model"], options, providers=["CPUExecutionProvider"])
    rng, found = np.random.default_rng(0), []
    for h, w in args["shapes"]:
        feed = {"image": rng.integers(0, 256, (1, 3, h, w), dtype=np.uint8), "sizes": np.array([[h, w]])}
        before, start = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
        session.run(["logits"], feed)
        seconds, after = time.perf_counter() - start, resource.getrusage(resource.RUSAGE_SELF)
        kernel = after.ru_stime - before.ru_stime
        found.append({"shape": [h, w], "seconds": round(seconds, 2), "kernel_s": round(kernel, 2),
                      "page_faults": after.ru_minflt - before.ru_minflt})  # fmt: skip
    print(json.dumps(found))


def memory_pattern(work: Path) -> dict:
    """welllog's model (random weights) with and without ONNX Runtime's memory pattern, each in its own process,
    over predict.py's shapes for the full-size scans: {"off" | "on": [runs]}."""
    from srforge.predict.tiling import tile_grid, tile_shape

    ckpt, onnx = checkpoint(work / "welllog.pt", 32, 5, 4), work / "welllog.onnx"
    export(ckpt, onnx)
    (h, w), (wide_h, wide_w) = FULL_SIZES
    plan = Predictor.from_onnx(onnx)  # the budget, overlap and divisor predict.py tiles the wide scan with
    largest = tile_shape(wide_h, wide_w, plan.max_pixels, plan.divisor)
    rows, columns = tile_grid(wide_h, wide_w, largest, plan.overlap, plan.divisor)
    tile = (rows[0][1] - rows[0][0], columns[0][1] - columns[0][0])  # the first tile, as predict.py runs it
    shapes = [(h, w), tile, tile, tile]
    found = {}
    for label, pattern in (("off", False), ("on", True)):
        spec = json.dumps({"model": str(onnx), "pattern": pattern, "shapes": shapes})
        done = subprocess.run([sys.executable, __file__, "--pattern-child", spec], capture_output=True, text=True,
                              check=True)  # fmt: skip
        found[label] = json.loads(done.stdout.strip().splitlines()[-1])
        for run in found[label]:
            print(f"memory pattern {label}: {run['shape'][0]} x {run['shape'][1]}: {run['seconds']:.2f} s, the "
                  f"kernel's {run['kernel_s']:.2f} s, {run['page_faults']:,} page faults")  # fmt: skip
    return found


def peak_rss() -> int:
    """This process's peak resident memory in bytes: VmHWM, its own address space's high-water mark. Not
    getrusage's ru_maxrss, which a process started by vfork + exec inherits from its parent (Linux folds the
    parent's high-water mark in at exec), so that every child would report the exporting parent's peak."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def run_predict(model: Path, folder: Path, out: Path) -> dict:
    args = ["--checkpoint", str(model), "--input", str(folder), "--output", str(out), "--device", "cpu", "--overwrite"]
    done = subprocess.run(
        [sys.executable, __file__, "--child", json.dumps(args)], capture_output=True, text=True, check=False
    )
    result = json.loads(done.stdout.strip().splitlines()[-1])
    if result["code"] != 0:
        raise SystemExit(f"predict.py --checkpoint {model} failed:\n{done.stderr[-2000:]}")
    return result


def agreement(a: Path, b: Path) -> tuple[float, float]:
    """The share of mask pixels of predict.py's outputs ``a`` and ``b`` that agree, over all pixels and over the
    foreground (pixels either calls a class other than 0: a model that sees little foreground agrees anyway)."""
    masks = sorted((a / "masks").rglob("*.png"))
    other = [b / "masks" / mask.relative_to(a / "masks") for mask in masks]
    return shares([(np.asarray(Image.open(x)), np.asarray(Image.open(y))) for x, y in zip(masks, other)])


def shares(pairs: list[tuple[np.ndarray, np.ndarray]]) -> tuple[float, float]:
    """(agreeing share of all pixels, of the foreground pixels) over [(mask a, mask b)] of class ids."""
    same = total = fg_same = fg_total = 0
    for x, y in pairs:
        fg = (x != 0) | (y != 0)
        same, total = same + int((x == y).sum()), total + x.size
        fg_same, fg_total = fg_same + int((x == y)[fg].sum()), fg_total + int(fg.sum())
    return same / total, fg_same / max(fg_total, 1)


def at_training_scale(ckpt: Path, models: dict[str, Path], n: int = 16, seed: int = 7) -> dict[str, dict]:
    """Mask agreement with eager of each exported model on ``n`` multiclass generator scans at welllog's training
    scale in trained(), another seed: where the trained model sees its curves as it learned them (at full size it
    calls most of them background, and agreement there says little about int8's rounding)."""
    scans = [welllog_scan(i, seed=seed, scale=0.125, classes="multiclass")[0] for i in range(n)]
    images = [torch.from_numpy(scan.copy()).permute(2, 0, 1).contiguous() for scan in scans]
    eager = Predictor.from_checkpoint(ckpt, device="cpu").predict(images)
    found = {}
    for backend, model in models.items():
        if backend != "eager":
            masks = Predictor.from_onnx(model).predict(images)
            share, fg = shares([(a.numpy(), b.numpy()) for a, b in zip(eager, masks)])
            found[backend] = {"agreement": share, "agreement_foreground": fg, "scans": n}
    return found


def logit_difference(ckpt: Path, onnx: Path, scan: Path) -> float:
    image = torch.from_numpy(np.asarray(Image.open(scan).convert("RGB"))).permute(2, 0, 1).contiguous()
    eager, ort = Predictor.from_checkpoint(ckpt, device="cpu"), Predictor.from_onnx(onnx)
    batch = eager.collate_images([image])
    with torch.no_grad():
        a = eager.model(batch["image"], batch["sizes"])
    b = ort.model(batch["image"], batch["sizes"])
    h, w = image.shape[1:]
    return float((a[..., :h, :w] - b[..., :h, :w]).abs().max())


def export(ckpt: Path, out: Path, calibrate: Path | None = None) -> float:
    """srforge-export (int8 when ``calibrate`` names the calibration scans); its seconds."""
    extra = [] if calibrate is None else ["--quantize", "int8", "--calibrate", str(calibrate)]
    start = time.perf_counter()
    assert main_export(["--checkpoint", str(ckpt), "--output", str(out), *extra]) == 0
    return time.perf_counter() - start


def compare(  # noqa: PLR0913 (the benchmark's options)
    work: Path, name: str, folder: Path, shape: tuple[int, int, int], repeats: int, calibrate=None, epochs: int = 0
) -> dict:
    """Export (and, with ``calibrate``, export as int8 too), then predict ``folder`` with each backend ``repeats``
    times (alternating): the medians, each backend's masks against eager's. The model: random weights, or trained
    for ``epochs``."""
    base, depth, classes = shape
    if epochs:
        ckpt = trained(work, name, base, depth, classes, epochs)
    else:
        ckpt = checkpoint(work / f"{name}.pt", base, depth, classes)
    models = {"eager": ckpt, "onnx": work / f"{name}.onnx"}
    export_s = {"onnx": export(ckpt, models["onnx"])}
    if calibrate is not None:
        models["int8"] = work / f"{name}.int8.onnx"
        export_s["int8"] = export(ckpt, models["int8"], calibrate)
    runs: dict[str, list] = {backend: [] for backend in models}
    for _ in range(repeats):
        for backend, model in models.items():
            runs[backend].append(run_predict(model, folder, work / f"out-{name}-{backend}"))
    scans = len(list(folder.glob("*.png")))
    first = sorted(folder.glob("*.png"))[0]
    row = {"model": name, "scans": scans, "export_s": {k: round(v, 1) for k, v in export_s.items()}, "epochs": epochs}
    if epochs and classes > 2:
        row["training_scale"] = at_training_scale(ckpt, models)
    for backend, results in runs.items():
        seconds = float(np.median([r["seconds"] for r in results]))
        peak = results[0]["peak_bytes"] / 2**20
        row[backend] = {"seconds": seconds, "scans_per_s": scans / seconds, "peak_mib": peak,
                        "runs_s": [round(r["seconds"], 2) for r in results]}  # fmt: skip
        if backend != "eager":
            row[backend]["speedup"] = row[backend]["scans_per_s"] / row["eager"]["scans_per_s"]
            # each repeat's eager run against the run that followed it: how far one pair's ratio strays
            pairs = [e["seconds"] / r["seconds"] for e, r in zip(runs["eager"], results)]
            row[backend]["pair_speedups"] = [round(p, 3) for p in pairs]
            shared = agreement(work / f"out-{name}-eager", work / f"out-{name}-{backend}")
            row[backend]["agreement"], row[backend]["agreement_foreground"] = shared
            row[backend]["max_logit_difference"] = logit_difference(ckpt, models[backend], first)
    return row


def print_table(rows: list[dict]) -> None:
    print("| model | scans | backend | export s | scans/s | vs eager | peak MiB | masks agreeing with eager (all / "
          "foreground) | max logit diff |")  # fmt: skip
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in rows:
        for backend in ("eager", "onnx", "int8"):
            if backend not in r:
                continue
            b = r[backend]
            label = {"eager": "PyTorch eager", "onnx": "ONNX Runtime", "int8": "ONNX Runtime int8"}[backend]
            export_s = r["export_s"].get(backend, "")
            versus = f"{b['speedup']:.2f}x" if "speedup" in b else ""
            if len(b.get("pair_speedups", [])) > 1:
                versus += f" (pairs {min(b['pair_speedups']):.2f}-{max(b['pair_speedups']):.2f}x)"
            agree = f"{100 * b['agreement']:.4f}% / {100 * b['agreement_foreground']:.3f}%" if "agreement" in b else ""
            diff = f"{b['max_logit_difference']:.2e}" if "max_logit_difference" in b else ""
            model = r["model"] + (f", trained {r['epochs']} epochs" if r.get("epochs") else ", random weights")
            print(f"| {model} | {r['scans']} | {label} | {export_s} | {b['scans_per_s']:.3f} | {versus} | "
                  f"{b['peak_mib']:.0f} | {agree} | {diff} |")  # fmt: skip
    for r in rows:
        for backend, found in r.get("training_scale", {}).items():
            print(
                f"{r['model']} {backend} at its training scale (1/8, {found['scans']} scans): masks agreeing with "
                f"eager {100 * found['agreement']:.4f}% / foreground {100 * found['agreement_foreground']:.3f}%"
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--int8", action="store_true", help="also a static int8 export, calibrated on other scans")
    parser.add_argument("--train-epochs", type=int, default=0, help="train each model first (default 0: random)")
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "bench_onnx.json"))
    parser.add_argument("--memory-pattern", action="store_true", help="what ONNX Runtime's memory pattern costs")
    parser.add_argument("--child")
    parser.add_argument("--pattern-child")
    args = parser.parse_args()
    if args.child:
        return child(args.child)
    if args.pattern_child:
        return pattern_child(args.pattern_child)
    work = Path(tempfile.mkdtemp(prefix="srforge-onnx-"))
    if args.memory_pattern:
        found = memory_pattern(work)
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps({"memory_pattern": found}, indent=2))
        return None
    full_size_scans(work / "full")
    tiny_scans(work / "tiny")
    if args.int8:  # calibration scans apart from the predicted ones: other seeds, the same sizes
        full_size_scans(work / "calibrate-full", seed=1)
        tiny_scans(work / "calibrate-tiny", n=8, seed=2)
    calibrate = {name: work / f"calibrate-{name}" if args.int8 else None for name in ("full", "tiny")}
    rows = [
        compare(work, "welllog", work / "full", (32, 5, 4), args.repeats, calibrate["full"], args.train_epochs),
        compare(work, "quickstart", work / "tiny", (8, 3, 2), args.repeats, calibrate["tiny"], args.train_epochs),
    ]
    print_table(rows)
    full, cores = rows[0], os.cpu_count() or 1
    pixels = sum(h * w for h, w in FULL_SIZES)
    for backend in [b for b in ("eager", "onnx", "int8") if b in full]:
        core_seconds = full[backend]["seconds"] * cores * ARCHIVE_PIXELS / pixels  # a mean archive scan's cost
        per_core_hour = 3600 / core_seconds
        print(f"{backend}: about {per_core_hour:.0f} mean archive scans ({ARCHIVE_PIXELS:,} px) a core-hour on these "
              f"{cores} cores; the archive's {ARCHIVE_SCANS:,} scans take {ARCHIVE_SCANS / per_core_hour:,.0f} "
              f"core-hours, {ARCHIVE_SCANS / per_core_hour / 64:.1f} h on 64 cores")  # fmt: skip
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
