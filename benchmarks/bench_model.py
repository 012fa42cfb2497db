"""What does padding-aware GroupNorm cost, and how close does the UNet get to the machine's matmul peak?

Times forward+backward of one UNet on one padded batch of well-log-shaped scans, with plain GroupNorm
(``sizes=None``) and in padding-aware mode (``sizes`` given), interleaved so that load from other processes hits
both alike; the ratio reported is the median of the per-pair ratios (goal <= 1.3x). FLOPs come from
torch.utils.flop_counter.FlopCounterMode on the plain mode (the convolutions; it counts no norm, plain or masked:
their elementwise passes are memory-bound bookkeeping, not model work), and achieved FLOP/s is set against a
measured fp32 matmul peak. The masked norm layer alone is timed against F.group_norm the same interleaved way.

    python benchmarks/bench_model.py                      # ~1-2 min on 2 CPU cores
    python benchmarks/bench_model.py --base-channels 32 --repeats 5 --out /tmp/bench.json

With ``--model`` (repeatable) it compares models side by side instead, on the same scans: srforge's ``unet`` and any
smp model ``smp_<arch>_<encoder>`` (``smp_unet_resnet18``, ``smp_unet_tu-mobilenetv3_small_100``; random init),
each with every ``--norm`` option of srforge.models.norms.apply_norm (srforge's UNet has its own padding-aware
norm). Per row: forward+backward seconds in train mode (best and median of --repeats, interleaved across rows;
under load from other processes the best is the steadier figure), the bytes one padded pixel costs in tensors kept
for backward (autograd's saved tensors, each storage counted once, parameters not counted: the per-pixel part of a
step's memory, the same on every device), and batch invariance: the max |logit difference| on a 64 x 96 scan's
true extent, predicted alone vs batched with a 160 x 320 one (eval mode, both padded to the divisor by
AlignedCollate).

    python benchmarks/bench_model.py --model unet --model smp_unet_resnet18 \
        --model smp_unet_tu-mobilenetv3_small_100 --norm keep group frozen masked --out /tmp/compare.json
"""

import argparse
import json
import platform
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.utils.flop_counter import FlopCounterMode

from srforge import AlignedCollate
from srforge.models import UNet, group_count, level_mask, masked_group_norm
from srforge.models.norms import NORM_OPTIONS, apply_norm
from srforge.runtime.device import resolve_device


def spread(low: int, high: int, count: int) -> list[int]:
    """count integers evenly from low to high inclusive."""
    return [round(low + (high - low) * i / max(count - 1, 1)) for i in range(count)]


def padded_batch(sizes: list[tuple[int, int]], channels: int, divisor: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Random uint8 scans of the given (H, W) through AlignedCollate -> ([B, C, Hp, Wp], sizes [B, 2])."""
    scans = [{"image": torch.randint(0, 256, (channels, h, w), dtype=torch.uint8)} for h, w in sizes]
    batch = AlignedCollate(divisor, pad={"image": 0})(scans)
    return batch["image"], batch["sizes"]


DEVICE = torch.device("cpu")  # set by --device; every tensor of the benchmark lives there


def synchronize() -> None:
    """Wait for the device's queued work, so that a wall-clock timer measures it (a no-op on the CPU)."""
    if DEVICE.type == "cuda":
        torch.cuda.synchronize(DEVICE)


def seconds(step, repeats: int) -> list[float]:
    """Wall time of each of ``repeats`` calls of step() after one warm-up call, the device's work included."""
    step()
    times = []
    for _ in range(repeats):
        synchronize()
        start = time.perf_counter()
        step()
        synchronize()
        times.append(time.perf_counter() - start)
    return times


def matmul_peak(n: int, repeats: int) -> float:
    """Best fp32 FLOP/s of an n x n matmul on the device."""
    a, b = torch.randn(n, n, device=DEVICE), torch.randn(n, n, device=DEVICE)
    return 2 * n**3 / min(seconds(lambda: a @ b, repeats))


def train_step(model: UNet, image: torch.Tensor, sizes: torch.Tensor | None) -> None:
    """One forward+backward (gradients dropped, as an optimizer's zero_grad would)."""
    model.zero_grad(set_to_none=True)
    model(image, sizes).logsumexp(1).mean().backward()


def model_flops(model: UNet, image: torch.Tensor) -> tuple[int, int]:
    """(forward, forward+backward) FLOPs of the plain mode on this batch."""
    with FlopCounterMode(display=False) as forward:
        logits = model(image)
    with FlopCounterMode(display=False) as backward:
        logits.logsumexp(1).mean().backward()
    model.zero_grad(set_to_none=True)
    return forward.get_total_flops(), forward.get_total_flops() + backward.get_total_flops()


def norm_ratio(channels: int, image: torch.Tensor, sizes: torch.Tensor, repeats: int) -> float:
    """Forward+backward time of masked_group_norm over F.group_norm alone (both affine, as in the model), on
    [B, channels, Hp, Wp]: the median of ``repeats`` interleaved per-pair ratios."""
    x = torch.randn(image.shape[0], channels, *image.shape[2:], device=DEVICE, requires_grad=True)
    weight = torch.randn(channels, device=DEVICE, requires_grad=True)
    bias = torch.randn(channels, device=DEVICE, requires_grad=True)
    mask, dy = level_mask(sizes, *image.shape[2:]), torch.randn_like(x)
    groups = group_count(channels)
    ratios = []
    for _ in range(repeats):
        plain = seconds(lambda: F.group_norm(x, groups, weight, bias).backward(dy), 1)[-1]
        masked = seconds(lambda: masked_group_norm(x, mask, groups, weight, bias).backward(dy), 1)[-1]
        ratios.append(masked / plain)
    return statistics.median(ratios)


def build_model(spec: str, norm: str, args: argparse.Namespace) -> torch.nn.Module:
    """``unet`` (base/depth from the flags; its own padding-aware norm) or ``smp_<arch>_<encoder>`` with ``norm``."""
    torch.manual_seed(args.seed)
    if spec == "unet":
        return UNet(base_channels=args.base_channels, depth=args.depth).to(DEVICE)
    kind, arch, encoder = (spec.split("_", 2) + ["", ""])[:3]
    if kind != "smp" or not arch or not encoder:
        raise SystemExit(f"--model must be unet or smp_<arch>_<encoder> (smp_unet_resnet18), got {spec!r}")
    from srforge.models.smp import SmpModel

    return apply_norm(SmpModel(arch=arch, encoder=encoder, encoder_weights=None), norm).to(DEVICE)


def saved_bytes_per_pixel(model: torch.nn.Module, image: torch.Tensor, sizes: torch.Tensor) -> float:
    """Bytes of the tensors autograd keeps for backward in one training forward, per padded pixel of ``image``:
    each storage counted once, the model's parameters and buffers not at all."""
    own = {t.untyped_storage().data_ptr() for t in (*model.parameters(), *model.buffers())}
    kept: dict[int, int] = {}

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        storage = tensor.untyped_storage()
        if storage.data_ptr() not in own:
            kept[storage.data_ptr()] = storage.nbytes()
        return tensor

    model.train()
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        logits = model(image, sizes)
    del logits
    return sum(kept.values()) / (image.shape[0] * image.shape[2] * image.shape[3])


@torch.no_grad()
def batch_invariance(model: torch.nn.Module, small=(64, 96), big=(160, 320)) -> float:
    """Max |logit difference| on a ``small`` scan's true extent, predicted alone vs batched with a ``big`` one."""
    model.eval()
    torch.manual_seed(1)
    alone, alone_sizes = padded_batch([small], model.in_channels, model.size_divisor)
    pair, pair_sizes = padded_batch([small, big], model.in_channels, model.size_divisor)
    pair[0] = 0
    pair[0, :, : alone.shape[2], : alone.shape[3]] = alone[0]
    one = model(alone.to(DEVICE), alone_sizes.to(DEVICE))[0, :, : small[0], : small[1]]
    two = model(pair.to(DEVICE), pair_sizes.to(DEVICE))[0, :, : small[0], : small[1]]
    model.train()
    return float((one - two).abs().max())


def compare(args: argparse.Namespace) -> None:
    """The side-by-side table of --model x --norm (see the module docstring)."""
    rows = []
    for spec in args.model:
        for norm in ["own"] if spec == "unet" else args.norm:
            model = build_model(spec, norm, args)
            invariance = batch_invariance(model)  # as built: the timed steps below move BatchNorm's running stats
            sizes = list(zip(spread(*args.heights, args.batch), spread(*args.widths, args.batch)))
            image, true_sizes = padded_batch(sizes, model.in_channels, model.size_divisor)
            rows.append({"model": spec, "norm": norm, "module": model, "image": image.to(DEVICE),
                         "sizes": true_sizes.to(DEVICE), "seconds": [], "batch_invariance": invariance})  # fmt: skip
    for row in rows:  # warm-up, then interleaved timing so that load from other processes hits every row alike
        row["module"].train()
        train_step(row["module"], row["image"], row["sizes"])
    for _ in range(args.repeats):
        for row in rows:
            row["seconds"] += seconds(lambda: train_step(row["module"], row["image"], row["sizes"]), 1)[-1:]
    print(f"scans {sizes[0]} to {sizes[-1]}, batch {args.batch}, {torch.get_num_threads()} threads, on {DEVICE}")
    header = f"{'model':36}{'norm':>8}{'params M':>10}{'divisor':>9}{'batch shape':>20}{'step s min/med':>16}"
    print(header + f"{'KB/padded px':>14}{'max |dlogit|':>14}")
    for row in rows:
        model, image = row.pop("module"), row.pop("image")
        row.update(
            parameters=sum(p.numel() for p in model.parameters()),
            size_divisor=model.size_divisor,
            batch_shape=list(image.shape),
            step_seconds=statistics.median(row["seconds"]),
            step_seconds_min=min(row["seconds"]),
            saved_bytes_per_pixel=saved_bytes_per_pixel(model, image, row.pop("sizes")),
        )
        print(
            f"{row['model']:36}{row['norm']:>8}{row['parameters'] / 1e6:10.2f}{row['size_divisor']:9d}"
            f"{str(row['batch_shape']):>20}{row['step_seconds_min']:9.2f}/{row['step_seconds']:<6.2f}"
            f"{row['saved_bytes_per_pixel'] / 1e3:14.2f}"
            f"{row['batch_invariance']:14.2e}"
        )
    out = args.out or Path("benchmarks/results/bench_model_compare.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"device": str(DEVICE), "torch": torch.__version__, "rows": rows}, indent=2) + "\n")
    print(f"wrote {out}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", type=int, default=4, help="scans per batch")
    parser.add_argument("--heights", type=int, nargs=2, default=(60, 80), help="scan heights, low high")
    parser.add_argument("--widths", type=int, nargs=2, default=(400, 1600), help="scan widths, low high")
    parser.add_argument("--base-channels", type=int, default=16)
    parser.add_argument("--depth", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=3, help="timed steps per mode (after one warm-up)")
    parser.add_argument("--norm-repeats", type=int, default=15, help="timed pairs for the norm layer alone")
    parser.add_argument("--matmul-size", type=int, default=1024)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", default="cpu", help="cpu or cuda (cuda:N): the model and every tensor there")
    parser.add_argument(
        "--model",
        action="append",
        help="compare models side by side instead: unet or smp_<arch>_<encoder> (smp_unet_resnet18, "
        "smp_unet_tu-mobilenetv3_small_100); repeat it for more",
    )
    parser.add_argument(
        "--norm", nargs="+", choices=NORM_OPTIONS, default=["masked"], help="apply_norm options for smp models"
    )
    parser.add_argument(
        "--out",
        type=Path,
        help="JSON results (default benchmarks/results/bench_model.json, or bench_model_compare.json)",
    )
    args = parser.parse_args()
    global DEVICE
    try:
        DEVICE = resolve_device(args.device)  # a CUDA device with its index, or a ValueError naming those there are
    except ValueError as exc:
        sys.exit(f"bench_model: --device: {exc}")

    if args.model:
        compare(args)
        return
    args.out = args.out or Path("benchmarks/results/bench_model.json")
    torch.manual_seed(args.seed)
    model = UNet(base_channels=args.base_channels, depth=args.depth).to(DEVICE)
    sizes = list(zip(spread(*args.heights, args.batch), spread(*args.widths, args.batch)))
    image, true_sizes = padded_batch(sizes, model.in_channels, model.size_divisor)
    image, true_sizes = image.to(DEVICE), true_sizes.to(DEVICE)
    pixels = image.shape[0] * image.shape[2] * image.shape[3]

    peak = matmul_peak(args.matmul_size, 5)
    forward_flops, step_flops = model_flops(model, image)
    train_step(model, image, None)  # warm-up both modes before the interleaved timing
    train_step(model, image, true_sizes)
    plain, aware = [], []
    for _ in range(args.repeats):
        plain += seconds(lambda: train_step(model, image, None), 1)[-1:]
        aware += seconds(lambda: train_step(model, image, true_sizes), 1)[-1:]
    ratio = statistics.median(a / p for a, p in zip(aware, plain))
    t_plain, t_aware = statistics.median(plain), statistics.median(aware)
    norm_only = norm_ratio(args.base_channels, image, true_sizes, args.norm_repeats)

    results = {
        "batch_shape": list(image.shape),
        "scan_sizes": sizes,
        "base_channels": args.base_channels,
        "depth": args.depth,
        "parameters": sum(p.numel() for p in model.parameters()),
        "threads": torch.get_num_threads(),
        "device": torch.cuda.get_device_name(DEVICE) if DEVICE.type == "cuda" else "cpu",
        "torch": torch.__version__,
        "machine": platform.processor(),
        "step_seconds": {"plain": t_plain, "padding_aware": t_aware},
        "step_seconds_all": {"plain": plain, "padding_aware": aware},
        "aware_over_plain": ratio,
        "norm_layer_aware_over_plain": norm_only,
        "flops_per_pixel_forward": forward_flops / pixels,
        "flops_per_pixel_step": step_flops / pixels,
        "matmul_peak_flops": peak,
        "achieved_flops": {"plain": step_flops / t_plain, "padding_aware": step_flops / t_aware},
        "fraction_of_peak": {"plain": step_flops / t_plain / peak, "padding_aware": step_flops / t_aware / peak},
    }
    print(
        f"batch {list(image.shape)} from scans {sizes}; UNet base {args.base_channels} depth {args.depth}, "
        f"{results['parameters'] / 1e6:.2f} M parameters, {results['threads']} threads, on {results['device']}"
    )
    print(
        f"FLOPs per padded pixel: forward {forward_flops / pixels / 1e3:.1f} k, forward+backward "
        f"{step_flops / pixels / 1e3:.1f} k; fp32 matmul peak {peak / 1e9:.1f} GFLOP/s (n={args.matmul_size})"
    )
    print(f"{'':28}{'plain GroupNorm':>17}{'padding-aware':>15}{'aware/plain':>13}")
    print(f"{'fwd+bwd seconds (median)':28}{t_plain:17.3f}{t_aware:15.3f}{ratio:12.2f}x   (goal <= 1.3x)")
    print(f"{'achieved GFLOP/s':28}{step_flops / t_plain / 1e9:17.1f}{step_flops / t_aware / 1e9:15.1f}")
    print(
        f"{'fraction of matmul peak':28}{results['fraction_of_peak']['plain']:17.3f}"
        f"{results['fraction_of_peak']['padding_aware']:15.3f}"
    )
    print(f"{'norm layer alone':28}{'':32}{norm_only:12.2f}x   ([B, {args.base_channels}, Hp, Wp], fwd+bwd)")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
