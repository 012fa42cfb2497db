"""srforge-make-masks: an annotation export (labelme, COCO, CVAT) as the folder srforge trains on, for those who
want files: ``OUT/images/<name>.<suffix>`` (the image file's bytes, copied; an embedded labelme image decoded to PNG)
and ``OUT/masks/<name>.png`` (class ids, drawn exactly as training draws them).

Everything that can be checked before writing is (the export's problems, every image's header and size); files are
written atomically, and a file already there is an error unless ``--overwrite`` says to replace it.
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

PROG = "srforge-make-masks"


def _parser() -> argparse.ArgumentParser:
    from srforge.data.annotations import FORMATS

    parser = argparse.ArgumentParser(prog=PROG, description=main_make_masks.__doc__)
    parser.add_argument("export", help="a labelme folder, COCO's instances JSON or CVAT's annotations XML")
    parser.add_argument("out", help="the folder to write images/ and masks/ into")
    parser.add_argument("--format", choices=FORMATS, required=True, help="the export's format")
    parser.add_argument("--classes", required=True, help="labels in class-id order, comma-separated")
    parser.add_argument("--ignore", default="", help="labels drawn as the ignore index, comma-separated")
    parser.add_argument("--unknown", choices=("error", "ignore"), default="error", help="a label not in --classes")
    parser.add_argument("--line-width", type=float, default=1.0, help="px width of lines and polylines (default 1)")
    parser.add_argument("--point-radius", type=float, default=1.0, help="px radius of points (default 1)")
    parser.add_argument("--image-root", metavar="DIR", help="a COCO or CVAT export's images (default: beside it)")
    parser.add_argument("--overwrite", action="store_true", help="replace files already in OUT")
    return parser


def _targets(dataset, out: Path) -> list[tuple[Path, Path]]:
    """(image file, mask file) under ``out`` for every scan of ``dataset``; a ValueError naming the scan for a target
    that does not resolve inside ``out`` (a scan's name comes from the export, a file srforge did not write: the
    readers refuse absolute names and '..', and this is the last guard, which also sees symlinks already in OUT)."""
    from srforge.data.images import DataError

    root = out.resolve()
    found = []
    for scan in dataset.scans:
        suffix = scan.image.suffix.lower() if scan.image is not None else ".png"
        pair = (out / "images" / f"{scan.name}{suffix}", out / "masks" / f"{scan.name}.png")
        for target in pair:
            if not target.resolve().is_relative_to(root):
                raise DataError(
                    f"{scan.file}: scan {scan.name!r} would be written to {target}, which resolves to "
                    f"{target.resolve()}, outside {root}; refused: rename the image in the export"
                )
        found.append(pair)
    return found


def write_scan(dataset, index: int, image_path: Path, mask_path: Path) -> None:
    """Scan ``index``'s image and mask, each written atomically."""
    import numpy as np
    from PIL import Image

    from srforge.atomic import atomic_write
    from srforge.predict.outputs import write_png

    scan = dataset.scans[index]
    mask = dataset.read_mask(index).numpy()
    image_path.parent.mkdir(parents=True, exist_ok=True)
    mask_path.parent.mkdir(parents=True, exist_ok=True)
    if scan.image is not None:

        def copy(f) -> None:
            with open(scan.image, "rb") as source:
                shutil.copyfileobj(source, f)

        atomic_write(image_path, copy)
    else:
        pixels = dataset.read_image(index).permute(1, 2, 0).numpy()
        atomic_write(image_path, lambda f: Image.fromarray(np.ascontiguousarray(pixels).squeeze()).save(f, "PNG"))
    if mask.dtype == np.uint8:
        write_png(mask_path, mask, "L")
    else:  # class ids past 255: a 16-bit PNG, which read_mask gives back as int64
        atomic_write(mask_path, lambda f: Image.fromarray(mask.astype(np.uint16)).save(f, "PNG"))


def main_make_masks(argv=None) -> int:
    """Write an annotation export as OUT/images + OUT/masks, the folder layout srforge trains on."""
    from srforge.cli.errors import fail
    from srforge.data.annotations import open_export

    args = _parser().parse_args(argv)
    out = Path(args.out)
    rules = {
        "ignore": [v for v in args.ignore.split(",") if v],
        "unknown": args.unknown,
        "line_width": args.line_width,
        "point_radius": args.point_radius,
    }
    try:
        classes = [name.strip() for name in args.classes.split(",")]
        dataset = open_export(args.format, args.export, classes, args.image_root, **rules)
        dataset.sizes()  # every image's header and stated size, before anything is written
        targets = _targets(dataset, out)
        there = [str(p) for pair in targets for p in pair if p.exists()]
        if there and not args.overwrite:
            raise FileExistsError(
                f"{out}: {len(there)} file(s) would be overwritten, e.g. {there[0]}; pass --overwrite to replace them "
                "or choose another OUT"
            )
        for index, (image_path, mask_path) in enumerate(targets):
            write_scan(dataset, index, image_path, mask_path)
    except (ValueError, OSError, KeyboardInterrupt) as exc:  # DataError is a ValueError
        return fail(PROG, exc)
    print(f"{PROG}: wrote {len(targets)} scan(s) to {out}/images and {out}/masks")
    return 0


if __name__ == "__main__":
    sys.exit(main_make_masks())
