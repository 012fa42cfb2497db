"""Drawing a scan's layers: paper, the depth grid, tracks and their scale lines, the curves (their own layer: the
mask is its coverage), and text over everything (depth numbers, track names, header text).

Depth runs along the width. Images are float32 [H, W, 3] in 0-255 until the scanner turns them into bytes.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np
from PIL import Image, ImageDraw, ImageFont

from srforge.synthetic.style import STYLES, CurveLook, ScanStyle

TRACK_NAMES = ("GR", "SP", "CALI", "ILD", "ILM", "SFL", "RHOB", "NPHI", "DT", "PEF", "LLD", "MSFL", "NEUT", "DRHO")
HEADER_WORDS = ("COMPANY", "WELL", "FIELD", "COUNTY", "STATE", "RUN", "DATE", "DEPTH", "SCALE", "LOGGED", "BIT",
                "CASING", "MUD", "RM", "BHT", "FT", "M", "1:200", "1:500", "OHMM", "API", "US/F", "G/CC")  # fmt: skip


@dataclass(frozen=True)
class PlottedCurve:
    """One curve placed on its track: track index, x px [N], position across the track in [0, 1] [N] (NaN where
    missing), wrap count [N] (the line breaks where it changes), its name and scale values (lo, hi)."""

    track: int
    x: np.ndarray
    position: np.ndarray
    turns: np.ndarray
    name: str
    lo: float
    hi: float


def _smooth_field(rng, height: int, width: int, cells: int) -> np.ndarray:
    """Low-frequency noise in about [-1, 1]: a coarse random grid resized bilinearly. float32 [H, W]"""
    coarse = rng.standard_normal((max(2, height * cells // max(height, width) + 2), cells + 2)).astype(np.float32)
    small = Image.fromarray(coarse, mode="F").resize((width, height), Image.Resampling.BILINEAR)
    return np.asarray(small) / 1.5


def paper(rng, style: ScanStyle) -> np.ndarray:
    """Paper tone, its texture (fibres, uneven tone) and grain. float32 [H, W, 3]"""
    h, w = style.height, style.width
    image = np.empty((h, w, 3), np.float32)
    image[:] = np.asarray(style.paper, np.float32)
    if style.texture > 0:
        image *= (1 + style.texture / 255 * _smooth_field(rng, h, w, int(rng.integers(8, 60))))[..., None]
    image += rng.standard_normal((h, w, 1), dtype=np.float32) * style.grain
    return image


def _blend(image: np.ndarray, index, ink: np.ndarray, alpha: float) -> None:
    image[index] = image[index] * (1 - alpha) + ink * alpha


def grid(rng, image: np.ndarray, style: ScanStyle) -> np.ndarray:
    """Depth lines every grid_step columns, heavier every heavy_every-th; returns the heavy lines' columns."""
    w = image.shape[1]
    ink = np.asarray(style.grid_ink, np.float32)
    columns = np.arange(int(rng.integers(style.grid_step)), w, style.grid_step)
    columns = columns[columns >= style.panel]
    heavy = columns[:: style.heavy_every] if style.heavy_every else columns[:0]
    rows = np.arange(image.shape[0])
    if style.grid_dotted:
        rows = rows[rows % 3 != 2]
    for offset in range(style.grid_width):
        _blend(image, np.ix_(rows, np.minimum(columns + offset, w - 1)), ink, style.grid_strength)
    if not style.randomised:  # the classic heavy line: darker where the scan is larger
        _blend(image, (slice(None), heavy), ink, 0.5 + 0.5 * min(1.0, style.grid_strength / 0.6))
        return heavy
    for offset in range(style.heavy_width):
        _blend(image, (slice(None), np.minimum(heavy + offset, w - 1)), ink, min(1.0, style.grid_strength * 1.5))
    return heavy


def _scale_rows(top: int, bottom: int, divisions: int, decades: int, flip: bool) -> np.ndarray:
    """Rows of a track's scale lines: even divisions, or each decade with its minor lines (2-9)."""
    if not decades:
        return np.linspace(top, bottom, divisions + 1).round().astype(int)[1:-1] if divisions > 1 else np.array([], int)
    steps = np.concatenate([d + np.log10(np.arange(1, 10)) for d in range(decades)])[1:]
    at = steps / decades
    return (top + (1 - at if flip else at) * (bottom - top)).round().astype(int)


def _border_rows(top: int, bottom: int, width: int, height: int) -> list[int]:
    """Rows of a track's borders ``width`` px thick, growing outward (the curves keep the rows between)."""
    return [r for k in range(width) for r in (top - k, bottom + k) if 0 <= r < height]


def tracks(image: np.ndarray, style: ScanStyle, decades: tuple[int, ...], flips: tuple[bool, ...]) -> None:
    """Track borders, the frame and each track's scale lines (logarithmic tracks: their decades)."""
    ink = np.asarray(style.grid_ink, np.float32)
    strength = 0.4 if not style.randomised else style.grid_strength * 0.7
    for (top, bottom), divisions, dec, flip in zip(style.tracks, style.scale_lines, decades, flips):
        rows = _scale_rows(top, bottom, divisions, dec, flip)
        rows = rows[(rows > top) & (rows < bottom)]
        columns = np.arange(style.panel, image.shape[1])
        if style.scale_dotted:
            columns = columns[columns % 3 != 2]
        _blend(image, np.ix_(rows, columns), ink, strength)
        edges = _border_rows(top, bottom, style.border_width, image.shape[0])
        image[edges, style.panel :] = ink * 0.6 if not style.randomised else ink * 0.75
    frame = ink * 0.6
    image[0, :], image[:, 0], image[:, -1] = frame, frame, frame
    if style.panel:  # the heading panel's box
        image[-1, : style.panel], image[:, style.panel - 1] = frame, frame


def style_columns(look: CurveLook, width: int) -> np.ndarray:
    """Which columns a curve of this look inks: dashes and dots along the depth axis. bool [W]"""
    if look.style == "solid":
        return np.ones(width, bool)
    return (np.arange(width) + look.phase) % look.period < look.on


def gaps(rng, width: int) -> np.ndarray:
    """Columns where the curve is missing (tool off, torn paper). bool [W]"""
    gap = np.zeros(width, bool)
    for _ in range(rng.integers(0, 3)):
        start, span = rng.integers(width), int(rng.uniform(0.005, 0.04) * width)
        gap[start : start + span] = True
    return gap


def _runs(curve: PlottedCurve, rows: int) -> list[list[float]]:
    """The curve's polylines on a canvas of ``rows`` rows: broken at missing values and wraps. [[x, y, ...]]"""
    y = curve.position * (rows - 1)
    ok = np.isfinite(y)
    breaks = np.flatnonzero(~ok[1:] | ~ok[:-1] | (curve.turns[1:] != curve.turns[:-1])) + 1
    edges = np.concatenate([[0], breaks, [len(y)]])
    points = np.column_stack([curve.x, np.where(ok, y, 0)])
    runs = []
    for start, stop in zip(edges[:-1].tolist(), edges[1:].tolist()):
        if ok[start]:  # a run is all finite or all missing
            run = points[start:stop].ravel().tolist()
            runs.append(run if stop - start > 1 else run * 2)
    return runs


def curve_coverage(curve: PlottedCurve, look: CurveLook, rows: int, width: int) -> np.ndarray:
    """The pixels the curve inks on its track's inner rows, before its style's dashes. bool [rows, W]"""
    canvas = Image.new("L", (width, rows))
    draw = ImageDraw.Draw(canvas)
    line_width = max(1, min(look.width, rows // 3))
    for points in _runs(curve, rows):
        draw.line(points, fill=255, width=line_width)
    return np.asarray(canvas) > 0


def shading(image: np.ndarray, style: ScanStyle, plotted, looks) -> None:
    """The shadings of curves whose look has one, under every curve: between the curve (its first wrap) and one
    edge of its track, into image [H, W, 3]."""
    columns = np.arange(image.shape[1])
    for curve, look in zip(plotted, looks):
        top, bottom = style.tracks[curve.track]
        if not look.fill or bottom - top < 3:
            continue
        ok = np.isfinite(curve.position)
        if ok.sum() < 2:
            continue
        y = np.interp(columns, curve.x[ok], curve.position[ok], left=np.nan, right=np.nan) * (bottom - top - 2)
        rows = np.arange(bottom - top - 1)[:, None]
        inside = (rows <= y[None, :]) if look.fill_low else (rows >= y[None, :])
        region = image[top + 1 : bottom]
        region[inside] = region[inside] * (1 - look.fill) + np.asarray(look.fill_ink, np.float32) * look.fill


def curves(rng, image, mask, style: ScanStyle, plotted, looks, classes: str) -> None:
    """Every curve into image [H, W, 3] (its ink) and into mask [H, W] (its class), later curves over earlier
    ones. The mask is the curve layer's coverage: a pixel is a curve pixel exactly where a curve was inked."""
    w = image.shape[1]
    for curve, look in zip(plotted, looks):
        top, bottom = style.tracks[curve.track]
        if bottom - top < 3:
            continue
        rows = slice(top + 1, bottom)
        drawn = curve_coverage(curve, look, bottom - top - 1, w)
        drawn &= (style_columns(look, w) & ~gaps(rng, w))[None, :]
        image[rows][drawn] = np.asarray(look.ink, np.float32)
        mask[rows][drawn] = 1 if classes == "binary" else STYLES.index(look.style) + 1


@functools.lru_cache(maxsize=32)
def font(size: int):
    """PIL's scalable default font at ``size`` px."""
    return ImageFont.load_default(size=size)
