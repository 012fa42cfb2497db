"""Text printed on a scan, over the curves: depth numbers, track names with their scale values, header text,
depth labels inside the tracks. Text never changes the mask (it is not a curve)."""

from __future__ import annotations

import numpy as np
from PIL import Image, ImageDraw

from srforge.synthetic.draw import HEADER_WORDS, TRACK_NAMES, font
from srforge.synthetic.style import ScanStyle


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
        for k, (name, lo, hi, _) in enumerate(names[track][:2]):
            x = x0 + int(rng.integers(0, max(1, style.width // 4)))
            text = f"{_number(lo)}  {name}  {_number(hi)}"
            y = min(style.header - size, 1 + k * size)
            draw.text((x, max(0, y)), text, fill=ink, font=face)


def _panel(rng, draw, style: ScanStyle, names: dict[int, list], ink) -> None:
    """The heading panel at the left: the well's name large, then curve names and scales in smaller type."""
    lines = [" ".join(HEADER_WORDS[k] for k in rng.integers(0, len(HEADER_WORDS), int(rng.integers(1, 3))))]
    lines += [f"{name} {_number(lo)} - {_number(hi)}" for track in sorted(names) for name, lo, hi, _ in names[track]]
    y, size = 1, int(rng.integers(style.font_px, max(style.font_px, style.height // 4) + 1))
    for text in lines:
        if y + size > style.height - 1:
            break
        draw.text((2, y), text, fill=ink, font=font(max(5, size)))
        y += size + int(rng.integers(0, 4))
        size = max(5, int(size * rng.uniform(0.6, 1.0)))


def _turned_text(rgb: Image.Image, at: tuple[int, int], text: str, fill, face, rows: int) -> None:
    """``text`` turned 90 degrees (reading upward) with its top-left at ``at``, cut to ``rows`` rows."""
    left, top, right, bottom = face.getbbox(text)
    glyphs = Image.new("L", (max(1, right), max(1, bottom)))
    ImageDraw.Draw(glyphs).text((0, 0), text, fill=255, font=face)
    glyphs = glyphs.rotate(90, expand=True).crop((0, 0, max(1, bottom), max(1, min(rows, right))))
    rgb.paste(Image.new("RGB", glyphs.size, fill), at, glyphs)


def _curve_labels(rng, rgb: Image.Image, draw, style: ScanStyle, names: dict[int, list]) -> None:
    """Each curve's name (and unit or scale) repeated along its track every curve_labels px, in the curve's ink
    or the text's, over the curves."""
    face = font(style.font_px)
    for track, curves in names.items():
        top, bottom = style.tracks[track]
        if bottom - top < style.font_px + 2:
            continue
        for name, lo, hi, ink in curves:
            text = f"{name} ({_number(lo)}-{_number(hi)})" if rng.random() < 0.5 else name
            fill = tuple(int(c) for c in ink) if rng.random() < 0.7 else (20, 20, 20)
            x = style.panel + int(rng.integers(0, max(1, style.curve_labels)))
            turned = rng.random() < 0.33
            while x < style.width:
                y = int(rng.integers(top + 1, bottom - style.font_px))
                if turned:
                    _turned_text(rgb, (x, top + 1), text, fill, face, bottom - top - 1)
                else:
                    draw.text((x, y), text, fill=fill, font=face)
                x += style.curve_labels


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
    if style.panel:
        _panel(rng, draw, style, names, ink)
    if style.curve_labels:
        _curve_labels(rng, rgb, draw, style, names)
    h, w = style.height, style.width
    face = font(style.font_px)
    for k in range(style.inside_labels):
        if w > 100 and h > style.header + style.font_px + 2:
            at = (int(rng.integers(w - 60)), int(rng.integers(style.header, h - style.font_px - 1)))
            draw.text(at, str(depth0 + 5 * step * k), fill=ink, font=face)
