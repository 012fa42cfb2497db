"""Error pictures: a strip of two panels, the scan above and its true positives, false positives and false
negatives in three colours over it below (GAP px of white between them).

Every foreground pixel (class != 0) of the truth or the prediction gets a code: TP (predicted its true class),
FP (predicted foreground where the truth is background), FN (a true foreground pixel given another class: missed,
or the wrong class); pixels the mask leaves unlabelled (ignore_index) are grey. The scan shows beneath, dimmed
to grey (128 + its mean / 2). A picture wider than the page is shrunk for it by an integer factor, each code by
max-pooling over its block (FN over FP over TP over ignored), so that a 1-px curve stays visible at any factor, the
grey by averaging; the two panels are shrunk apart, so no block mixes them.

A picture is a palette PNG: one byte a pixel, the 128 greys of the dimmed scan then the four colours, compressed
by Huffman codes alone (zlib's Z_HUFFMAN_ONLY: the dimmed scan's grain leaves little for string matching to find,
so it is both faster and smaller than an RGB PNG at zlib's default).
"""

from __future__ import annotations

import io
import math
import zlib

import numpy as np
import torch
from PIL import Image

# code -> RGB, in the order of priority when shrinking (the higher code wins a block)
COLORS = {1: (150, 150, 150), 2: (44, 160, 44), 3: (230, 120, 0), 4: (30, 110, 230)}
LEGEND = {"true positive": COLORS[2], "false positive": COLORS[3], "false negative": COLORS[4], "ignored": COLORS[1]}
GREYS = 128  # palette entries 0..127: the greys 128..255 of the dimmed scan; entry GREYS - 1 + code: a code
BLANK = 235 - 128  # the entry of the grey (235) under a picture without its scan
WHITE = GREYS - 1  # the entry of white (255): the gap between the panels
GAP = 2  # px between the panels (a shrunk strip keeps 1 at least)
PALETTE = [v for i in range(GREYS) for v in (128 + i,) * 3] + [v for code in sorted(COLORS) for v in COLORS[code]]


def error_codes(truth: torch.Tensor, pred: torch.Tensor, ignore_index: int) -> torch.Tensor:
    """uint8 [H, W]: 0 true and predicted background, 1 ignored, 2 TP, 3 FP, 4 FN (truth, pred [H, W] ids)."""
    t, p = truth.numpy(), pred.numpy()  # numpy keeps uint8 results uint8: half the time of torch.where here
    code = np.uint8
    codes = np.where(t != 0, np.where(p == t, code(2), code(4)), np.where(p != 0, code(3), code(0)))
    codes[t == ignore_index] = 1  # an ignore_index the dtype cannot hold is nowhere
    return torch.from_numpy(codes)


def greys(image: torch.Tensor | None, shape) -> torch.Tensor:
    """uint8 [H, W] palette entries of the scan [C, H, W] dimmed to grey, 128 + its mean / 2 (or a blank grey)."""
    if image is None:
        return torch.full(tuple(shape), BLANK, dtype=torch.uint8)
    return torch.div(image.sum(0, dtype=torch.int32), 2 * image.shape[0], rounding_mode="floor").to(torch.uint8)


def colourise(codes: torch.Tensor, grey: torch.Tensor) -> np.ndarray:
    """uint8 [H, W] palette entries (PALETTE): each code's colour over the grey entries of the scan."""
    return torch.where(codes > 0, codes + (GREYS - 1), grey).numpy()


def shrink(codes: torch.Tensor, grey: torch.Tensor, factor: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(codes max-pooled, grey entries average-pooled) by ``factor`` in both directions (partial blocks kept)."""
    pool = {"kernel_size": factor, "stride": factor, "ceil_mode": True}
    small = torch.nn.functional.max_pool2d(codes[None, None].float(), **pool)[0, 0].to(torch.uint8)
    grey = torch.nn.functional.avg_pool2d(grey[None, None].float(), **pool)[0, 0].round().to(torch.uint8)
    return small, grey


def strip(codes: torch.Tensor, grey: torch.Tensor, factor: int) -> np.ndarray:
    """uint8 [2 h + gap, w] PALETTE entries: the scan's greys above, the codes over them below, each panel shrunk
    by ``factor`` (1: not at all), a white gap of ceil(GAP / factor) rows between them."""
    if factor > 1:
        small_codes, small_grey = shrink(codes, grey, factor)
        scan = shrink(torch.zeros_like(codes), grey, factor)[1]
    else:
        small_codes, small_grey, scan = codes, grey, grey
    gap = np.full((math.ceil(GAP / factor), small_grey.shape[1]), WHITE, dtype=np.uint8)
    return np.concatenate([scan.numpy(), gap, colourise(small_codes, small_grey)])


def picture(
    truth: torch.Tensor, pred: torch.Tensor, image: torch.Tensor | None, ignore_index: int, page_width: int
) -> tuple[np.ndarray, np.ndarray | None]:
    """(the full-size strip [2 H + GAP, W], the strip shrunk to at most ``page_width`` px wide, or None when the
    full one fits), as PALETTE entries (truth, pred [H, W] class ids, image [C, H, W] or None)."""
    if image is not None and tuple(image.shape[-2:]) != tuple(truth.shape):
        image = None  # a scan of another size than its mask: the picture shows the masks alone
    codes = error_codes(truth, pred, ignore_index)
    grey = greys(image, codes.shape)
    width = codes.shape[1]
    if width <= page_width:
        return strip(codes, grey, 1), None
    return strip(codes, grey, 1), strip(codes, grey, math.ceil(width / page_width))


def png_bytes(entries: np.ndarray) -> bytes:
    """A picture's PALETTE entries [H, W] as a palette PNG."""
    buffer = io.BytesIO()
    image = Image.fromarray(entries, "P")
    image.putpalette(PALETTE)
    image.save(buffer, format="PNG", compress_level=1, compress_type=zlib.Z_HUFFMAN_ONLY)
    return buffer.getvalue()
