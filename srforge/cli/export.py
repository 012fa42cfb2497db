"""srforge-export: a checkpoint to ONNX, checked in onnxruntime.

The model is rebuilt from the checkpoint alone. Its class is imported only when it may be
(srforge.config.trust.check_checkpoint_model): srforge's own, or named with ``--allow-model module:Class``
(a config.yaml beside the checkpoint does not count); anything else exits 2 saying how to allow it.
"""

from __future__ import annotations

import argparse
import functools

from srforge.cli.errors import fail

PROG = "srforge-export"


def import_path(text: str) -> str:
    """An argparse type: "module.path:ClassName"."""
    module_name, _, name = text.partition(":")
    if not module_name or not name:
        raise argparse.ArgumentTypeError(f"expected 'module.path:ClassName', got {text!r}")
    return text


def add_allow_model(parser: argparse.ArgumentParser) -> None:
    """--allow-model, shared by srforge-export and srforge-predict."""
    parser.add_argument(
        "--allow-model",
        action="append",
        default=[],
        type=import_path,
        metavar="MODULE:CLASS",
        help="import this model class when the checkpoint names it, also from the working directory (repeatable); "
        "without it only srforge's own classes are imported (a config.yaml beside the checkpoint does not count)",
    )


def main_export(argv=None) -> int:
    """Export a trained srforge checkpoint to ONNX (dynamic batch, H, W) and check it against PyTorch."""
    from srforge.config import import_object
    from srforge.config.trust import check_checkpoint_model
    from srforge.export.onnx import EXTRA, TOLERANCE, OnnxCheckError, check_onnx, export_onnx, require, takes_sizes
    from srforge.extras import MissingExtraError
    from srforge.models.create import import_class
    from srforge.runtime.checkpoint import load_checkpoint, model_from_checkpoint

    parser = argparse.ArgumentParser(prog=PROG, description=main_export.__doc__)
    parser.add_argument("--checkpoint", required=True, help="checkpoint written by srforge-train (last.pt, best.pt)")
    parser.add_argument("--output", required=True, help="the .onnx file to write")
    parser.add_argument("--opset", type=int, default=None, help="ONNX opset (default: torch's choice)")
    parser.add_argument("--no-check", action="store_true", help="skip the onnxruntime comparison")
    add_allow_model(parser)
    args = parser.parse_args(argv)
    try:
        ckpt = load_checkpoint(args.checkpoint)
        path = check_checkpoint_model(ckpt, args.checkpoint, args.allow_model)
        named = path in args.allow_model  # only a class the user named is looked for in the working directory
        resolve = functools.partial(import_object, key=f"{args.checkpoint}: model_class") if named else import_class
        model = model_from_checkpoint(ckpt, args.checkpoint, allowed=[path], resolve=resolve)
        require("onnx", "onnxscript")
    except (MissingExtraError, FileNotFoundError, ValueError) as exc:
        return fail(PROG, exc)
    try:
        path = export_onnx(model, args.output, class_names=ckpt["class_names"], opset=args.opset)
    except OSError as exc:  # an output path that cannot be written
        return fail(PROG, OSError(f"cannot write {args.output}: {exc}"))
    d = model.size_divisor
    inputs = "image uint8 [B, C, H, W]" + (", sizes int64 [B, 2]" if takes_sizes(model) else "")
    print(
        f"srforge-export: wrote {path} ({path.stat().st_size / 1e6:.2f} MB): {inputs} -> logits [B, K, H, W], "
        f"H and W multiples of {d}"
    )
    if args.no_check:
        return 0
    try:
        diff = check_onnx(model, path)
    except MissingExtraError:
        print(f"srforge-export: onnxruntime is not installed, so the export was not checked ({EXTRA})")
        return 0
    except OnnxCheckError as exc:
        return fail(PROG, exc)
    print(
        f"srforge-export: onnxruntime vs PyTorch: max |logits difference| {diff:.2e} (tolerance {TOLERANCE:g}) "
        "on 3 scans of different sizes, batched and alone"
    )
    return 0
