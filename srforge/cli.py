"""Command-line entry points; scripts/*.py and the console scripts are thin wrappers over these."""

from __future__ import annotations

import argparse
import re
import sys
import time
from pathlib import Path

from srforge.defaults import IGNORE_INDEX, PRECISIONS


def main_make_synthetic(argv=None) -> int:
    """Write synthetic well-log scans: OUT/images/*.png and OUT/masks/*.png."""
    from srforge.data.synthetic import CLASSES, make_welllog_scans

    parser = argparse.ArgumentParser(prog="make_synthetic", description=main_make_synthetic.__doc__)
    parser.add_argument("out_dir", help="folder to write images/ and masks/ into")
    parser.add_argument("-n", "--num", type=int, default=40, help="number of scans (default 40)")
    parser.add_argument(
        "--scale",
        type=float,
        default=1.0,
        help="size factor: 1 gives 3,200-12,800 x 480-640 px scans, 0.125 an eighth (default 1)",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--classes",
        choices=sorted(CLASSES),
        default="binary",
        help="binary: curve=1; multiclass: solid=1, dashed=2, dotted=3 (default binary)",
    )
    parser.add_argument("--workers", type=int, default=1, help="parallel processes (default 1)")
    args = parser.parse_args(argv)
    if args.num < 1 or args.scale <= 0:
        parser.error("--num must be >= 1 and --scale > 0")
    start = time.perf_counter()
    paths = make_welllog_scans(
        args.out_dir, args.num, scale=args.scale, seed=args.seed, classes=args.classes, workers=args.workers
    )
    seconds = time.perf_counter() - start
    print(
        f"wrote {len(paths)} scans to {args.out_dir} in {seconds:.1f} s ({len(paths) / seconds:.1f} scans/s); "
        f"classes: {', '.join(CLASSES[args.classes])}"
    )
    return 0


def main_check_data(argv=None) -> int:
    """Decode every image and mask under ROOT and report every problem; exit status 1 if any."""
    from srforge.data.datasets import check_folder

    parser = argparse.ArgumentParser(prog="check_data", description=main_check_data.__doc__)
    parser.add_argument("root", help="dataset folder holding images/ and masks/")
    parser.add_argument("--images", default="images", help="image subfolder (default images)")
    parser.add_argument("--masks", default="masks", help="mask subfolder (default masks)")
    parser.add_argument("--num-classes", type=int, default=None, help="mask values must be below this")
    parser.add_argument("--ignore-index", type=int, default=IGNORE_INDEX, help="mask value exempt from --num-classes")
    parser.add_argument("--image-mode", default="RGB", help="PIL mode images are converted to (default RGB)")
    _add_plot_arguments(parser)
    args = parser.parse_args(argv)
    if args.num_classes is not None and args.num_classes < 1:
        parser.error(f"--num-classes must be >= 1, found {args.num_classes}")
    count, problems = check_folder(
        args.root,
        args.images,
        args.masks,
        num_classes=args.num_classes,
        ignore_index=args.ignore_index,
        image_mode=args.image_mode,
    )
    for problem in problems:
        print(problem, file=sys.stderr)
    print(f"{args.root}: {count} pairs checked, {len(problems)} problem(s)")
    if args.plot and not _plot_layout(args):
        return 1
    return 1 if problems else 0


def _add_plot_arguments(parser: argparse.ArgumentParser) -> None:
    """check_data's --plot and the batching it draws; the defaults are the trainer's (configs/quickstart.yaml)."""
    from srforge.config import SCHEMA

    def default(section: str, key: str):
        return SCHEMA[section][key][1]

    group = parser.add_argument_group("batch-layout picture (--plot); defaults are the trainer's")
    group.add_argument("--plot", metavar="OUT.png", help="draw the first training batches and the size histogram")
    group.add_argument(
        "--batch-size", type=int, default=default("data", "batch_size"), help="data.batch_size (default %(default)s)"
    )
    group.add_argument(
        "--max-pixels",
        type=int,
        default=None,
        help="data.max_pixels: a pixel budget per batch, instead of --batch-size",
    )
    group.add_argument(
        "--depth",
        type=int,
        default=default("model", "depth"),
        help="model.depth: divisor 2**depth (default %(default)s)",
    )
    group.add_argument("--divisor", type=int, default=None, help="the size divisor itself, instead of --depth")
    group.add_argument(
        "--val-fraction",
        type=float,
        default=default("data", "val_fraction"),
        help="data.val_fraction, 0 for no split (default %(default)s)",
    )
    group.add_argument("--seed", type=int, default=default("run", "seed"), help="run.seed (default %(default)s)")
    group.add_argument("--plot-batches", type=int, default=4, help="batches to draw (default 4)")


def _plot_layout(args) -> bool:
    """Write the --plot picture; False (with the reason on stderr) when the folder cannot be batched."""
    from srforge.data import SegmentationFolder
    from srforge.data.layout_plot import plot_batch_layout, totals

    try:
        sizes = SegmentationFolder(args.root, args.images, args.masks).sizes()
        layout = plot_batch_layout(
            sizes,
            args.plot,
            num_batches=args.plot_batches,
            batch_size=None if args.max_pixels else args.batch_size,
            max_pixels=args.max_pixels,
            divisor=args.divisor or 2**args.depth,
            val_fraction=args.val_fraction,
            seed=args.seed,
        )
    except ValueError as exc:  # DataError (unpaired files), an empty folder, bad settings
        print(f"check_data: cannot draw {args.plot}: {exc}", file=sys.stderr)
        return False
    print(f"wrote {args.plot}: " + "; ".join(totals(layout, args.plot_batches)))
    return True


def _worker_free(exc: BaseException) -> str:
    """An exception's own message: one re-raised from a DataLoader worker carries the worker's whole traceback
    in its text ("Caught ValueError in DataLoader worker process 0. Original Traceback ..."); keep its last line."""
    text = str(exc)
    if "Original Traceback" not in text:
        return text
    ends = [m.end() for m in re.finditer(rf"\n(?:[\w.]+\.)?{re.escape(type(exc).__name__)}: ", text)]
    return text[ends[-1] :].strip() if ends else text


def _names_run_dir(overrides: list[str]) -> bool:
    """Whether the command line sets run.dir (``run.dir=X`` or ``run={dir: X}``)."""
    from srforge.config import parse_override

    for text in overrides:
        path, value = parse_override(text)
        if path == "run.dir" or (path == "run" and isinstance(value, dict) and "dir" in value):
            return True
    return False


def _train_config(config: str | None, resume: str | None, overrides: list[str]) -> dict:
    """The resolved config for srforge-train: --config FILE, or with --resume alone the checkpoint's own config,
    whose import paths must be named by the user too (srforge.trust). A resume writes into the folder it was
    given (for a checkpoint file, the folder it sits in) unless run.dir is set on the command line."""
    from srforge.config import ConfigError, load_config, parse_override, read_yaml_file, resolve
    from srforge.engine.checkpoint import load_checkpoint
    from srforge.trust import check_checkpoint_imports

    if resume is None:
        return load_config(config or "configs/quickstart.yaml", overrides)
    resume_path = Path(resume)
    folder = resume_path if resume_path.is_dir() else resume_path.parent
    checkpoint = resume_path / "last.pt" if resume_path.is_dir() else resume_path
    ckpt = load_checkpoint(checkpoint)  # refuses what is not a well-formed srforge checkpoint, before any write
    if config is not None:
        cfg = load_config(config, overrides)
    else:
        if not isinstance(ckpt.get("config"), dict):
            raise ConfigError(f"{checkpoint} holds no training config; pass the run's config with --config FILE.")
        cfg = resolve(ckpt["config"], overrides)
        trusted = []
        if (folder / "config.yaml").is_file():
            trusted.append((str(folder / "config.yaml"), read_yaml_file(folder / "config.yaml") or {}))
        trusted.append(("the command line", dict(parse_override(text) for text in overrides)))
        check_checkpoint_imports(cfg, str(checkpoint), trusted)
    if not _names_run_dir(overrides):
        cfg["run"]["dir"] = str(folder)
    return cfg


def main_train(argv=None) -> int:
    """Train a padding-aware U-Net from a YAML config: srforge-train --config configs/X.yaml [key.path=value ...]."""
    from srforge.config import ConfigError
    from srforge.engine.trainer import DiskFullError, NonFiniteLossError, train
    from srforge.preflight import check_before_training

    parser = argparse.ArgumentParser(prog="srforge-train", description=main_train.__doc__)
    parser.add_argument(
        "--config", help="YAML config (default: configs/quickstart.yaml, or the run's own config with --resume)"
    )
    parser.add_argument(
        "--resume",
        metavar="RUN_DIR|CKPT",
        help="continue a run from RUN_DIR/last.pt or a checkpoint file, writing into RUN_DIR (or the checkpoint's "
        "folder) unless run.dir is given",
    )
    parser.add_argument("overrides", nargs="*", metavar="key.path=value", help="config overrides, values read as YAML")
    args = parser.parse_args(argv)
    try:
        cfg = _train_config(args.config, args.resume, args.overrides)
        check_before_training(cfg)
    except (ConfigError, FileNotFoundError, ValueError) as exc:
        print(f"srforge-train: error: {exc}", file=sys.stderr)
        return 2
    try:
        summary = train(cfg, resume=args.resume)
    except NonFiniteLossError as exc:
        print(f"srforge-train: error: {exc}", file=sys.stderr)
        return 1
    except DiskFullError as exc:  # "no space left on <path>"
        print(f"srforge-train: error: {exc.strerror}", file=sys.stderr)
        return 1
    except ValueError as exc:  # ConfigError, DataError, a mask value beyond model.num_classes: bad data, not a bug
        print(f"srforge-train: error: {_worker_free(exc)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    if summary.get("val_iou") is not None:
        per_class = ", ".join(f"{n} {v:.4f}" for n, v in zip(summary["class_names"], summary["val_iou"]))
        print(
            f"srforge: done. validation IoU {per_class} (mean {summary['val_mean_iou']:.4f}); "
            f"best validation mean IoU {summary['best_mean_iou']:.4f}; run directory {summary['run_dir']}"
        )
    return 0


_PREDICT_EPILOG = """\
outputs under --output DIR (<rel> = the scan's relative path without its suffix):
  masks/<rel>.png           class ids, uint8 grayscale PNG, exactly the scan's size
  overlays/<rel>.png        with --overlay: the scan with its classes drawn over it
  probabilities/<rel>.npy   with --probabilities: float16 [K, H, W] softmax probabilities (numpy.load)
  report.json, report.csv   per scan: name, size, status (ok / skipped / failed / rejected / stopped), error,
                            class pixel fractions, milliseconds; report.json also holds the summary
A rerun skips scans whose outputs are complete (decode, right size) unless --overwrite. Members with
absolute paths, '..', links or devices are rejected, never read; nothing is written outside DIR.
Several processes share one archive under torchrun (torchrun --nproc_per_node=N scripts/predict.py ...).

exit status: 0 every scan ok or skipped; 1 some scan failed or was rejected, --strict stopped, no scans
             found, or the disk filled; 2 bad arguments, a missing or unusable input or output, or a file
             that is not a usable srforge checkpoint."""


def _int_at_least(minimum: int, also: tuple[str, ...] = ()):
    """An argparse type: an int >= minimum (or one of ``also``), else an error that names the option."""

    def parse(text: str):
        if text in also:
            return text
        try:
            value = int(text)
        except ValueError:
            value = None
        if value is None or value < minimum:
            choices = " or ".join([f"an integer >= {minimum}", *map(repr, also)])
            raise argparse.ArgumentTypeError(f"expected {choices}, got {text!r}")
        return value

    return parse


def main_predict(argv=None) -> int:
    """Predict class masks for every scan of a folder, .zip or .tar(.gz) with a trained srforge checkpoint."""
    from srforge.data.archive import ScanArchive
    from srforge.engine.outputs import DiskFullError, OutputError, check_input, check_output
    from srforge.engine.pipeline import predict_archive
    from srforge.engine.predictor import DEFAULT_CPU_PIXELS, Predictor
    from srforge.engine.sharding import process_rank, rank_device
    from srforge.engine.workers import default_workers

    parser = argparse.ArgumentParser(
        prog="srforge-predict",
        description=main_predict.__doc__,
        epilog=_PREDICT_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--checkpoint", required=True, help="checkpoint written by srforge-train (last.pt, best.pt)")
    parser.add_argument("--input", required=True, help="folder (searched recursively), .zip, .tar or .tar.gz of scans")
    parser.add_argument("--output", required=True, help="folder for masks/, overlays/, probabilities/, report.*")
    parser.add_argument(
        "--device", default="auto", help="auto (cuda when available), cpu, cuda, cuda:1 ... (default auto)"
    )
    parser.add_argument("--precision", choices=PRECISIONS, default="fp32", help="autocast dtype (default fp32)")
    parser.add_argument(
        "--max-pixels",
        type=_int_at_least(1),
        default=None,
        help=f"padded pixels per batch; larger scans are tiled (default {DEFAULT_CPU_PIXELS:,} on CPU; on CUDA "
        "half the free memory, shared by the processes on the GPU, over the model's bytes per pixel, measured at "
        "start, at most 2**27)",
    )
    parser.add_argument(
        "--max-batch",
        type=_int_at_least(0, ("auto",)),
        default="auto",
        help="scans per batch at most, 0 for no cap (default auto: 1 on CPU, where batching is slower; none on CUDA)",
    )
    parser.add_argument(
        "--tile-overlap", type=_int_at_least(0), default=None, help="overlap of tiles in px (default 4 x size divisor)"
    )
    parser.add_argument(
        "--workers",
        type=_int_at_least(0),
        default=None,
        help=f"background processes decoding scans; 0 decodes in this process (default {default_workers()}: "
        "this process's share of the CPUs less one, at most 8)",
    )
    parser.add_argument("--overlay", action="store_true", help="also write overlays/")
    parser.add_argument("--probabilities", action="store_true", help="also write probabilities/ (float16 .npy)")
    parser.add_argument("--overwrite", action="store_true", help="predict again scans whose outputs exist")
    parser.add_argument("--strict", action="store_true", help="stop at the first failed or rejected scan")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # argparse has printed the message naming the option
        return int(exc.code or 0)
    source, output = Path(args.input), Path(args.output)
    try:
        check_input(source)
        check_output(output, source)
        predictor = Predictor.from_checkpoint(
            args.checkpoint,
            device=rank_device(args.device),
            precision=args.precision,
            max_pixels=args.max_pixels,
            overlap=args.tile_overlap,
            max_batch=args.max_batch,
        )
        archive = ScanArchive(source)
    except (FileNotFoundError, ValueError, RuntimeError, OutputError) as exc:  # DataError is a ValueError
        print(f"srforge-predict: error: {exc}", file=sys.stderr)
        return 2
    if len(archive) == 0 and not archive.rejected:
        archive.close()
        print(f"srforge-predict: error: no scans found in {source}", file=sys.stderr)
        return 1
    try:
        with archive:
            summary = predict_archive(
                predictor,
                archive,
                output,
                overlay=args.overlay,
                probabilities=args.probabilities,
                overwrite=args.overwrite,
                strict=args.strict,
                progress=not args.no_progress,
                workers=default_workers() if args.workers is None else args.workers,
            )
    except OutputError as exc:
        print(f"srforge-predict: error: {exc}", file=sys.stderr)
        return 2
    except DiskFullError as exc:
        print(f"srforge-predict: error: {exc}; the report holds what was done", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    if process_rank()[0] == 0:
        stopped = f", {summary['stopped']} stopped" if summary["stopped"] else ""
        print(
            f"srforge-predict: {summary['scans']} scans: {summary['ok']} ok, {summary['skipped']} skipped, "
            f"{summary['failed']} failed, {summary['rejected']} rejected{stopped}"
            f"{' (stopped at the first failure: --strict)' if summary['stopped_early'] else ''}; "
            f"{summary['scans_per_second'] or 0:.2f} scans/s; report: {output / 'report.json'}"
        )
    return 0 if summary["failed"] + summary["rejected"] + summary["stopped"] == 0 else 1


def main_export(argv=None) -> int:
    """Export a trained srforge checkpoint to ONNX (dynamic batch, H, W) and check it against PyTorch."""
    from srforge.engine.checkpoint import load_checkpoint, model_from_checkpoint
    from srforge.engine.export import EXTRA, TOLERANCE, OnnxCheckError, check_onnx, export_onnx, require

    parser = argparse.ArgumentParser(prog="srforge-export", description=main_export.__doc__)
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
        print(f"srforge-export: error: {exc}", file=sys.stderr)
        return 2
    try:
        path = export_onnx(model, args.output, class_names=ckpt["class_names"], opset=args.opset)
    except OSError as exc:  # an output path that cannot be written
        print(f"srforge-export: error: cannot write {args.output}: {exc}", file=sys.stderr)
        return 2
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
        print(f"srforge-export: error: {exc}", file=sys.stderr)
        return 1
    print(
        f"srforge-export: onnxruntime vs PyTorch: max |logits difference| {diff:.2e} (tolerance {TOLERANCE:g}) "
        "on 3 scans of different sizes, batched and alone"
    )
    return 0
