"""srforge-check-data: decode every pair of a dataset folder, report problems, draw the batch layout.

With ``--config FILE`` the settings come from a training config wherever the command line leaves them out: the
class count and ignore index of the mask check, the batching of the picture, and its size divisor -- 2**model.depth
for srforge's UNet, else the ``size_divisor`` of the configured model, built on the CPU (no weights file is read).
Without it they are the trainer's defaults.

With ``--format labelme|coco|cvat`` ROOT is an annotation export (a labelme folder, COCO's JSON, CVAT's XML): every
problem of the export is reported at once (:mod:`srforge.data.annotations.check`), the labels mapped by ``--classes``
or by the config's dataset args (an export dataset's, else model.class_names), and ``--plot`` draws the first scans
with their rasterised masks over them: what the model will be taught.

With ``--cache PATH`` (or the config's ``data.cache``) every pair that decodes is also written into the decoded-scan
cache (:mod:`srforge.data.cache`), with a progress bar, so that training reads even its first epoch at memory speed.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from srforge.constants import IGNORE_INDEX


def main_check_data(argv=None) -> int:
    """Decode every image and mask under ROOT and report every problem; exit status 1 if any."""
    from srforge.data.datasets import check_folder

    parser = argparse.ArgumentParser(prog="check_data", description=main_check_data.__doc__)
    parser.add_argument("root", help="dataset folder holding images/ and masks/")
    parser.add_argument("--images", default="images", help="image subfolder (default images)")
    parser.add_argument("--masks", default="masks", help="mask subfolder (default masks)")
    parser.add_argument(
        "--num-classes",
        type=int,
        default=None,
        help="mask values must be below this (default: the config's, else none)",
    )
    parser.add_argument(
        "--ignore-index",
        type=int,
        default=None,
        help=f"mask value exempt from --num-classes (default: the config's data.ignore_index, else {IGNORE_INDEX})",
    )
    parser.add_argument("--image-mode", default="RGB", help="PIL mode images are converted to (default RGB)")
    parser.add_argument(
        "--config", metavar="FILE", help="a training config: the defaults of every setting here, the model's divisor"
    )
    parser.add_argument(
        "--cache", metavar="PATH", help="fill this decoded-scan cache folder (data.cache) while checking, with a bar"
    )
    parser.add_argument(
        "--cache-max-gb", type=float, default=None, help="the cache's budget in GB (data.cache_max_gb; default none)"
    )
    _add_export_arguments(parser)
    _add_plot_arguments(parser)
    args = parser.parse_args(argv)
    if args.num_classes is not None and args.num_classes < 1:
        parser.error(f"--num-classes must be >= 1, found {args.num_classes}")
    _check_plot_arguments(parser, args)
    _fill_from_config(parser, args)
    if args.format:
        return _check_export(parser, args)
    count, problems = check_folder(
        args.root,
        args.images,
        args.masks,
        num_classes=args.num_classes,
        ignore_index=args.ignore_index,
        image_mode=args.image_mode,
        cache=_open_cache(parser, args),
        progress=args.cache is not None,
    )
    for problem in problems:
        print(problem, file=sys.stderr)
    print(f"{args.root}: {count} pairs checked, {len(problems)} problem(s)")
    if args.plot and not _plot_layout(args):
        return 1
    return 1 if problems else 0


def _add_export_arguments(parser: argparse.ArgumentParser) -> None:
    from srforge.data.annotations import FORMATS

    group = parser.add_argument_group("annotation exports (ROOT is a labelme folder, COCO's JSON or CVAT's XML)")
    group.add_argument("--format", choices=FORMATS, help="check ROOT as this annotation export")
    group.add_argument(
        "--classes",
        help="labels in class-id order, comma-separated (default: the config's dataset classes, else "
        "model.class_names)",
    )
    group.add_argument("--image-root", metavar="DIR", help="the images of a COCO or CVAT export (default: beside it)")


def _export_args(parser: argparse.ArgumentParser, args) -> dict:
    """The label rules' args of --format: the config's export dataset args, with --classes over its classes."""
    from srforge.config import load_config

    rules: dict = {}
    if args.config:
        cfg = load_config(args.config)
        if "annotations:" in str(cfg.data.dataset.class_):
            rules = dict(cfg.data.dataset.args)
            for key in ("root", "annotations", "transform", "cache", "image_mode"):
                rules.pop(key, None)
        elif cfg.model.class_names:
            rules["classes"] = list(cfg.model.class_names)
    if args.classes:
        rules["classes"] = [name.strip() for name in args.classes.split(",")]
    if not rules.get("classes"):
        parser.error("--format: give --classes NAME,NAME,... (class-id order) or a --config that names them")
    if args.image_root:
        rules["images"] = args.image_root
    return rules


def _check_export(parser: argparse.ArgumentParser, args) -> int:
    """check_data --format: every problem of the export, its scans drawn with their masks for --plot."""
    from srforge.data.annotations.check import check_export

    rules = _export_args(parser, args)
    images, occluded = rules.pop("images", None), rules.pop("occluded", "draw")
    dataset, problems = check_export(
        args.format,
        args.root,
        rules,
        images,
        args.num_classes,
        progress=args.cache is not None,
        image_mode=args.image_mode,
        cache=_open_cache(parser, args),
        occluded=occluded,
    )
    for problem in problems:
        print(problem, file=sys.stderr)
    count = len(dataset) if dataset is not None else 0
    print(f"{args.root}: {count} annotated scans checked, {len(problems)} problem(s)")
    if args.plot and not _plot_masks(dataset, args):
        return 1
    return 1 if problems else 0


def _plot_masks(dataset, args) -> bool:
    """Write the --plot picture of an export: its first --plot-batches scans that read, each with its mask drawn
    over it, one under another; False (the reason on stderr) when none reads or the file cannot be written."""
    import numpy as np

    from srforge.data.images import DataError
    from srforge.predict.outputs import draw_overlay, write_png

    shown = []
    for index in range(len(dataset) if dataset is not None else 0):
        try:
            entry = dataset.load(index)
        except DataError:
            continue  # reported above
        classes = max(2, max(dataset.rules.classes.values()) + 1)
        shown.append(draw_overlay(entry.image, entry.mask.long(), classes).permute(1, 2, 0).numpy())
        if len(shown) == args.plot_batches:
            break
    if not shown:
        print(f"check_data: cannot draw {args.plot}: no scan of {args.root} reads", file=sys.stderr)
        return False
    width = max(p.shape[1] for p in shown)
    rows = [np.pad(p, ((0, 4), (0, width - p.shape[1]), (0, 0)), constant_values=255) for p in shown]
    try:
        write_png(Path(args.plot), np.concatenate(rows), "RGB")
    except OSError as exc:
        print(f"check_data: cannot write {args.plot}: {exc.strerror or exc}", file=sys.stderr)
        return False
    print(f"wrote {args.plot}: {len(shown)} scan(s) with their masks")
    return True


def _open_cache(parser: argparse.ArgumentParser, args):
    """The decoded-scan cache of --cache (None without it); a folder that cannot be a cache exits 2 naming it."""
    from srforge.data.cache import DecodedCache

    if args.cache is None:
        return None
    try:
        return DecodedCache(args.cache, args.cache_max_gb, args.channels_last)
    except ValueError as exc:  # DataError: not a cache folder, cannot be made; a budget <= 0
        parser.error(f"--cache: {exc}")


def _add_plot_arguments(parser: argparse.ArgumentParser) -> None:
    """check_data's --plot and the batching it draws; the defaults are the trainer's (srforge.config.schema;
    configs/quickstart.yaml differs: give --config)."""
    from srforge.config.schema import Config
    from srforge.constants import MAX_DEPTH

    defaults = Config()

    group = parser.add_argument_group("batch-layout picture (--plot); defaults are --config's, else the trainer's")
    group.add_argument("--plot", metavar="OUT.png", help="draw the first training batches and the size histogram")
    group.add_argument(
        "--batch-size", type=int, default=None, help=f"data.batch_size (default {defaults.data.batch_size})"
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
        default=None,
        help=f"model.depth: size divisor 2**depth; 1 to {MAX_DEPTH}, and refused where its deepest stage would see "
        f"every scan as a single row or column (default {defaults.model.depth})",
    )
    group.add_argument(
        "--divisor",
        type=int,
        default=None,
        help=f"the size divisor itself, 1 to {2**MAX_DEPTH:,}, instead of --depth",
    )
    group.add_argument(
        "--val-fraction",
        type=float,
        default=None,
        help=f"data.val_fraction, 0 for no split (default {defaults.data.val_fraction})",
    )
    group.add_argument("--seed", type=int, default=None, help=f"run.seed (default {defaults.run.seed})")
    group.add_argument("--plot-batches", type=int, default=4, help="batches to draw (default 4)")


def _check_plot_arguments(parser: argparse.ArgumentParser, args) -> None:
    """The static bounds of --depth and --divisor (the config's for model.depth), before any file is read: a
    deeper net only pads, and 2**40 would ask for more memory than any machine has. Exits 2 naming the bound."""
    from srforge.constants import MAX_DEPTH

    if args.depth is not None and not 1 <= args.depth <= MAX_DEPTH:
        parser.error(
            f"--depth must be 1 to {MAX_DEPTH} (model.depth; size divisor 2**depth, at most {2**MAX_DEPTH:,} px), "
            f"found {args.depth}"
        )
    if args.divisor is not None and not 1 <= args.divisor <= 2**MAX_DEPTH:
        parser.error(f"--divisor must be 1 to {2**MAX_DEPTH:,} (2**{MAX_DEPTH}), found {args.divisor}")


def _fill_from_config(parser: argparse.ArgumentParser, args) -> None:
    """Every setting the command line left out, from --config (else the trainer's defaults). A --plot without
    --depth or --divisor takes the configured model's divisor. A config that does not load, or a model that does
    not build, exits 2 naming it."""
    from srforge.config import ConfigError, load_config
    from srforge.config.schema import Config
    from srforge.constants import UNET_CLASSES

    try:
        cfg = load_config(args.config) if args.config else Config()
    except ConfigError as exc:
        parser.error(f"--config: {exc}")
    if args.config and args.num_classes is None:
        args.num_classes = cfg.model.num_classes
    args.ignore_index = cfg.data.ignore_index if args.ignore_index is None else args.ignore_index
    if args.cache is None:
        args.cache = cfg.data.cache
    if args.cache_max_gb is None:
        args.cache_max_gb = cfg.data.cache_max_gb
    args.channels_last = cfg.train.channels_last  # the cache's image layout is the batch's
    if args.batch_size is None and args.max_pixels is None:
        args.batch_size, args.max_pixels = cfg.data.batch_size, cfg.data.max_pixels
    if args.max_pixels == "auto":  # measured on the training device at start: draw at the CPU's budget instead
        from srforge.constants import CPU_PIXELS

        args.max_pixels = CPU_PIXELS
    args.val_fraction = cfg.data.val_fraction if args.val_fraction is None else args.val_fraction
    args.seed = cfg.run.seed if args.seed is None else args.seed
    if args.depth is not None or args.divisor is not None:
        return
    if cfg.model.class_ in UNET_CLASSES:
        args.depth = cfg.model.depth
    elif args.plot:
        args.divisor = _model_divisor(parser, cfg)


def _model_divisor(parser: argparse.ArgumentParser, cfg) -> int:
    """The size divisor of the model ``cfg`` configures, built on the CPU without its weights file."""
    import torch

    from srforge.extras import MissingExtraError
    from srforge.train.from_config import build_model

    try:
        model, _ = build_model(cfg.model, torch.device("cpu"), channels_last=False, load_weights=False)
    except (MissingExtraError, ValueError) as exc:  # ConfigError is a ValueError
        parser.error(f"--config: cannot build the model for its size divisor: {exc}")
    return model.size_divisor


def _plot_layout(args) -> bool:
    """Write the --plot picture; False (with the reason on stderr, one line) when the folder cannot be batched,
    --depth is deeper than its scans allow (checked before anything is drawn), or the picture cannot be written."""
    from srforge.data import SegmentationFolder
    from srforge.data.layout_plot import batch_layout, save_batch_layout, totals
    from srforge.geometry import depth_problem

    try:
        sizes = SegmentationFolder(args.root, args.images, args.masks).sizes()
        problem = None if args.divisor else depth_problem(sizes, args.depth)
        if problem:
            raise ValueError(f"--depth: {problem}")
        layout = batch_layout(
            sizes,
            batch_size=None if args.max_pixels else args.batch_size,
            max_pixels=args.max_pixels,
            divisor=args.divisor or 2**args.depth,
            val_fraction=args.val_fraction,
            seed=args.seed,
        )
        save_batch_layout(layout, args.plot, args.plot_batches)
    except ValueError as exc:  # DataError (unpaired files), an empty folder, bad settings, too deep
        print(f"check_data: cannot draw {args.plot}: {exc}", file=sys.stderr)
        return False
    except OSError as exc:  # only writing raises it (reading raises DataError): a read-only or full file system
        reason = exc.strerror or exc
        print(f"check_data: cannot write {args.plot}: {reason}; choose a --plot path you can write", file=sys.stderr)
        return False
    print(f"wrote {args.plot}: " + "; ".join(totals(layout, args.plot_batches)))
    return True
