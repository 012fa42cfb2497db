"""srforge-export: a checkpoint to ONNX, checked in onnxruntime.

The model is rebuilt from the checkpoint alone. Its class is imported only when it may be
(srforge.config.trust.check_checkpoint_model): srforge's own, or named with ``--allow-model module:Class``
(a config.yaml beside the checkpoint does not count); anything else exits 2 saying how to allow it.
"""

from __future__ import annotations

import argparse
import functools
import tempfile
import time
from pathlib import Path

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


def _parser() -> argparse.ArgumentParser:
    from srforge.export.quantize import CALIBRATION_COUNT

    parser = argparse.ArgumentParser(prog=PROG, description=main_export.__doc__)
    parser.add_argument("--checkpoint", required=True, help="checkpoint written by srforge-train (last.pt, best.pt)")
    parser.add_argument("--output", required=True, help="the .onnx file to write")
    parser.add_argument("--opset", type=int, default=None, help="ONNX opset (default: torch's choice)")
    parser.add_argument("--no-check", action="store_true", help="skip the onnxruntime comparison")
    parser.add_argument(
        "--quantize",
        choices=["int8"],
        help="write a static int8 model (convolutions in int8, calibrated on --calibrate's scans) instead of the "
        "float32 one: faster on CPUs with int8 instructions, its masks not identical to the checkpoint's",
    )
    parser.add_argument(
        "--calibrate",
        metavar="SCANS",
        help="a folder, .zip or .tar of scans like those the model will predict, for --quantize int8's ranges",
    )
    parser.add_argument(
        "--calibrate-count",
        type=int,
        default=CALIBRATION_COUNT,
        metavar="N",
        help=f"calibrate on N scans spread over --calibrate's (default {CALIBRATION_COUNT})",
    )
    add_allow_model(parser)
    return parser


def _load(args):
    """(checkpoint, model) for ``args``, the model class imported only when trusted."""
    from srforge.config import import_object
    from srforge.config.trust import check_checkpoint_model
    from srforge.models.create import import_class
    from srforge.runtime.checkpoint import load_checkpoint, model_from_checkpoint

    ckpt = load_checkpoint(args.checkpoint)
    path = check_checkpoint_model(ckpt, args.checkpoint, args.allow_model)
    named = path in args.allow_model  # only a class the user named is looked for in the working directory
    resolve = functools.partial(import_object, key=f"{args.checkpoint}: model_class") if named else import_class
    return ckpt, model_from_checkpoint(ckpt, args.checkpoint, allowed=[path], resolve=resolve)


def _check(model, path) -> int | None:
    """Compare the float export at ``path`` with ``model`` and print the figure; an exit status on failure."""
    from srforge.export.onnx import EXTRA, TOLERANCE, OnnxCheckError, check_onnx
    from srforge.extras import MissingExtraError

    try:
        diff = check_onnx(model, path)
    except MissingExtraError:
        print(f"srforge-export: onnxruntime is not installed, so the export was not checked ({EXTRA})")
        return None
    except OnnxCheckError as exc:
        return fail(PROG, exc)
    print(
        f"srforge-export: onnxruntime vs PyTorch: max |logits difference| {diff:.2e} (tolerance {TOLERANCE:g}) "
        "on 3 scans of different sizes, batched and alone"
    )
    return None


def _quantize(args, ckpt, model, float_path) -> int:
    """--quantize int8: the int8 model of the float export at ``float_path`` written to --output."""
    from srforge.export.quantize import int8_agreement, quantize_int8
    from srforge.predict import Predictor

    mode = Predictor(model, class_names=ckpt["class_names"], device="cpu", image_mode=ckpt.get("image_mode")).image_mode
    start = time.perf_counter()
    try:
        path, used = quantize_int8(float_path, args.output, args.calibrate, mode, args.calibrate_count)
    except ValueError as exc:  # a calibration scan that does not decode (DataError)
        return fail(PROG, exc)
    except OSError as exc:
        return fail(PROG, OSError(f"cannot write {args.output}: {exc}"))
    print(
        f"srforge-export: wrote {path} ({path.stat().st_size / 1e6:.2f} MB): int8, calibrated on {used} scans of "
        f"{args.calibrate} in {time.perf_counter() - start:.1f} s"
    )
    same, pixels = int8_agreement(float_path, path, args.calibrate, mode)
    print(
        f"srforge-export: int8 vs float32 masks: {100 * same:.3f}% of {pixels:,} pixels agree on the first "
        "calibration scan (its calibration window)"
    )
    return 0


def main_export(argv=None) -> int:
    """Export a trained srforge checkpoint to ONNX (dynamic batch, H, W) and check it against PyTorch; with
    --quantize int8, a static int8 model calibrated on the user's scans."""
    from srforge.export.onnx import export_onnx, require, takes_sizes
    from srforge.export.quantize import calibration_archive
    from srforge.extras import MissingExtraError

    parser = _parser()
    args = parser.parse_args(argv)
    if (args.quantize is None) != (args.calibrate is None):
        parser.error("--quantize int8 and --calibrate SCANS go together (int8 ranges are measured on your scans)")
    if args.calibrate_count < 1:
        parser.error(f"--calibrate-count must be at least 1, got {args.calibrate_count}")
    try:
        ckpt, model = _load(args)
        require("onnx", "onnxscript", *(["onnxruntime"] if args.quantize else []))
        if args.quantize:
            calibration_archive(args.calibrate).close()  # before the export: a bad folder costs no minute
    except (MissingExtraError, FileNotFoundError, ValueError) as exc:  # CalibrationError is a ValueError
        return fail(PROG, exc)
    with tempfile.TemporaryDirectory(prefix="srforge-export-") as tmp:
        target = Path(tmp) / "float32.onnx" if args.quantize else args.output
        start = time.perf_counter()
        try:
            path = export_onnx(model, target, class_names=ckpt["class_names"], opset=args.opset)
        except OSError as exc:  # an output path that cannot be written
            return fail(PROG, OSError(f"cannot write {args.output}: {exc}"))
        inputs = "image uint8 [B, C, H, W]" + (", sizes int64 [B, 2]" if takes_sizes(model) else "")
        print(
            f"srforge-export: {'exported' if args.quantize else 'wrote'} {path if not args.quantize else 'float32'} "
            f"({path.stat().st_size / 1e6:.2f} MB) in {time.perf_counter() - start:.1f} s: {inputs} -> logits "
            f"[B, K, H, W], H and W multiples of {model.size_divisor}"
        )
        status = None if args.no_check else _check(model, path)
        if status is not None or not args.quantize:
            return status or 0
        return _quantize(args, ckpt, model, path)
