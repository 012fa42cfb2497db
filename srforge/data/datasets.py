"""SegmentationFolder: image/mask pairs from ROOT/images and ROOT/masks, each scan in its natural shape.

Images and masks pair by relative path and stem (``images/a/b.jpg`` with ``masks/a/b.png`` is the scan
``a/b``). Sizes come from file headers, cached beside the data, so size-grouped samplers and splits
cost no decoding. Every bad file is a DataError that names it.
"""

from __future__ import annotations

import json
import os
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path, PurePosixPath

import numpy as np
import torch
from PIL import Image, UnidentifiedImageError

from srforge.atomic import atomic_write_text
from srforge.data.entry import Entry

SUFFIXES = (".png", ".jpg", ".jpeg", ".tif", ".tiff", ".bmp")
SIZES_FILE = ".srforge_sizes.json"
LAYOUT = "ROOT/images/<name>.(png|jpg|jpeg|tif|tiff|bmp) with ROOT/masks/<name>.png (same relative <name>)"


class DataError(ValueError):
    """A data file is missing, unreadable or inconsistent with its partner; the message names the file."""


def scan_stem(relative) -> str:
    """The name a scan goes by: its relative posix path without its suffix (``a/b.v1.png`` -> ``a/b.v1``).

    Images pair with masks by it, and prediction writes ``masks/<stem>.png``: two files with one stem clash.
    """
    return PurePosixPath(str(relative).replace("\\", "/")).with_suffix("").as_posix()


def is_hidden(relative) -> bool:
    """Whether a relative path has a hidden part (``.cache/a.png``, ``.a.png``): such files are passed over."""
    return any(part.startswith(".") for part in PurePosixPath(str(relative).replace("\\", "/")).parts)


def _list_files(folder: Path) -> dict[str, Path]:
    """Image files under folder by relative stem (posix); hidden files and other suffixes are skipped."""
    found: dict[str, Path] = {}
    for path in sorted(folder.rglob("*")):
        rel = path.relative_to(folder)
        if path.suffix.lower() not in SUFFIXES or is_hidden(rel) or not path.is_file():
            continue
        key = scan_stem(rel)
        if key in found:
            raise DataError(f"{found[key]} and {path} have the same name {key!r}; keep one of them")
        found[key] = path
    return found


def find_pairs(root, images: str = "images", masks: str = "masks") -> tuple[list[tuple[str, Path, Path]], list[str]]:
    """Pair image and mask files: ([(name, image_path, mask_path)], problems), one problem per unpaired file."""
    root = Path(root)
    image_dir, mask_dir = root / images, root / masks
    for folder in (image_dir, mask_dir):
        if not folder.is_dir():
            raise DataError(f"{folder} is not a folder; expected layout: {LAYOUT}")
    image_files, mask_files = _list_files(image_dir), _list_files(mask_dir)
    if not image_files:
        raise DataError(f"no images in {image_dir}; expected layout: {LAYOUT}")
    problems = [f"{image_files[k]}: no mask (expected {mask_dir / k}.png)" for k in image_files if k not in mask_files]
    problems += [
        f"{mask_files[k]}: no image (expected {image_dir / k}.png or .jpg, .tif, .bmp)"
        for k in mask_files
        if k not in image_files
    ]
    pairs = [(k, image_files[k], mask_files[k]) for k in image_files if k in mask_files]
    return pairs, problems


def open_image(source, label=None) -> Image.Image:
    """Open lazily (header only) a path or binary file; every PIL failure becomes a DataError naming
    ``label`` (default: the path), e.g. ``archive.zip:scans/a.png`` for an archive member."""
    label = source if label is None else label
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            return Image.open(source)
    except (Image.DecompressionBombError, Image.DecompressionBombWarning) as error:
        raise DataError(
            f"{label}: {error} If the file is trusted, raise the limit before loading, e.g. "
            "`PIL.Image.MAX_IMAGE_PIXELS = 500_000_000` (None disables the check)."
        ) from error
    except (UnidentifiedImageError, OSError, ValueError) as error:
        raise DataError(
            f"{label}: cannot read as an image ({error}); the file is corrupt, empty or not an image"
        ) from error


def _decode(source, label=None) -> Image.Image:
    label = source if label is None else label
    image = open_image(source, label)
    try:
        image.load()
    except (OSError, ValueError, SyntaxError) as error:  # truncated or damaged pixel data
        image.close()
        raise DataError(f"{label}: cannot decode ({error}); the file is truncated or corrupt") from error
    return image


def read_image(source, mode: str = "RGB", label=None) -> torch.Tensor:
    """Decode an image (a path, or a binary file named by ``label`` in errors) to uint8 [C, H, W] in PIL
    ``mode`` (RGB: C=3, L: C=1, RGBA: C=4).

    16-bit (and 32-bit integer) grayscale is scaled by its full range (value / 257), so a given raw
    value maps to the same 8-bit value in every file. Palette images are expanded through their palette.
    """
    label = source if label is None else label
    with _decode(source, label) as image:  # closed at once: a TIFF would otherwise hold its file open
        return _to_uint8_chw(image, mode, label)


def _to_uint8_chw(image: Image.Image, mode: str, label) -> torch.Tensor:
    if image.mode.startswith("I") or image.mode == "F":
        values = np.asarray(image, dtype=np.float64)
        top = 65535.0 if image.mode != "F" else 1.0 if values.max(initial=0) <= 1 else 255.0
        image = Image.fromarray(np.clip(values / top * 255 + 0.5, 0, 255).astype(np.uint8), "L")
    try:
        array = np.asarray(image.convert(mode))
    except ValueError as error:
        raise DataError(f"{label}: cannot convert mode {image.mode} to {mode} ({error})") from error
    array = array[:, :, None] if array.ndim == 2 else array
    return torch.from_numpy(array.copy()).permute(2, 0, 1).contiguous()


def read_mask(path) -> torch.Tensor:
    """Decode a mask file to int64 [H, W] class indices (palette masks give their indices, as in VOC)."""
    path = Path(path)
    with _decode(path) as image:
        return _mask_indices(image, path)


def _mask_indices(image: Image.Image, path: Path) -> torch.Tensor:
    if image.mode == "LA":
        image = image.getchannel("L")
    if image.mode not in ("1", "L", "P") and not image.mode.startswith("I"):
        raise DataError(
            f"{path}: mask has mode {image.mode}; save masks as single-channel class indices "
            "(8- or 16-bit grayscale or palette PNG)"
        )
    return torch.from_numpy(np.asarray(image).astype(np.int64))


def read_size(source, label=None) -> tuple[int, int]:
    """(H, W) of an image path or binary file, from its header only."""
    with open_image(source, label) as image:
        width, height = image.size
    return height, width


def measure_sizes(paths: Sequence, cache=None) -> list[tuple[int, int]]:
    """(H, W) of each image from its header, never its pixels; ``cache`` is an optional JSON index file.

    The index maps each path (relative to the index's folder) to its byte size, mtime and (H, W); an
    entry is re-read when the file's size or mtime changes. It is rewritten atomically (temporary
    file, then rename) and silently left alone when the folder is read-only.
    """
    paths = [Path(p) for p in paths]
    cache = Path(cache) if cache is not None else None
    index: dict[str, list[int]] = {}
    if cache is not None and cache.is_file():
        try:
            index = json.loads(cache.read_text()).get("files", {})
        except (OSError, ValueError, AttributeError):
            index = {}  # a damaged index is rebuilt, never trusted
    sizes, changed = [], False
    for path in paths:
        key = os.path.relpath(path, cache.parent).replace(os.sep, "/") if cache is not None else str(path)
        try:
            stat = path.stat()
        except OSError as error:
            raise DataError(f"{path}: cannot stat ({error})") from error
        entry = index.get(key)
        if entry is not None and entry[:2] == [stat.st_size, stat.st_mtime_ns]:
            sizes.append((entry[2], entry[3]))
            continue
        height, width = read_size(path)
        index[key] = [stat.st_size, stat.st_mtime_ns, height, width]
        sizes.append((height, width))
        changed = True
    if cache is not None and changed:
        try:
            atomic_write_text(cache, json.dumps({"version": 1, "files": index}))
        except OSError:  # read-only data: measure every time instead
            pass
    return sizes


def _pair_problems(
    image_path: Path,
    image: torch.Tensor,
    mask_path: Path,
    mask: torch.Tensor,
    num_classes: int | None,
    ignore_index: int,
) -> list[str]:
    """What is wrong with a decoded pair: sizes that differ, class values out of range."""
    problems = []
    if tuple(mask.shape) != tuple(image.shape[1:]):
        problems.append(
            f"{mask_path}: mask is {tuple(mask.shape)} (H, W) but its image {image_path} "
            f"is {tuple(image.shape[1:])}; they must match"
        )
    if num_classes is not None:
        values = torch.unique(mask)
        bad = values[(values >= num_classes) & (values != ignore_index)].tolist()
        if bad:
            problems.append(
                f"{mask_path}: mask values {bad[:20]} are >= num_classes={num_classes} and not "
                f"ignore_index={ignore_index}; fix the mask or num_classes"
            )
    return problems


class SegmentationFolder(torch.utils.data.Dataset):
    """Scans in ROOT/images with masks in ROOT/masks; item i is
    ``Entry(name="a/b", image=uint8 [C, H, W], mask=int64 [H, W])`` in natural shape.

    ``image_mode`` is the PIL mode every image is converted to. ``num_classes`` (optional) makes any
    mask value >= num_classes other than ``ignore_index`` an error. ``transform`` (optional) maps the
    Entry, e.g. an augmentation. Missing partners are reported all at once on construction.
    """

    def __init__(
        self,
        root,
        images: str = "images",
        masks: str = "masks",
        image_mode: str = "RGB",
        num_classes: int | None = None,
        ignore_index: int = 255,
        transform: Callable | None = None,
    ):
        self.root = Path(root)
        self.image_mode, self.num_classes, self.ignore_index = image_mode, num_classes, ignore_index
        self.transform = transform
        pairs, problems = find_pairs(self.root, images, masks)
        if problems:
            raise DataError(f"{len(problems)} unpaired file(s) in {self.root}:\n  " + "\n  ".join(problems))
        self.names = [name for name, _, _ in pairs]
        self.image_paths = [image for _, image, _ in pairs]
        self.mask_paths = [mask for _, _, mask in pairs]

    def __len__(self) -> int:
        return len(self.names)

    def sizes(self) -> list[tuple[int, int]]:
        """True (H, W) of every scan, from headers (cached in ROOT/.srforge_sizes.json)."""
        return measure_sizes(self.image_paths, cache=self.root / SIZES_FILE)

    def load(self, index: int) -> Entry:
        """Decode and validate scan ``index`` (no transform)."""
        image_path, mask_path = self.image_paths[index], self.mask_paths[index]
        image, mask = read_image(image_path, self.image_mode), read_mask(mask_path)
        problems = _pair_problems(image_path, image, mask_path, mask, self.num_classes, self.ignore_index)
        if problems:
            raise DataError("; ".join(problems))
        return Entry(name=self.names[index], image=image, mask=mask)

    def __getitem__(self, index: int) -> Entry:
        entry = self.load(index)
        return self.transform(entry) if self.transform is not None else entry


def check_folder(
    root,
    images: str = "images",
    masks: str = "masks",
    num_classes: int | None = None,
    ignore_index: int = 255,
    image_mode: str = "RGB",
) -> tuple[int, list[str]]:
    """Fully decode every pair under root; returns (number of pairs, every problem found)."""
    try:
        pairs, problems = find_pairs(root, images, masks)
    except DataError as error:
        return 0, [str(error)]
    for _, image_path, mask_path in pairs:
        decoded = []
        for read, path in ((lambda p: read_image(p, image_mode), image_path), (read_mask, mask_path)):
            try:
                decoded.append(read(path))
            except DataError as error:
                problems.append(str(error))
        if len(decoded) == 2:
            problems += _pair_problems(image_path, decoded[0], mask_path, decoded[1], num_classes, ignore_index)
    return len(pairs), problems
