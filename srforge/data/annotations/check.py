"""Every problem of an annotation export at once (check_data's --format): what the readers find (malformed shapes,
unknown labels, duplicate images, annotations pointing at no image, missing images), images that do not decode or
are of another size than the export states, shapes reaching outside their image, degenerate polygons, class ids
beyond the model's."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
from tqdm import tqdm

from srforge.data.annotations.dataset import AnnotatedScans, export_rules, read_export
from srforge.data.annotations.shapes import (
    LabelRules,
    Scan,
    Shape,
    displayed,
    header,
    orient_shape,
    size_problem,
    unknown_labels,
)
from srforge.data.images import DataError, invalid_mask_values


def shape_problems(scan: Scan, shape: Shape, size: tuple[int, int]) -> list[str]:
    """A shape (as displayed) that reaches outside an image of ``size`` (H, W), or a polygon ring of fewer than 3
    points or no area."""
    found = []
    if shape.kind == "bitmap":
        (left, top), (h, w) = shape.origin, shape.bitmap.shape
        if left < 0 or top < 0 or left + w > size[1] or top + h > size[0]:
            found.append(f"its {w} x {h} px mask at ({left}, {top}) reaches outside the {size[1]} x {size[0]} image")
        return [f"{scan.file}: {shape.where}: {p}" for p in found]
    for ring in shape.parts:
        outside = (ring[:, 0] < 0) | (ring[:, 0] > size[1]) | (ring[:, 1] < 0) | (ring[:, 1] > size[0])
        if outside.any():
            x, y = ring[outside.argmax()]
            found.append(f"point ({x:g}, {y:g}) is outside the {size[1]} x {size[0]} (W x H) image")
        if shape.kind == "polygon":
            area = 0.5 * abs(np.dot(ring[:, 0], np.roll(ring[:, 1], -1)) - np.dot(ring[:, 1], np.roll(ring[:, 0], -1)))
            if len(ring) < 3 or area == 0:
                found.append(f"degenerate polygon: {len(ring)} point(s), area {area:g}; it covers no pixel")
    return [f"{scan.file}: {shape.where}: {p}" for p in found]


def scan_problems(dataset: AnnotatedScans, index: int, num_classes: int | None) -> list[str]:
    """What is wrong with scan ``index``: its image (unreadable, another size), its shapes, its mask's values."""
    scan, rules = dataset.scans[index], dataset.rules
    try:
        stored, turn = header(scan)
        problem = size_problem(scan, stored, turn, rules)
        if problem:
            return [problem]
        entry = dataset.load(index)
    except DataError as error:
        return [str(error)]
    except (ValueError, TypeError, OverflowError) as error:  # a shape that passed its reader but cannot be drawn
        return [f"{scan.file}: scan {scan.name!r}: its mask cannot be drawn ({type(error).__name__}: {error})"]
    size = displayed(stored, turn)
    found = []
    for shape in scan.shapes:
        shown = orient_shape(shape, turn, stored) if rules.coords == "stored" else shape
        found += shape_problems(scan, shown, size)
    bad = invalid_mask_values(entry.mask, num_classes, rules.ignore_index) if num_classes is not None else []
    if bad:
        found.append(
            f"{scan.file}: scan {scan.name!r}: class ids {bad} are >= num_classes={num_classes}; fix the dataset's "
            "classes or model.num_classes"
        )
    return found


def check_export(
    fmt: str, path, rules: dict, images=None, num_classes: int | None = None, progress: bool = False, **dataset
) -> tuple[AnnotatedScans | None, list[str]]:
    """(the export's dataset, every problem found) for ``check_data --format``: ``rules`` are the dataset's label
    args (classes, ignore, unknown, line_width, ...); ``dataset``: AnnotatedScans's own (image_mode, cache, and
    occluded for CVAT). The dataset is None when the export cannot be read at all."""
    occluded = dataset.pop("occluded", "draw")
    try:
        label_rules: LabelRules = export_rules(rules, fmt)
        scans, problems = read_export(fmt, path, images, occluded)
    except (DataError, ValueError, TypeError) as error:
        return None, [str(error)]
    problems += unknown_labels(scans, label_rules)
    # The rest is checked without the unknown labels' shapes, so that each scan's other problems still show.
    known = [replace(s, shapes=[sh for sh in s.shapes if label_rules.value(sh.label) is not None]) for s in scans]
    checked = AnnotatedScans(known, label_rules, **dataset)
    for index in tqdm(range(len(known)), desc="checking", unit="scan", disable=not progress):
        problems += scan_problems(checked, index, num_classes)
    return checked, problems
