"""srforge-make-synthetic: write synthetic well-log scans and their masks."""

from __future__ import annotations

import argparse
import sys
import time


def main_make_synthetic(argv=None) -> int:
    """Write synthetic well-log scans: OUT/images/*.png and OUT/masks/*.png."""
    from srforge.extras import MissingExtraError
    from srforge.synthetic import CLASSES, LasError, make_welllog_scans

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
    parser.add_argument(
        "--las",
        nargs="+",
        metavar="PATH",
        help="LAS files or globs (quote them) the curves come from, read with lasio (the las extra); "
        "default: srforge's own log-like curves",
    )
    parser.add_argument(
        "--randomise",
        action=argparse.BooleanOptionalAction,
        default=False,
        help="draw paper, grid, inks, text and scanner from the wide ranges archives vary over "
        "(default: srforge's classic look)",
    )
    args = parser.parse_args(argv)
    if args.num < 1 or args.scale <= 0:
        parser.error("--num must be >= 1 and --scale > 0")
    start = time.perf_counter()
    try:
        paths = make_welllog_scans(
            args.out_dir,
            args.num,
            scale=args.scale,
            seed=args.seed,
            classes=args.classes,
            workers=args.workers,
            las=args.las,
            randomise=args.randomise,
        )
    except (LasError, MissingExtraError) as exc:
        print(f"make_synthetic: error: {exc}", file=sys.stderr)
        return 2
    seconds = time.perf_counter() - start
    print(
        f"wrote {len(paths)} scans to {args.out_dir} in {seconds:.1f} s ({len(paths) / seconds:.1f} scans/s); "
        f"classes: {', '.join(CLASSES[args.classes])}"
    )
    return 0
