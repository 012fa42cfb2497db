"""COCO's instances JSON: ``images``, ``categories`` and ``annotations`` whose ``segmentation`` is polygons (flat
[x, y, x, y, ...] lists, even-odd together: a part inside another is a hole), uncompressed RLE (``counts`` a list)
or compressed RLE (``counts`` COCO's string), crowd or not; the images under a folder by ``file_name``.

RLE is decoded here (:func:`srforge.data.annotations.rasterise.coco_counts`), exactly as pycocotools decodes it; no
extra package is needed. A scan's annotations are drawn in the order the file lists them, later over earlier.
"""

from __future__ import annotations

import json
from pathlib import Path

from srforge.data.annotations.rasterise import coco_counts, runs_to_bitmap
from srforge.data.annotations.shapes import Scan, Shape, check_points, default_images, digest
from srforge.data.archive import unsafe_name
from srforge.data.images import DataError
from srforge.data.naming import scan_stem


def _rle_shape(rle: dict, label: str, where: str, stated) -> Shape:
    """An RLE segmentation ({counts: list | str, size: [h, w]}) as a bitmap Shape over the whole image."""
    size = rle.get("size")
    if not (
        isinstance(size, list)
        and len(size) == 2
        and all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in size)
    ):
        raise ValueError(f"{where}: RLE 'size' must be [height, width], found {size!r}")
    if stated is not None and tuple(size) != tuple(stated):
        raise ValueError(f"{where}: RLE size {size} (H, W) but its image is {list(stated)}")
    counts = rle.get("counts")
    if isinstance(counts, str):
        try:
            counts = coco_counts(counts)
        except ValueError as error:
            raise ValueError(f"{where}: RLE 'counts' string: {error}") from None
    elif not (isinstance(counts, list) and all(isinstance(v, int) and not isinstance(v, bool) for v in counts)):
        raise ValueError(f"{where}: RLE 'counts' must be a list of integers or COCO's string, found {str(counts)[:60]}")
    try:
        bitmap = runs_to_bitmap(counts, size[0], size[1], "F")
    except ValueError as error:
        raise ValueError(f"{where}: {error}") from None
    return Shape(label, "bitmap", [], where, bitmap=bitmap)


def read_annotation(entry: dict, label: str, index: int, stated) -> Shape:
    """One COCO annotation as a Shape; a ValueError naming it for anything malformed."""
    where = f"annotation {index} (id {entry.get('id')}, {label!r})"
    segmentation = entry.get("segmentation")
    if isinstance(segmentation, dict):
        return _rle_shape(segmentation, label, where, stated)
    if not isinstance(segmentation, list) or not segmentation:
        raise ValueError(
            f"{where}: 'segmentation' must be polygons [[x, y, ...], ...] or RLE, found {str(segmentation)[:60]}"
        )
    rings = [check_points(part, f"{where} polygon {k}") for k, part in enumerate(segmentation)]
    return Shape(label, "polygon", rings, where)


def _index(document: dict, path: Path) -> tuple[dict, dict, list[str]]:
    """({image id: image entry}, {category id: name}, problems) of a COCO document."""
    problems, images, categories = [], {}, {}
    for key in ("images", "annotations", "categories"):
        if not isinstance(document.get(key), list):
            problems.append(f"{path}: expected COCO's '{key}' list, found {type(document.get(key)).__name__}")
    if problems:
        return images, categories, problems
    names: dict[str, object] = {}
    for entry in document["images"]:
        if not isinstance(entry, dict) or "id" not in entry or not isinstance(entry.get("file_name"), str):
            problems.append(f"{path}: image entry {str(entry)[:80]} lacks 'id' or 'file_name'")
        elif unsafe_name(entry["file_name"]):
            problems.append(
                f"{path}: image entry id {entry['id']}: file_name {entry['file_name']!r} is no relative path under "
                f"the images folder ({unsafe_name(entry['file_name'])}); refused, as it names a file outside it"
            )
        elif entry["id"] in images:
            problems.append(f"{path}: image id {entry['id']} is listed twice")
        elif scan_stem(entry["file_name"]) in names:
            first = names[scan_stem(entry["file_name"])]
            problems.append(f"{path}: image {entry['file_name']!r} is listed twice (ids {first} and {entry['id']})")
        else:
            images[entry["id"]] = entry
            names[scan_stem(entry["file_name"])] = entry["id"]
    for entry in document["categories"]:
        if isinstance(entry, dict) and "id" in entry and isinstance(entry.get("name"), str):
            categories[entry["id"]] = entry["name"]
        else:
            problems.append(f"{path}: category entry {str(entry)[:80]} lacks 'id' or 'name'")
    return images, categories, problems


def _stated(entry: dict) -> tuple[int, int] | None:
    height, width = entry.get("height"), entry.get("width")
    ok = all(isinstance(v, int) and not isinstance(v, bool) for v in (height, width))
    return (height, width) if ok else None


def read_coco(annotations, images=None) -> tuple[list[Scan], list[str]]:
    """The scans of the COCO file ``annotations``, images under the folder ``images`` (default:
    :func:`srforge.data.annotations.shapes.default_images`): (scans by name, every problem found)."""
    path = Path(annotations)
    try:
        document = json.loads(path.read_bytes())
    except (OSError, ValueError) as error:
        raise DataError(
            f"{path}: cannot read as COCO JSON ({error}); the file is missing, truncated or not JSON"
        ) from None
    if not isinstance(document, dict):
        raise DataError(
            f"{path}: expected COCO's JSON object (images, annotations, categories), found {type(document).__name__}"
        )
    folder = Path(images) if images is not None else default_images(path)
    by_id, categories, problems = _index(document, path)
    shapes: dict = {i: [] for i in by_id}
    raw: dict = {i: [] for i in by_id}
    for index, entry in enumerate(document.get("annotations") or []):
        image_id = entry.get("image_id") if isinstance(entry, dict) else None
        if image_id not in by_id:
            problems.append(
                f"{path}: annotation {index} (id {entry.get('id') if isinstance(entry, dict) else '?'}) "
                f"points at image id {image_id!r}, which the file does not list"
            )
            continue
        label = categories.get(entry.get("category_id"))
        if label is None:
            problems.append(
                f"{path}: annotation {index} (id {entry.get('id')}) has category_id "
                f"{entry.get('category_id')!r}, which the file does not list"
            )
            continue
        try:
            shapes[image_id].append(read_annotation(entry, label, index, _stated(by_id[image_id])))
            raw[image_id].append([label, entry.get("segmentation")])
        except ValueError as error:
            problems.append(f"{path}: {error}")
    scans = []
    for image_id, entry in by_id.items():
        image = folder / entry["file_name"]
        if not image.is_file():
            problems.append(f"{path}: image {entry['file_name']!r} (id {image_id}): no file at {image}")
            continue
        key = digest([entry["file_name"], _stated(entry), raw[image_id]])
        scans.append(Scan(scan_stem(entry["file_name"]), str(path), image, None, _stated(entry), shapes[image_id], key))
    return sorted(scans, key=lambda s: s.name), problems
