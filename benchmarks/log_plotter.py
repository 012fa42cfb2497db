"""A second renderer of well-log scans from LAS curves, kept apart from srforge's generator (issue 30's test set).

It plots a LAS file's curves the way a logging plotter prints them -- drawn with matplotlib (Agg) at an exact pixel
size -- and then degrades the print the way paper ages and a scanner reads it (numpy, PIL). It shares no code and
no drawing decisions with ``srforge.synthetic``: benchmarks/bench_transfer.py trains on that generator and
tests on this renderer, so a model is scored on scans srforge did not draw.

What a scan holds (everything drawn from numpy's generator seeded with (seed, i) alone, so a set is reproducible
and growing it keeps its first scans):

- depth along the width (increasing to the right or to the left), a depth window of the LAS file at a depth scale
  of 0.8-5 px per sample at full size (the whole file, stretched, when it is shorter than the scan);
- 1-4 tracks stacked across the height, with an optional depth track of numbers; each track linear (2-10
  divisions) or logarithmic (2-4 decades with their 2..9 lines), a depth grid with a heavy line every 5 or 10;
- 1-3 curves a track, chosen by mnemonic, unit and value range (resistivity-like and positive curves spanning
  decades on log tracks), each on its own "nice" scale (sometimes reversed), values leaving the track wrapped
  around, drawn as a backup trace in another dash, or pegged at the edge; now and then an amplified (x5) trace;
- line widths of 1-2.5 px at 1/8 scale (6-20 px at full size), inks black, grey and colour, solid, dashed,
  dotted and dash-dot;
- curve names, units and scale values repeated along the tracks, depth numbers, an optional header panel with
  the well's name; text of several sizes and fonts, along the depth or turned by 90 degrees, under or over the
  curves;
- a small skew (in the drawing's geometry), paper tone and texture, stains, fan-fold creases, uneven
  illumination, scanner blur and noise, grey scans, JPEG artefacts.

The mask is exact. The curves are rasterised alone (antialiased) on a layer of their own; a pixel is a curve
pixel iff its coverage in that layer is >= ``MASK_COVERAGE``, and the composite puts the curve ink on exactly those
pixels (hard-edged), whatever grid, text or header lies under or over it. Skew is applied to the drawing's
coordinates, so no resampling moves ink off its mask; everything after composition (blur included) is
photometric and leaves the mask as it is.

Sizes: a full-size scan is 3,200-12,800 x 480-640 px (W x H); ``scale`` multiplies both (1/8: 400-1,600 x 60-80).
"""

from __future__ import annotations

import io
import math
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.collections import LineCollection
from matplotlib.figure import Figure
from matplotlib.transforms import Affine2D
from PIL import Image, ImageFilter

FULL_WIDTH = (3200, 12800)
FULL_HEIGHT = (480, 640)
MASK_COVERAGE = 0.5  # a curve pixel: coverage >= this in the curve layer (the stroke's centre half-pixel rule)
MAX_WRAPS = 1 / 40  # wraps per pixel of depth beyond which a trace is pegged (it would fill its track with jumps)
DPI = 72  # 1 point = 1 pixel, so line widths and font sizes are given in pixels
FONTS = ("DejaVu Sans", "DejaVu Serif", "DejaVu Sans Mono")
ANGLES = ("deg", "degree", "degrees", "dega")
RESISTIVITY = re.compile(r"^(R[A-Z0-9]*|IL[DM]|LL[DS]|M?SFL|RES.*|PR|RT|RXO|AT\d0|AHT\d0|HDRS|HMRS)$")
CURVE_INKS = {
    "black": (0.05, 0.05, 0.05), "dark grey": (0.3, 0.3, 0.3), "grey": (0.45, 0.45, 0.45),
    "red": (0.8, 0.1, 0.1), "blue": (0.1, 0.2, 0.75), "green": (0.05, 0.5, 0.15), "magenta": (0.65, 0.1, 0.55),
    "brown": (0.5, 0.28, 0.08), "navy": (0.1, 0.1, 0.4), "orange": (0.85, 0.4, 0.05),
}  # fmt: skip
GRID_INKS = [
    (0.72, 0.72, 0.72), (0.55, 0.55, 0.55), (0.35, 0.35, 0.35), (0.12, 0.12, 0.12), (0.92, 0.5, 0.35),
    (0.45, 0.7, 0.5), (0.5, 0.62, 0.88), (0.66, 0.52, 0.38),
]  # fmt: skip
GRID_WEIGHTS = (0.14, 0.14, 0.16, 0.22, 0.1, 0.08, 0.08, 0.08)  # black-and-white copies are the common archive
PAPERS = [
    (0.97, 0.97, 0.96), (0.95, 0.92, 0.82), (0.9, 0.85, 0.7), (0.85, 0.85, 0.85), (0.88, 0.92, 0.95),
    (0.93, 0.88, 0.84),
]  # fmt: skip
DASHES = {"solid": None, "dashed": (4.0, 2.0), "long dash": (7.0, 2.5), "dotted": (1.0, 1.8), "dash-dot": (5, 2, 1, 2)}


# -- curves from LAS files -----------------------------------------------------------------------------------
@dataclass(frozen=True)
class Curve:
    """One LAS curve: ``values`` float64 [N] on the well's depths (NaN where the file holds its null value), how
    a plotter scales it (``kind``: "linear", "log" or "either"), and its 1st and 99th percentiles."""

    name: str
    unit: str
    values: np.ndarray
    kind: str
    low: float
    high: float


@dataclass(frozen=True)
class Well:
    """A LAS file's index (``depth`` float64 [N], ``unit``) and the curves worth plotting."""

    name: str
    depth: np.ndarray
    unit: str
    curves: tuple[Curve, ...]


def curve_kind(name: str, unit: str, low: float, high: float) -> str:
    """How a plotter scales a curve: "log" for positive resistivity-like curves (by mnemonic or an ohm unit) and
    positive curves spanning 1.5 decades or more, "either" for positive curves spanning 5x or more, else (and for
    angles) "linear"."""
    if unit.strip().lower() in ANGLES or low <= 0:
        return "linear"
    if RESISTIVITY.match(name.upper()) or "OHM" in unit.upper() or high / low >= 30:
        return "log"
    return "either" if high / low >= 5 else "linear"


def read_well(path: str | Path) -> Well:
    """The curves of the LAS file at ``path`` (lasio) that a plotter would draw: at least half their samples
    present and not constant. ValueError naming the file when none is left."""
    import lasio

    las = lasio.read(str(path))
    depth = np.asarray(las.index, np.float64)
    curves = []
    for item in las.curves[1:]:
        values = np.asarray(item.data, np.float64)
        finite = values[np.isfinite(values)]
        if finite.size < 0.5 * values.size:
            continue
        low, high = np.percentile(finite, [1, 99])
        if high > low:
            name, unit = item.mnemonic, item.unit or ""
            curves.append(Curve(name, unit, values, curve_kind(name, unit, low, high), float(low), float(high)))
    if not curves:
        raise ValueError(f"{path}: expected curves with at least half their samples present, found none")
    return Well(str(las.well.WELL.value or Path(path).stem), depth, las.curves[0].unit or "", tuple(curves))


def split_las(source: str | Path, fraction: float, first: str | Path, rest: str | Path) -> tuple[int, int]:
    """Write the first ``fraction`` of the depth samples of the LAS file ``source`` to ``first`` and the others
    to ``rest`` (lasio, LAS 2.0); returns the number of samples in each."""
    import lasio

    las = lasio.read(str(source))
    cut = int(round(len(las.index) * fraction))
    whole = np.column_stack([np.asarray(c.data, np.float64) for c in las.curves])
    for rows, path in ((whole[:cut], first), (whole[cut:], rest)):
        las.set_data(rows)
        with open(path, "w") as handle:
            las.write(handle, version=2.0)
    return cut, len(whole) - cut


# -- what a scan is: drawn from (seed, i) ----------------------------------------------------------------------
def nice_step(span: float) -> float:
    """The 1, 2, 2.5 or 5 x 10^k nearest above ``span``."""
    power = 10.0 ** math.floor(math.log10(span))
    return next(m * power for m in (1, 2, 2.5, 5, 10) if m * power >= span * 0.999)


def linear_scale(rng: np.random.Generator, curve: Curve) -> tuple[float, float, int]:
    """(left, right, divisions) of a linear track for ``curve``: a span of 0.6-1.5x its 1-99% range (narrower
    spans make it wrap), rounded to nice numbers."""
    span = (curve.high - curve.low) * rng.uniform(0.6, 1.5)
    divisions = int(rng.choice([2, 4, 5, 10]))
    step = nice_step(span / divisions)
    centre = (curve.low + curve.high) / 2 + rng.uniform(-0.15, 0.15) * span
    left = math.floor((centre - step * divisions / 2) / step) * step
    return left, left + step * divisions, divisions


def log_scale(rng: np.random.Generator, curve: Curve) -> tuple[float, float, int]:
    """(left, right, decades) of a logarithmic track: 2-4 decades starting at or below the curve's 1st
    percentile's decade."""
    decades = int(rng.integers(2, 5))
    left = 10.0 ** (math.floor(math.log10(curve.low)) - int(rng.integers(0, 2)))
    return left, left * 10.0**decades, decades


def scan_size(rng: np.random.Generator, scale: float) -> tuple[int, int]:
    """(H, W) of a scan at ``scale`` of full size."""
    width = rng.uniform(*FULL_WIDTH) * scale
    height = rng.uniform(*FULL_HEIGHT) * scale
    return max(8, int(round(height))), max(16, int(round(width)))


def draw_style(rng: np.random.Generator, scale: float) -> dict:
    """Paper, grid, text and orientation of one scan; widths in pixels at ``scale``."""
    grid = np.array(GRID_INKS[rng.choice(len(GRID_INKS), p=GRID_WEIGHTS)])
    return {
        "paper": np.clip(np.array(PAPERS[rng.integers(len(PAPERS))]) + rng.normal(0, 0.015, 3), 0.6, 1.0),
        "grid": grid,
        "heavy": grid * rng.uniform(0.6, 1.0),
        "minor_px": max(0.35, rng.uniform(3, 8) * scale),
        "heavy_px": max(0.7, rng.uniform(8, 16) * scale),
        "border_px": max(0.8, rng.uniform(8, 20) * scale),
        "grid_dashes": None if rng.random() < 0.8 else (2.0, 2.0),
        "text": np.array((0.05, 0.05, 0.05)) if rng.random() < 0.7 else grid * 0.6,
        "font": FONTS[rng.integers(len(FONTS))],
        "font_px": max(4.0, rng.uniform(40, 100) * scale),
        "turned": bool(rng.random() < 0.4),  # text turned by 90 degrees, as a printed log scanned sideways
        "flip_depth": bool(rng.random() < 0.3),  # depth increasing to the left
        "flip_value": bool(rng.random() < 0.5),  # a scale's left end at the bottom of its track, else the top
        "labels_over": bool(rng.random() < 0.5),  # curve labels printed over the curves
        "colour": bool(rng.random() < 0.55),
        "skew": float(rng.uniform(-0.35, 0.35)),  # degrees
        "density": float(rng.uniform(0.75, 1.0)),  # how fully the inks cover the paper
    }


def draw_bands(rng: np.random.Generator, height: int) -> list[dict]:
    """The bands across the height, top to bottom: 1-4 curve tracks and at most one depth track, each
    {"kind": "track" | "depth", "y0", "y1"} in pixels."""
    tracks = int(rng.choice([1, 2, 3, 4], p=[0.15, 0.35, 0.35, 0.15]))
    kinds = ["track"] * tracks
    if rng.random() < 0.7:
        kinds.insert(int(rng.integers(0, min(tracks, 2) + 1)), "depth")
    weights = np.array([rng.uniform(0.12, 0.2) if k == "depth" else rng.uniform(0.6, 1.4) for k in kinds])
    top, bottom = rng.uniform(0.0, 0.06) * height, height - rng.uniform(0.0, 0.06) * height
    gap = rng.uniform(0, 0.02) * height
    usable = bottom - top - gap * (len(kinds) - 1)
    edges = top + np.concatenate([[0], np.cumsum(weights / weights.sum() * usable)])
    return [
        {"kind": k, "y0": float(edges[j] + gap * j), "y1": float(edges[j + 1] + gap * j)} for j, k in enumerate(kinds)
    ]


def draw_window(rng: np.random.Generator, well: Well, x0: float, x1: float, scale: float) -> dict:
    """The depth samples a scan shows between ``x0`` and ``x1`` px: {"start", "count", "pps" (px per sample)}."""
    available = len(well.depth)
    pps = math.exp(rng.uniform(math.log(0.8), math.log(5.0))) * scale
    count = int(math.ceil((x1 - x0) / pps)) + 1
    if count >= available:
        count, pps = available, (x1 - x0) / max(available - 1, 1)
    start = int(rng.integers(0, available - count + 1))
    return {"start": start, "count": count, "pps": pps}


def pick_curves(rng: np.random.Generator, well: Well, track_count: int) -> list[tuple[str, list[Curve]]]:
    """(scale kind, curves) of each track: one log track (half the time, where the well has log curves), 1-3
    curves a track, curves repeated only once every curve has been used."""
    loggable = [c for c in well.curves if c.kind in ("log", "either")]
    linear = [c for c in well.curves if c.kind in ("linear", "either")]
    log_track = int(rng.integers(track_count)) if loggable and (rng.random() < 0.5 or not linear) else -1
    used: set[str] = set()
    chosen = []
    for t in range(track_count):
        pool = loggable if t == log_track else linear
        fresh = [c for c in pool if c.name not in used] or pool
        n = min(len(fresh), int(rng.choice([1, 2, 3], p=[0.35, 0.4, 0.25])))
        picks = [fresh[j] for j in rng.choice(len(fresh), n, replace=False)]
        used.update(c.name for c in picks)
        chosen.append(("log" if t == log_track else "linear", picks))
    return chosen


def draw_trace(rng: np.random.Generator, curve: Curve, scale_kind: str, style: dict, scale: float) -> dict:
    """How one curve is drawn: its scale (left, right, divisions), ink, width, dashes and what happens to values
    beyond the track (wrap, backup trace, peg)."""
    left, right, divisions = (log_scale if scale_kind == "log" else linear_scale)(rng, curve)
    if scale_kind == "linear" and rng.random() < 0.15:
        left, right = right, left  # reversed scales (SP, sonic) are common
    inks = list(CURVE_INKS.values()) if style["colour"] else list(CURVE_INKS.values())[:3]
    dash = list(DASHES)[int(rng.choice(len(DASHES), p=[0.5, 0.15, 0.1, 0.15, 0.1]))]
    return {
        "curve": curve,
        "scale": scale_kind,
        "left": left,
        "right": right,
        "divisions": divisions,
        "ink": np.array(inks[rng.integers(len(inks))]),
        "width": max(1.0, rng.uniform(6, 20) * scale),
        "dashes": DASHES[dash],
        "beyond": ["wrap", "backup", "peg"][int(rng.choice(3, p=[0.45, 0.35, 0.2]))],
        "backup_dashes": DASHES[["dashed", "dotted", "solid"][rng.integers(3)]],
        "amplified": bool(scale_kind == "linear" and rng.random() < 0.12),
    }


def draw_degradation(rng: np.random.Generator, scale: float) -> dict:
    """What ageing and scanning do to one scan (applied by :func:`degrade`); ``seed`` seeds its pixel noise."""
    return {
        "seed": int(rng.integers(2**31)),
        "grain": rng.uniform(0, 0.03),
        "mottle": rng.uniform(0, 0.07),
        "stains": int(rng.choice([0, 0, 1, 2, 3])),
        "fold_period": rng.uniform(2800, 4000) * scale if rng.random() < 0.4 else None,
        "light": rng.uniform(0, 0.25),
        # sigma 2-5 px at full size (a scanner's optics and a downsampling filter): 0.25-0.6 px at 1/8
        "blur": rng.uniform(2, 5) * scale if rng.random() < 0.8 else 0.0,
        "noise": rng.uniform(0, 0.03),
        "grey": bool(rng.random() < 0.3),
        "jpeg": int(rng.integers(30, 96)) if rng.random() < 0.7 else None,
    }


def plan_scan(well: Well, seed: int, i: int, scale: float) -> dict:
    """Everything scan ``i`` of ``seed`` draws, from numpy's generator seeded with (seed, i) alone."""
    rng = np.random.default_rng([seed, i])
    height, width = scan_size(rng, scale)
    style = draw_style(rng, scale)
    bands = draw_bands(rng, height)
    header = rng.uniform(0.06, 0.14) * width if rng.random() < 0.35 else 0.0
    x0, x1 = header + rng.uniform(0, 0.01) * width, width * (1 - rng.uniform(0, 0.01))
    window = draw_window(rng, well, x0, x1, scale)
    tracks = [band for band in bands if band["kind"] == "track"]
    for band, (kind, curves) in zip(tracks, pick_curves(rng, well, len(tracks))):
        band["scale"] = kind
        band["traces"] = [draw_trace(rng, c, kind, style, scale) for c in curves]
    return {
        "scale": scale,
        "size": (height, width),
        "style": style,
        "bands": bands,
        "header": header,
        "x": (x0, x1),
        "window": window,
        "grid": draw_depth_grid(rng, well, window, scale),
        "stations": rng.uniform(1600, 5000) * scale,
        "degrade": draw_degradation(rng, scale),
    }


def draw_depth_grid(rng: np.random.Generator, well: Well, window: dict, scale: float) -> dict:
    """Depth lines: a spacing in the well's depth unit and a heavy line every ``period``; minor lines closer than
    3 px are left out."""
    metres = well.unit.strip().lower() in ("m", "meter", "meters", "metre", "metres")
    spacing = float(rng.choice([1.0, 2.0, 5.0] if metres else [2.0, 5.0, 10.0]))
    period = int(rng.choice([5, 10]))
    step = float(np.median(np.diff(well.depth))) if len(well.depth) > 1 else 1.0
    px_per_unit = window["pps"] / abs(step)
    while spacing * px_per_unit < 3 * max(1.0, scale / 0.125) and spacing < 1e6:
        spacing *= period
    return {"spacing": spacing, "period": period}


# -- positions ------------------------------------------------------------------------------------------------
def normalised(values: np.ndarray, trace: dict) -> np.ndarray:
    """float64 [N]: 0 at the trace's left scale value, 1 at its right (logarithmic on log tracks; values <= 0
    there are gaps), NaN where the curve has none."""
    left, right = trace["left"], trace["right"]
    if trace["scale"] == "log":
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.where(values > 0, np.log10(values / left) / math.log10(right / left), np.nan)
    return (values - left) / (right - left)


def wrapped(u: np.ndarray, beyond: str) -> tuple[np.ndarray, np.ndarray | None, np.ndarray]:
    """(main positions, backup positions or None, breaks) for normalised values ``u`` [N]: positions in [0, 1],
    NaN where a trace is not drawn; ``breaks`` are indices before which the main trace is lifted (a wrap).

    ``wrap``: u modulo 1, lifted where it jumps to the other edge; ``backup``: the main trace where 0 <= u <= 1,
    a backup trace one track-width over where the value is beyond (pegged at the edge past that); ``peg``: u
    clipped to [0, 1]."""
    if beyond == "peg":
        return np.clip(u, 0, 1), None, np.zeros(0, np.int64)
    band = np.floor(u)
    band[u == 1.0] = 0
    if beyond == "wrap":
        change = np.nonzero(band[1:] != band[:-1])[0] + 1
        change = change[np.isfinite(band[change]) & np.isfinite(band[change - 1])]
        return u - band, None, change
    main = np.where(band == 0, u, np.nan)
    backup = np.where(band > 0, np.clip(u - 1, 0, 1), np.where(band < 0, np.clip(u + 1, 0, 1), np.nan))
    return main, backup, np.zeros(0, np.int64)


def depth_x(plan: dict, count: int) -> np.ndarray:
    """float64 [count]: the x (px) of each sample of the window, depth increasing left to right or flipped."""
    x0, x1 = plan["x"]
    x = x0 + np.arange(count) * plan["window"]["pps"]
    return x0 + x1 - x if plan["style"]["flip_depth"] else x


def value_y(band: dict, positions: np.ndarray, flip: bool) -> np.ndarray:
    """float64: the y (px) of positions in [0, 1] across ``band`` (0 at its top, or at its bottom if ``flip``)."""
    span = band["y1"] - band["y0"]
    return band["y1"] - positions * span if flip else band["y0"] + positions * span


# -- drawing ----------------------------------------------------------------------------------------------------
@dataclass
class Sheet:
    """One transparent layer of the scan: a matplotlib figure whose data coordinates are pixels (x right, y
    down) and ``skew`` the transform every artist is drawn with (rotation about the centre)."""

    figure: Figure
    axes: object
    skew: object


def new_sheet(height: int, width: int, skew_deg: float) -> Sheet:
    figure = Figure(figsize=(width / DPI, height / DPI), dpi=DPI)
    figure.patch.set_alpha(0)
    FigureCanvasAgg(figure)
    axes = figure.add_axes((0, 0, 1, 1))
    axes.set_xlim(0, width)
    axes.set_ylim(height, 0)
    axes.axis("off")
    axes.patch.set_alpha(0)
    skew = Affine2D().rotate_deg_around(width / 2, height / 2, skew_deg) + axes.transData
    return Sheet(figure, axes, skew)


def rasterise(sheet: Sheet) -> np.ndarray:
    """float32 [H, W, 4] in [0, 1]: the layer's straight-alpha RGBA."""
    sheet.figure.canvas.draw()
    return np.asarray(sheet.figure.canvas.buffer_rgba(), dtype=np.float32) / 255.0


def stroke(sheet: Sheet, x: np.ndarray, y: np.ndarray, ink, width: float, dashes=None) -> None:
    """A polyline (NaN: lifted) of ``width`` px in ``ink``; ``dashes`` in units of the width."""
    (line,) = sheet.axes.plot(x, y, color=tuple(ink), linewidth=width, transform=sheet.skew, solid_capstyle="butt")
    if dashes is not None:
        line.set_dashes(dashes)
        line.set_dash_capstyle("butt")


def segments(sheet: Sheet, pairs: list, ink, width: float, dashes=None) -> None:
    """Straight segments [((x0, y0), (x1, y1)), ...] of ``width`` px."""
    if pairs:
        style = "solid" if dashes is None else (0, dashes)
        sheet.axes.add_collection(
            LineCollection(pairs, colors=[tuple(ink)], linewidths=width, linestyles=style, transform=sheet.skew)
        )


def label(sheet: Sheet, x: float, y: float, text: str, style: dict, size: float, **options) -> None:
    """Text at (x, y) in the scan's font, turned by 90 degrees where the scan's text is."""
    sheet.axes.text(
        x, y, text, fontsize=size, family=style["font"], color=tuple(options.pop("ink", style["text"])),
        rotation=90 if style["turned"] else 0, rotation_mode="anchor", transform=sheet.skew,
        transform_rotates_text=True, **options,
    )  # fmt: skip


def depth_lines(plan: dict, well: Well) -> tuple[list[float], list[float], list[float]]:
    """(x of minor lines, x of heavy lines, depth of each heavy line) inside the window."""
    window, grid = plan["window"], plan["grid"]
    depths = well.depth[window["start"] : window["start"] + window["count"]]
    low, high = float(np.nanmin(depths)), float(np.nanmax(depths))
    marks = np.arange(math.ceil(low / grid["spacing"]), math.floor(high / grid["spacing"]) + 1)
    xs = np.interp(marks * grid["spacing"], depths, depth_x(plan, len(depths))) if marks.size else np.zeros(0)
    heavy = marks % grid["period"] == 0
    return xs[~heavy].tolist(), xs[heavy].tolist(), (marks[heavy] * grid["spacing"]).tolist()


def value_lines(band: dict, flip: bool) -> tuple[list[float], list[float]]:
    """(minor, heavy) y of a track's scale lines: linear divisions (the middle heavy), or log decades (heavy)
    with their 2..9 lines; ``flip`` as for the curves (:func:`value_y`)."""
    trace = band["traces"][0]
    if band["scale"] == "log":
        decades = trace["divisions"]
        minor = [(d + math.log10(m)) / decades for d in range(decades) for m in range(2, 10)]
        heavy = [d / decades for d in range(1, decades)]
    else:
        n = trace["divisions"]
        heavy = [0.5] if n % 2 == 0 else []
        minor = [k / n for k in range(1, n) if k / n != 0.5]
    return value_y(band, np.array(minor), flip).tolist(), value_y(band, np.array(heavy), flip).tolist()


def draw_grid(sheet: Sheet, plan: dict, well: Well) -> None:
    """Track borders, depth lines and scale lines on the print layer."""
    style, (x0, x1) = plan["style"], plan["x"]
    minor_x, heavy_x, _ = depth_lines(plan, well)
    for band in plan["bands"]:
        y0, y1 = band["y0"], band["y1"]
        segments(sheet, [((x0, y), (x1, y)) for y in (y0, y1)], style["heavy"], style["border_px"])
        if band["kind"] == "depth":
            tick = (y1 - y0) * 0.2
            segments(sheet, [((x, y0), (x, y0 + tick)) for x in heavy_x], style["heavy"], style["heavy_px"])
            continue
        dashes = style["grid_dashes"]
        segments(sheet, [((x, y0), (x, y1)) for x in minor_x], style["grid"], style["minor_px"], dashes)
        segments(sheet, [((x, y0), (x, y1)) for x in heavy_x], style["heavy"], style["heavy_px"])
        minor_y, heavy_y = value_lines(band, style["flip_value"])
        segments(sheet, [((x0, y), (x1, y)) for y in minor_y], style["grid"], style["minor_px"], dashes)
        segments(sheet, [((x0, y), (x1, y)) for y in heavy_y], style["heavy"], style["heavy_px"])


def fitted(size: float, text: str, room: float) -> float:
    """A font size no larger than ``size`` px at which ``text`` spans at most ``room`` px (0.62 em a glyph)."""
    return max(2.0, min(size, room / max(1, 0.62 * len(text))))


def draw_depth_numbers(sheet: Sheet, plan: dict, well: Well) -> None:
    """A depth number at every heavy depth line in each depth track, sized to fit it."""
    style = plan["style"]
    _, heavy_x, heavy_depths = depth_lines(plan, well)
    for band in (b for b in plan["bands"] if b["kind"] == "depth"):
        room = band["y1"] - band["y0"]
        ym = (band["y0"] + band["y1"]) / 2
        for x, depth in zip(heavy_x, heavy_depths):
            text = f"{depth:g}"
            size = fitted(style["font_px"], text, room) if style["turned"] else min(style["font_px"], room * 0.8)
            label(sheet, x + 1, ym, text, style, size, ha="center", va="center")


def draw_curve_labels(sheet: Sheet, plan: dict) -> None:
    """At stations along each track: every curve's name and unit and its scale's two ends, in its ink."""
    style, (x0, x1) = plan["style"], plan["x"]
    stations = np.arange(x0 + plan["stations"] * 0.3, x1 - 10, plan["stations"])
    for band in (b for b in plan["bands"] if b["kind"] == "track"):
        room = band["y1"] - band["y0"]
        rows = len(band["traces"])
        for k, trace in enumerate(band["traces"]):
            name = f"{trace['curve'].name} ({trace['curve'].unit})" if trace["curve"].unit else trace["curve"].name
            ends = (f"{trace['left']:g}", f"{trace['right']:g}")
            size = min(style["font_px"], room / (rows + 1.5))
            if style["turned"]:
                size = fitted(style["font_px"], name, room)
            for x in stations + k * size * 1.3 * (1 if style["turned"] else 0):
                y = band["y0"] + room * (k + 1) / (rows + 1)
                label(sheet, x, y, name, style, size, ink=trace["ink"], ha="left", va="center")
                if not style["turned"]:
                    top, bottom = (ends[1], ends[0]) if style["flip_value"] else ends
                    label(sheet, x, band["y0"] + 0.5, top, style, size * 0.8, ink=trace["ink"], va="top")
                    label(sheet, x, band["y1"] - 0.5, bottom, style, size * 0.8, ink=trace["ink"], va="bottom")


def draw_header(sheet: Sheet, plan: dict, well: Well) -> None:
    """The header panel at the left: a frame, the well's name, and each track's curves with their scales."""
    width = plan["header"]
    if not width:
        return
    style = plan["style"]
    height = plan["size"][0]
    frame = [((1, 1), (width - 1, 1)), ((width - 1, 1), (width - 1, height - 1)), ((1, height - 1), (width - 1,
             height - 1)), ((1, 1), (1, height - 1))]  # fmt: skip
    segments(sheet, frame, style["text"], style["border_px"])
    title = well.name
    label(sheet, 3, 2, title, style, min(style["font_px"] * 1.4, width / max(1, 0.62 * len(title))), va="top")
    for band in (b for b in plan["bands"] if b["kind"] == "track"):
        segments(sheet, [((1, band["y0"]), (width - 1, band["y0"]))], style["text"], style["minor_px"])
        for k, trace in enumerate(band["traces"]):
            text = f"{trace['curve'].name} {trace['left']:g} - {trace['right']:g}"
            size = min(style["font_px"], (band["y1"] - band["y0"]) / (len(band["traces"]) + 1), width / len(text))
            y = band["y0"] + (band["y1"] - band["y0"]) * (k + 1) / (len(band["traces"]) + 1)
            label(sheet, 3, y, text, style, size, ink=trace["ink"], va="center")


def curve_traces(plan: dict, well: Well) -> list[tuple[np.ndarray, np.ndarray, dict, object]]:
    """(x, y, trace, dashes) of every polyline the curve layer draws: main traces, backup traces, amplified
    traces; lifts (NaN) at gaps and wraps. A trace that would wrap more often than MAX_WRAPS a pixel is pegged
    instead."""
    window = plan["window"]
    span = slice(window["start"], window["start"] + window["count"])
    flip = plan["style"]["flip_value"]
    lines = []
    for band in (b for b in plan["bands"] if b["kind"] == "track"):
        for trace in band["traces"]:
            values = trace["curve"].values[span]
            x = depth_x(plan, len(values))
            versions = [(trace, trace["beyond"], trace["dashes"])]
            if trace["amplified"]:
                amplified = {**trace, "right": trace["left"] + (trace["right"] - trace["left"]) / 5}
                versions.append((amplified, "wrap", DASHES["dashed"]))
            for version, beyond, dashes in versions:
                u = normalised(values, version)
                main, backup, breaks = wrapped(u, beyond)
                if len(breaks) > MAX_WRAPS * len(u) * window["pps"]:  # a scale edge in the noise: pegged instead
                    main, backup, breaks = wrapped(u, "peg")
                mx, my = np.insert(x, breaks, np.nan), np.insert(value_y(band, main, flip), breaks, np.nan)
                lines.append((mx, my, trace, dashes))
                if backup is not None:
                    lines.append((x, value_y(band, backup, flip), trace, trace["backup_dashes"]))
    return lines


def draw_curves(sheet: Sheet, plan: dict, well: Well) -> None:
    for x, y, trace, dashes in curve_traces(plan, well):
        stroke(sheet, x, y, trace["ink"], trace["width"], dashes)


def scan_layers(well: Well, seed: int, i: int, scale: float) -> dict:
    """The plan of scan ``i`` and its three layers, float32 [H, W, 4] straight-alpha RGBA: ``print`` (grid,
    header, depth numbers, and the curve labels unless they go over), ``curves`` (the curves alone, antialiased)
    and ``over`` (the curve labels printed over the curves, else empty)."""
    plan = plan_scan(well, seed, i, scale)
    (height, width), style = plan["size"], plan["style"]
    sheets = {name: new_sheet(height, width, style["skew"]) for name in ("print", "curves", "over")}
    draw_grid(sheets["print"], plan, well)
    draw_header(sheets["print"], plan, well)
    draw_depth_numbers(sheets["print"], plan, well)
    draw_curve_labels(sheets["over" if style["labels_over"] else "print"], plan)
    draw_curves(sheets["curves"], plan, well)
    return {"plan": plan, **{name: rasterise(sheet) for name, sheet in sheets.items()}}


# -- composition and degradation --------------------------------------------------------------------------------
def curve_mask(curves: np.ndarray) -> np.ndarray:
    """uint8 [H, W]: 1 where the curve layer [H, W, 4] covers a pixel by >= MASK_COVERAGE, else 0."""
    return (curves[..., 3] >= MASK_COVERAGE).astype(np.uint8)


def smooth_field(rng: np.random.Generator, height: int, width: int, cells: int) -> np.ndarray:
    """float32 [H, W], zero mean, unit-ish amplitude: a ``cells``-wide random grid enlarged bicubically."""
    coarse = rng.normal(0, 1, (max(2, cells * height // max(width, 1) + 2), cells + 2)).astype(np.float32)
    return np.asarray(Image.fromarray(coarse, mode="F").resize((width, height), Image.BICUBIC))


def paper(plan: dict) -> np.ndarray:
    """float32 [H, W, 3]: the paper's tone with mottling and grain."""
    height, width = plan["size"]
    rng = np.random.default_rng([plan["degrade"]["seed"], 1])
    tone = plan["style"]["paper"].astype(np.float32)
    shade = 1 + plan["degrade"]["mottle"] * smooth_field(rng, height, width, 12) / 2
    grain = rng.normal(0, plan["degrade"]["grain"], (height, width)).astype(np.float32)
    return np.clip(tone[None, None, :] * (shade + grain)[..., None], 0, 1)


def overlay(base: np.ndarray, layer: np.ndarray, density: float) -> np.ndarray:
    """``layer``'s inks multiplied into ``base`` [H, W, 3] by their alpha (inks tint with the paper)."""
    alpha = layer[..., 3:] * density
    return base * (1 - alpha + alpha * layer[..., :3])


def compose(layers: dict, with_curves: bool = True) -> np.ndarray:
    """float32 [H, W, 3] in [0, 1], before degradation: paper, the print layer, the curve ink on exactly the
    mask's pixels (``with_curves``), the labels printed over."""
    density = layers["plan"]["style"]["density"]
    image = overlay(paper(layers["plan"]), layers["print"], density)
    if with_curves:
        hard = layers["curves"].copy()
        hard[..., 3] = curve_mask(layers["curves"])
        image = overlay(image, hard, density)
    return overlay(image, layers["over"], density)


def stains(rng: np.random.Generator, image: np.ndarray, count: int) -> np.ndarray:
    """``count`` soft brownish ellipses multiplied into ``image`` [H, W, 3]."""
    height, width = image.shape[:2]
    yy, xx = np.mgrid[0:height, 0:width].astype(np.float32)
    for _ in range(count):
        cy, cx = rng.uniform(0, height), rng.uniform(0, width)
        ry, rx = rng.uniform(0.2, 1.0) * height, rng.uniform(0.02, 0.12) * width
        blob = np.exp(-(((yy - cy) / ry) ** 2 + ((xx - cx) / rx) ** 2))
        tint = np.array([0.85, 0.72, 0.5], np.float32) ** rng.uniform(0.2, 1.0)
        image = image * (1 - blob[..., None] * (1 - tint))
    return image


def folds(image: np.ndarray, period: float, scale: float) -> np.ndarray:
    """Fan-fold creases every ``period`` px along the depth: a dark line and a shaded side."""
    width = image.shape[1]
    x = np.arange(width, dtype=np.float32)
    phase = (x % period) / period
    sigma = max(0.6, 6 * scale)
    distance = np.minimum(x % period, period - x % period)
    crease = 1 - 0.25 * np.exp(-((distance / sigma) ** 2)) - 0.05 * (phase > 0.5)
    return image * crease[None, :, None]


def illumination(image: np.ndarray, strength: float, rng: np.random.Generator) -> np.ndarray:
    """A smooth light falloff: a tilt across the scan and a darker band along one edge."""
    height, width = image.shape[:2]
    yy, xx = np.mgrid[0:height, 0:width].astype(np.float32)
    tilt = rng.uniform(-1, 1) * xx / width + rng.uniform(-1, 1) * yy / height
    edge = np.exp(-(yy if rng.random() < 0.5 else height - 1 - yy) / (0.3 * height))
    field = 1 - strength * (0.5 * (tilt - tilt.min()) / max(float(np.ptp(tilt)), 1e-6) + 0.5 * edge)
    return image * field[..., None]


def degrade(image: np.ndarray, plan: dict) -> np.ndarray:
    """uint8 [H, W, 3]: ``image`` float32 [H, W, 3] aged and scanned as ``plan["degrade"]`` says (photometric
    only: no pixel moves)."""
    d = plan["degrade"]
    rng = np.random.default_rng([d["seed"], 2])
    image = stains(rng, image, d["stains"])
    if d["fold_period"]:
        image = folds(image, d["fold_period"], plan["scale"])
    image = illumination(image, d["light"], rng)
    out = Image.fromarray((np.clip(image, 0, 1) * 255 + 0.5).astype(np.uint8))
    if d["blur"] > 0.05:
        out = out.filter(ImageFilter.GaussianBlur(d["blur"]))
    pixels = np.asarray(out, np.float32) + rng.normal(0, d["noise"] * 255, (*image.shape[:2], 1))
    if d["grey"]:
        pixels = np.repeat(pixels @ np.array([[0.299], [0.587], [0.114]], np.float32), 3, axis=2)
    out = Image.fromarray(np.clip(pixels + 0.5, 0, 255).astype(np.uint8))
    if d["jpeg"]:
        buffer = io.BytesIO()
        out.save(buffer, format="JPEG", quality=d["jpeg"])
        out = Image.open(io.BytesIO(buffer.getvalue())).convert("RGB")
    return np.asarray(out)


def render_scan(well: Well, seed: int, i: int, scale: float) -> tuple[np.ndarray, np.ndarray]:
    """Scan ``i`` of ``seed`` at ``scale``: (image uint8 [H, W, 3], mask uint8 [H, W] with 1 = curve)."""
    layers = scan_layers(well, seed, i, scale)
    return degrade(compose(layers), layers["plan"]), curve_mask(layers["curves"])


def write_scans(well: Well, folder: str | Path, n: int, *, seed: int, scale: float) -> Path:
    """Scans 0..n-1 of ``seed`` as ``folder``/images/NNNNN.png and ``folder``/masks/NNNNN.png (mask values 0 and
    1); scans already there are kept (scan i depends only on (seed, i))."""
    folder = Path(folder)
    for sub in ("images", "masks"):
        (folder / sub).mkdir(parents=True, exist_ok=True)
    for i in range(n):
        name = f"{i:05d}.png"
        if (folder / "images" / name).is_file() and (folder / "masks" / name).is_file():
            continue
        image, mask = render_scan(well, seed, i, scale)
        for sub, array in (("masks", mask), ("images", image)):
            temporary = folder / sub / f".{name}.tmp"
            Image.fromarray(array).save(temporary, format="PNG")
            temporary.replace(folder / sub / name)
    return folder
