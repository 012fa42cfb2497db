"""Command-line entry points; scripts/*.py and the console scripts are thin wrappers over these."""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path


def main_make_synthetic(argv=None) -> int:
    """Write synthetic well-log scans: OUT/images/*.png and OUT/masks/*.png."""
    from srforge.data.synthetic import CLASSES, make_welllog_scans

    parser = argparse.ArgumentParser(prog="make_synthetic", description=main_make_synthetic.__doc__)
    parser.add_argument("out_dir", help="folder to write images/ and masks/ into")
    parser.add_argument("-n", "--num", type=int, default=40, help="number of scans (default 40)")
    parser.add_argument("--scale", type=float, default=1.0,
                        help="size factor: 1 gives 3,200-12,800 x 480-640 px scans, 0.125 an eighth (default 1)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--classes", choices=sorted(CLASSES), default="binary",
                        help="binary: curve=1; multiclass: solid=1, dashed=2, dotted=3 (default binary)")
    parser.add_argument("--workers", type=int, default=1, help="parallel processes (default 1)")
    args = parser.parse_args(argv)
    if args.num < 1 or args.scale <= 0:
        parser.error("--num must be >= 1 and --scale > 0")
    start = time.perf_counter()
    paths = make_welllog_scans(args.out_dir, args.num, scale=args.scale, seed=args.seed, classes=args.classes,
                               workers=args.workers)
    seconds = time.perf_counter() - start
    print(f"wrote {len(paths)} scans to {args.out_dir} in {seconds:.1f} s ({len(paths) / seconds:.1f} scans/s); "
          f"classes: {', '.join(CLASSES[args.classes])}")
    return 0


def main_check_data(argv=None) -> int:
    """Decode every image and mask under ROOT and report every problem; exit status 1 if any."""
    from srforge.data.datasets import check_folder

    parser = argparse.ArgumentParser(prog="check_data", description=main_check_data.__doc__)
    parser.add_argument("root", help="dataset folder holding images/ and masks/")
    parser.add_argument("--images", default="images", help="image subfolder (default images)")
    parser.add_argument("--masks", default="masks", help="mask subfolder (default masks)")
    parser.add_argument("--num-classes", type=int, default=None, help="mask values must be below this")
    parser.add_argument("--ignore-index", type=int, default=255, help="mask value exempt from --num-classes")
    parser.add_argument("--image-mode", default="RGB", help="PIL mode images are converted to (default RGB)")
    args = parser.parse_args(argv)
    count, problems = check_folder(args.root, args.images, args.masks, num_classes=args.num_classes,
                                   ignore_index=args.ignore_index, image_mode=args.image_mode)
    for problem in problems:
        print(problem, file=sys.stderr)
    print(f"{args.root}: {count} pairs checked, {len(problems)} problem(s)")
    return 1 if problems else 0


def main_train(argv=None) -> int:
    """Train a padding-aware U-Net from a YAML config: srforge-train --config configs/X.yaml [key.path=value ...]."""
    from srforge.config import ConfigError, load_config, resolve
    from srforge.engine.checkpoint import load_checkpoint
    from srforge.engine.trainer import NonFiniteLossError, train

    parser = argparse.ArgumentParser(prog="srforge-train", description=main_train.__doc__)
    parser.add_argument("--config", help="YAML config (default: configs/quickstart.yaml, or the run's own config with --resume)")
    parser.add_argument("--resume", metavar="RUN_DIR|CKPT", help="continue a run from RUN_DIR/last.pt or a checkpoint file")
    parser.add_argument("overrides", nargs="*", metavar="key.path=value", help="config overrides, values read as YAML")
    args = parser.parse_args(argv)
    try:
        if args.config is None and args.resume is not None:
            resume = Path(args.resume)
            saved = load_checkpoint(resume / "last.pt" if resume.is_dir() else resume)["config"]
            cfg = resolve(saved, args.overrides)
        else:
            cfg = load_config(args.config or "configs/quickstart.yaml", args.overrides)
    except (ConfigError, FileNotFoundError, ValueError) as exc:
        print(f"srforge-train: error: {exc}", file=sys.stderr)
        return 2
    try:
        summary = train(cfg, resume=args.resume)
    except NonFiniteLossError as exc:
        print(f"srforge-train: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    if summary.get("val_mean_iou") is not None:
        print(f"srforge: done. best validation mean IoU {summary['best_mean_iou']:.4f}; run directory {summary['run_dir']}")
    return 0
