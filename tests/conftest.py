"""Fixtures that write tiny image/mask folders (tens of pixels) in every supported format."""

from pathlib import Path

import pytest
from helpers import labels, rgb, write


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
