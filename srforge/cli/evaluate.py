"""srforge-evaluate: how good a model is on labelled scans, per class, per scan, by width; report.html to look at."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from srforge.cli.errors import RUN_FAILED, fail
from srforge.cli.predict import add_model_options, int_at_least, open_predictor
from srforge.constants import IGNORE_INDEX
from srforge.limits import class_names_problem

PROG = "srforge-evaluate"

_EPILOG = """\
modes:
  --checkpoint CKPT --input DATA      predict DATA (a labelled folder ROOT/images + ROOT/masks, or a .zip / .tar
                                      of one) as srforge-predict does, then score; --compare CKPT_B a second model
  --labels PATH --format F            instead of --input or --masks: true masks drawn from an annotation export
                                      (F: labelme folder, coco JSON, cvat XML; classes in the model's order, or
                                      --classes; --image-root DIR: a COCO or CVAT export's images)
  --predictions DIR --masks DIR       score existing predicted masks (srforge-predict's output folder or any
                                      folder of masks, matched by relative path and stem); a second
                                      --predictions DIR is compared with the first

outputs under --output DIR (default: CKPT's folder/evaluate-<DATA name>, or <DIR>-evaluate):
  metrics.json   micro (pixels pooled) and macro (mean over scans) figures, by width third too; per class IoU,
                 Dice, precision, recall, tolerance F1; means with and without the background class (id 0);
                 the confusion matrix; each model's fingerprint, the data, the options
  scans.csv      one row a scan (failed rows say which file, what was expected and what was found)
  report.html    one page, offline: headline, plots, tables, the scan table (sort, filter; a row opens its scan),
                 the --worst N scans as strips that open zoomable at full resolution
  predictions/   checkpoint mode: the masks predicted (a rerun skips the scans done by the same model)

exit status: 0 every scan scored; 1 some scan failed (no prediction, another size, ids beyond the classes,
             unreadable) or the disk filled; 2 bad arguments, a missing or unusable input, a folder without
             masks, an output folder holding other files or in use, an unusable checkpoint; 130 / 143 Ctrl-C /
             SIGTERM."""


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG,
        description=main_evaluate.__doc__,
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--checkpoint", help="checkpoint to evaluate (srforge-train's best.pt, last.pt)")
    parser.add_argument("--input", help="labelled folder, .zip or .tar (images/ and masks/) for --checkpoint")
    parser.add_argument("--compare", metavar="CKPT_B", help="a second checkpoint scored on the same scans")
    parser.add_argument("--predictions", action="append", default=[], help="folder of predicted masks (twice: compare)")
    parser.add_argument("--masks", help="true masks for --predictions: a masks folder, or a root with images/ masks/")
    parser.add_argument("--labels", metavar="PATH", help="true masks from an annotation export (with --format)")
    parser.add_argument("--format", choices=("labelme", "coco", "cvat"), help="the format of --labels")
    parser.add_argument("--image-root", metavar="DIR", help="--labels: a COCO or CVAT export's images folder")
    parser.add_argument(
        "--classes",
        help="--predictions mode: class names, comma-separated (default: the names in "
        "the predictions folder's report.json)",
    )
    parser.add_argument(
        "--ignore-index",
        type=int_at_least(0),
        default=None,
        help="--predictions mode: the id of "
        f"unlabelled pixels in the true masks (default {IGNORE_INDEX}; checkpoint mode: the checkpoint's; an "
        "exported .onnx model records none, so it takes this)",
    )
    parser.add_argument("--output", help="folder for metrics.json, scans.csv, report.html, pictures/, predictions/")
    parser.add_argument("--tolerance", type=int_at_least(0), default=2, help="px for the tolerance F1 (default 2)")
    parser.add_argument("--worst", type=int_at_least(0), default=20, help="scans pictured in the report (default 20)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    add_model_options(parser)
    return parser


def _mode_error(args) -> str | None:
    if bool(args.checkpoint) == bool(args.predictions):
        return "give either --checkpoint CKPT --input DATA or --predictions DIR --masks DIR"
    if bool(args.labels) != bool(args.format) or (args.image_root and not args.labels):
        return "--labels PATH needs --format labelme|coco|cvat (and --format, --image-root need --labels)"
    if args.checkpoint and (bool(args.input) == bool(args.labels) or args.masks or args.classes):
        return (
            "--checkpoint needs --input DATA (a labelled folder or archive) or --labels PATH --format F, and takes "
            "no --masks or --classes"
        )
    if args.predictions and (
        bool(args.masks) == bool(args.labels) or args.input or args.compare or len(args.predictions) > 2
    ):
        return "--predictions DIR (at most twice) needs --masks DIR or --labels PATH, and takes no --input or --compare"
    return None


def _default_output(args) -> Path:
    if args.output:
        return Path(args.output)
    if args.checkpoint:
        name = Path(args.input or args.labels).name.split(".")[0] or "data"
        return Path(args.checkpoint).parent / f"evaluate-{name}"
    first = Path(args.predictions[0])
    return first.parent / f"{first.name}-evaluate"


def _checkpoint_models(args, out: Path):
    """(truths, models, scorer, inputs checked) of checkpoint mode; the output folder checked before a model loads."""
    from srforge.evaluate.inputs import LabelledArchive
    from srforge.evaluate.run import check_evaluation_output
    from srforge.evaluate.scoring import Scorer
    from srforge.predict.folders import check_input
    from srforge.predict.onnx_model import is_onnx_path
    from srforge.runtime.checkpoint import load_checkpoint

    data = Path(args.input or args.labels)
    if args.input:
        check_input(data)
    elif not data.exists():
        raise FileNotFoundError(f"--labels {data}: no such file or folder")
    check_evaluation_output(out, [data])
    models = []
    for name, path in (("A", args.checkpoint), ("B", args.compare)):
        if path:
            predictor = open_predictor(args, path)
            models.append(
                {"name": name, "source": str(path), "fingerprint": predictor.fingerprint, "predictor": predictor}
            )
    names = [list(m["predictor"].class_names) for m in models]
    if len(names) == 2 and names[0] != names[1]:
        raise ValueError(f"--checkpoint has classes {names[0]} and --compare {names[1]}; they must be the same")
    # An exported model records no ignore index: --ignore-index, else the default, as for masks from any tool.
    if is_onnx_path(args.checkpoint):
        ignore = _ignore_index(args.ignore_index, len(names[0]))
    else:
        ignore = load_checkpoint(args.checkpoint).get("ignore_index", IGNORE_INDEX)
    truths = _export_truths(args, names[0], ignore) if args.labels else LabelledArchive(data)
    scorer = Scorer(names[0], ignore, args.tolerance, models[0]["predictor"].device, args.max_pixels)
    return truths, models, scorer


def _export_truths(args, classes: list[str], ignore: int):
    """The true masks of --labels PATH --format F, drawn with ``classes`` in id order."""
    from srforge.evaluate.inputs import ExportTruths

    return ExportTruths(Path(args.labels), args.format, classes, ignore, args.image_root)


def _class_names(args, folder: Path) -> list[str]:
    if args.classes:
        names = [name.strip() for name in args.classes.split(",")]
        problem = class_names_problem(names)
        if problem:
            raise ValueError(f"--classes {args.classes!r}: {problem} (as training requires of model.class_names)")
        return names
    try:
        classes = json.loads((folder / "report.json").read_text())["summary"]["classes"]
    except (OSError, ValueError, KeyError, TypeError):
        classes = None
    if not classes:
        raise ValueError(
            f"--predictions {folder}: no srforge report.json naming the classes there; give --classes NAME,NAME,..."
        )
    return list(classes)


def _prediction_models(args, out: Path):
    from srforge.evaluate.inputs import MaskFolder, Predictions
    from srforge.evaluate.run import check_evaluation_output
    from srforge.evaluate.scoring import Scorer
    from srforge.runtime.device import resolve_device
    from srforge.runtime.distributed import rank_device

    folders = [Path(p) for p in args.predictions]
    check_evaluation_output(out, [*folders, Path(args.masks or args.labels)])
    truths = None if args.labels else MaskFolder(Path(args.masks))
    models = []
    for name, folder in zip(("A", "B"), folders):
        predictions = Predictions(folder)
        mark = _report_model(folder)
        models.append({"name": name, "source": str(folder), "fingerprint": mark, "predictions": predictions})
    device = resolve_device(rank_device(args.device))
    names = _class_names(args, folders[0])
    ignore = _ignore_index(args.ignore_index, len(names))
    truths = truths or _export_truths(args, names, ignore)
    scorer = Scorer(names, ignore, args.tolerance, device, args.max_pixels)
    return truths, models, scorer


def _ignore_index(given: int | None, classes: int) -> int:
    """``--ignore-index`` checked as training checks data.ignore_index: a mask value (0-255) that is no class id."""
    if given is None:
        return IGNORE_INDEX
    if not classes <= given <= 255:
        raise ValueError(
            f"--ignore-index {given}: expected a mask value from {classes} to 255 that is no class id (the classes are "
            f"0 to {classes - 1}); the default is {IGNORE_INDEX}"
        )
    return given


def _report_model(folder: Path) -> str | None:
    try:
        return json.loads((folder / "report.json").read_text())["summary"].get("model")
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None


def _print_summary(document: dict, out: Path) -> None:
    key = document["primary"]
    for model in document["models"]:
        found = model["results"]
        micro, macro = found["micro"], found["macro"]
        figures = ", ".join(
            f"{label} {micro.get(k, float('nan')):.4f} micro / {macro.get(k, float('nan')):.4f} macro"
            for label, k in (
                ("pixel accuracy", "pixel_accuracy"),
                (key, key),
                ("tolerance F1", "mean_tol_f1_without_bg"),
            )
        )
        print(
            f"{PROG}: {model['name']} {model['source']}: {found['scored']} scans scored, {found['failed']} "
            f"failed; {figures}"
        )
    from srforge.evaluate.aggregate import scored_apart

    both = document.get("both_scored")
    if scored_apart(both):  # each line above pools its own scans: say so, with the fair one
        a, b = both["micro_a"].get(key, float("nan")), both["micro_b"].get(key, float("nan"))
        print(
            f"{PROG}: on the {both['scans']} scans both scored (besides them A scored {both['a_only']}, B "
            f"{both['b_only']}): {key} A {a:.4f} micro, B {b:.4f}, B - A {b - a:+.4f}"
        )
    print(f"{PROG}: report: {(out / 'report.html').absolute()}")


def main_evaluate(argv=None) -> int:
    """Score a checkpoint (or a folder of predicted masks) against true masks: per class, per scan, by width."""
    from srforge.runtime.distributed import stop
    from srforge.runtime.signals import TERMINATED_STATUS, Terminated, terminate_as_interrupt

    try:
        args = _parser().parse_args(argv)
    except SystemExit as exc:  # argparse has printed the message naming the option
        return int(exc.code or 0)
    problem = _mode_error(args)
    if problem:
        print(f"{PROG}: error: {problem}", file=sys.stderr)
        return 2
    with terminate_as_interrupt():
        try:
            return _evaluate(args)
        except KeyboardInterrupt as exc:
            print(f"{PROG}: stopped by {'SIGTERM' if isinstance(exc, Terminated) else 'Ctrl-C'}", file=sys.stderr)
            return TERMINATED_STATUS if isinstance(exc, Terminated) else fail(PROG, exc)
        finally:
            stop()  # the group scoring joined, ended before the interpreter: gloo's threads abort an exit with it


def _evaluate(args) -> int:
    from srforge.atomic import DiskFullError
    from srforge.evaluate.run import evaluate
    from srforge.extras import MissingExtraError
    from srforge.locks import FolderLockedError
    from srforge.predict import OutputError
    from srforge.predict.background import default_workers
    from srforge.runtime.distributed import environment

    out = _default_output(args)
    expected = (FileNotFoundError, ValueError, RuntimeError, OutputError, MissingExtraError, FolderLockedError)
    try:
        truths, models, scorer = (_checkpoint_models if args.checkpoint else _prediction_models)(args, out)
    except expected as exc:  # DataError and ConfigError are ValueErrors
        return fail(PROG, exc)
    options = {"tolerance": args.tolerance, "worst": args.worst, "tta": args.tta, "precision": args.precision}
    settings = {
        "worst": args.worst,
        "workers": default_workers() if args.workers is None else args.workers,
        "progress": not args.no_progress,
        "data": args.input or args.masks or args.labels,
        "options": options,
    }
    try:
        document = evaluate(truths, models, out, scorer, settings)
    except (OutputError, FolderLockedError, DiskFullError) as exc:
        return fail(PROG, exc)
    finally:
        truths.close()
    if environment().rank == 0:
        _print_summary(document, out)
    return 0 if all(model["results"]["failed"] == 0 for model in document["models"]) else RUN_FAILED
