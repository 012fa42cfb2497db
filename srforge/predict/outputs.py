"""One scan's files in the prediction output folder: where they go, whose they are, when they are complete, how
they are written.

Under the output folder::

    masks/<rel>.png           class ids, uint8 PNG mode 'L', exactly the scan's (H, W)
    overlays/<rel>.png        the scan with every non-background class drawn over it     (overlay)
    probabilities/<rel>.npy   float16 [K, H, W] softmax probabilities (np.load)           (probabilities)

and the run's report beside them (srforge.predict.report).

<rel> is the member's relative path without its suffix. Every file is written to a hidden temporary name
in its folder and renamed over the final name (os.replace), so a kill never leaves a truncated output.

Every file carries srforge's mark, naming the model that wrote it (:func:`srforge.predict.predictor.fingerprint`):
a PNG a ``tEXt`` chunk ``srforge`` = ``model=<fingerprint>`` before its pixels, a ``.npy`` the line
``srforge model=<fingerprint>`` after its array (np.load reads the header and exactly the array's bytes, so the
array is unchanged for it). The mark is written with the file, in one atomic rename, so it survives a kill at
any moment and needs no shared record between the processes of a run. It is how srforge tells its own files from
someone else's (ground-truth masks in a folder given as --output): a file without it is never overwritten (unless
the last report lists its scan as predicted: srforge wrote it and something damaged it since, see
srforge.predict.report.PastReport), and a rerun treats a scan as done only when each of its outputs bears the
mark of the model predicting now, decodes and has the scan's size.

Nothing here knows about models but the fingerprint it marks files with: :mod:`srforge.predict.pipeline` decides
what to predict, this module owns the files of each scan.
"""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import torch
from PIL import Image, PngImagePlugin

from srforge.atomic import as_disk_full, atomic_write
from srforge.data.naming import scan_stem
from srforge.predict.mask_png import gray_png

_COLORS = [
    (230, 25, 75),
    (60, 180, 75),
    (0, 130, 200),
    (245, 130, 48),
    (145, 30, 180),
    (70, 240, 240),
    (240, 50, 230),
    (210, 245, 60),
    (250, 190, 212),
    (0, 128, 128),
]


MARK = "srforge"  # the PNG text key of srforge's mark
_NPY_MARK = re.compile(rb"\nsrforge model=([0-9a-f]{1,64})\n\Z")
_NPY_TAIL = 128  # bytes read from the end of a .npy to find its mark


def output_paths(out_dir: Path, name: str) -> dict[str, Path]:
    """Where scan ``name`` (a safe relative path) writes each output."""
    stem = scan_stem(name)  # the key ScanArchive checks for clashes: scan.v1.tif and scan.v2.tif stay apart
    return {
        "mask": out_dir / "masks" / f"{stem}.png",
        "overlay": out_dir / "overlays" / f"{stem}.png",
        "probabilities": out_dir / "probabilities" / f"{stem}.npy",
    }


def _png_model(image: Image.Image) -> str | None:
    text = image.info.get(MARK)
    return text[len("model=") :] if isinstance(text, str) and text.startswith("model=") else None


def read_complete(path: Path, size: tuple[int, int], mode: str, model: str | None = None) -> np.ndarray | None:
    """The image at path as an array if it decodes fully, in PIL ``mode``, at ``size`` (H, W), and (when ``model``
    is given) bears the mark of that model; else None."""
    try:
        with Image.open(path) as image:
            if model is not None and _png_model(image) != model:
                return None
            image.load()
            if image.mode != mode or image.size != (size[1], size[0]):
                return None
            return np.asarray(image)
    except (OSError, ValueError, SyntaxError):  # missing, a folder, a name too long, truncated, not an image
        return None


def _npy_model(path: Path) -> str | None:
    with open(path, "rb") as f:
        f.seek(max(0, f.seek(0, os.SEEK_END) - _NPY_TAIL))
        found = _NPY_MARK.search(f.read())
    return found.group(1).decode() if found else None


def _npy_complete(path: Path, shape: tuple[int, ...], model: str) -> bool:
    try:
        return _npy_model(path) == model and np.load(path, mmap_mode="r").shape == shape
    except (OSError, ValueError):
        return False


def model_of(path: Path) -> str | None:
    """The fingerprint in srforge's mark of the output file at ``path`` (a PNG or a .npy), or None: no such file,
    or one without the mark (srforge did not write it, or it was cut short before the mark)."""
    try:
        if path.suffix == ".npy":
            return _npy_model(path)
        with Image.open(path) as image:
            return _png_model(image)
    except (OSError, ValueError, SyntaxError):
        return None


def foreign_outputs(
    paths: dict[str, Path], wanted: Sequence[str], recorded: Callable[[], bool] | None = None
) -> list[Path]:
    """The files at the ``wanted`` output paths of a scan that srforge did not write: regular files without its
    mark, unless ``recorded()`` (asked only then: the last report lists the scan as predicted, so its files are
    srforge's, however damaged since), and anything else but a folder (a FIFO, a socket, a device). A folder is
    left to the write, which fails and names it."""
    foreign = []
    for kind in wanted:
        try:
            mode = os.lstat(paths[kind]).st_mode
        except OSError:  # missing (or unreachable: the write will say why)
            continue
        if stat.S_ISREG(mode):
            if model_of(paths[kind]) is None and not (recorded is not None and recorded()):
                foreign.append(paths[kind])
        elif not stat.S_ISDIR(mode):
            foreign.append(paths[kind])
    return foreign


def not_srforge(path: Path, out_dir: Path) -> str:
    """A failed row's error for a scan with a file srforge did not write at one of its output paths."""
    return (
        f"{path} is not a file srforge wrote (expected srforge's mark in it, found none, and the last report in "
        f"{out_dir} does not list this scan as predicted); srforge never overwrites it, not even with --overwrite. "
        "Move it out of the output folder to predict this scan, or choose another --output"
    )


def finished_mask(
    paths: dict[str, Path], size: tuple[int, int], k: int, wanted: Sequence[str], model: str
) -> np.ndarray | None:
    """The finished mask uint8 [H, W] when every wanted output of a scan is complete and bears ``model``'s mark,
    else None (outputs of another model are predicted again, never skipped)."""
    mask = read_complete(paths["mask"], size, "L", model)
    if mask is None or ("overlay" in wanted and read_complete(paths["overlay"], size, "RGB", model) is None):
        return None
    if "probabilities" in wanted and not _npy_complete(paths["probabilities"], (k, *size), model):
        return None
    return mask


def class_fractions(mask: np.ndarray, num_classes: int) -> list[float]:
    """Fraction of the pixels of ``mask`` (uint8 [H, W]) in each class, [K] summing to 1."""
    counts = np.bincount(mask.ravel(), minlength=num_classes)[:num_classes]
    return [round(float(c) / mask.size, 6) for c in counts]


def draw_overlay(image: torch.Tensor, mask: torch.Tensor, num_classes: int) -> torch.Tensor:
    """The scan [C, H, W] uint8 as RGB with classes 1..K-1 of ``mask`` [H, W] drawn at half opacity -> [3, H, W]."""
    from torchvision.utils import draw_segmentation_masks  # torchvision costs a process ~1 s: only overlays load it

    rgb = image[:3] if image.shape[0] >= 3 else image[:1].expand(3, -1, -1)
    if image.is_floating_point():
        rgb = (rgb.clamp(0, 1) * 255).round().to(torch.uint8)
    classes = torch.arange(1, num_classes)[:, None, None]
    colors = [_COLORS[(c - 1) % len(_COLORS)] for c in range(1, num_classes)]
    return draw_segmentation_masks(rgb, mask[None] == classes, alpha=0.5, colors=colors)


def write_png(path: Path, array: np.ndarray, mode: str, model: str | None = None) -> None:
    """Write ``array`` ([H, W] for 'L', [H, W, 3] for 'RGB') as a PNG at ``path``, atomically, with srforge's mark
    naming ``model`` (no mark when None). PIL writes RGB; gray (a mask) is :func:`srforge.predict.mask_png.gray_png`,
    about 3x faster on a mask for fewer bytes."""
    if mode == "L":
        text = {} if model is None else {MARK: f"model={model}"}
        png = gray_png(array, text)
        atomic_write(path, lambda f: f.write(png))
        return
    info = PngImagePlugin.PngInfo()
    if model is not None:
        info.add_text(MARK, f"model={model}")
    atomic_write(path, lambda f: Image.fromarray(array, mode).save(f, format="PNG", pnginfo=info))


def write_npy(path: Path, array: np.ndarray, model: str | None = None) -> None:
    """Write ``array`` as a .npy at ``path``, atomically, with srforge's mark after the array (no mark when None)."""

    def write(f) -> None:
        np.save(f, array)
        if model is not None:
            f.write(f"\nsrforge model={model}\n".encode())

    atomic_write(path, write)


def write_scan(
    paths: dict[str, Path],
    mask: np.ndarray,
    num_classes: int,
    image: torch.Tensor | None = None,
    probabilities: np.ndarray | None = None,
    model: str | None = None,
) -> list[float]:
    """Write a scan's mask (uint8 [H, W]) and, when given, its overlay (from ``image`` [C, H, W]) and
    probabilities (float16 [K, H, W]), each marked as written by ``model``; returns its class fractions. Raises
    what writing raises, ENOSPC as DiskFullError."""
    try:
        if probabilities is not None:
            write_npy(paths["probabilities"], probabilities, model)
        if image is not None:
            drawn = draw_overlay(image, torch.from_numpy(mask).long(), num_classes)
            write_png(paths["overlay"], drawn.permute(1, 2, 0).contiguous().numpy(), "RGB", model)
        write_png(paths["mask"], mask, "L", model)  # last: a complete mask is what marks the scan done
    except OSError as error:
        raise as_disk_full(error, paths["mask"].parents[1]) from error
    return class_fractions(mask, num_classes)
