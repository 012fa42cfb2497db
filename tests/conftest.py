"""Fixtures that write tiny image/mask folders (tens of pixels) in every supported format."""

from pathlib import Path

import numpy as np
import pytest
from PIL import Image


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


@pytest.fixture
def make_pair(tmp_path):
    """make_pair(name, image_array, mask_array, image_suffix=".png", root=tmp_path) writes one pair."""

    def make(name, image, mask, image_suffix=".png", root=None, mode=None):
        root = Path(root or tmp_path)
        write(root / "images" / f"{name}{image_suffix}", image, mode)
        if mask is not None:
            write(root / "masks" / f"{name}.png", mask)
        return root

    return make


@pytest.fixture
def folder(make_pair):
    """Three RGB PNG pairs of different sizes with 3-class masks."""
    for i, (h, w) in enumerate([(12, 20), (16, 9), (7, 30)]):
        root = make_pair(f"scan_{i}", rgb(h, w, i), labels(h, w, seed=i))
    return root
