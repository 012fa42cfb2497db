"""Text printed on a scan, over the curves: depth numbers, track names with their scale values, header text,
depth labels inside the tracks. Text never changes the mask (it is not a curve)."""

from __future__ import annotations

import numpy as np
from PIL import Image, ImageDraw

from srforge.data.synthetic.draw import HEADER_WORDS, TRACK_NAMES, font
from srforge.data.synthetic.style import ScanStyle


def _ink(rng, style: ScanStyle) -> tuple[int, ...]:
    if not style.randomised or rng.random() < 0.5:
        return tuple(int(c) for c in np.asarray(style.grid_ink) * 0.5)
    return tuple(int(c) for c in rng.uniform(0, 60, 3))


def _number(value: float) -> str:
    return f"{value:.0f}" if abs(value) >= 10 else f"{value:.2g}"


def _header(rng, draw, style: ScanStyle, names: dict[int, list], ink) -> None:
    """Track names and their scale values in the header strip; header words at its left."""
    size = max(5, min(style.font_px, style.header - 1))
    face = font(size)
    x0 = 4
    if style.header_text:
        words = " ".join(HEADER_WORDS[k] for k in rng.integers(0, len(HEADER_WORDS), int(rng.integers(1, 5))))
        draw.text((x0, 1), words, fill=ink, font=face)
        x0 += int(draw.textlength(words, font=face)) + 12
    for track in sorted(names):
        for k, (name, lo, hi) in enumerate(names[track][:2]):
            x = x0 + int(rng.integers(0, max(1, style.width // 4)))
            text = f"{_number(lo)}  {name}  {_number(hi)}"
            y = min(style.header - size, 1 + k * size)
            draw.text((x, max(0, y)), text, fill=ink, font=face)


def labels(rng, rgb: Image.Image, style: ScanStyle, heavy: np.ndarray, names: dict[int, list]) -> None:
    """Depth numbers at the heavy grid lines, track names and scale values, header words, and a few depth
    numbers printed inside the tracks (over the curves). ``names``: track -> [(name, lo, hi)] of its curves.
    Scans too small for the font (the classic look's 11 px) go without."""
    if not style.labels:
        return
    draw = ImageDraw.Draw(rgb)
    ink = _ink(rng, style)
    depth0, step = int(rng.integers(100, 9000)), int(rng.choice((1, 2, 5, 10, 20, 50)))
    if style.header >= 12 or (style.randomised and style.header >= 6):
        face = font(max(5, min(style.font_px, style.header - 1)))
        for k, x in enumerate(heavy):
            draw.text((int(x) + 2, 1), str(depth0 + step * k), fill=ink, font=face)
        if style.randomised:
            _header(rng, draw, style, names, ink)
        else:
            for top, _ in style.tracks:
                draw.text((4, top + 2), TRACK_NAMES[rng.integers(len(TRACK_NAMES))], fill=ink, font=font(11))
    h, w = style.height, style.width
    face = font(style.font_px)
    for k in range(style.inside_labels):
        if w > 100 and h > style.header + style.font_px + 2:
            at = (int(rng.integers(w - 60)), int(rng.integers(style.header, h - style.font_px - 1)))
            draw.text(at, str(depth0 + 5 * step * k), fill=ink, font=face)
