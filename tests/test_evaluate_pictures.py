"""Error pictures as a browser shows them: a strip of the scan above (dimmed to 128 + its mean / 2) and its errors
below (each code's colour over the dimmed scan), a white gap between; a 1-px curve that survives shrinking for the
page, each panel shrunk apart."""

import io

import numpy as np
import torch
from PIL import Image

from srforge.evaluate.pictures import COLORS, GAP, picture, png_bytes

IGNORE = 255
WHITE = (255, 255, 255)


def shown(entries: np.ndarray) -> np.ndarray:
    return np.asarray(Image.open(io.BytesIO(png_bytes(entries))).convert("RGB"))


def test_the_strip_is_the_dimmed_scan_above_each_code_in_its_colour_below():
    truth = torch.tensor([[0, 1, 1, 0, IGNORE], [0, 2, 0, 0, 0]], dtype=torch.uint8)
    pred = torch.tensor([[0, 1, 0, 1, 1], [0, 1, 0, 0, 0]], dtype=torch.uint8)
    image = torch.arange(30, dtype=torch.uint8).reshape(3, 2, 5) * 8
    full, small = picture(truth, pred, image, IGNORE, page_width=100)
    assert small is None
    rgb = shown(full)
    assert rgb.shape == (2 + GAP + 2, 5, 3) and (rgb[2 : 2 + GAP] == WHITE).all()
    grey = (128 + image.float().mean(0) * 0.5).int().numpy()
    assert (rgb[:2] == grey[..., None]).all()  # the scan, every pixel
    errors = rgb[2 + GAP :]
    assert tuple(errors[0, 1]) == COLORS[2] and tuple(errors[1, 1]) == COLORS[4]  # TP; wrong class is a miss
    assert tuple(errors[0, 2]) == COLORS[4] and tuple(errors[0, 3]) == COLORS[3] and tuple(errors[0, 4]) == COLORS[1]
    for y, x in ((0, 0), (1, 0), (1, 2), (1, 4)):
        assert tuple(errors[y, x]) == (grey[y, x],) * 3
    assert tuple(shown(picture(truth, pred, None, IGNORE, 100)[0])[0, 0]) == (235,) * 3  # no scan: blank grey


def test_a_1px_curve_survives_shrinking_for_the_page():
    truth = torch.zeros(4, 40, dtype=torch.uint8)
    truth[2] = 1
    pred = torch.zeros_like(truth)
    full, small = picture(truth, pred, None, IGNORE, page_width=10)
    assert shown(full).shape == (4 + GAP + 4, 40, 3) and shown(small).shape == (1 + 1 + 1, 10, 3)
    assert (shown(small)[2] == COLORS[4]).all()  # every block of the error panel holds a missed pixel
    assert (shown(small)[0] == 235).all()  # the scan panel: no colour leaks into it
