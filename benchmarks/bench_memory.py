"""Training memory per padded pixel, by model size, precision and activation checkpointing; what each card can train.

For the padding-aware UNet (depth 5, 4 classes, Dice weight 1: configs/welllog.yaml's model at base 8, 16 and 32)
in fp32 and bf16, with ``model.checkpointing`` off and on, it measures one training step (forward, loss, backward)
with the trainer's own probe (:func:`srforge.train.pixel_budget.probe_memory`): bytes per padded pixel and the fixed
part
(gradients, workspaces, and AdamW's state counted from the parameters). On the CPU the peaks come from the
profiler's record of torch's CPU allocator, on CUDA from ``max_memory_allocated``; bytes per pixel is a ratio of
two input sizes, so small inputs measure it. Then, from the measured model, the largest scan each common card (24,
48, 80 and 141 GB, taken as that many 10^9 bytes less 1 GB for the CUDA context) can train alone under
``data.max_pixels: auto`` (75% of its free memory), and the auto budget itself. Last, the time checkpointing costs:
median seconds of a step with it off and on, interleaved, per model size (fp32).

    python benchmarks/bench_memory.py [--device cpu|cuda] [--bases 8 16 32] [--out FILE.json]

On a GPU, two checks that benchmarks/gpu_check.sh runs (exit status 0 passed, 3 failed, one line of figures):

    --check probe   configs/welllog.yaml's model (base 32, bf16, channels_last): the probe's predicted peak of a
                    training step at the data.max_pixels: auto budget against max_memory_allocated of a real step
                    (forward, loss, backward, fused AdamW) over that many pixels of 640 x 4,800 scans; within 15%.
    --check oom     a batch the probe says needs 1.2x the free memory (base 32, fp32) really runs out of memory, is
                    redone in parts by the trainer's step and the budget lowered; the step is taken.

On the CPU or a GPU:

    --check step    UNets of base 16, depth 3 and 5, fp32, checkpointing off and on: the probe's bytes per pixel
                    against a real step's (forward, loss, backward, AdamW step, confusion matrix) over two inputs
                    of 512 x 2,048 and 512 x 4,096 px (CPU: torch's allocator through the profiler; CUDA:
                    max_memory_allocated); within 10% each. On the CPU also the peak RSS a pixel of the same step
                    (each input in a fresh process, so fixed costs cancel), shown, not judged: glibc keeps freed
                    blocks of under its mmap threshold in its heap, so RSS and tensors part at mid sizes.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from srforge.data.collate import AlignedCollate  # noqa: E402
from srforge.data.entry import Entry  # noqa: E402
from srforge.models import UNet  # noqa: E402
from srforge.runtime.device import autocast, resolve_device  # noqa: E402
from srforge.runtime.device_memory import (  # noqa: E402
    MEMORY_FRACTIONS,
    auto_budget,
    free_memory,
    peak_bytes,
    planning_share,
)

AUTO_FRACTION = MEMORY_FRACTIONS["train", "cuda"]
from srforge.train.losses import segmentation_loss  # noqa: E402
from srforge.train.pixel_budget import probe_memory  # noqa: E402

CARDS_GB = (24, 48, 80, 141)
CONTEXT_BYTES = 10**9  # what the CUDA context and the library kernels take on a card before training starts
FULL_SIZE = (640, 12_800)  # the widest full-size well-log scan


def welllog_loss(logits: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """configs/welllog.yaml's training loss: cross-entropy + Dice (weight 1) over valid pixels."""
    return segmentation_loss(logits, mask, 255, dice_weight=1.0)


def measure(base: int, precision: str, checkpointing: bool, device: torch.device) -> dict:
    torch.manual_seed(0)
    model = UNet(num_classes=4, base_channels=base, depth=5, checkpointing=checkpointing).to(device)
    channels_last = device.type == "cuda"  # as configs/welllog.yaml on a GPU
    if channels_last:
        model = model.to(memory_format=torch.channels_last)
    started = time.perf_counter()
    memory = probe_memory(model, device, precision, welllog_loss, channels_last=channels_last)
    return {
        "base_channels": base,
        "precision": precision,
        "checkpointing": checkpointing,
        "bytes_per_pixel": memory.bytes_per_pixel,
        "fixed_bytes": memory.fixed_bytes,
        "parameters": sum(p.numel() for p in model.parameters()),
        "probe_seconds": time.perf_counter() - started,
        "memory": memory,
    }


def cards(row: dict) -> list[dict]:
    """The largest scan a card can train alone (capacity) and the auto budget, from the row's measured model."""
    out = []
    for gb in CARDS_GB:
        share = planning_share(gb * 10**9 - CONTEXT_BYTES, "cuda")
        budget, capacity = auto_budget(row["memory"], share, "cuda", 32)
        width = capacity // FULL_SIZE[0] // 32 * 32
        out.append({"card_gb": gb, "capacity_px": capacity, "auto_budget_px": budget, "width_at_640": width})
    return out


def step_seconds(base: int, device: torch.device, shape: tuple[int, int], repeats: int) -> tuple[float, float]:
    """Median seconds of a fp32 training step (forward, loss, backward) with checkpointing off and on, the two
    interleaved so that a machine shared with other work slows both alike."""
    torch.manual_seed(0)
    model = UNet(num_classes=4, base_channels=base, depth=5).to(device)
    g = torch.Generator().manual_seed(0)
    image = torch.randint(0, 256, (1, 3, *shape), dtype=torch.uint8, generator=g).to(device)
    mask = torch.randint(0, 4, (1, *shape), generator=g).to(device)
    sizes = torch.tensor([list(shape)], device=device)
    times: dict[bool, list[float]] = {False: [], True: []}
    for i in range(repeats + 1):
        for checkpointing in (False, True):
            model.checkpointing = checkpointing
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            t0 = time.perf_counter()
            with autocast(device, "fp32"):
                logits = model(image, sizes)
            segmentation_loss(logits, mask, 255, 1.0).backward()
            model.zero_grad(set_to_none=True)
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            if i:  # the first round warms up
                times[checkpointing].append(time.perf_counter() - t0)
    return statistics.median(times[False]), statistics.median(times[True])


def welllog_model(device: torch.device, precision: str, channels_last: bool) -> UNet:
    torch.manual_seed(0)
    model = UNet(num_classes=4, base_channels=32, depth=5).to(device)
    return model.to(memory_format=torch.channels_last) if channels_last else model


class TwoScans(torch.utils.data.Dataset):
    """Two 640 x 4,800 scans (4 classes): all a Trainer needs to build; the OOM check feeds it its own batch."""

    def __len__(self):
        return 2

    def __getitem__(self, i):
        return scans_batch(2)[i]


def welllog_trainer(device: torch.device):
    """A Trainer with configs/welllog.yaml's model (base 32, fp32, Dice 1), its pixel budget unbounded."""
    from srforge.config import resolve
    from srforge.runtime.distributed import environment
    from srforge.train import Trainer

    run_dir = Path(os.environ.get("TMPDIR", "/tmp")) / "srforge-bench-memory"
    run_dir.mkdir(parents=True, exist_ok=True)
    cfg = resolve(
        {
            "run": {"dir": str(run_dir), "device": str(device)},
            "data": {"dataset": {"class": "__main__:TwoScans"}, "batch_size": 1, "val_fraction": 0.5},
            "model": {"num_classes": 4, "base_channels": 32, "depth": 5},
            "train": {"dice_weight": 1.0, "lr": 1e-4},
        }
    )
    return Trainer.from_config(cfg, environment(), run_dir)


def scans_batch(count: int, height: int = 640, width: int = 4800) -> Entry:
    """A collated batch of ``count`` random scans of height x width with 4-class masks, in host memory."""
    g = torch.Generator().manual_seed(0)
    samples = [
        Entry(
            name=f"scan_{i}",
            image=torch.randint(0, 256, (3, height, width), dtype=torch.uint8, generator=g),
            mask=torch.randint(0, 4, (height, width), dtype=torch.uint8, generator=g),
        )
        for i in range(count)
    ]
    return AlignedCollate(32, pad={"image": 0, "mask": 255})(samples)


def check_probe(device: torch.device) -> tuple[bool, str]:
    """The probe's peak against a real step's at the auto budget (see the module docstring)."""
    model = welllog_model(device, "bf16", channels_last=True)
    weights = torch.cuda.memory_allocated(device)
    memory = probe_memory(model, device, "bf16", welllog_loss, channels_last=True)
    free = free_memory(device)
    budget, _ = auto_budget(memory, planning_share(free, "cuda"), "cuda", 32)
    count = max(1, budget // (640 * 4800))
    batch = scans_batch(count)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    for measured_step in (False, True):  # the first creates AdamW's state, as every step after the first holds it
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        image = batch.image.to(device).contiguous(memory_format=torch.channels_last)
        mask, sizes = batch.mask.to(device).long(), batch.sizes.to(device)
        with autocast(device, "bf16"):
            logits = model(image, sizes)
        segmentation_loss(logits, mask, 255, 1.0).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        del image, mask, sizes, logits
        torch.cuda.synchronize(device)
    measured = torch.cuda.max_memory_allocated(device) - weights
    pixels = count * 640 * 4800
    predicted = memory.peak(pixels)
    error = abs(predicted - measured) / measured
    figures = (
        f"{memory.describe()}; {free / 1e9:.1f} GB free, auto budget {budget / 1e6:.1f} Mpx; a step over {count} x "
        f"640 x 4,800 ({pixels / 1e6:.1f} Mpx): predicted {predicted / 1e9:.2f} GB, measured {measured / 1e9:.2f} GB "
        f"({error:.1%} apart; goal <= 15%)"
    )
    return error <= 0.15, figures


def check_oom(device: torch.device) -> tuple[bool, str]:
    """A batch that cannot fit, recovered by the trainer's step (see the module docstring)."""
    trainer = welllog_trainer(device)
    memory = trainer.memory
    free = free_memory(device)
    per_scan = memory.bytes_per_pixel * 640 * 4800
    count = max(2, int((1.2 * free - memory.fixed_bytes) // per_scan) + 1)
    batch = scans_batch(count)
    started = time.perf_counter()
    trainer.run_step(iter([batch]))
    seconds = time.perf_counter() - started
    finite = all(bool(torch.isfinite(p).all()) for p in trainer.model.parameters())
    budget = trainer.budget.pixels
    figures = (
        f"a batch of {count} x 640 x 4,800 ({count * 640 * 4800 / 1e6:.1f} Mpx, about "
        f"{memory.peak(count * 640 * 4800) / 1e9:.0f} GB by the probe) on {free / 1e9:.1f} GB free: "
        f"{trainer.budget.events} out-of-memory event(s), budget lowered to "
        f"{'none' if budget is None else f'{budget / 1e6:.1f} Mpx'}, {trainer.step} step taken in {seconds:.1f} s, "
        f"weights finite: {finite}"
    )
    return trainer.budget.events >= 1 and trainer.step == 1 and finite, figures


# -- --check step: the probe against a real step, checkpointing off and on -----------------------------------------
STEP_SHAPES = ((512, 2048), (512, 4096))  # 1 and 2 Mpx: well past where the weights' gradients set the peak
STEP_MARGIN = 0.10


def step_model(depth: int, checkpointing: bool, device: torch.device) -> UNet:
    torch.manual_seed(0)
    return UNet(num_classes=4, base_channels=16, depth=depth, checkpointing=checkpointing).to(device)


def real_step(model: UNet, optimizer: torch.optim.Optimizer, shape: tuple[int, int], device: torch.device) -> None:
    """One training step as the Trainer takes it: forward, loss, backward, confusion matrix, AdamW step."""
    from srforge.models.class_map import class_map
    from srforge.train.metrics import confusion_matrix

    g = torch.Generator().manual_seed(0)
    image = torch.randint(0, 256, (1, 3, *shape), dtype=torch.uint8, generator=g).to(device)
    mask = torch.randint(0, 4, (1, *shape), generator=g).to(device)
    optimizer.zero_grad(set_to_none=True)
    with autocast(device, "fp32"):
        logits = model(image, torch.tensor([list(shape)], device=device))
    welllog_loss(logits, mask).backward()
    with torch.no_grad():
        confusion_matrix(class_map(logits.detach()), mask, 4, 255)
    optimizer.step()


def step_rss(depth: int, checkpointing: bool, shape: tuple[int, int]) -> int:
    """Peak RSS bytes of a fresh process that takes two real steps over ``shape`` on the CPU (VmHWM)."""
    code = (
        f"import sys, torch; sys.path.insert(0, {str(Path(__file__).resolve().parent)!r}); import bench_memory as b;"
        f"torch.set_num_threads(1); d = torch.device('cpu'); m = b.step_model({depth}, {checkpointing}, d);"
        f"o = torch.optim.AdamW(m.parameters(), lr=1e-4); [b.real_step(m, o, {tuple(shape)}, d) for _ in range(2)];"
        "print([l.split()[1] for l in open('/proc/self/status') if l.startswith('VmHWM')][0])"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return int(done.stdout.split()[-1]) * 1024


def check_step(device: torch.device) -> tuple[bool, str]:
    """The probe's bytes per pixel against a real step's, depth 3 and 5, checkpointing off and on."""
    lines, passed = [], True
    pixels = [h * w for h, w in STEP_SHAPES]
    for depth, checkpointing in ((3, False), (3, True), (5, False), (5, True)):
        model = step_model(depth, checkpointing, device)
        probed = probe_memory(model, device, "fp32", welllog_loss).bytes_per_pixel
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
        real_step(model, optimizer, STEP_SHAPES[0], device)  # AdamW's state, as every step after the first holds it
        peaks = [peak_bytes(lambda s=s: real_step(model, optimizer, s, device), device) for s in STEP_SHAPES]
        real = (peaks[1] - peaks[0]) / (pixels[1] - pixels[0])
        error = abs(probed - real) / real
        passed &= error <= STEP_MARGIN
        line = f"depth {depth} checkpointing {'on ' if checkpointing else 'off'}: probe {probed:,.0f} B/px, real step "
        line += f"{real:,.0f} B/px ({error:.1%} apart)"
        if device.type == "cpu" and sys.platform.startswith("linux"):
            rss = [step_rss(depth, checkpointing, s) for s in STEP_SHAPES]
            line += f", peak RSS {(rss[1] - rss[0]) / (pixels[1] - pixels[0]):,.0f} B/px"
        lines.append(line)
        print(line, flush=True)
    shapes = " and ".join(f"{h} x {w}" for h, w in STEP_SHAPES)
    lines.append(f"base 16, fp32, inputs {shapes} px on {device}; goal: within {STEP_MARGIN:.0%} each")
    return passed, "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu", help="cpu or cuda (cuda:N)")
    parser.add_argument("--bases", type=int, nargs="+", default=[8, 16, 32])
    parser.add_argument("--precisions", nargs="+", default=["fp32", "bf16"])
    parser.add_argument("--repeats", type=int, default=3, help="timed steps per setting for the checkpointing cost")
    parser.add_argument("--out", default="benchmarks/results/bench_memory.json")
    parser.add_argument("--check", choices=("probe", "oom", "step"), help="run one check instead of the table")
    args = parser.parse_args(argv)
    try:
        device = resolve_device(args.device)  # a CUDA device with its index, or a ValueError naming those there are
    except ValueError as exc:
        print(f"bench_memory: --device: {exc}", file=sys.stderr)
        return 2
    if device.type == "cuda":
        torch.cuda.set_device(device)
    if args.check == "step":
        passed, figures = check_step(device)
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps({"check": args.check, "passed": passed, "figures": figures}, indent=2))
        print(figures)
        return 0 if passed else 3
    if args.check:
        if device.type != "cuda":
            print(f"bench_memory: --check {args.check} needs --device cuda", file=sys.stderr)
            return 2
        passed, figures = (check_probe if args.check == "probe" else check_oom)(device)
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps({"check": args.check, "passed": passed, "figures": figures}, indent=2))
        print(figures)
        return 0 if passed else 3
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    rows = []
    for base in args.bases:
        for precision in args.precisions:
            for checkpointing in (False, True):
                row = measure(base, precision, checkpointing, device)
                rows.append(row)
                print(
                    f"base {base:2d} {precision} checkpointing {'on ' if checkpointing else 'off'}: "
                    f"{row['bytes_per_pixel']:7,.0f} B/px, fixed {row['fixed_bytes'] / 1e6:7,.1f} MB "
                    f"(probe {row['probe_seconds']:.1f} s)",
                    flush=True,
                )
    shape = (512, 2048) if device.type == "cuda" else (128, 1024)
    timing = {}
    for base in args.bases:
        plain, checkpointed = step_seconds(base, device, shape, args.repeats)
        timing[base] = {"plain_s": plain, "checkpointing_s": checkpointed, "ratio": checkpointed / plain}
        print(
            f"base {base:2d} fp32 step {shape[0]} x {shape[1]}: {plain:.3f} s, checkpointing {checkpointed:.3f} s "
            f"({checkpointed / plain:.2f}x)",
            flush=True,
        )
    report_table(rows, timing, device, load)
    for row in rows:
        row["cards"] = cards(row)
        del row["memory"]
    report = {
        "device": str(device),
        "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or "CPU",
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, torch {torch.__version__}",
        "load_average_at_start": load,
        "auto_fraction": AUTO_FRACTION,
        "rows": rows,
        "checkpointing_time": {str(k): v for k, v in timing.items()},
        "timing_shape": list(shape),
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=2))
    return 0


def report_table(rows: list[dict], timing: dict, device: torch.device, load: float) -> None:
    """The markdown tables: bytes per pixel with the checkpointing ratio; the cards; the time cost."""
    print(f"\ndevice {device}; load average {load:.2f} at start\n")
    print("| base | precision | B/px | B/px, checkpointing | ratio | fixed MB (incl. AdamW) |")
    print("| --- | --- | --- | --- | --- | --- |")
    pairs = {(r["base_channels"], r["precision"], r["checkpointing"]): r for r in rows}
    for (base, precision, checkpointing), row in pairs.items():
        if checkpointing:
            continue
        on = pairs[(base, precision, True)]
        print(
            f"| {base} | {precision} | {row['bytes_per_pixel']:,.0f} | {on['bytes_per_pixel']:,.0f} | "
            f"{row['bytes_per_pixel'] / on['bytes_per_pixel']:.2f}x | {row['fixed_bytes'] / 1e6:,.0f} |"
        )
    print(
        f"\nLargest scan alone under data.max_pixels: auto ({AUTO_FRACTION:.0%} of the card less 1 GB), "
        "Mpx (width at 640 px high); * = a full-size 640 x 12,800 scan fits\n"
    )
    print("| base | precision | checkpointing | " + " | ".join(f"{gb} GB" for gb in CARDS_GB) + " |")
    print("| --- | --- | --- | " + " | ".join("---" for _ in CARDS_GB) + " |")
    full = FULL_SIZE[0] * FULL_SIZE[1]
    for row in rows:
        cells = [
            f"{c['capacity_px'] / 1e6:.1f} ({c['width_at_640']:,}){'*' if c['capacity_px'] >= full else ''}"
            for c in cards(row)
        ]
        flag = "on" if row["checkpointing"] else "off"
        print(f"| {row['base_channels']} | {row['precision']} | {flag} | " + " | ".join(cells) + " |")
    print("\n| base | fp32 step | with checkpointing | ratio |\n| --- | --- | --- | --- |")
    for base, t in timing.items():
        print(f"| {base} | {t['plain_s']:.3f} s | {t['checkpointing_s']:.3f} s | {t['ratio']:.2f}x |")


if __name__ == "__main__":
    raise SystemExit(main())
