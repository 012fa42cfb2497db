"""Writing a set of scans: OUT/images/scan_XXXXX.png and OUT/masks/scan_XXXXX.png, in parallel, atomically, and
the settings they were drawn with (OUT/.srforge_synthetic.json), so that a folder made with other settings is
never taken for the one asked for."""

from __future__ import annotations

import hashlib
import json
import os
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np
from PIL import Image

from srforge.atomic import atomic_write, atomic_write_text
from srforge.synthetic.las import las_files, load_wells
from srforge.synthetic.scale import Scale, scale_range
from srforge.synthetic.scan import CLASSES, welllog_scan

SETTINGS_FILE = ".srforge_synthetic.json"
# Changed whenever the generator draws other bytes for the same settings, so that older folders are redone.
GENERATOR_VERSION = 2


def _save_atomic(array: np.ndarray, path: Path) -> None:
    atomic_write(path, lambda f: Image.fromarray(array).save(f, format="PNG", compress_level=1))


def scan_name(index: int) -> str:
    return f"scan_{index:05d}.png"


def missing_scans(out_dir, n: int) -> list[int]:
    """Indices i < n whose image or mask is not yet in out_dir. A file present is complete: both are written to a
    temporary name and renamed."""
    out = Path(out_dir)
    return [i for i in range(n) if not all((out / sub / scan_name(i)).is_file() for sub in ("images", "masks"))]


def _digest(path: str) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def scan_settings(scale: Scale, seed: int, classes: str, las=None, randomise: bool = False) -> dict:
    """What scan i depends on besides i (not n): the generator's version, scale, seed, classes, randomise, and
    the LAS files by content (sha256, in order). JSON-ready."""
    lo, hi = scale_range(scale)
    return {
        "generator": GENERATOR_VERSION,
        "scale": [lo, hi] if isinstance(scale, (tuple, list)) else scale,
        "seed": seed,
        "classes": classes,
        "randomise": bool(randomise),
        "las": [_digest(p) for p in las_files(las)] if las else [],
    }


def folder_settings(out_dir) -> dict | None:
    """The settings a folder's scans were drawn with, None when it has none (or they cannot be read)."""
    try:
        return json.loads((Path(out_dir) / SETTINGS_FILE).read_text())
    except (OSError, ValueError):
        return None


def is_stale(out_dir, settings: dict) -> bool:
    """True when out_dir holds scans drawn with other settings than ``settings`` (:func:`scan_settings`), or
    scans without a settings file (an older srforge drew them)."""
    found = folder_settings(out_dir)
    if found is not None:
        return found != settings
    return any(any((Path(out_dir) / sub).glob("scan_*.png")) for sub in ("images", "masks"))


def clear_scans(out_dir) -> int:
    """Remove the scans (images/scan_*.png and masks/scan_*.png, nothing else) and the settings file of a folder
    drawn with other settings; returns how many files went."""
    out = Path(out_dir)
    (out / SETTINGS_FILE).unlink(missing_ok=True)
    gone = 0
    for sub in ("images", "masks"):
        for path in sorted((out / sub).glob("scan_*.png")):
            path.unlink(missing_ok=True)
            gone += 1
    return gone


def _write_scan(out: Path, index: int, options: tuple) -> Path:
    scale, seed, classes, las, randomise = options
    image, mask = welllog_scan(index, seed=seed, scale=scale, classes=classes, las=las, randomise=randomise)
    _save_atomic(mask, out / "masks" / scan_name(index))
    _save_atomic(image, out / "images" / scan_name(index))
    return out / "images" / scan_name(index)


def _checked(scale, classes: str, las) -> tuple | None:
    """Arguments checked here, not first in a worker (and also when no scan is missing); LAS files resolved."""
    if classes not in CLASSES:
        raise ValueError(f"classes must be one of {sorted(CLASSES)}, got {classes!r}")
    scale_range(scale)
    if not las:
        return None
    files = las_files(las)
    load_wells(files)  # every file read once here: an unreadable one is named before any worker starts
    return files


def make_welllog_scans(
    out_dir,
    n: int,
    scale: Scale = 1.0,
    seed: int = 0,
    classes: str = "binary",
    workers: int | None = None,
    only_missing: bool = False,
    las=None,
    randomise: bool = False,
) -> list[Path]:
    """Write n scans as out_dir/images/scan_XXXXX.png and out_dir/masks/scan_XXXXX.png; return the image paths.

    The folder is what SegmentationFolder(out_dir) reads; mask values follow ``CLASSES[classes]``. ``scale``: a
    number for every scan, or a range (lo, hi) (tuple or list) each scan draws its own from (:func:`scan_scale`).
    ``las``: LAS paths or globs the curves come from (lasio, the ``las`` extra); None: srforge's own curves.
    ``randomise``: every property of a scan drawn from the ranges archives vary over (style.RANDOMISED).
    ``workers`` processes write scans in parallel (default: one per CPU); the bytes written do not depend on it,
    since scan i depends only on (seed, i). ``only_missing`` writes only the scans :func:`missing_scans` names,
    so that a generation cut short (or run by several processes at once) completes the same set. The settings
    are written to out_dir/.srforge_synthetic.json (:func:`scan_settings`) first; scans drawn with other
    settings (or by an older srforge, without that file) are removed first (:func:`is_stale`). A LAS file
    that is missing or unreadable or has no usable curve, or a glob matching nothing, is a LasError (a
    ValueError) naming it.
    """
    las = _checked(scale, classes, las)
    out = Path(out_dir)
    (out / "images").mkdir(parents=True, exist_ok=True)
    (out / "masks").mkdir(parents=True, exist_ok=True)
    settings = scan_settings(scale, seed, classes, las, randomise)
    if is_stale(out, settings):
        clear_scans(out)
    atomic_write_text(out / SETTINGS_FILE, json.dumps(settings))
    todo = missing_scans(out, n) if only_missing else range(n)
    options = (scale, seed, classes, las, randomise)
    jobs = [(out, i, options) for i in todo]
    workers = min(os.cpu_count() or 1, len(jobs)) if workers is None else min(workers, len(jobs))
    if workers > 1:
        with ProcessPoolExecutor(workers) as pool:
            list(pool.map(_write_scan, *zip(*jobs), chunksize=max(1, len(jobs) // (8 * workers))))
    else:
        for job in jobs:
            _write_scan(*job)
    return [out / "images" / scan_name(i) for i in range(n)]
