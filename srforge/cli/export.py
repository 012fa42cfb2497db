"""srforge-export: a checkpoint to ONNX, checked in onnxruntime."""

from __future__ import annotations

import argparse

from srforge.cli.errors import fail

PROG = "srforge-export"


def main_export(argv=None) -> int:
    """Export a trained srforge checkpoint to ONNX (dynamic batch, H, W) and check it against PyTorch."""
    from srforge.export.onnx import EXTRA, TOLERANCE, OnnxCheckError, check_onnx, export_onnx, require
    from srforge.runtime.checkpoint import load_checkpoint, model_from_checkpoint

    parser = argparse.ArgumentParser(prog=PROG, description=main_export.__doc__)
    parser.add_argument("--checkpoint", required=True, help="checkpoint written by srforge-train (last.pt, best.pt)")
    parser.add_argument("--output", required=True, help="the .onnx file to write")
    parser.add_argument("--opset", type=int, default=None, help="ONNX opset (default: torch's choice)")
    parser.add_argument("--no-check", action="store_true", help="skip the onnxruntime comparison")
    args = parser.parse_args(argv)
    try:
        ckpt = load_checkpoint(args.checkpoint)
        model = model_from_checkpoint(ckpt, args.checkpoint)
        require("onnx", "onnxscript")
    except (ImportError, FileNotFoundError, ValueError) as exc:
        return fail(PROG, exc)
    try:
        path = export_onnx(model, args.output, class_names=ckpt["class_names"], opset=args.opset)
    except OSError as exc:  # an output path that cannot be written
        return fail(PROG, OSError(f"cannot write {args.output}: {exc}"))
    d = model.size_divisor
    inputs = "image uint8 [B, C, H, W]" + (", sizes int64 [B, 2]" if model.padding_aware else "")
    print(
        f"srforge-export: wrote {path} ({path.stat().st_size / 1e6:.2f} MB): {inputs} -> logits [B, K, H, W], "
        f"H and W multiples of {d}"
    )
    if args.no_check:
        return 0
    try:
        diff = check_onnx(model, path)
    except ImportError:
        print(f"srforge-export: onnxruntime is not installed, so the export was not checked ({EXTRA})")
        return 0
    except OnnxCheckError as exc:
        return fail(PROG, exc)
    print(
        f"srforge-export: onnxruntime vs PyTorch: max |logits difference| {diff:.2e} (tolerance {TOLERANCE:g}) "
        "on 3 scans of different sizes, batched and alone"
    )
    return 0
