"""Ink on paper: each pixel as its darkness against the scan's own paper, in its darkest channel.

Scans of ink on paper differ most in what says nothing about where the ink is: the paper's tint and brightness, and
the ink's colour. A red curve on pink paper and a black one on white paper are the same curve. :func:`ink_image`
maps each scan to one value a pixel, the same for both:

    paper[b, c]   the PAPER_PERCENTILE-th percentile of channel c over scan b's valid pixels (paper covers most
                  of a scan; ink, grid and text a minority, so a high percentile is the paper's colour)
    ink[b, h, w]  min over c of image[b, c, h, w] / paper[b, c], at most 1: 1 on paper, towards 0 on ink of any
                  colour (a red curve is dark in green and blue, a blue one in red)

The percentile comes from a 256-bin histogram of the 8-bit values (float images are quantised to 1/255 for it):
one pass over the scan, exact, and exported to ONNX as ScatterElements(add) and CumSum. Padding never counts: the
valid pixels are ``mask``'s (srforge.geometry.level_mask), or all of them without one.

The paper is the input's own: a scan tiled by the Predictor (larger than its pixel budget) or cut by ``data.crop``
gets one per tile or crop, close to the scan's where the paper is even.

Measured on well-log scans another renderer drew (docs/performance.md, "Transfer to scans srforge did not draw"):
a model trained on srforge's generator with ``UNet(ink=True)`` scores 0.599 foreground IoU on the same well
against 0.541 reading colours, 0.769 against 0.690 on srforge's own held-out scans; on the other well 0.396 ±
0.050 against 0.373, within the seeds' spread. For scans that are not ink on paper (microscopy, photographs),
colour is information: leave it off.
"""

from __future__ import annotations

import torch

from srforge.models.contract import unit_image

PAPER_PERCENTILE = 0.9  # in tenths: paper_colour compares in integers
LEVELS = 256  # 8-bit values: one histogram bin each


def paper_colour(levels: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """levels int64 [B, C, N] in 0..255, valid [B, 1, N] (1 valid, 0 padding) -> [B, C] int64: each scan's and
    channel's PAPER_PERCENTILE-th percentile over its valid pixels (the lowest level at or below which that share of
    them lie; 0 for a scan without valid pixels). Counts are int64, so the percentile is exact at any size (float32
    counts stop counting at 2**24 pixels a level)."""
    b, c, n = levels.shape
    weights = valid.to(torch.int64).expand(b, c, n).reshape(b * c, n)
    counts = torch.zeros(b * c, LEVELS, dtype=torch.int64, device=levels.device)
    counts = counts.scatter_add(1, levels.reshape(b * c, n), weights)  # [B*C, 256] valid pixels per level
    below = torch.cumsum(counts, dim=1)
    # The first level whose cumulative count reaches the share: the number of levels that fall short of it
    # (below / total < 9 / 10, in integers).
    tenths = round(PAPER_PERCENTILE * 10)
    return (below * 10 < tenths * below[:, -1:]).sum(dim=1).reshape(b, c)


def ink_image(image: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
    """image [B, C, H, W] uint8 (0..255) or float (0..1), mask [B, 1, H, W] (1 valid, 0 padding) or None (all
    valid) -> float32 [B, C, H, W] in [0, 1]: each pixel's darkest channel against the scan's paper colour
    (:func:`paper_colour`), the same value in every channel, so that the model's own input normalisation and
    ``in_channels`` are unchanged."""
    b, c, h, w = image.shape
    x = unit_image(image, torch.float32, "the ink input")
    levels = image.long() if image.dtype == torch.uint8 else (x * 255.0).round().clamp(0, 255).long()
    valid = torch.ones(b, 1, h * w, device=image.device) if mask is None else mask.reshape(b, 1, h * w).float()
    paper = paper_colour(levels.reshape(b, c, h * w), valid).float().clamp_min(1.0) / 255.0  # [B, C]
    darkest = (x / paper[:, :, None, None]).amin(dim=1, keepdim=True).clamp(0.0, 1.0)  # [B, 1, H, W]
    return darkest.expand(b, c, h, w)
