"""Error pictures: a scan with its true positives, false positives and false negatives in three colours.

Every foreground pixel (class != 0) of the truth or the prediction gets a code: TP (predicted its true class),
FP (predicted foreground where the truth is background), FN (a true foreground pixel given another class: missed,
or the wrong class); pixels the mask leaves unlabelled (ignore_index) are grey. The scan shows beneath, dimmed.
A picture wider than the page is shrunk for it by an integer factor, each code by max-pooling over its block
(FN over FP over TP over ignored), so that a 1-px curve stays visible at any factor.
"""

from __future__ import annotations

import math

import numpy as np
import torch

# code -> RGB, in the order of priority when shrinking (the higher code wins a block)
COLORS = {1: (150, 150, 150), 2: (44, 160, 44), 3: (230, 120, 0), 4: (30, 110, 230)}
LEGEND = {"true positive": COLORS[2], "false positive": COLORS[3], "false negative": COLORS[4], "ignored": COLORS[1]}


def error_codes(truth: torch.Tensor, pred: torch.Tensor, ignore_index: int) -> torch.Tensor:
    """uint8 [H, W]: 0 true and predicted background, 1 ignored, 2 TP, 3 FP, 4 FN (truth, pred [H, W] ids)."""
    truth, pred = truth.long(), pred.long()
    codes = torch.zeros(truth.shape, dtype=torch.uint8)
    codes[(pred != 0) & (truth == 0)] = 3
    codes[(truth != 0) & (pred != truth)] = 4
    codes[(truth != 0) & (pred == truth)] = 2
    codes[truth == ignore_index] = 1
    return codes


def colourise(codes: torch.Tensor, image: torch.Tensor | None) -> np.ndarray:
    """uint8 [H, W, 3]: the scan [3, H, W] (or white) dimmed to grey, each code's colour over it."""
    if image is None:
        base = torch.full((*codes.shape, 3), 235, dtype=torch.uint8)
    else:
        grey = image.float().mean(0)
        base = (128 + grey * 0.5).clamp(0, 255).to(torch.uint8)[..., None].expand(*codes.shape, 3).clone()
    for code, colour in COLORS.items():
        base[codes == code] = torch.tensor(colour, dtype=torch.uint8)
    return base.numpy()


def shrink(codes: torch.Tensor, image: torch.Tensor | None, factor: int) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(codes max-pooled, image average-pooled) by ``factor`` in both directions (partial blocks kept)."""
    pool = {"kernel_size": factor, "stride": factor, "ceil_mode": True}
    small = torch.nn.functional.max_pool2d(codes[None, None].float(), **pool)[0, 0].to(torch.uint8)
    if image is not None:
        image = torch.nn.functional.avg_pool2d(image[None].float(), **pool)[0].round().to(torch.uint8)
    return small, image


def picture(
    truth: torch.Tensor, pred: torch.Tensor, image: torch.Tensor | None, ignore_index: int, page_width: int
) -> tuple[np.ndarray, np.ndarray | None]:
    """(the full-size picture [H, W, 3], the picture shrunk to at most ``page_width`` px wide, or None when the
    full one fits)."""
    if image is not None and tuple(image.shape[-2:]) != tuple(truth.shape):
        image = None  # a scan of another size than its mask: the picture shows the masks alone
    codes = error_codes(truth, pred, ignore_index)
    full = colourise(codes, image)
    width = codes.shape[1]
    if width <= page_width:
        return full, None
    small_codes, small_image = shrink(codes, image, math.ceil(width / page_width))
    return full, colourise(small_codes, small_image)
