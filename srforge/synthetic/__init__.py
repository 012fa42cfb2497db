"""Synthetic well-log scans with exact curve masks, in the size range of the real archive.

A scan is paper with depth running along the width: a depth grid, horizontal tracks with borders and scale lines,
curves in each track (from LAS files through lasio, or srforge's own log-like curves), text, then a scanner. At
scale=1 widths are 3,200-12,800 px and heights 480-640 px; ``scale`` shrinks every length but keeps curves at
least 1 px wide, dashes at least 6 px apart (3 inked) and dots 3 px apart (1 inked), so that the three styles
stay apart at every scale. ``scale`` is one number for every scan, or a range (lo, hi) that gives each scan its
own (:func:`scan_scale`). ``randomise=True`` draws every property archives vary (paper, grid, tracks, inks, line
widths, dashes, text, stains, folds, blur, skew, illumination, JPEG) from wide ranges (style.RANDOMISED).

Scan i depends only on (seed, i), never on n, so growing a set keeps its first scans. The mask is the curve
layer's coverage: nothing drawn over or under a curve changes it, and the scanner's skew moves it with the image.

Modules: scale (the scale of a scan), curves (srforge's own curves; a value's place on its track), las (curves
from LAS files), style (the per-scan draw of every property), draw and text (the layers), degrade (the scanner),
scan (one scan), write (a folder of them and its settings).
"""

from srforge.synthetic.draw import style_columns
from srforge.synthetic.las import LasError, las_files, load_wells
from srforge.synthetic.scale import Scale, scan_scale
from srforge.synthetic.scan import CLASSES, ScanLayers, scan_layers, welllog_scan
from srforge.synthetic.style import RANDOMISED, STYLES, CurveLook, Scanner, ScanStyle, curve_look, draw_style
from srforge.synthetic.write import (
    SETTINGS_FILE,
    clear_scans,
    folder_settings,
    is_stale,
    make_welllog_scans,
    missing_scans,
    scan_name,
    scan_settings,
)

__all__ = [
    "CLASSES",
    "STYLES",
    "RANDOMISED",
    "Scale",
    "scan_scale",
    "welllog_scan",
    "scan_layers",
    "ScanLayers",
    "make_welllog_scans",
    "missing_scans",
    "scan_name",
    "scan_settings",
    "folder_settings",
    "is_stale",
    "clear_scans",
    "SETTINGS_FILE",
    "LasError",
    "las_files",
    "load_wells",
    "ScanStyle",
    "Scanner",
    "CurveLook",
    "draw_style",
    "curve_look",
    "style_columns",
]
