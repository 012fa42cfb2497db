"""labelme's JSON files: a folder of ``*.json``, each beside (``imagePath``) or embedding (``imageData``) its image.

Shape types: polygon, rectangle (two corners), circle (centre, a point on it), line, linestrip (polylines), point,
points and mask (a base64 PNG over the box of its two points). labelme shows a photo upright (it applies the EXIF
orientation when it opens it, and embeds it so), so its coordinates are over the image as displayed.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import io
import json
from pathlib import Path

import numpy as np

from srforge.data.annotations.shapes import Scan, Shape, check_points, digest
from srforge.data.images import DataError, open_image
from srforge.data.naming import is_hidden, scan_stem

LINES = ("line", "linestrip")
POINTS = ("point", "points")


def _corners(points: np.ndarray) -> list[np.ndarray]:
    """A rectangle of two opposite corners as its one ring [4, 2]."""
    (x0, y0), (x1, y1) = points[0], points[-1]
    return [np.array([[x0, y0], [x1, y0], [x1, y1], [x0, y1]], dtype=np.float64)]


def _mask_shape(entry: dict, points: np.ndarray, label: str, where: str) -> Shape:
    """labelme's mask shape: a base64 PNG of the box from its first point (top-left pixel) to its second."""
    try:
        data = base64.b64decode(entry["mask"], validate=True)
    except (KeyError, TypeError, binascii.Error):
        raise ValueError(f"{where}: a mask shape needs 'mask', a base64 PNG") from None
    try:
        with open_image(io.BytesIO(data), where) as picture:
            bitmap = np.asarray(picture.convert("L")) != 0
    except (DataError, OSError) as error:
        raise ValueError(f"{where}: its mask is no image ({error})") from None
    left, top = int(np.floor(points[:, 0].min())), int(np.floor(points[:, 1].min()))
    return Shape(label, "bitmap", [], where, bitmap=bitmap, origin=(left, top))


def read_shape(entry, index: int) -> Shape:
    """One entry of labelme's ``shapes`` as a Shape; a ValueError naming it for anything else."""
    if not isinstance(entry, dict) or not isinstance(entry.get("label"), str):
        raise ValueError(f"shape {index}: expected an object with a 'label' string, found {str(entry)[:80]}")
    kind = entry.get("shape_type") or "polygon"  # labelme's files before shape_type hold polygons
    label = entry["label"]
    where = f"shape {index} ({kind} {label!r})"
    points = check_points(entry.get("points"), where)
    if kind == "polygon":
        return Shape(label, "polygon", [points], where)
    if kind == "rectangle":
        return Shape(label, "polygon", _corners(points), where)
    if kind in LINES:
        return Shape(label, "line", [points], where)
    if kind in POINTS:
        return Shape(label, "points", [points], where)
    if kind == "circle":
        if len(points) != 2:
            raise ValueError(f"{where}: a circle needs 2 points (centre, a point on it), found {len(points)}")
        return Shape(label, "circle", [points[:1]], where, radius2=float(((points[1] - points[0]) ** 2).sum()))
    if kind == "mask":
        return _mask_shape(entry, points, label, where)
    raise ValueError(
        f"{where}: shape_type {kind!r} is not one of polygon, rectangle, circle, line, linestrip, point, points, mask"
    )


def _stated(document: dict) -> tuple[int, int] | None:
    height, width = document.get("imageHeight"), document.get("imageWidth")
    if isinstance(height, int) and isinstance(width, int) and not isinstance(height, bool):
        return height, width
    return None


def read_file(path: Path, name: str) -> tuple[Scan | None, list[str]]:
    """(the Scan of labelme file ``path``, []) or (None, its problems)."""
    try:
        document = json.loads(path.read_bytes())
    except (OSError, ValueError) as error:  # UnicodeDecodeError is a ValueError
        return None, [f"{path}: cannot read as labelme JSON ({error}); the file is truncated or not JSON"]
    if not isinstance(document, dict) or not isinstance(document.get("shapes"), list):
        return None, [f"{path}: expected labelme's JSON object with a 'shapes' list, found {type(document).__name__}"]
    shapes, problems = [], []
    for index, entry in enumerate(document["shapes"]):
        try:
            shapes.append(read_shape(entry, index))
        except ValueError as error:
            problems.append(f"{path}: {error}")
    data, image = None, None
    if document.get("imageData"):
        try:
            data = base64.b64decode(document["imageData"], validate=True)
        except (TypeError, binascii.Error) as error:
            problems.append(f"{path}: imageData is not base64 ({error})")
    elif isinstance(document.get("imagePath"), str) and document["imagePath"]:
        image = path.parent / document["imagePath"].replace("\\", "/")
        if not image.is_file():
            problems.append(f"{path}: imagePath {document['imagePath']!r}: no image at {image}")
    else:
        problems.append(f"{path}: neither imageData nor imagePath: no image for its shapes")
    if problems:
        return None, problems
    embedded = hashlib.sha256(data).hexdigest() if data is not None else None
    key = digest([document["shapes"], document.get("imagePath"), _stated(document), embedded])
    return Scan(name, str(path), image, data, _stated(document), shapes, key), []


def read_labelme(root) -> tuple[list[Scan], list[str]]:
    """Every labelme file under the folder ``root`` (recursive; hidden files passed over), named by its relative
    path without ``.json``: (the scans, sorted by name; every problem found)."""
    root = Path(root)
    if not root.is_dir():
        raise DataError(f"{root}: not a folder; expected a folder of labelme *.json files")
    files = sorted(p for p in root.rglob("*.json") if not is_hidden(p.relative_to(root)) and p.is_file())
    scans, problems = [], []
    for path in files:
        scan, found = read_file(path, scan_stem(path.relative_to(root)))
        problems += found
        if scan is not None:
            scans.append(scan)
    if not files:
        problems.append(f"{root}: no labelme *.json files")
    return scans, problems
