"""Helpers shared by the tests: deep comparison, tiny images and masks written to disk."""

from collections.abc import Mapping
from pathlib import Path

import numpy as np
import torch
from PIL import Image


def same(a, b) -> bool:
    """Deep equality that compares tensors by dtype, shape and values, and Entries by batch state too."""
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return (
            isinstance(a, torch.Tensor)
            and isinstance(b, torch.Tensor)
            and a.dtype == b.dtype
            and a.shape == b.shape
            and bool(torch.equal(a, b))
        )
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return isinstance(a, np.ndarray) and isinstance(b, np.ndarray) and a.dtype == b.dtype and np.array_equal(a, b)
    if isinstance(a, Mapping):
        if type(a) is not type(b) or list(a.keys()) != list(b.keys()):
            return False
        if getattr(a, "is_batched", None) != getattr(b, "is_batched", None):
            return False
        return all(same(a[k], b[k]) for k in a.keys())
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    return type(a) is type(b) and a == b


def write(path: Path, array: np.ndarray, mode: str | None = None, palette: list[int] | None = None) -> Path:
    """Save an array as an image file (format from the suffix), creating folders; returns the path."""
    path.parent.mkdir(parents=True, exist_ok=True)
    image = Image.fromarray(array, mode) if mode else Image.fromarray(array)
    if palette is not None:
        image.putpalette(palette)
    image.save(path)
    return path


def rgb(h: int, w: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (h, w, 3), dtype=np.uint8)


def labels(h: int, w: int, classes: int = 3, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, classes, (h, w), dtype=np.uint8)


def scan_folder(root: Path, n: int = 8) -> Path:
    """``n`` image/mask pairs of 18-22 x 24-59 px under ``root`` (deep enough for model.depth's default check)."""
    for i in range(n):
        h, w = 18 + i % 5, 24 + 5 * i
        write(root / "images" / f"s{i}.png", rgb(h, w, i))
        write(root / "masks" / f"s{i}.png", labels(h, w, 2, i))
    return root


def odd_scans(folder: Path) -> dict[str, tuple[int, int]]:
    """Three RGB scans of sizes that are no multiple of 4, as PNG; {name: (H, W)}."""
    sizes = {"a": (19, 30), "b": (22, 41), "c": (13, 9)}
    for i, (name, (h, w)) in enumerate(sizes.items()):
        write(folder / f"{name}.png", rgb(h, w, i))
    return sizes
