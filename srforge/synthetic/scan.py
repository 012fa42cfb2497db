"""One synthetic scan: image and exact curve mask, drawn from (seed, index) alone.

The printed log is drawn in layers -- paper, grid and tracks under the curves; the curves in their own layer,
whose coverage is the mask; text, stains and folds over them -- then scanned (srforge.synthetic.degrade).
Nothing drawn over or under a curve changes the mask, and the scanner's skew moves image and mask alike.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from PIL import Image

from srforge.synthetic.curves import formation, log_curve, track_positions, track_scale
from srforge.synthetic.degrade import scan
from srforge.synthetic.draw import TRACK_NAMES, PlottedCurve, curves, grid, paper, shading, tracks
from srforge.synthetic.las import is_logarithmic, las_window, load_wells
from srforge.synthetic.scale import Scale, scan_scale
from srforge.synthetic.style import (
    CURVE_STREAM,
    SCANNER_STREAM,
    STYLE_STREAM,
    TEXT_STREAM,
    ScanStyle,
    curve_look,
    draw_style,
)
from srforge.synthetic.text import labels

CLASSES = {"binary": ("background", "curve"), "multiclass": ("background", "solid", "dashed", "dotted")}


@dataclass(frozen=True)
class ScanLayers:
    """A scan and the layers it was drawn from (for checking the mask): ``under`` the paper, grid and tracks
    float32 [H, W, 3]; ``inked`` that with the curves drawn; ``coverage`` the curve layer's classes before the
    scanner uint8 [H, W]; ``image`` uint8 [H, W, 3] and ``mask`` uint8 [H, W] as written."""

    style: ScanStyle
    under: np.ndarray | None
    inked: np.ndarray | None
    coverage: np.ndarray
    image: np.ndarray
    mask: np.ndarray


def _choose(rng, names: list[str], logs: set[str], count: int, logarithmic: bool) -> list[str]:
    """``count`` curve names for one track: the first at random, the others of the same kind (log or linear)."""
    first = names[rng.integers(len(names))]
    kind = [n for n in names if (n in logs) == (first in logs) and n != first]
    more = rng.permutation(kind)[: count - 1].tolist() if kind else []
    return [first, *more]


def _track_values(rng, style: ScanStyle, samples: int, las) -> list[tuple[int, str, np.ndarray, bool]]:
    """(track, name, values [N], logarithmic) of every curve: from a LAS window, or srforge's own curves."""
    found = []
    if las:
        window = las_window(rng, load_wells(las), samples)
        names = sorted(window)
        logs = {n for n in names if is_logarithmic(window[n])}
        for t, count in enumerate(style.curves_per_track):
            chosen = _choose(rng, names, logs, count, False)
            found += [(t, n, window[n], chosen[0] in logs) for n in chosen]
        return found
    latent = formation(rng, samples)
    for t, count in enumerate(style.curves_per_track):
        log = style.logarithmic[t]
        for _ in range(count):
            found.append((t, TRACK_NAMES[rng.integers(len(TRACK_NAMES))], log_curve(rng, latent, log), log))
    return found


def plot_curves(rng, style: ScanStyle, las, looks) -> tuple[list[PlottedCurve], tuple[int, ...], tuple[bool, ...]]:
    """Every curve placed on its track (wrapping or pinned at the edges as its look says), the decades of each
    logarithmic track (0: linear) and whether each track's scale runs upward (flip)."""
    samples = max(4, math.ceil((style.width - style.panel) / style.scale * style.samples_per_px))
    values = _track_values(rng, style, samples, las)
    flips = tuple(bool(rng.random() < 0.5) for _ in style.tracks)
    decades = [0] * len(style.tracks)
    plotted = []
    for (track, name, v, log), look in zip(values, looks):
        lo, hi = track_scale(rng, v, log)
        position, turns = track_positions(v, lo, hi, log, wrap=look.wrap)
        x = style.panel + (np.arange(len(v)) + 0.5) * ((style.width - style.panel) / len(v))
        plotted.append(PlottedCurve(track, x, 1 - position if flips[track] else position, turns, name, lo, hi))
        if log and not decades[track]:
            decades[track] = round(hi - lo)
    return plotted, tuple(decades), flips


def _names(plotted: list[PlottedCurve], decades: tuple[int, ...], looks) -> dict[int, list]:
    """track -> [(name, left value, right value, ink)] for the text (decades as values on logarithmic tracks)."""
    names: dict[int, list] = {}
    for c, look in zip(plotted, looks):
        lo, hi = (10**c.lo, 10**c.hi) if decades[c.track] else (c.lo, c.hi)
        names.setdefault(c.track, []).append((c.name, lo, hi, look.ink))
    return names


def scan_layers(
    index: int,
    seed: int = 0,
    scale: Scale = 1.0,
    classes: str = "binary",
    las=None,
    randomise: bool = False,
    style: ScanStyle | None = None,
    keep_layers: bool = True,
) -> ScanLayers:
    """Scan ``index`` of set ``seed`` with its layers (:class:`ScanLayers`; ``under`` and ``inked`` None unless
    ``keep_layers``). ``style``: draw with this style instead of the scan's own (a test turns properties off)."""
    if classes not in CLASSES:
        raise ValueError(f"classes must be one of {sorted(CLASSES)}, got {classes!r}")
    scale = scan_scale(index, seed, scale)
    style = style or draw_style(index, seed, scale, randomise)
    looks_rng = np.random.default_rng([seed, index, STYLE_STREAM, 1])
    looks = [curve_look(looks_rng, scale, style.randomised) for _ in range(sum(style.curves_per_track))]
    plotted, decades, flips = plot_curves(np.random.default_rng([seed, index, CURVE_STREAM]), style, las, looks)
    layer_rng = np.random.default_rng([seed, index, STYLE_STREAM, 2])
    image = paper(layer_rng, style)
    heavy = grid(layer_rng, image, style)
    tracks(image, style, decades, flips)
    shading(image, style, plotted, looks)
    under = image.copy() if keep_layers else None
    mask = np.zeros((style.height, style.width), np.uint8)
    curves(layer_rng, image, mask, style, plotted, looks, classes)
    inked = image.copy() if keep_layers else None
    rgb = Image.fromarray(np.clip(image, 0, 255).astype(np.uint8))
    labels(np.random.default_rng([seed, index, TEXT_STREAM]), rgb, style, heavy, _names(plotted, decades, looks))
    printed = np.asarray(rgb, dtype=np.float32).copy()
    out, moved = scan(np.random.default_rng([seed, index, SCANNER_STREAM, 1]), printed, mask, style)
    return ScanLayers(style, under, inked, mask, out, moved)


def welllog_scan(
    index: int, seed: int = 0, scale: Scale = 1.0, classes: str = "binary", las=None, randomise: bool = False
) -> tuple[np.ndarray, np.ndarray]:
    """One synthetic scan: image uint8 [H, W, 3] and mask uint8 [H, W] (0 background; 1 curve, or 1-3 by style).

    ``scale``: a number, or a range (lo, hi) that scan ``index`` draws its own from (:func:`scan_scale`); at the
    scale drawn, the scan is the one that number would give. ``las``: LAS paths or globs the curves come from
    (None: srforge's own log-like curves). ``randomise``: draw paper, grid, tracks, inks, text and scanner from
    the ranges of srforge.synthetic.style.RANDOMISED instead of the classic look.
    """
    layers = scan_layers(index, seed, scale, classes, las, randomise, keep_layers=False)
    return layers.image, layers.mask
