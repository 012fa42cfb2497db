"""What a scan is called: relative posix names, stems, hidden files, and pairing images with masks.

A scan goes by its relative path without its suffix (``a/b.v1.png`` is the scan ``a/b.v1``), whether it lives
in a folder, a zip or a tar. Images pair with masks by that name, and prediction writes ``masks/<name>.png``,
so two files with one name clash: each clash is reported, never resolved by a silent choice.
"""

from __future__ import annotations

from pathlib import Path, PurePosixPath

from srforge.data.images import SUFFIXES, DataError

LAYOUT = "ROOT/images/<name>.(png|jpg|jpeg|tif|tiff|bmp) with ROOT/masks/<name>.png (same relative <name>)"


def posix_name(relative) -> str:
    """A relative path as a posix string, with Windows separators (as zips made on Windows hold) turned to ``/``."""
    return str(relative).replace("\\", "/")


def scan_stem(relative) -> str:
    """The name a scan goes by: its relative posix path without its suffix (``a/b.v1.png`` -> ``a/b.v1``)."""
    return PurePosixPath(posix_name(relative)).with_suffix("").as_posix()


def is_hidden(relative) -> bool:
    """Whether a relative path has a hidden part (``.cache/a.png``, ``.a.png``): such files are passed over."""
    return any(part.startswith(".") for part in PurePosixPath(posix_name(relative)).parts)


def list_images(folder: Path) -> tuple[dict[str, Path], list[str]]:
    """Image files under ``folder`` by scan name, and one problem per name clash (the first file is kept).

    Hidden files and other suffixes are passed over.
    """
    found: dict[str, Path] = {}
    problems = []
    for path in sorted(folder.rglob("*")):
        rel = path.relative_to(folder)
        if path.suffix.lower() not in SUFFIXES or is_hidden(rel) or not path.is_file():
            continue
        key = scan_stem(rel)
        if key in found:
            problems.append(f"{found[key]} and {path} have the same name {key!r}; keep one of them")
            continue
        found[key] = path
    return found, problems


def find_pairs(root, images: str = "images", masks: str = "masks") -> tuple[list[tuple[str, Path, Path]], list[str]]:
    """Pair image and mask files: ([(name, image_path, mask_path)], problems).

    Problems are every unpaired file and every name clash; a missing or empty images folder is a DataError,
    since nothing else can be checked then.
    """
    root = Path(root)
    image_dir, mask_dir = root / images, root / masks
    for folder in (image_dir, mask_dir):
        if not folder.is_dir():
            raise DataError(f"{folder} is not a folder; expected layout: {LAYOUT}")
    (image_files, image_clashes), (mask_files, mask_clashes) = list_images(image_dir), list_images(mask_dir)
    if not image_files:
        raise DataError(f"no images in {image_dir}; expected layout: {LAYOUT}")
    problems = image_clashes + mask_clashes
    problems += [f"{image_files[k]}: no mask (expected {mask_dir / k}.png)" for k in image_files if k not in mask_files]
    problems += [
        f"{mask_files[k]}: no image (expected {image_dir / k}.png or .jpg, .tif, .bmp)"
        for k in mask_files
        if k not in image_files
    ]
    pairs = [(k, image_files[k], mask_files[k]) for k in image_files if k in mask_files]
    return pairs, problems
