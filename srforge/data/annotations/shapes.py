"""Shapes read from an annotation export, the rules that turn their labels into class ids, and the mask they make.

Every format's reader (labelme, COCO, CVAT) gives a list of :class:`Scan` records, each holding its image's source
and its :class:`Shape` list in drawing order; :func:`rasterise` draws one at the image's true, displayed size.
"""

from __future__ import annotations

import hashlib
import io
import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from srforge.constants import IGNORE_INDEX
from srforge.data.annotations.rasterise import (
    bitmap_cover,
    paint,
    polygon_cover,
    polyline_cover,
    segment_cover,
    turn_array,
    turn_points,
)
from srforge.data.images import DataError, open_image, orientation

MAX_POINTS = 100_000  # points one shape may have: a curve across a 12,800 px scan needs about 13,000
MAX_COORDINATE = 2.0**20  # |x|, |y| beyond this (1,048,576 px) are no drawing of any scan: a damaged file
KINDS = ("polygon", "line", "points", "circle", "bitmap")
COORDS = ("stored", "displayed")
UNKNOWN = ("error", "ignore")


@dataclass
class Shape:
    """One labelled shape. ``kind``: polygon (``parts``: its rings, each [N, 2] (x, y)), line (``parts``: one
    polyline [N, 2]), points (``parts``: [N, 2], discs of the point radius), circle (``parts``: [[centre]],
    ``radius2`` its squared radius) or bitmap (``bitmap`` bool [h, w] with its top-left pixel at ``origin`` (x, y)).
    ``where`` names it in messages ("shape 3 (polygon 'curve')")."""

    label: str
    kind: str
    parts: list = field(default_factory=list)
    where: str = ""
    radius2: float = 0.0
    bitmap: np.ndarray | None = None
    origin: tuple[int, int] = (0, 0)


@dataclass
class Scan:
    """One image of an export: its name (the scan's), the annotation ``file`` it comes from (for messages), its
    image as a file path or embedded bytes, the (H, W) the export states (None: none), its shapes in drawing order
    and ``digest``, a hash of everything of the export that draws it (the cache key of its mask)."""

    name: str
    file: str
    image: Path | None
    data: bytes | None
    stated: tuple[int, int] | None
    shapes: list[Shape]
    digest: str = ""

    def label(self) -> str:
        """The image as messages name it."""
        return str(self.image) if self.image is not None else f"{self.file} (embedded imageData)"

    def source(self):
        """What PIL opens: the image path or a binary stream of the embedded bytes."""
        return self.image if self.image is not None else io.BytesIO(self.data)


def digest(value) -> str:
    """A hash of a JSON-able value: the content a scan's mask is drawn from."""
    return hashlib.sha256(json.dumps(value, sort_keys=True, default=str).encode()).hexdigest()


@dataclass(frozen=True)
class LabelRules:
    """How labels become mask values: ``classes`` {label: id}; labels in ``ignore`` become ``ignore_index``;
    an ``unknown`` label is an error ("error") or ignored ("ignore"); lines are ``line_width`` px wide unless
    ``line_widths`` names their label; points are discs of ``point_radius`` px; ``coords``: whether the export's
    coordinates are over the image as stored ("stored": turned with an EXIF-oriented image) or as displayed."""

    classes: dict
    ignore: frozenset = frozenset()
    unknown: str = "error"
    ignore_index: int = IGNORE_INDEX
    line_width: float = 1.0
    line_widths: dict = field(default_factory=dict)
    point_radius: float = 1.0
    coords: str = "stored"

    def value(self, label: str) -> int | None:
        """The mask value of ``label``; None for an unknown label."""
        if label in self.ignore:
            return self.ignore_index
        if label in self.classes:
            return self.classes[label]
        return self.ignore_index if self.unknown == "ignore" else None

    def key(self) -> str:
        """What the rules draw by, for the cache key of a mask."""
        return digest(
            [
                self.classes,
                sorted(self.ignore),
                self.unknown,
                self.ignore_index,
                self.line_width,
                self.line_widths,
                self.point_radius,
                self.coords,
            ]
        )


def _number(value, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        raise ValueError(f"{what}: expected a finite number >= 0, found {value!r}")
    return float(value)


def make_rules(
    classes,
    ignore=(),
    unknown: str = "error",
    ignore_index: int = IGNORE_INDEX,
    line_width: float = 1.0,
    point_radius: float = 1.0,
    coords: str = "stored",
) -> LabelRules:
    """:class:`LabelRules` from a dataset's args: ``classes`` a list of labels (id = position, as
    ``model.class_names``) or a {label: id} mapping; ``line_width`` a number or {label: width, "default": width}.
    A ValueError names the arg that is wrong."""
    if isinstance(classes, (list, tuple)):
        mapping = {str(name): i for i, name in enumerate(classes)}
    elif isinstance(classes, dict):
        mapping = {str(k): v for k, v in classes.items()}
    else:
        raise ValueError(
            f"classes: expected a list of labels (id = position) or a {{label: id}} mapping, found {classes}"
        )
    bad = {k: v for k, v in mapping.items() if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v < 65536}
    if not mapping or bad:
        raise ValueError(f"classes: expected labels mapped to class ids 0 and up, found {bad or classes!r}")
    if unknown not in UNKNOWN:
        raise ValueError(f"unknown: expected one of {', '.join(UNKNOWN)}, found {unknown!r}")
    if coords not in COORDS:
        raise ValueError(f"coords: expected one of {', '.join(COORDS)}, found {coords!r}")
    widths = dict(line_width) if isinstance(line_width, dict) else {"default": line_width}
    widths = {str(k): _number(v, f"line_width[{k!r}]") for k, v in widths.items()}
    default = widths.pop("default", 1.0)
    return LabelRules(
        mapping,
        frozenset(map(str, ignore or ())),
        unknown,
        int(ignore_index),
        default,
        widths,
        _number(point_radius, "point_radius"),
        coords,
    )


def check_points(points, where: str) -> np.ndarray:
    """``points`` (a list of [x, y] pairs, or a flat [x, y, x, y, ...] list) as float64 [N, 2]; a ValueError naming
    ``where`` for anything else, a coordinate that is not finite or beyond MAX_COORDINATE, or over MAX_POINTS."""
    try:
        array = np.asarray(points, dtype=np.float64)
    except (TypeError, ValueError):
        raise ValueError(f"{where}: expected points as [[x, y], ...] numbers, found {str(points)[:80]}") from None
    if array.ndim == 1 and array.size % 2 == 0:
        array = array.reshape(-1, 2)
    if array.ndim != 2 or array.shape[1] != 2 or len(array) == 0:
        raise ValueError(f"{where}: expected points [N, 2] (x, y), found shape {list(array.shape)}")
    if len(array) > MAX_POINTS:
        raise ValueError(f"{where}: {len(array):,} points, expected at most {MAX_POINTS:,} a shape")
    if not np.isfinite(array).all() or np.abs(array).max() > MAX_COORDINATE:
        # The first value that is not finite, else the largest in magnitude (argmax indexes the flattened array).
        flat = array.ravel()
        worst = flat[~np.isfinite(flat)][0] if not np.isfinite(flat).all() else flat[np.abs(flat).argmax()]
        raise ValueError(
            f"{where}: coordinate {float(worst):g} is not a pixel position of any image (expected finite "
            f"values within +-{MAX_COORDINATE:,.0f})"
        )
    return array


def default_images(path: Path) -> Path:
    """Where an export file (COCO's JSON, CVAT's XML) keeps its images by default: ``images/`` beside the file, or
    beside its ``annotations/`` folder, or the file's own folder."""
    for folder in (path.parent / "images", path.parent.parent / "images"):
        if folder.is_dir():
            return folder
    return path.parent


def header(scan: Scan) -> tuple[tuple[int, int], int]:
    """(the stored (H, W), the EXIF orientation) of a scan's image, from its header; a DataError naming it."""
    with open_image(scan.source(), scan.label()) as image:
        width, height = image.size
        if image.format == "TIFF":
            width, height = image.tag_v2.get(256, width), image.tag_v2.get(257, height)
        return (height, width), orientation(image)


def displayed(stored: tuple[int, int], turn: int) -> tuple[int, int]:
    """The displayed (H, W) of an image stored at ``stored`` under EXIF orientation ``turn``."""
    return (stored[1], stored[0]) if turn >= 5 else stored


def size_problem(scan: Scan, stored: tuple[int, int], turn: int, rules: LabelRules) -> str | None:
    """What is wrong when the export states another size than its image's (stored or displayed, per the rules)."""
    shown = displayed(stored, turn)
    expected = stored if rules.coords == "stored" else shown
    if scan.stated is None or tuple(scan.stated) == tuple(expected):
        return None
    hint = ""
    if tuple(scan.stated) == shown != stored:
        hint = "; its coordinates look drawn over the image as displayed: set the dataset's coords: displayed"
    elif tuple(scan.stated) == stored != shown:
        hint = "; its coordinates look drawn over the image as stored: set the dataset's coords: stored"
    return (
        f"{scan.file}: states image {scan.name!r} is {scan.stated[0]} x {scan.stated[1]} (H x W) but "
        f"{scan.label()} is {expected[0]} x {expected[1]} as {rules.coords}{hint}"
    )


def _windows(shape: Shape, rules: LabelRules, size: tuple[int, int]) -> list:
    """The covered windows of one shape over an image of displayed ``size``."""
    if shape.kind == "polygon":
        return polygon_cover(shape.parts, size) if all(len(p) >= 3 for p in shape.parts) else []
    if shape.kind == "line":
        half = rules.line_widths.get(shape.label, rules.line_width) / 2
        return polyline_cover(shape.parts[0], half * half, size)
    if shape.kind == "points":
        r2 = rules.point_radius**2
        return [window for p in shape.parts[0] for window in segment_cover(p, p, r2, size)]
    if shape.kind == "circle":
        centre = shape.parts[0][0]
        return segment_cover(centre, centre, shape.radius2, size)
    found = bitmap_cover(shape.bitmap, shape.origin[0], shape.origin[1], size)
    return [found] if found is not None else []


def orient_shape(shape: Shape, turn: int, stored: tuple[int, int]) -> Shape:
    """``shape`` drawn over the stored pixels, as displayed under EXIF orientation ``turn``."""
    if turn == 1:
        return shape
    if shape.kind != "bitmap":
        parts = [turn_points(p, turn, stored) for p in shape.parts]
        return Shape(shape.label, shape.kind, parts, shape.where, shape.radius2)
    h, w = shape.bitmap.shape
    corners = turn_points(
        np.array([[shape.origin[0], shape.origin[1]], [shape.origin[0] + w, shape.origin[1] + h]], dtype=np.float64),
        turn,
        stored,
    )
    origin = (int(corners[:, 0].min()), int(corners[:, 1].min()))
    return Shape(shape.label, "bitmap", [], shape.where, bitmap=turn_array(shape.bitmap, turn), origin=origin)


def unknown_labels(scans: list[Scan], rules: LabelRules) -> list[str]:
    """One problem per shape whose label maps to no class (under ``unknown: error``), naming file, shape, label."""
    known = ", ".join(sorted(rules.classes)) or "none"
    return [
        f"{scan.file}: {shape.where}: label {shape.label!r} is no class ({known}) and not in ignore; add it to the "
        "dataset's classes or ignore, or set unknown: ignore"
        for scan in scans
        for shape in scan.shapes
        if rules.value(shape.label) is None
    ]


def rasterise(scan: Scan, rules: LabelRules, stored: tuple[int, int], turn: int) -> torch.Tensor:
    """The mask of ``scan`` at its image's displayed size: [H, W] uint8 (int64 when a class id or the ignore index
    passes 255); 0 where no shape draws, later shapes over earlier ones. ``stored``, ``turn``: the image's stored
    (H, W) and EXIF orientation, from its header."""
    size = displayed(stored, turn)
    top = max([*rules.classes.values(), rules.ignore_index])
    canvas = np.zeros(size, np.uint8 if top < 256 else np.int64)
    for shape in scan.shapes:
        value = rules.value(shape.label)
        if value is None:
            raise DataError(unknown_labels(Scan(scan.name, scan.file, None, None, None, [shape]), rules)[0])
        drawn = orient_shape(shape, turn, stored) if rules.coords == "stored" else shape
        paint(canvas, _windows(drawn, rules, size), value)
    return torch.from_numpy(canvas)
