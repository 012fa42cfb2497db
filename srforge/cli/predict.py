"""srforge-predict: masks for every scan of a folder or archive, at each scan's own size."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from srforge.cli.errors import INTERRUPTED, RUN_FAILED, fail
from srforge.constants import PRECISIONS, TTA_MODES

PROG = "srforge-predict"

_PREDICT_EPILOG = """\
outputs under --output DIR (<rel> = the scan's relative path without its suffix):
  masks/<rel>.png           class ids, uint8 grayscale PNG, exactly the scan's size
  overlays/<rel>.png        with --overlay: the scan with its classes drawn over it
  probabilities/<rel>.npy   with --probabilities: float16 [K, H, W] softmax probabilities (numpy.load)
  report.json, report.csv   per scan: name, size, status (ok / skipped / failed / rejected / stopped), error,
                            class pixel fractions, milliseconds; report.json also holds the summary and how
                            many tiles each scan was cut into (1: predicted whole)
Every mask, overlay and probabilities file carries srforge's mark, naming the model that wrote it. A rerun
skips scans whose outputs are complete (decode, right size) and marked by the same model, unless
--overwrite; outputs of another model are predicted again. A file at an output path that srforge did not
write (no mark, e.g. ground-truth masks) is never overwritten, not even with --overwrite: that scan fails.
DIR and the input never overlap. One run at a time writes into DIR (a second one exits 2, naming the first).
Members with absolute paths, '..', links or devices are rejected, never read; nothing is written outside DIR.
Several processes share one archive under torchrun (torchrun --nproc_per_node=N scripts/predict.py ...).

exit status: 0 every scan ok or skipped; 1 some scan failed or was rejected, --strict stopped, no scans
             found, or the disk filled; 2 bad arguments, a missing or unusable input or output, an output
             folder in use by another run, a file that is not a usable srforge checkpoint, or one whose model
             class is not allowed (srforge's own, or --allow-model MODULE:CLASS; a config.yaml beside the
             checkpoint does not count); 130 Ctrl-C and 143 SIGTERM, after writing the report with the scans
             not reached marked stopped."""


def int_at_least(minimum: int, also: tuple[str, ...] = ()):
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


def add_tta(parser: argparse.ArgumentParser) -> None:
    """--tta none|flip, as srforge-predict and srforge-evaluate take it."""
    parser.add_argument(
        "--tta",
        choices=TTA_MODES,
        default="none",
        help="test-time augmentation: flip averages the probabilities of the scan and its left-right, upside-down "
        "and doubly mirrored images (4 forward passes; default none)",
    )


def add_model_options(parser: argparse.ArgumentParser) -> None:
    """How a checkpoint predicts, as srforge-predict and srforge-evaluate take it: --device, --precision,
    --max-pixels, --max-batch, --tile-overlap, --workers, --tta, --allow-model (read by :func:`open_predictor`)."""
    from srforge.cli.export import add_allow_model
    from srforge.constants import CPU_PIXELS
    from srforge.predict.background import default_workers

    parser.add_argument(
        "--device", default="auto", help="auto (cuda when available), cpu, cuda, cuda:1 ... (default auto)"
    )
    parser.add_argument("--precision", choices=PRECISIONS, default="fp32", help="autocast dtype (default fp32)")
    parser.add_argument(
        "--max-pixels",
        type=int_at_least(1),
        default=None,
        help=f"padded pixels per batch; larger scans are tiled (default {CPU_PIXELS:,} on CPU; on CUDA "
        "half the free memory, shared by the processes on the GPU, over the model's bytes per pixel, measured at "
        "start, at most 2**27)",
    )
    parser.add_argument(
        "--max-batch",
        type=int_at_least(0, ("auto",)),
        default="auto",
        help="scans per batch at most, 0 for no cap (default auto: 1 on CPU, where batching is slower; none on CUDA)",
    )
    parser.add_argument(
        "--tile-overlap", type=int_at_least(0), default=None, help="overlap of tiles in px (default 4 x size divisor)"
    )
    parser.add_argument(
        "--workers",
        type=int_at_least(0),
        default=None,
        help=f"background processes decoding scans; 0 decodes in this process (default {default_workers()}: "
        "this process's share of the CPUs less one, at most 8)",
    )
    add_tta(parser)
    add_allow_model(parser)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG,
        description=main_predict.__doc__,
        epilog=_PREDICT_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--checkpoint", required=True, help="checkpoint written by srforge-train (last.pt, best.pt)")
    parser.add_argument("--input", required=True, help="folder (searched recursively), .zip, .tar or .tar.gz of scans")
    parser.add_argument("--output", required=True, help="folder for masks/, overlays/, probabilities/, report.*")
    add_model_options(parser)
    parser.add_argument("--overlay", action="store_true", help="also write overlays/")
    parser.add_argument("--probabilities", action="store_true", help="also write probabilities/ (float16 .npy)")
    parser.add_argument("--overwrite", action="store_true", help="predict again scans whose outputs exist")
    parser.add_argument("--strict", action="store_true", help="stop at the first failed or rejected scan")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    return parser


def open_predictor(args, checkpoint):
    """The Predictor of ``checkpoint`` with the options :func:`add_model_options` added to ``args``."""
    from srforge.predict import Predictor
    from srforge.predict.onnx_model import is_onnx_path
    from srforge.runtime.distributed import rank_device

    options = dict(max_pixels=args.max_pixels, overlap=args.tile_overlap, max_batch=args.max_batch, tta=args.tta)
    if is_onnx_path(checkpoint):  # an exported model: ONNX Runtime on this process's share of the CPUs
        return Predictor.from_onnx(checkpoint, **options)
    return Predictor.from_checkpoint(
        checkpoint, allow_model=args.allow_model, device=rank_device(args.device), precision=args.precision, **options
    )


def _open(args):
    """(Predictor, ScanArchive) for the parsed arguments, after checking the input and output folders."""
    from srforge.data.archive import ScanArchive
    from srforge.predict.folders import check_input, check_output

    source, output = Path(args.input), Path(args.output)
    check_input(source)
    check_output(output, source)
    return open_predictor(args, args.checkpoint), ScanArchive(source)


def _print_summary(summary: dict, output: Path) -> None:
    stopped = f", {summary['stopped']} stopped" if summary["stopped"] else ""
    print(
        f"{PROG}: {summary['scans']} scans: {summary['ok']} ok, {summary['skipped']} skipped, "
        f"{summary['failed']} failed, {summary['rejected']} rejected{stopped}"
        f"{' (stopped at the first failure: --strict)' if summary['stopped_early'] else ''}; "
        f"{summary['scans_per_second'] or 0:.2f} scans/s; report: {(output / 'report.json').absolute()}"
    )


def _report_stamp(output: Path) -> tuple[int, int, int] | None:
    """Which report.json lies in ``output`` now: a report is written to a new file renamed over the old one, so
    the stamp changes exactly when a run writes its report."""
    try:
        info = (output / "report.json").stat()
    except OSError:
        return None
    return info.st_dev, info.st_ino, info.st_mtime_ns


def _stopped(exc: KeyboardInterrupt, report: Path, written: bool) -> int:
    """Say that Ctrl-C or SIGTERM stopped the run, and whether the report was written; the exit status."""
    from srforge.runtime.signals import TERMINATED_STATUS, Terminated

    where = f"the report marks the scans not reached as stopped: {report}" if written else "no report was written"
    print(f"{PROG}: stopped by {'SIGTERM' if isinstance(exc, Terminated) else 'Ctrl-C'}; {where}", file=sys.stderr)
    return TERMINATED_STATUS if isinstance(exc, Terminated) else INTERRUPTED


def main_predict(argv=None) -> int:
    """Predict class masks for every scan of a folder, .zip or .tar(.gz) with a trained srforge checkpoint."""
    from srforge.atomic import DiskFullError
    from srforge.runtime.distributed import stop
    from srforge.runtime.signals import terminate_as_interrupt

    try:
        args = _parser().parse_args(argv)
    except SystemExit as exc:  # argparse has printed the message naming the option
        return int(exc.code or 0)
    output = Path(args.output)
    before = _report_stamp(output)
    with terminate_as_interrupt():  # SIGTERM (a preemption) ends the run as Ctrl-C does: report, then exit
        try:
            return _predict(args)
        except KeyboardInterrupt as exc:
            return _stopped(exc, (output / "report.json").absolute(), _report_stamp(output) != before)
        except DiskFullError as exc:
            if _report_stamp(output) != before:
                return fail(PROG, exc, "the report holds what was done")
            where = output / "report.json"
            note = f"the report could not be written either, so {where} does not hold this run; free space and rerun"
            return fail(PROG, exc, f"{note} (finished scans are skipped)")
        finally:
            stop()  # the group prediction joined, ended before the interpreter: gloo's threads abort an exit with it


def looks_like_masks(folder: Path) -> str | None:
    """What is wrong with an input folder that holds ground-truth masks rather than scans: a ``masks`` folder with an
    ``images`` folder beside it, or a labelled dataset's root (``images/`` and ``masks/`` inside, both of which
    would be predicted). None for anything else (a file, an archive, a folder of scans)."""
    if not folder.is_dir():
        return None
    if folder.name == "masks" and (folder.parent / "images").is_dir():
        return f"{folder.resolve()} looks like a folder of masks (an images/ folder is beside it): give the scans"
    if (folder / "images").is_dir() and (folder / "masks").is_dir():
        return (
            f"{folder.resolve()} looks like a labelled dataset's root: its masks/ would be predicted as scans too; "
            f"give {folder / 'images'}, or score the model with scripts/evaluate.py"
        )
    return None


def _predict(args) -> int:
    from srforge.extras import MissingExtraError
    from srforge.locks import FolderLockedError
    from srforge.predict import OutputError, predict_archive
    from srforge.predict.background import default_workers
    from srforge.runtime.distributed import environment

    try:
        predictor, archive = _open(args)
    except (FileNotFoundError, ValueError, RuntimeError, OutputError, MissingExtraError) as exc:
        # DataError is a ValueError; MissingExtraError: the checkpoint's model needs an optional package (named)
        return fail(PROG, exc)
    if len(archive) == 0 and not archive.rejected:
        archive.close()
        print(f"{PROG}: error: no scans found in {args.input}", file=sys.stderr)
        return RUN_FAILED
    looks = looks_like_masks(Path(args.input))
    if looks and environment().main:
        print(f"srforge: warning: {looks}; predicting it all the same", file=sys.stderr)
    options = {k: getattr(args, k) for k in ("overlay", "probabilities", "overwrite", "strict")}
    workers = default_workers() if args.workers is None else args.workers
    try:
        with archive:
            summary = predict_archive(
                predictor, archive, Path(args.output), **options, progress=not args.no_progress, workers=workers
            )
    except (OutputError, FolderLockedError) as exc:
        return fail(PROG, exc)
    if environment().rank == 0:
        _print_summary(summary, Path(args.output))
    return 0 if summary["failed"] + summary["rejected"] + summary["stopped"] == 0 else RUN_FAILED
