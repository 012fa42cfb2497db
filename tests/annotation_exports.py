"""One small labelled set written as a labelme folder, a COCO export, a CVAT export and a mask folder, with its masks
computed by hand from the rules of docs/training.md ("Labels from annotation tools").

Scan ``a`` (12 x 16, no EXIF): a region polygon (2, 2)-(10, 8) with a hole (4, 4)-(6, 6), a curve polyline through
pixel centres, a point. Scan ``b`` (stored 10 x 14, EXIF orientation 6: shown 14 x 10): a region rectangle and an
L-shaped run-length blob, drawn over the stored pixels in COCO and CVAT and over the upright picture in labelme.
"""

from __future__ import annotations

import base64
import io
import json
from pathlib import Path

import numpy as np
from helpers import rgb, write
from PIL import Image

CLASSES = ["background", "region", "curve"]
ORIENTATION_TAG = 0x0112


def expected_masks() -> dict[str, np.ndarray]:
    """The masks by hand: which pixel centres each shape covers (docs/training.md)."""
    a = np.zeros((12, 16), np.uint8)
    a[2:8, 2:10] = 1  # centres x 2.5..9.5, y 2.5..7.5 inside (2, 2)-(10, 8)
    a[4:6, 4:6] = 0  # the hole's centres
    a[10, 0:13] = 2  # the polyline (0.5, 10.5) -> (12.5, 10.5): row 10, columns 0..12
    a[3:11, 12] = 2  # ... -> (12.5, 3.5): column 12, rows 3..10
    a[1, 14] = a[1, 15] = a[2, 14] = 2  # point (14.5, 1.5), radius 1: its centre, and the ties right of and below it
    b = np.zeros((14, 10), np.uint8)
    # Stored (x, y) shows at (10 - y, x) under orientation 6: the stored rectangle (1, 2)-(5, 6) shows as (4, 1)-(8, 5).
    b[1:5, 4:8] = 1
    # Stored pixel (r, c) shows at (c, 9 - r): the blob's stored rows 6..8, columns 8..12 show as rows 8..12,
    # columns 1..3; its stored pixel (6, 12) is left out, shown (12, 3).
    b[8:13, 1:4] = 1
    b[12, 3] = 0
    return {"a": a, "b": b}


def stored_blob() -> np.ndarray:
    """Scan b's blob over its stored pixels, bool [10, 14]."""
    blob = np.zeros((10, 14), bool)
    blob[6:9, 8:13] = True
    blob[6, 12] = False
    return blob


def write_images(folder: Path) -> dict[str, Path]:
    """Scans a (PNG) and b (PNG with EXIF orientation 6) in ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    a = write(folder / "a.png", rgb(12, 16, 1))
    exif = Image.Exif()
    exif[ORIENTATION_TAG] = 6
    b = folder / "b.png"
    Image.fromarray(rgb(10, 14, 2)).save(b, exif=exif)
    return {"a": a, "b": b}


def coco_string(counts: list[int]) -> str:
    """COCO's compressed RLE string of ``counts`` (the documented format, written independently of srforge's
    decoder): from the fourth count on the difference from the count two before, in 5-bit groups, least significant
    first, 0x20 for more to come, each group + 48."""
    out = []
    for i, count in enumerate(counts):
        value = count - counts[i - 2] if i > 2 else count
        while True:
            group = value & 0x1F
            value >>= 5
            more = not ((value == 0 and not group & 0x10) or (value == -1 and group & 0x10))
            out.append(chr(group + (0x20 if more else 0) + 48))
            if not more:
                break
    return "".join(out)


def runs(bits: np.ndarray) -> list[int]:
    """Alternating run lengths of a flat bool array, 0s first."""
    counts, current, length = [], False, 0
    for bit in bits.tolist():
        if bit == current:
            length += 1
        else:
            counts.append(length)
            current, length = bit, 1
    return counts + [length]


def _region_a() -> list[list[float]]:
    return [[2, 2], [10, 2], [10, 8], [2, 8]]


def _hole_a() -> list[list[float]]:
    return [[4, 4], [6, 4], [6, 6], [4, 6]]


CURVE = [[0.5, 10.5], [12.5, 10.5], [12.5, 3.5]]
POINT = [[14.5, 1.5]]


def write_labelme(root: Path) -> Path:
    """The set as labelme files: a.json beside a.png; b.json with b embedded as it shows upright (labelme's way)."""
    images = write_images(root)
    blob = np.rot90(stored_blob(), k=-1)[8:13, 1:4]  # shown upright, as labelme keeps it: rows 8..12, columns 1..3
    png = io.BytesIO()
    Image.fromarray(blob).save(png, format="PNG")
    upright = io.BytesIO()
    Image.open(images["b"]).transpose(Image.Transpose.ROTATE_270).save(upright, format="PNG")
    docs = {
        "a": {
            "imagePath": "a.png",
            "imageData": None,
            "imageHeight": 12,
            "imageWidth": 16,
            "shapes": [
                {"label": "region", "points": _region_a(), "shape_type": "polygon"},
                {"label": "background", "points": _hole_a(), "shape_type": "polygon"},
                {"label": "curve", "points": CURVE, "shape_type": "linestrip"},
                {"label": "curve", "points": POINT, "shape_type": "point"},
            ],
        },
        "b": {
            "imagePath": "b.png",
            "imageData": base64.b64encode(upright.getvalue()).decode(),
            "imageHeight": 14,
            "imageWidth": 10,
            "shapes": [
                {"label": "region", "points": [[4, 1], [8, 5]], "shape_type": "rectangle"},
                {
                    "label": "region",
                    "points": [[1, 8], [3, 12]],
                    "shape_type": "mask",
                    "mask": base64.b64encode(png.getvalue()).decode(),
                },
            ],
        },
    }
    images["b"].unlink()  # b lives only in its JSON
    for name, doc in docs.items():
        (root / f"{name}.json").write_text(json.dumps({"version": "5.4.1", "flags": {}, **doc}))
    return root


def write_coco(root: Path) -> Path:
    """The set as COCO: annotations/instances_default.json and images/; the hole as a second ring, the curve (COCO
    has no lines) and b's rectangle as uncompressed RLE (column-major), b's blob as compressed RLE."""
    write_images(root / "images")
    rect = np.zeros((10, 14), bool)
    rect[2:6, 1:5] = True  # stored centres inside (1, 2)-(5, 6)
    flat = [sum(_region_a(), []), sum(_hole_a(), [])]
    annotations = [
        {"id": 1, "image_id": 1, "category_id": 1, "segmentation": flat, "iscrowd": 0},
        {"id": 2, "image_id": 1, "category_id": 2, "iscrowd": 0,
         "segmentation": {"counts": runs((expected_masks()["a"] == 2).T.ravel()), "size": [12, 16]}},
        {"id": 3, "image_id": 2, "category_id": 1, "iscrowd": 1,
         "segmentation": {"counts": runs(rect.T.ravel()), "size": [10, 14]}},
        {"id": 4, "image_id": 2, "category_id": 1, "iscrowd": 1,
         "segmentation": {"counts": coco_string(runs(stored_blob().T.ravel())), "size": [10, 14]}},
    ]  # fmt: skip
    document = {
        "images": [
            {"id": 1, "file_name": "a.png", "height": 12, "width": 16},
            {"id": 2, "file_name": "b.png", "height": 10, "width": 14},
        ],
        "categories": [{"id": 1, "name": "region"}, {"id": 2, "name": "curve"}],
        "annotations": annotations,
    }
    path = root / "annotations" / "instances_default.json"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(document))
    return path


def cvat_points(points) -> str:
    return ";".join(f"{x},{y}" for x, y in points)


def write_cvat(root: Path) -> Path:
    """The set as CVAT for images 1.1: annotations.xml and images/; the hole as a background polygon above the
    region by z_order (listed first), the point as <points>, b's blob as a mask."""
    write_images(root / "images")
    blob = stored_blob()[6:9, 8:13]
    xml = f"""<?xml version="1.0" encoding="utf-8"?>
<annotations>
  <version>1.1</version>
  <meta><task><name>t</name></task></meta>
  <image id="0" name="a.png" width="16" height="12">
    <polygon label="background" occluded="0" points="{cvat_points(_hole_a())}" z_order="1"/>
    <polygon label="region" occluded="0" points="{cvat_points(_region_a())}" z_order="0"/>
    <polyline label="curve" occluded="0" points="{cvat_points(CURVE)}" z_order="2"/>
    <points label="curve" occluded="0" points="{cvat_points(POINT)}" z_order="2"/>
    <tag label="checked"/>
  </image>
  <image id="1" name="b.png" width="14" height="10">
    <box label="region" occluded="0" xtl="1" ytl="2" xbr="5" ybr="6" z_order="0"/>
    <mask label="region" occluded="0" rle="{", ".join(map(str, runs(blob.ravel())))}" left="8" top="6" width="5"
      height="3" z_order="0"/>
  </image>
</annotations>
"""
    path = root / "annotations.xml"
    path.write_text(xml)
    return path


def write_mask_folder(root: Path) -> Path:
    """The same scans with the hand-computed masks, as the folder srforge trains on (masks as shown)."""
    write_images(root / "images")
    for name, mask in expected_masks().items():
        write(root / "masks" / f"{name}.png", mask)
    return root
