"""Labels from annotation tools: labelme, COCO and CVAT exports as datasets, rasterised at true size."""

from srforge.data.annotations.dataset import (
    FORMATS,
    AnnotatedScans,
    CocoExport,
    CvatExport,
    LabelmeExport,
    open_export,
    read_export,
)
from srforge.data.annotations.shapes import LabelRules, Scan, Shape, make_rules, rasterise

__all__ = [
    "FORMATS",
    "AnnotatedScans",
    "CocoExport",
    "CvatExport",
    "LabelmeExport",
    "LabelRules",
    "Scan",
    "Shape",
    "make_rules",
    "open_export",
    "rasterise",
    "read_export",
]
