"""srforge's own log-like curves, and how a plotter puts any curve's values on its track.

A well log is not a random walk: the rock comes in beds, so a curve holds a level for a while and steps to the
next, softened by the tool's response; curves of one well are correlated (they see the same beds); there are
spikes (a bad sample, a collar), flat runs (a tool at its limit, a repeated value) and gaps (no data). The
generator draws a shared formation per scan (:func:`formation`) and every curve from it (:func:`log_curve`).

A plotter maps a value to the track linearly or by decades (logarithmic tracks for resistivity-like curves)
between a left and a right scale value; values past either edge wrap around to the other side, as the backup
scales of plotted logs do, or are pinned at the edge (:func:`track_positions`).
"""

from __future__ import annotations

import numpy as np


def _loguniform(rng, lo: float, hi: float) -> float:
    return float(lo * (hi / lo) ** rng.random())


def _moving_average(values: np.ndarray, width: int) -> np.ndarray:
    """Centred running mean over ``width`` samples (the tool's response), edges by the nearest value. [N]"""
    if width <= 1:
        return values
    padded = np.pad(values, (width // 2, width - 1 - width // 2), mode="edge")
    sums = np.cumsum(np.concatenate([[0.0], padded]))
    return (sums[width:] - sums[:-width]) / width


def _beds(rng, n: int, mean_bed: float) -> np.ndarray:
    """Piecewise-constant bed levels, each bed's level correlated with the one above it. [N]"""
    lengths = np.maximum(1, rng.exponential(mean_bed, int(n / mean_bed) * 2 + 8)).astype(int)
    starts = np.concatenate([[0], np.cumsum(lengths)])
    starts = starts[: np.searchsorted(starts, n) + 1]
    rho = rng.uniform(0.0, 0.8)
    levels = np.empty(len(starts))
    levels[0] = rng.standard_normal()
    for k in range(1, len(levels)):
        levels[k] = rho * levels[k - 1] + np.sqrt(1 - rho * rho) * rng.standard_normal()
    which = np.searchsorted(starts, np.arange(n), side="right") - 1
    return levels[which]


def formation(rng, n: int) -> np.ndarray:
    """The beds one scan's curves all see: a latent level per depth sample, zero mean, unit-ish spread. [N]"""
    mean_bed = _loguniform(rng, 3, 300)
    latent = _beds(rng, n, mean_bed) + rng.uniform(-1, 1) * np.linspace(-1, 1, n)  # plus a compaction trend
    return _moving_average(latent, int(rng.integers(1, max(2, int(mean_bed)))))


def _spikes_and_runs(rng, curve: np.ndarray) -> None:
    """Spikes (1-3 samples, several spreads tall), flat runs and gaps, in place into curve [N]."""
    n = len(curve)
    for _ in range(rng.poisson(n / _loguniform(rng, 40, 3000))):
        at = int(rng.integers(n))
        curve[at : at + int(rng.integers(1, 4))] += rng.choice((-1, 1)) * rng.uniform(1.5, 5)
    for _ in range(rng.integers(0, 3)):
        start = int(rng.integers(n))
        curve[start : start + int(rng.uniform(0.01, 0.12) * n)] = curve[start]
    if rng.random() < 0.15:
        start = int(rng.integers(n))
        curve[start : start + int(rng.uniform(0.005, 0.05) * n)] = np.nan


def log_curve(rng, latent: np.ndarray, positive: bool) -> np.ndarray:
    """One curve over the beds ``latent`` [N]: correlated with it (either sign), with beds of its own, the tool's
    noise, spikes, flat runs and the odd gap (NaN). ``positive``: resistivity-like, log-normal over 1-4 decades
    (for a logarithmic track); otherwise a linear curve around 0. float [N]"""
    n = len(latent)
    own = _moving_average(_beds(rng, n, _loguniform(rng, 2, 100)), int(rng.integers(1, 6)))
    curve = rng.choice((-1, 1)) * rng.uniform(0.4, 1.0) * latent + rng.uniform(0.1, 0.7) * own
    noise = _moving_average(rng.standard_normal(n), int(rng.integers(1, 4)))
    curve += _loguniform(rng, 0.01, 0.4) * noise
    _spikes_and_runs(rng, curve)
    if positive:
        return 10.0 ** (rng.uniform(-0.5, 1.5) + rng.uniform(0.25, 0.8) * curve)
    return curve


def track_scale(rng, values: np.ndarray, logarithmic: bool) -> tuple[float, float]:
    """Left and right scale values of a track for ``values`` [N] (finite ones at least two apart), as a plotter
    picks them: around the curve's usual range, sometimes tighter (more wraps), sometimes wider; whole decades
    on a logarithmic track. Returns (lo, hi) with lo < hi, in log10 units on a logarithmic track."""
    finite = values[np.isfinite(values)]
    if logarithmic:
        finite = np.log10(finite[finite > 0])
        lo = np.floor(np.percentile(finite, rng.uniform(0, 10)) - rng.uniform(0, 0.5))
        decades = max(1, round(np.percentile(finite, 99) - lo + rng.uniform(-0.7, 0.7)))
        return float(lo), float(lo + decades)
    p_lo, p_hi = np.percentile(finite, [rng.uniform(0, 8), rng.uniform(92, 100)])
    span = max(p_hi - p_lo, 1e-9) * _loguniform(rng, 0.7, 1.6)
    centre = (p_lo + p_hi) / 2 + rng.uniform(-0.15, 0.15) * span
    return float(centre - span / 2), float(centre + span / 2)


def track_positions(values: np.ndarray, lo: float, hi: float, logarithmic: bool, wrap: bool) -> np.ndarray:
    """Where a plotter puts ``values`` [N] across its track: 0 at the left scale value ``lo``, 1 at ``hi``.

    Past an edge a value wraps around (``wrap``: position modulo 1, the backup scale) or is pinned at that edge.
    Returns (position [N], wrap count [N]): a polyline is broken where the wrap count changes, so that a wrap is
    a jump to the other edge, not a line across the track; positions are NaN where the value is missing (or not
    positive on a logarithmic track).
    """
    with np.errstate(divide="ignore", invalid="ignore"):
        v = np.where(values > 0, np.log10(values), np.nan) if logarithmic else values.astype(float)
    u = (v - lo) / (hi - lo)
    if not wrap:
        return np.clip(u, 0, 1), np.zeros(len(u))
    turns = np.floor(u)
    return u - turns, turns
