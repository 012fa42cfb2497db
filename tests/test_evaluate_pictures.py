"""Error pictures as a browser shows them: the palette PNG decoded to RGB has each code's colour, the scan beneath
dimmed to 128 + its mean / 2, and a 1-px curve that survives shrinking for the page."""

import io

import numpy as np
import torch
from PIL import Image

from srforge.evaluate.pictures import COLORS, picture, png_bytes

IGNORE = 255


def shown(entries: np.ndarray) -> np.ndarray:
    return np.asarray(Image.open(io.BytesIO(png_bytes(entries))).convert("RGB"))


def test_every_code_has_its_colour_over_the_dimmed_scan():
    truth = torch.tensor([[0, 1, 1, 0, IGNORE], [0, 2, 0, 0, 0]], dtype=torch.uint8)
    pred = torch.tensor([[0, 1, 0, 1, 1], [0, 1, 0, 0, 0]], dtype=torch.uint8)
    image = torch.arange(30, dtype=torch.uint8).reshape(3, 2, 5) * 8
    full, small = picture(truth, pred, image, IGNORE, page_width=100)
    assert small is None
    rgb = shown(full)
    assert tuple(rgb[0, 1]) == COLORS[2] and tuple(rgb[1, 1]) == COLORS[4]  # TP; wrong class is a miss
    assert tuple(rgb[0, 2]) == COLORS[4] and tuple(rgb[0, 3]) == COLORS[3] and tuple(rgb[0, 4]) == COLORS[1]
    grey = 128 + image.float().mean(0) * 0.5
    for y, x in ((0, 0), (1, 0), (1, 2), (1, 4)):
        assert tuple(rgb[y, x]) == (int(grey[y, x]),) * 3
    assert tuple(shown(picture(truth, pred, None, IGNORE, 100)[0])[0, 0]) == (235,) * 3  # no scan: blank grey


def test_a_1px_curve_survives_shrinking_for_the_page():
    truth = torch.zeros(4, 40, dtype=torch.uint8)
    truth[2] = 1
    pred = torch.zeros_like(truth)
    full, small = picture(truth, pred, None, IGNORE, page_width=10)
    assert shown(full).shape == (4, 40, 3) and shown(small).shape == (1, 10, 3)
    assert (shown(small)[0] == COLORS[4]).all()  # every block holds a missed pixel
