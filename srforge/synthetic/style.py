"""One draw, per scan, of everything an archive varies: the look of paper, grid, tracks, curves, text and scanner.

``randomise=False`` keeps srforge's classic look (one grid style, four inks, cream paper, a light blur);
``randomise=True`` draws every property from the ranges of :data:`RANDOMISED` (docs/training.md lists them).
Every draw comes from a generator seeded by (seed, index, stream), one stream per concern, so that turning one
property off (a test does) leaves the others as they were, and scan i depends on (seed, i) alone.
"""

from __future__ import annotations

import colorsys
from dataclasses import dataclass, replace

import numpy as np

from srforge.synthetic.scale import length

STYLES = ("solid", "dashed", "dotted")  # multiclass mask value = position + 1
CLASSIC_INKS = ((20, 20, 25), (25, 35, 120), (140, 25, 30), (30, 90, 40))
# Grid papers of real logs: grey, and the orange, red, green, blue and brown of printed log paper.
GRID_TINTS = ((0.55, 0.55, 0.55), (0.95, 0.55, 0.25), (0.85, 0.3, 0.3), (0.35, 0.7, 0.4), (0.35, 0.5, 0.85),
              (0.6, 0.45, 0.3))  # fmt: skip
LUMINANCE = np.array([0.299, 0.587, 0.114])
MAX_INK_LUMINANCE = 140  # no curve is inked lighter: the paper is 205-255
STYLE_STREAM, CURVE_STREAM, SCANNER_STREAM, TEXT_STREAM = 0x57E1E, 0xC0FE, 0x5CA7, 0x7E47

# The ranges of a randomised scan (full-size px are scaled; "px" are pixels of the scan as written).
RANDOMISED = {
    "tracks": "1-4, heights at random (each at least a sixth of the others' mean), a gap between them sometimes",
    "header": "none (40%) or 5-20% of the height, with track names, scale values and header text",
    "grid step": "8-80 full-size px, log-uniform (at least 3 px); a heavy line every 2, 4, 5 or 10, or none",
    "grid ink": "grey (as dark as curves) or a log paper's orange, red, green, blue or brown; strength 0.3-1 (fainter "
    "for steps under 8 px); 1-2 px, heavy 1-3 px; dotted 15%",
    "scale lines": "0-9 per linear track; decades with their minor lines on logarithmic tracks; dotted 20%; "
    "track borders 1-3 px",
    "curves": "1-4 per track; solid 50%, dashed 30%, dotted 20%; width 1-4 px (1-2 px most often; thicker at larger "
    "scales); 12% "
    "shaded towards one edge of the track (opacity 0.15-0.6, a light colour, under the curves)",
    "inks": "near-black 50%, grey (luminance 60-140) 15%, a colour 35% (any hue, luminance at most 140)",
    "samples": "0.04-0.4 depth samples per full-size px, log-uniform (the depth scale of the plot)",
    "wrap": "95% of curves wrap around past an edge, the others are pinned to it",
    "logarithmic": "resistivity-like curves (LAS) and 25% of the generator's own tracks",
    "paper": "white, cream, yellowed, grey or bluish; texture 0-12, grain 0-8 grey levels",
    "text": "depth numbers and names in fonts of 5-14 px, 0-4 depth labels inside the tracks, over the curves; "
    "each curve's name repeated along its track in its ink (50%; a third of them turned 90 degrees); a heading "
    "panel of text in a box at the left "
    "(30%, 4-20% of the width)",
    "scanner": "skew up to 0.5 degrees, blur sigma 0-1 px, resolution loss 1.2-2x 20%, uneven illumination up to "
    "25%, 0-3 stains 40%, 0-2 fold lines 25%, sensor noise 0-6, gamma 0.75-1.35, greyscale 35%, JPEG quality "
    "30-95 50%",
}


@dataclass(frozen=True)
class CurveLook:
    """How one curve is inked: style (an entry of STYLES), width px, ink RGB, dash period and inked length px,
    dash phase, wrap (True) or pin at the track's edges; a shading between the curve and one edge of its track
    (fill: its opacity, 0 none; fill_ink; fill_low: towards the track's first row)."""

    style: str
    width: int
    ink: tuple[float, float, float]
    period: int
    on: int
    phase: int
    wrap: bool
    fill: float = 0.0
    fill_ink: tuple[float, float, float] = (0.0, 0.0, 0.0)
    fill_low: bool = True


@dataclass(frozen=True)
class Scanner:
    """What the scanner did: skew (radians), shear (px across the width), blur sigma px, resolution loss factor
    (1: none), illumination amplitude, stains, folds, noise sd, gamma, greyscale, JPEG quality (0: PNG only)."""

    skew: float = 0.0
    shear: float = 0.0
    blur: float = 0.0
    downsample: float = 1.0
    illumination: float = 0.0
    stains: int = 0
    folds: int = 0
    noise: float = 0.0
    gamma: float = 1.0
    grey: bool = False
    jpeg: int = 0


@dataclass(frozen=True)
class ScanStyle:
    """Every property of one scan drawn up front. Lengths in px of the scan; tracks as (top, bottom) rows (the
    borders); colours RGB floats."""

    height: int
    width: int
    scale: float
    randomised: bool
    paper: tuple[float, float, float]
    grain: float
    texture: float
    grid_ink: tuple[float, float, float]
    grid_strength: float
    grid_step: int
    heavy_every: int
    grid_width: int
    heavy_width: int
    grid_dotted: bool
    header: int
    tracks: tuple[tuple[int, int], ...]
    logarithmic: tuple[bool, ...]
    scale_lines: tuple[int, ...]
    curves_per_track: tuple[int, ...]
    samples_per_px: float
    font_px: int
    inside_labels: int
    header_text: bool
    scanner: Scanner
    labels: bool = True
    panel: int = 0  # width px of a heading panel at the left (text in a box, no grid or curves); 0: none
    curve_labels: int = 0  # px between the repeated name labels of each curve inside its track; 0: none
    border_width: int = 1  # px of the track borders
    scale_dotted: bool = False  # scale lines dotted (every third px left out)


def loguniform(rng, lo: float, hi: float) -> float:
    return float(lo * (hi / lo) ** rng.random())


def _track_rows(rng, top: int, bottom: int, n: int, randomise: bool) -> tuple[tuple[int, int], ...]:
    """n tracks between rows top and bottom: equal (classic) or of random heights with gaps sometimes."""
    if not randomise:
        borders = np.linspace(top, bottom, n + 1).round().astype(int)
        return tuple(zip(borders[:-1].tolist(), borders[1:].tolist()))
    gap = rng.uniform(0.04, 0.15) if (n > 1 and rng.random() < 0.3) else 0.0
    shares = rng.dirichlet(np.full(n, 4.0)) + 1 / (6 * n)
    shares = shares / shares.sum() * (1 - gap * (n - 1))
    edges, at = [], float(top)
    for share in shares:
        span = share * (bottom - top)
        edges.append((round(at), round(at + span)))
        at += span + gap * (bottom - top)
    return tuple(edges)


def _paper(rng, randomise: bool) -> tuple[np.ndarray, float, float]:
    if not randomise:
        tone = np.array([rng.uniform(232, 250), rng.uniform(228, 246), rng.uniform(210, 238)])
        return tone, rng.uniform(2, 7), 0.0
    kind = rng.choice(5, p=(0.35, 0.25, 0.15, 0.15, 0.1))
    base = rng.uniform(205, 253)
    tint = ((1, 1, 1), (1, 0.98, 0.9), (1, 0.95, 0.8), (0.96, 0.96, 0.96), (0.93, 0.96, 1))[kind]
    tone = np.minimum(255, base * np.array(tint) * rng.uniform(0.98, 1.02, 3))
    return tone, rng.uniform(0, 8), rng.uniform(0, 12)


def _grid_ink(rng, paper: np.ndarray, randomise: bool) -> np.ndarray:
    if not randomise:
        return paper * rng.uniform(0.55, 0.8)
    if rng.random() < 0.55:  # grey grids as dark as the curves, so that darkness never tells them apart
        return paper * rng.uniform(0.2, 0.75)
    tint = np.array(GRID_TINTS[1 + rng.integers(len(GRID_TINTS) - 1)])
    return np.clip(255 * tint * rng.uniform(0.6, 1.05), 0, 255)


def _scanner(rng, scale: float, width: int, randomise: bool) -> Scanner:
    if not randomise:
        # A 3x3 Gaussian: the scanner's softness is under a pixel.
        return Scanner(shear=rng.uniform(-1.5, 1.5), blur=rng.uniform(0.3, 0.7) * min(1.0, scale * 2))
    return Scanner(
        skew=np.deg2rad(rng.uniform(-0.5, 0.5)),
        shear=0.0,
        blur=rng.uniform(0, 1.0),
        downsample=rng.uniform(1.2, 2.0) if rng.random() < 0.2 else 1.0,
        illumination=rng.uniform(0, 0.25),
        stains=int(rng.integers(1, 4)) if rng.random() < 0.4 else 0,
        folds=int(rng.integers(1, 3)) if rng.random() < 0.25 else 0,
        noise=rng.uniform(0, 6),
        gamma=loguniform(rng, 0.75, 1.35),
        grey=bool(rng.random() < 0.35),
        jpeg=int(rng.integers(30, 96)) if rng.random() < 0.5 else 0,
    )


def _grid(rng, scale: float, randomise: bool) -> dict:
    if not randomise:
        step = length(rng.uniform(18, 40), scale, minimum=5)
        return dict(
            grid_step=step,
            heavy_every=5,
            grid_width=1,
            heavy_width=2 if scale >= 0.5 else 1,
            grid_dotted=False,
            grid_strength=0.6 * min(1.0, 4 * scale),
        )
    step = length(loguniform(rng, 8, 80), scale, minimum=3)
    return dict(
        grid_step=step,
        heavy_every=int(rng.choice((0, 2, 4, 5, 10), p=(0.15, 0.1, 0.15, 0.35, 0.25))),
        grid_width=1 + int(rng.random() < 0.25 * min(1.0, 8 * scale)),
        heavy_width=1 + int(rng.integers(0, 3) * min(1.0, 8 * scale)),
        grid_dotted=bool(rng.random() < 0.15),
        grid_strength=rng.uniform(0.3, 1.0) * min(1.0, 0.3 + step / 12),  # a fine grid is printed fainter
    )


def _layout(rng, height: int, scale: float, randomise: bool) -> dict:
    if randomise:
        header = round(height * rng.uniform(0.05, 0.2)) if rng.random() < 0.6 else 0
        n = int(rng.choice(4, p=(0.15, 0.35, 0.3, 0.2))) + 1
    else:
        header = length(rng.uniform(18, 30), scale, minimum=1) if height >= 40 else 0
        n = int(rng.integers(2, 5))
    tracks = _track_rows(rng, header, height - 1, n, randomise)
    per_track = rng.choice(4, n, p=(0.35, 0.35, 0.2, 0.1)) + 1 if randomise else rng.integers(1, 5, n)
    return dict(
        header=header,
        tracks=tracks,
        logarithmic=tuple(bool(rng.random() < 0.25) for _ in range(n)) if randomise else (False,) * n,
        scale_lines=tuple(int(v) for v in (rng.integers(0, 10, n) if randomise else rng.integers(3, 6, n))),
        curves_per_track=tuple(int(v) for v in per_track),
    )


def _labelling(rng, width: int, randomise: bool) -> dict:
    """The heading panel, the curve labels inside tracks, track borders and dotted scale lines (randomised scans
    only)."""
    if not randomise:
        return {}
    panel = round(width * rng.uniform(0.04, 0.2)) if rng.random() < 0.3 and width >= 200 else 0
    labels = round(loguniform(rng, 0.15, 0.8) * width) if rng.random() < 0.5 else 0
    border = int(rng.choice(3, p=(0.5, 0.35, 0.15))) + 1
    return dict(panel=panel, curve_labels=labels, border_width=border, scale_dotted=bool(rng.random() < 0.2))


def draw_style(index: int, seed: int, scale: float, randomise: bool) -> ScanStyle:
    """The style of scan ``index`` of set ``seed`` at ``scale``: sizes from (seed, index), every other property
    from its own stream. At scale 1 widths are 3,200-12,800 px and heights 480-640 px."""
    sizes = np.random.default_rng([seed, index])
    height = length(sizes.integers(480, 641), scale, minimum=8)
    width = length(sizes.integers(3200, 12801), scale, minimum=8)
    rng = np.random.default_rng([seed, index, STYLE_STREAM])
    paper, grain, texture = _paper(rng, randomise)
    return ScanStyle(
        **_labelling(np.random.default_rng([seed, index, STYLE_STREAM, 3]), width, randomise),
        height=height,
        width=width,
        scale=scale,
        randomised=randomise,
        paper=tuple(paper.tolist()),
        grain=grain,
        texture=texture,
        grid_ink=tuple(_grid_ink(rng, paper, randomise).tolist()),
        **_grid(rng, scale, randomise),
        **_layout(rng, height, scale, randomise),
        samples_per_px=loguniform(rng, 0.04, 0.4) if randomise else loguniform(rng, 0.03, 0.2),
        font_px=int(rng.integers(5, 15)) if randomise else 11,
        inside_labels=int(rng.integers(0, 5)) if randomise else int(rng.integers(0, 3)),
        header_text=bool(rng.random() < 0.7) if randomise else False,
        scanner=_scanner(np.random.default_rng([seed, index, SCANNER_STREAM]), scale, width, randomise),
    )


def _ink(rng, randomise: bool) -> tuple[float, float, float]:
    if not randomise:
        return tuple((np.array(CLASSIC_INKS[rng.integers(len(CLASSIC_INKS))]) + rng.normal(0, 8, 3)).tolist())
    kind = rng.choice(3, p=(0.5, 0.15, 0.35))
    if kind == 0:
        return tuple(rng.uniform(0, 45, 3).tolist())
    if kind == 1:
        return (float(rng.uniform(60, MAX_INK_LUMINANCE)),) * 3
    rgb = 255 * np.array(colorsys.hsv_to_rgb(rng.random(), rng.uniform(0.5, 1.0), rng.uniform(0.35, 0.9)))
    luminance = float(rgb @ LUMINANCE)
    # A colour as light as the paper's tone (a pale yellow) is not how logs are inked: darken it to the limit.
    return tuple((rgb * min(1.0, MAX_INK_LUMINANCE / max(luminance, 1e-6))).tolist())


def curve_look(rng, scale: float, randomise: bool) -> CurveLook:
    """The look of one curve. Dashes keep at least 6 px (3 inked) and dots 3 px (1 inked), so that the three
    styles stay apart at every scale."""
    style = STYLES[rng.choice(3, p=(0.5, 0.3, 0.2))]
    if randomise:
        base = int(rng.choice(4, p=(0.4, 0.4, 0.15, 0.05))) + 1
        width = max(1, round(base * max(1.0, scale * 8) ** 0.5))
    else:
        width = length(rng.integers(1, 4), scale)
    dashed = style == "dashed"
    low, high = ((10, 36) if dashed else (3, 9)) if randomise else ((14, 24) if dashed else (4, 7))
    period = length(rng.uniform(low, high), scale, minimum=6 if dashed else 3)
    duty = (rng.uniform(0.45, 0.75) if dashed else rng.uniform(0.25, 0.45)) if randomise else (0.6 if dashed else 0.35)
    on = min(max(int(period * duty), 3), period - 3) if dashed else max(1, min(int(period * duty), 2, period - 2))
    wrap = bool(rng.random() < 0.95) if randomise else True
    look = CurveLook(style, width, _ink(rng, randomise), period, on, int(rng.integers(period)), wrap)
    if randomise and rng.random() < 0.12:
        tint = colorsys.hsv_to_rgb(rng.random(), rng.uniform(0.2, 0.9), rng.uniform(0.6, 1.0))
        fill_ink = tuple(float(255 * c) for c in tint)
        return replace(look, fill=rng.uniform(0.15, 0.6), fill_ink=fill_ink, fill_low=bool(rng.random() < 0.5))
    return look
