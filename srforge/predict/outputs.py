"""One scan's files in the prediction output folder: where they go, when they are complete, how they are written.

Under the output folder::

    masks/<rel>.png           class ids, uint8 PNG mode 'L', exactly the scan's (H, W)
    overlays/<rel>.png        the scan with every non-background class drawn over it     (overlay)
    probabilities/<rel>.npy   float16 [K, H, W] softmax probabilities (np.load)           (probabilities)

and the run's report beside them (srforge.predict.report).

<rel> is the member's relative path without its suffix. Every file is written to a hidden temporary name
in its folder and renamed over the final name (os.replace), so a kill never leaves a truncated output; a
rerun treats a scan as done when each of its outputs decodes and has the scan's size.

Nothing here knows about models: :mod:`srforge.predict.pipeline` decides what to predict, this module owns the
files of each scan.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
from PIL import Image
from torchvision.utils import draw_segmentation_masks

from srforge.atomic import as_disk_full, atomic_write
from srforge.data.naming import scan_stem

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


def output_paths(out_dir: Path, name: str) -> dict[str, Path]:
    """Where scan ``name`` (a safe relative path) writes each output."""
    stem = scan_stem(name)  # the key ScanArchive checks for clashes: scan.v1.tif and scan.v2.tif stay apart
    return {
        "mask": out_dir / "masks" / f"{stem}.png",
        "overlay": out_dir / "overlays" / f"{stem}.png",
        "probabilities": out_dir / "probabilities" / f"{stem}.npy",
    }


def read_complete(path: Path, size: tuple[int, int], mode: str) -> np.ndarray | None:
    """The image at path as an array if it decodes fully, in PIL ``mode``, at ``size`` (H, W); else None."""
    try:
        with Image.open(path) as image:
            image.load()
            if image.mode != mode or image.size != (size[1], size[0]):
                return None
            return np.asarray(image)
    except (OSError, ValueError, SyntaxError):  # missing, a folder, a name too long, truncated, not an image
        return None


def _npy_complete(path: Path, shape: tuple[int, ...]) -> bool:
    try:
        return np.load(path, mmap_mode="r").shape == shape
    except (OSError, ValueError):
        return False


def finished_mask(paths: dict[str, Path], size: tuple[int, int], k: int, wanted: Sequence[str]) -> np.ndarray | None:
    """The finished mask uint8 [H, W] when every wanted output of a scan is complete, else None."""
    mask = read_complete(paths["mask"], size, "L")
    if mask is None or ("overlay" in wanted and read_complete(paths["overlay"], size, "RGB") is None):
        return None
    if "probabilities" in wanted and not _npy_complete(paths["probabilities"], (k, *size)):
        return None
    return mask


def class_fractions(mask: np.ndarray, num_classes: int) -> list[float]:
    """Fraction of the pixels of ``mask`` (uint8 [H, W]) in each class, [K] summing to 1."""
    counts = np.bincount(mask.ravel(), minlength=num_classes)[:num_classes]
    return [round(float(c) / mask.size, 6) for c in counts]


def draw_overlay(image: torch.Tensor, mask: torch.Tensor, num_classes: int) -> torch.Tensor:
    """The scan [C, H, W] uint8 as RGB with classes 1..K-1 of ``mask`` [H, W] drawn at half opacity -> [3, H, W]."""
    rgb = image[:3] if image.shape[0] >= 3 else image[:1].expand(3, -1, -1)
    if image.is_floating_point():
        rgb = (rgb.clamp(0, 1) * 255).round().to(torch.uint8)
    classes = torch.arange(1, num_classes)[:, None, None]
    colors = [_COLORS[(c - 1) % len(_COLORS)] for c in range(1, num_classes)]
    return draw_segmentation_masks(rgb, mask[None] == classes, alpha=0.5, colors=colors)


def write_png(path: Path, array: np.ndarray, mode: str) -> None:
    """Write ``array`` ([H, W] for 'L', [H, W, 3] for 'RGB') as a PNG at ``path``, atomically."""
    atomic_write(path, lambda f: Image.fromarray(array, mode).save(f, format="PNG"))


def write_scan(
    paths: dict[str, Path],
    mask: np.ndarray,
    num_classes: int,
    image: torch.Tensor | None = None,
    probabilities: np.ndarray | None = None,
) -> list[float]:
    """Write a scan's mask (uint8 [H, W]) and, when given, its overlay (from ``image`` [C, H, W]) and
    probabilities (float16 [K, H, W]); returns its class fractions. Raises what writing raises, ENOSPC as
    DiskFullError."""
    try:
        if probabilities is not None:
            atomic_write(paths["probabilities"], lambda f: np.save(f, probabilities))
        if image is not None:
            drawn = draw_overlay(image, torch.from_numpy(mask).long(), num_classes)
            write_png(paths["overlay"], drawn.permute(1, 2, 0).contiguous().numpy(), "RGB")
        write_png(paths["mask"], mask, "L")  # last: a complete mask is what marks the scan done
    except OSError as error:
        raise as_disk_full(error, paths["mask"].parents[1]) from error
    return class_fractions(mask, num_classes)
