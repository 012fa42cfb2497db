"""Synthetic well-log scans with exact curve masks, in the size range of the real archive.

A scan is paper (tone + grain) with depth running along the width: a depth grid (heavier every fifth
line, depth labels), horizontal tracks with borders, scale lines and a name, and in each track 1-4
curves, 1-3 px wide, drawn solid, dashed or dotted, with gaps and the odd crossing. A slight skew is
applied to image and mask alike, then only the image is blurred. At scale=1 widths are 3,200-12,800 px
and heights 480-640 px; ``scale`` shrinks every length but keeps curves at least 1 px wide, dashes at least 6 px
apart (3 inked) and dots 3 px apart (1 inked), so that the three styles stay apart at every scale. ``scale`` is one
number for every scan, or a range (lo, hi) that gives each scan its own, as an archive scanned at several
resolutions has (:func:`scan_scale`).

Scan i depends only on (seed, i), never on n, so growing a set keeps its first scans.
"""

from __future__ import annotations

import math
import os
from concurrent.futures import ProcessPoolExecutor
from numbers import Real
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw, ImageFilter

from srforge.atomic import atomic_write

STYLES = ("solid", "dashed", "dotted")  # multiclass mask value = position + 1
CLASSES = {"binary": ("background", "curve"), "multiclass": ("background",) + STYLES}
_TRACK_NAMES = ("GR", "SP", "CALI", "ILD", "ILM", "SFL", "RHOB", "NPHI", "DT", "PEF")
_INKS = ((20, 20, 25), (25, 35, 120), (140, 25, 30), (30, 90, 40))
# Mixed into a scan's seed for the stream its scale is drawn from, apart from the stream that draws the scan,
# so that a scale range leaves every other draw of scan i as it is at one scale.
_SCALE_STREAM = 0x5CA1E

Scale = float | tuple[float, float]  # one scale for every scan, or a range (lo, hi) each scan's scale is drawn from


def _positive_number(value) -> bool:
    return isinstance(value, Real) and not isinstance(value, bool) and math.isfinite(value) and value > 0


def _scale_range(scale) -> tuple[float, float]:
    """``scale`` checked, as (lo, hi): (s, s) for a number s. Raises ValueError naming ``scale`` unless it is a
    positive number or a pair (lo, hi) (tuple or list) of them with lo <= hi."""
    if _positive_number(scale):
        return scale, scale
    expected = "a positive number or a pair (lo, hi) of them with lo <= hi, e.g. (0.03, 0.0625)"
    if not isinstance(scale, (tuple, list)):
        raise ValueError(f"scale: expected {expected}, found {type(scale).__name__} {scale!r}")
    if len(scale) != 2:
        raise ValueError(f"scale: expected {expected}, found a {type(scale).__name__} of {len(scale)}: {scale!r}")
    if not all(_positive_number(v) for v in scale):
        raise ValueError(f"scale: expected {expected}, found {scale!r}, not two positive numbers")
    lo, hi = scale
    if lo > hi:
        raise ValueError(f"scale: expected {expected}, found lo {lo} > hi {hi}; swap them")
    return lo, hi


def scan_scale(index: int, seed: int, scale: Scale) -> float:
    """The scale scan ``index`` of the set ``seed`` is drawn at.

    A number is returned as it is. For a range (lo, hi) the scale is drawn log-uniformly in [lo, hi] (as many
    scans between 0.025 and 0.05 as between 0.05 and 0.1), from a generator seeded by (seed, index) alone: it
    does not depend on n, the worker count or other scans. lo == hi gives lo. ``scale`` that is neither a positive
    number nor a pair (lo, hi) (tuple or list) of them with lo <= hi is a ValueError naming it.
    """
    lo, hi = _scale_range(scale)
    if not isinstance(scale, (tuple, list)):
        return scale
    u = np.random.default_rng([seed, index, _SCALE_STREAM]).random()
    return float(min(hi, lo * (hi / lo) ** u))  # min: rounding must not take u < 1 past hi


def _length(value: float, scale: float, minimum: int = 1) -> int:
    return max(minimum, round(value * scale))


def _curve_path(rng, width: int, top: int, bottom: int) -> np.ndarray:
    """y for every x in [0, width): a smooth random walk with log-like jitter, inside rows [top, bottom]. [W]"""
    span = max(1, bottom - top)
    knot_every = max(4, int(rng.uniform(0.02, 0.08) * width))
    knots = np.cumsum(rng.normal(0, 0.25, width // knot_every + 2))
    knots = (knots - knots.mean()) * rng.uniform(0.3, 1.0) + rng.uniform(-0.3, 0.3)
    y = np.interp(np.arange(width), np.arange(len(knots)) * knot_every, knots)
    y += rng.normal(0, 0.02, width)  # the high-frequency wiggle of real logs
    return top + span * (0.5 + 0.5 * np.clip(y, -1, 1))


def _style_mask(rng, style: str, width: int, scale: float) -> np.ndarray:
    """Which columns a curve of this style inks: dashes and dots along the depth axis. bool [W]"""
    x = np.arange(width)
    if style == "solid":
        return np.ones(width, bool)
    # Shrunk below a few pixels both patterns would round to the same one (one pixel in three): a dash keeps at
    # least 6 px (3 inked), a dot 3 px (1 inked), so the styles stay distinguishable at every scale.
    dashed = style == "dashed"
    period = _length(rng.uniform(14, 24) if dashed else rng.uniform(4, 7), scale, minimum=6 if dashed else 3)
    on = max(1, int(period * (0.6 if dashed else 0.35)))
    return (x + rng.integers(period)) % period < on


def _gaps(rng, width: int) -> np.ndarray:
    """Columns where the curve is missing (tool off, torn paper). bool [W]"""
    gap = np.zeros(width, bool)
    for _ in range(rng.integers(0, 3)):
        start, length = rng.integers(width), int(rng.uniform(0.005, 0.04) * width)
        gap[start : start + length] = True
    return gap


def _draw_grid(rng, image: np.ndarray, grid_ink: np.ndarray, scale: float) -> np.ndarray:
    """Depth grid into image [H, W, 3]: thin lines every ``step`` columns, a heavier one every fifth (returned).
    Shrunken scans show thin lines fainter, as downsampling a real scan would."""
    w = image.shape[1]
    fade = min(1.0, 4 * scale)
    step = _length(rng.uniform(18, 40), scale, minimum=5)
    phase = int(rng.integers(step))
    columns = np.arange(phase, w, step)
    image[:, columns] = image[:, columns] * (1 - 0.6 * fade) + grid_ink * 0.6 * fade
    heavy = columns[::5]
    image[:, heavy] = image[:, heavy] * (0.5 - 0.5 * fade) + grid_ink * (0.5 + 0.5 * fade)
    if scale >= 0.5:
        image[:, np.minimum(heavy + 1, w - 1)] = grid_ink
    return heavy


def _draw_tracks(rng, image: np.ndarray, grid_ink: np.ndarray, scale: float) -> tuple[int, np.ndarray]:
    """Tracks stacked across the height, a header strip on top for labels: (header height, track borders)."""
    h = image.shape[0]
    header = _length(rng.uniform(18, 30), scale, minimum=1) if h >= 40 else 0
    n_tracks = int(rng.integers(2, 5))
    borders = np.linspace(header, h - 1, n_tracks + 1).round().astype(int)
    for top, bottom in zip(borders[:-1], borders[1:]):
        scale_lines = np.linspace(top, bottom, int(rng.integers(3, 6)) + 1).round().astype(int)[1:-1]
        image[scale_lines, :] = image[scale_lines, :] * 0.6 + grid_ink * 0.4
    image[borders, :] = grid_ink * 0.6
    image[0, :], image[:, 0], image[:, -1] = grid_ink * 0.6, grid_ink * 0.6, grid_ink * 0.6
    return header, borders


def _draw_curves(rng, image: np.ndarray, mask: np.ndarray, borders: np.ndarray, scale: float, classes: str) -> None:
    """One to four curves per track into image [H, W, 3] and their class into mask [H, W]."""
    w = image.shape[1]
    for top, bottom in zip(borders[:-1], borders[1:]):
        inner_top, inner_bottom = top + 2, bottom - 2
        if inner_bottom <= inner_top:
            continue
        for _ in range(rng.integers(1, 5)):
            style = STYLES[rng.choice(3, p=(0.5, 0.3, 0.2))]
            ys = _curve_path(rng, w, inner_top, inner_bottom)
            # Drawn on a canvas of the track's rows only, which also keeps thick curves off the borders.
            canvas = Image.new("L", (w, bottom - top - 1))
            points = np.column_stack([np.arange(w), ys - top - 1]).ravel().tolist()
            ImageDraw.Draw(canvas).line(points, fill=255, width=_length(rng.integers(1, 4), scale))
            drawn = np.asarray(canvas) > 0
            drawn &= (_style_mask(rng, style, w, scale) & ~_gaps(rng, w))[None, :]
            rows = slice(top + 1, bottom)
            image[rows][drawn] = np.array(_INKS[rng.integers(len(_INKS))], np.float32) + rng.normal(0, 8, 3)
            mask[rows][drawn] = 1 if classes == "binary" else STYLES.index(style) + 1


def _draw_labels(rng, rgb: Image.Image, grid_ink: np.ndarray, header: int, heavy, borders) -> None:
    """Depth numbers along the header and track names; none when the header is too small for the font."""
    if header < 12:  # the default font needs ~11 px; smaller scans simply go without labels
        return
    w, h = rgb.size
    draw = ImageDraw.Draw(rgb)
    ink = tuple(int(c) for c in grid_ink * 0.5)
    depth0 = int(rng.integers(500, 9000))
    for k, x in enumerate(heavy):
        draw.text((int(x) + 2, 1), str(depth0 + 10 * k), fill=ink)
    for top in borders[:-1]:
        draw.text((4, int(top) + 2), _TRACK_NAMES[rng.integers(len(_TRACK_NAMES))], fill=ink)
    for k in range(int(rng.integers(0, 3))):
        if w > 100:  # depth labels printed inside the tracks as well, over the curves
            at = (int(rng.integers(w - 60)), int(rng.integers(header, h - 12)))
            draw.text(at, str(depth0 + 50 * k), fill=ink)


def _skew_and_blur(rng, rgb: Image.Image, mask: np.ndarray, paper: np.ndarray, scale: float):
    """The same slight skew (depth axis drifting across the scan) for image and mask, then blur the image only."""
    w, h = rgb.size
    shear = rng.uniform(-1.5, 1.5) / w
    affine = (1, 0, 0, shear, 1, -shear * w / 2)
    rgb = rgb.transform(
        (w, h), Image.Transform.AFFINE, affine, Image.Resampling.BILINEAR, fillcolor=tuple(int(c) for c in paper)
    )
    skewed = Image.fromarray(mask).transform(
        (w, h), Image.Transform.AFFINE, affine, Image.Resampling.NEAREST, fillcolor=0
    )
    # A 3x3 Gaussian: the scanner's softness is under a pixel, and PIL's GaussianBlur costs 20x more.
    a = float(np.exp(-1 / (2 * (rng.uniform(0.3, 0.7) * min(1.0, scale * 2)) ** 2)))
    rgb = rgb.filter(ImageFilter.Kernel((3, 3), [a * a, a, a * a, a, 1, a, a * a, a, a * a]))
    return np.asarray(rgb), np.asarray(skewed)


def welllog_scan(
    index: int, seed: int = 0, scale: Scale = 1.0, classes: str = "binary"
) -> tuple[np.ndarray, np.ndarray]:
    """One synthetic scan: image uint8 [H, W, 3] and mask uint8 [H, W] (0 background; 1 curve, or 1-3 by style).

    ``scale``: a number, or a range (lo, hi) that scan ``index`` draws its own from (:func:`scan_scale`); at the
    scale drawn, the scan is the one that number would give.
    """
    if classes not in CLASSES:
        raise ValueError(f"classes must be one of {sorted(CLASSES)}, got {classes!r}")
    scale = scan_scale(index, seed, scale)
    rng = np.random.default_rng([seed, index])
    h = _length(rng.integers(480, 641), scale, minimum=8)
    w = _length(rng.integers(3200, 12801), scale, minimum=8)
    paper = np.array([rng.uniform(232, 250), rng.uniform(228, 246), rng.uniform(210, 238)], np.float32)
    image = np.empty((h, w, 3), np.float32)
    image[:] = paper
    image += rng.standard_normal((h, w, 1), dtype=np.float32) * rng.uniform(2, 7)
    mask = np.zeros((h, w), np.uint8)
    grid_ink = paper * rng.uniform(0.55, 0.8)
    heavy = _draw_grid(rng, image, grid_ink, scale)
    header, borders = _draw_tracks(rng, image, grid_ink, scale)
    _draw_curves(rng, image, mask, borders, scale, classes)
    rgb = Image.fromarray(np.clip(image, 0, 255).astype(np.uint8))
    _draw_labels(rng, rgb, grid_ink, header, heavy, borders)
    return _skew_and_blur(rng, rgb, mask, paper, scale)


def _save_atomic(array: np.ndarray, path: Path) -> None:
    atomic_write(path, lambda f: Image.fromarray(array).save(f, format="PNG", compress_level=1))


def scan_name(index: int) -> str:
    return f"scan_{index:05d}.png"


def missing_scans(out_dir, n: int) -> list[int]:
    """Indices i < n whose image or mask is not yet in out_dir. A file present is complete: both are written to a
    temporary name and renamed."""
    out = Path(out_dir)
    return [i for i in range(n) if not all((out / sub / scan_name(i)).is_file() for sub in ("images", "masks"))]


def _write_scan(out: Path, index: int, scale: Scale, seed: int, classes: str) -> Path:
    image, mask = welllog_scan(index, seed=seed, scale=scale, classes=classes)
    _save_atomic(mask, out / "masks" / scan_name(index))
    _save_atomic(image, out / "images" / scan_name(index))
    return out / "images" / scan_name(index)


def make_welllog_scans(
    out_dir,
    n: int,
    scale: Scale = 1.0,
    seed: int = 0,
    classes: str = "binary",
    workers: int | None = None,
    only_missing: bool = False,
) -> list[Path]:
    """Write n scans as out_dir/images/scan_XXXXX.png and out_dir/masks/scan_XXXXX.png; return the image paths.

    The folder is what SegmentationFolder(out_dir) reads; mask values follow ``CLASSES[classes]``. ``scale``: a
    number for every scan, or a range (lo, hi) (tuple or list) each scan draws its own from (:func:`scan_scale`).
    ``workers`` processes write scans in parallel (default: one per CPU); the bytes written do not depend on it,
    since scan i depends only on (seed, i). ``only_missing`` writes only the scans :func:`missing_scans` names,
    so that a generation cut short (or run by several processes at once) completes the same set.
    """
    if classes not in CLASSES:
        raise ValueError(f"classes must be one of {sorted(CLASSES)}, got {classes!r}")
    _scale_range(scale)  # here, not first in a worker, and also when no scan is missing
    out = Path(out_dir)
    (out / "images").mkdir(parents=True, exist_ok=True)
    (out / "masks").mkdir(parents=True, exist_ok=True)
    todo = missing_scans(out, n) if only_missing else range(n)
    jobs = [(out, i, scale, seed, classes) for i in todo]
    workers = min(os.cpu_count() or 1, len(jobs)) if workers is None else min(workers, len(jobs))
    if workers > 1:
        with ProcessPoolExecutor(workers) as pool:
            list(pool.map(_write_scan, *zip(*jobs)))
    else:
        for job in jobs:
            _write_scan(*job)
    return [out / "images" / scan_name(i) for i in range(n)]
