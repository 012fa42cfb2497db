"""Curves from LAS files (lasio, the ``las`` extra): which files, what is usable in them, a depth window per scan.

``data.synthetic.las`` lists paths or globs. Every file is read once per process; a curve is usable where at
least half its samples are numbers and it takes at least two values (the depth index is never a curve).
Resistivity-like curves (positive over more than a decade and a half) are plotted on logarithmic tracks. A
scan draws, from its own generator, a file (by its number of samples), a depth window and the curves of each
track (:func:`las_window`).
"""

from __future__ import annotations

import functools
import glob
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from srforge.extras import MissingExtraError

MIN_FINITE = 0.5  # a curve is usable in a window where at least this share of its samples are numbers
MIN_SAMPLES = 16  # a file with fewer depth samples has no usable curve


class LasError(ValueError):
    """A LAS file that cannot give curves (missing, unreadable, no usable curve) or a glob that matches nothing;
    the message names the file or the pattern and what was wrong."""


@dataclass(frozen=True)
class Well:
    """The usable curves of one LAS file: name -> values [N] (NaN where the file has no value)."""

    path: str
    curves: dict[str, np.ndarray]

    @property
    def samples(self) -> int:
        return len(next(iter(self.curves.values())))


def _glob_chars(text: str) -> bool:
    return any(c in text for c in "*?[")


def las_files(patterns) -> tuple[str, ...]:
    """The files ``patterns`` (a path or glob, or a list of them) name: globs expanded and sorted, duplicates
    dropped, in the order given. A missing file, a glob that matches nothing or an empty list is a LasError."""
    if isinstance(patterns, (str, Path)):
        patterns = [patterns]
    files: list[str] = []
    for pattern in map(str, patterns):
        if _glob_chars(pattern):
            matched = sorted(p for p in glob.glob(pattern, recursive=True) if Path(p).is_file())
            if not matched:
                raise LasError(f"LAS glob {pattern!r} matches no file")
        elif not Path(pattern).is_file():
            found = "a folder" if Path(pattern).is_dir() else "nothing there"
            raise LasError(f"LAS file {pattern}: expected a LAS file, found {found}")
        else:
            matched = [pattern]
        files += [str(Path(p).resolve()) for p in matched if str(Path(p).resolve()) not in files]
    if not files:
        raise LasError("LAS files: expected at least one path or glob, found an empty list")
    return tuple(files)


def _lasio():
    try:
        import lasio
    except ImportError as exc:
        raise MissingExtraError(
            "curves from LAS files (data.synthetic.las) need lasio: pip install 'srforge-seg[las]' "
            f"(or pip install lasio); the import failed: {exc}"
        ) from exc
    return lasio


def usable(values: np.ndarray) -> bool:
    """True when at least MIN_FINITE of ``values`` [N] are numbers and they take at least two values."""
    finite = values[np.isfinite(values)]
    return len(values) >= MIN_SAMPLES and finite.size >= MIN_FINITE * len(values) and np.ptp(finite) > 0


def _read_well(path: str) -> Well:
    lasio = _lasio()
    try:
        las = lasio.read(path, ignore_header_errors=True)
    except Exception as exc:  # lasio raises many kinds (LASHeaderError, ValueError, UnicodeDecodeError, ...)
        raise LasError(f"LAS file {path}: lasio cannot read it ({type(exc).__name__}: {exc})") from None
    curves = {}
    for curve in las.curves[1:]:  # the first is the depth index
        values = np.asarray(curve.data, dtype=float) if np.asarray(curve.data).dtype.kind in "fiu" else None
        if values is not None and values.ndim == 1 and usable(values):
            curves[curve.mnemonic] = values
    if not curves:
        names = ", ".join(c.mnemonic for c in las.curves[1:]) or "none"
        raise LasError(
            f"LAS file {path}: no usable curve (expected one with at least {MIN_SAMPLES} samples, "
            f"{MIN_FINITE:.0%} of them numbers, and two different values; curves found: {names})"
        )
    return Well(path, curves)


@functools.lru_cache(maxsize=4)
def _wells(files: tuple[str, ...], stamps: tuple) -> tuple[Well, ...]:
    return tuple(_read_well(path) for path in files)


def load_wells(patterns) -> tuple[Well, ...]:
    """The wells of ``patterns`` (:func:`las_files`), read once per process while the files stay unchanged.
    Raises LasError naming a file that cannot be read or holds no usable curve, MissingExtraError without
    lasio."""
    files = las_files(patterns)
    stamps = tuple((Path(p).stat().st_size, Path(p).stat().st_mtime_ns) for p in files)
    return _wells(files, stamps)


def is_logarithmic(values: np.ndarray) -> bool:
    """Resistivity-like: every number positive and spanning more than a decade and a half (5th to 95th
    percentile)."""
    finite = values[np.isfinite(values)]
    if finite.size == 0 or finite.min() <= 0:
        return False
    lo, hi = np.percentile(finite, [5, 95])
    return hi / lo > 10**1.5


def las_window(rng, wells: tuple[Well, ...], samples: int) -> dict[str, np.ndarray]:
    """A depth window of ``samples`` consecutive samples (all of a shorter file): a file drawn by its number of
    samples, a start drawn uniformly, the curves usable in that window (name -> values [samples or fewer]).
    Windows with no usable curve are drawn again (up to 20 times); then the whole file is taken."""
    weights = np.array([w.samples for w in wells], float)
    well = wells[rng.choice(len(wells), p=weights / weights.sum())]
    n = min(samples, well.samples)
    for _ in range(20):
        start = int(rng.integers(well.samples - n + 1))
        window = {k: v[start : start + n] for k, v in well.curves.items() if usable(v[start : start + n])}
        if window:
            return window
    return dict(well.curves)
