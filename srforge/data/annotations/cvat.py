"""CVAT for images 1.1 XML: ``<image name width height>`` elements holding box (with its rotation), polygon,
polyline, points and mask (CVAT's RLE: run lengths, background first, along the rows of its left/top/width/height
box) shapes; tags are passed over. Shapes are drawn by ``z_order``, then in the order the file lists them.
``occluded`` shapes are drawn like the rest by default (their z_order puts them behind), or made ignore, or left out.

The XML is parsed safely: a document type declaration (where entities, and so entity bombs, are declared) is refused
before anything in it is read, so nothing is ever expanded.
"""

from __future__ import annotations

import math
import xml.etree.ElementTree as ET
from pathlib import Path
from xml.parsers import expat

import numpy as np

from srforge.data.annotations.rasterise import runs_to_bitmap
from srforge.data.annotations.shapes import Scan, Shape, check_points, default_images, digest
from srforge.data.archive import unsafe_name
from srforge.data.images import DataError
from srforge.data.naming import scan_stem

OCCLUDED = ("draw", "ignore", "skip")
SHAPES = ("box", "polygon", "polyline", "points", "mask")
PASSED_OVER = ("tag", "attribute")


class _Refused(Exception):
    pass


def _refuse(*_args) -> None:
    raise _Refused


def parse_xml(data: bytes, path: Path) -> ET.Element:
    """The root element of the XML ``data``; a DataError naming ``path`` when it is not well-formed or declares a
    document type (DOCTYPE, ENTITY: refused unread, so that no entity is expanded)."""
    builder = ET.TreeBuilder()
    parser = expat.ParserCreate()
    parser.SetParamEntityParsing(expat.XML_PARAM_ENTITY_PARSING_NEVER)
    parser.StartDoctypeDeclHandler = _refuse
    parser.EntityDeclHandler = _refuse
    parser.ExternalEntityRefHandler = _refuse
    parser.StartElementHandler = builder.start
    parser.EndElementHandler = builder.end
    parser.CharacterDataHandler = builder.data
    try:
        parser.Parse(data, True)
    except _Refused:
        raise DataError(
            f"{path}: declares a document type (<!DOCTYPE> or <!ENTITY>), which CVAT never writes and which can "
            "hide an entity bomb; refused without reading it"
        ) from None
    except expat.ExpatError as error:
        raise DataError(f"{path}: not well-formed XML ({error}); the file is truncated or not CVAT's XML") from None
    return builder.close()


def _float(element: ET.Element, name: str, where: str, default: float | None = None) -> float:
    """The attribute ``name`` as a finite float (``default`` when it is absent or empty and a default is given); a
    ValueError naming ``where`` otherwise: "nan" and "inf" are numbers to float() but no coordinate or angle."""
    text = element.attrib.get(name)
    if default is not None and not text:
        return default
    try:
        value = float(text)
    except (TypeError, ValueError):
        value = math.nan
    if not math.isfinite(value):
        raise ValueError(f"{where}: expected a finite number in '{name}', found {text!r}")
    return value


def _points(element: ET.Element, where: str) -> np.ndarray:
    text = element.attrib.get("points", "")
    try:
        pairs = [[float(v) for v in pair.split(",")] for pair in text.split(";") if pair.strip()]
    except ValueError:
        raise ValueError(f"{where}: expected points 'x,y;x,y;...', found {text[:60]!r}") from None
    return check_points(pairs, where)


def _box(element: ET.Element, where: str) -> list[np.ndarray]:
    """A box's corners as one ring, turned by its ``rotation`` (degrees, clockwise on screen) about its centre."""
    x0, y0, x1, y1 = (_float(element, k, where) for k in ("xtl", "ytl", "xbr", "ybr"))
    ring = check_points([[x0, y0], [x1, y0], [x1, y1], [x0, y1]], where)
    rotation = _float(element, "rotation", where, default=0.0)
    angle = math.radians(rotation)
    if angle:
        centre = ring.mean(axis=0)
        c, s = math.cos(angle), math.sin(angle)
        offset = ring - centre
        turned = centre + np.stack([offset[:, 0] * c - offset[:, 1] * s, offset[:, 0] * s + offset[:, 1] * c], axis=1)
        ring = check_points(turned, f"{where} turned {rotation:g} degrees")  # the drawn ring is what must be a position
    return [ring]


def _mask(element: ET.Element, label: str, where: str, stated: tuple[int, int] | None) -> Shape:
    """CVAT's mask: run lengths along the rows of its left/top/width/height box, which must fit in its image's stated
    (H, W), and in PIL's pixel limit when none is stated (a box of 50,000 x 50,000 px would be a 2.5 GB bitmap)."""
    try:
        # int(float("inf")) is an OverflowError, not a ValueError.
        left, top, width, height = (int(float(element.attrib[k])) for k in ("left", "top", "width", "height"))
    except (KeyError, ValueError, OverflowError):
        box = {k: element.attrib.get(k) for k in ("left", "top", "width", "height")}
        raise ValueError(f"{where}: a mask needs finite numbers left, top, width, height, found {box}") from None
    text = element.attrib.get("rle", "")
    try:
        counts = [int(v) for v in text.split(",")]
    except ValueError:  # also a count of more than 4,300 digits, which Python refuses to convert
        raise ValueError(f"{where}: a mask needs rle 'n, n, ...' (integers), found {text[:60]!r}") from None
    if stated is not None and (width > stated[1] or height > stated[0]):
        raise ValueError(
            f"{where}: its {width} x {height} (W x H) mask box is larger than its {stated[1]} x {stated[0]} image"
        )
    try:
        bitmap = runs_to_bitmap(counts, height, width, "C")
    except ValueError as error:
        raise ValueError(f"{where}: {error}") from None
    return Shape(label, "bitmap", [], where, bitmap=bitmap, origin=(left, top))


def read_element(element: ET.Element, index: int, stated: tuple[int, int] | None = None) -> Shape:
    """One shape element of an ``<image>`` (of ``stated`` (H, W), None: not stated) as a Shape; a ValueError naming
    it for anything malformed."""
    label = element.attrib.get("label", "")
    where = f"shape {index} (<{element.tag}> {label!r})"
    if element.tag not in SHAPES:
        raise ValueError(f"{where}: <{element.tag}> is not one of {', '.join(SHAPES)}")
    if element.tag == "mask":
        return _mask(element, label, where, stated)
    if element.tag == "box":
        return Shape(label, "polygon", _box(element, where), where)
    kind = {"polygon": "polygon", "polyline": "line", "points": "points"}[element.tag]
    return Shape(label, kind, [_points(element, where)], where)


def _z(element: ET.Element) -> int:
    try:
        return int(element.attrib.get("z_order", 0))
    except ValueError:
        return 0


def read_image(element: ET.Element, path: Path, occluded: str, ignore_label: str) -> tuple[list[Shape], list[str]]:
    """The shapes of one ``<image>`` in drawing order (z_order, then file order), and its problems."""
    shapes, problems = [], []
    elements = [e for e in element if e.tag not in PASSED_OVER]
    for index, child in sorted(enumerate(elements), key=lambda pair: _z(pair[1])):
        hidden = child.attrib.get("occluded", "0") == "1"
        if hidden and occluded == "skip":
            continue
        try:
            shape = read_element(child, index, _stated(element))
        except ValueError as error:
            problems.append(f"{path}: image {element.attrib.get('name')!r}: {error}")
            continue
        if hidden and occluded == "ignore":
            shape.label = ignore_label
        shapes.append(shape)
    return shapes, problems


def _stated(element: ET.Element) -> tuple[int, int] | None:
    try:
        return int(element.attrib["height"]), int(element.attrib["width"])
    except (KeyError, ValueError):
        return None


def read_cvat(annotations, images=None, occluded: str = "draw", ignore_label: str = "") -> tuple[list[Scan], list[str]]:
    """The scans of the CVAT for images 1.1 file ``annotations``, images under ``images`` (default:
    :func:`srforge.data.annotations.shapes.default_images`): (scans by name, every problem found). ``occluded``:
    draw, ignore (the shape's pixels get ``ignore_label``, a label the rules ignore) or skip occluded shapes."""
    path = Path(annotations)
    if occluded not in OCCLUDED:
        raise ValueError(f"occluded: expected one of {', '.join(OCCLUDED)}, found {occluded!r}")
    try:
        root = parse_xml(path.read_bytes(), path)
    except OSError as error:
        raise DataError(f"{path}: cannot read ({error})") from None
    if root.tag != "annotations":
        raise DataError(f"{path}: expected CVAT's <annotations> root, found <{root.tag}>")
    folder = Path(images) if images is not None else default_images(path)
    scans, problems, seen = [], [], set()
    if root.find("track") is not None:
        problems.append(f"{path}: holds <track> elements (CVAT for video); export the task as CVAT for images 1.1")
    for element in root.iter("image"):
        name = element.attrib.get("name")
        if not name:
            problems.append(f"{path}: an <image> without a name (id {element.attrib.get('id')!r})")
            continue
        if unsafe_name(name):
            problems.append(
                f"{path}: <image> id {element.attrib.get('id')!r}: name {name!r} is no relative path under the images "
                f"folder ({unsafe_name(name)}); refused, as it names a file outside it"
            )
            continue
        if scan_stem(name) in seen:
            problems.append(f"{path}: image {name!r} is listed twice")
            continue
        seen.add(scan_stem(name))
        shapes, found = read_image(element, path, occluded, ignore_label)
        problems += found
        image = folder / name
        if not image.is_file():
            problems.append(f"{path}: image {name!r}: no file at {image}")
            continue
        raw = [[child.tag, sorted(child.attrib.items())] for child in element]
        key = digest([name, _stated(element), occluded, raw])
        scans.append(Scan(scan_stem(name), str(path), image, None, _stated(element), shapes, key))
    return sorted(scans, key=lambda s: s.name), problems
