"""The scale a scan is drawn at: one number for every scan, or a range (lo, hi) each scan draws its own from."""

from __future__ import annotations

import math
from numbers import Real

import numpy as np

# Mixed into a scan's seed for the stream its scale is drawn from, apart from the streams that draw the scan,
# so that a scale range leaves every other draw of scan i as it is at one scale.
SCALE_STREAM = 0x5CA1E

Scale = float | tuple[float, float]  # one scale for every scan, or a range (lo, hi) each scan's scale is drawn from


def _positive_number(value) -> bool:
    return isinstance(value, Real) and not isinstance(value, bool) and math.isfinite(value) and value > 0


def scale_range(scale) -> tuple[float, float]:
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
    lo, hi = scale_range(scale)
    if not isinstance(scale, (tuple, list)):
        return scale
    u = np.random.default_rng([seed, index, SCALE_STREAM]).random()
    return float(min(hi, lo * (hi / lo) ** u))  # min: rounding must not take u < 1 past hi


def length(value: float, scale: float, minimum: int = 1) -> int:
    """A length of ``value`` px at full size, at ``scale``: rounded, at least ``minimum``."""
    return max(minimum, round(value * scale))
