"""Datasets of annotation exports: labelme, COCO and CVAT, each chosen by one line of YAML, rasterised at each
image's true, displayed size into class ids.

Item i is ``Entry(name="a/b", image=uint8 [C, H, W], mask=[H, W] class ids)``, exactly as
:class:`srforge.data.datasets.SegmentationFolder` gives it. Sizes come from image headers (no decoding). With a
decoded-scan cache (``data.cache``) the mask is drawn once and kept under a key of everything that draws it (the
scan's shapes as the export holds them, the label rules, the image file's stamp), so that later epochs read it at
memory speed, as they read a mask PNG.
"""

from __future__ import annotations

import os
from collections.abc import Callable

import torch

from srforge.data.annotations.coco import read_coco
from srforge.data.annotations.cvat import read_cvat
from srforge.data.annotations.labelme import read_labelme
from srforge.data.annotations.shapes import (
    LabelRules,
    Scan,
    displayed,
    header,
    make_rules,
    rasterise,
    size_problem,
    unknown_labels,
)
from srforge.data.cache import DecodedCache, cached_image, file_stamp, open_cache
from srforge.data.entry import Entry
from srforge.data.images import DataError, read_image

FORMATS = ("labelme", "coco", "cvat")
OCCLUDED_LABEL = "\0occluded"  # the label CVAT's occluded shapes take under occluded: ignore (the rules ignore it)
SHOWN = 20  # problems one error message lists


def read_export(fmt: str, path, images=None, occluded: str = "draw") -> tuple[list[Scan], list[str]]:
    """(the scans, every problem found) of the export ``path`` in format ``fmt`` (labelme: a folder; coco: the
    JSON; cvat: the XML); ``images``: the images folder of a COCO or CVAT export. A file that cannot be read at all
    is a DataError naming it."""
    if fmt == "labelme":
        return read_labelme(path)
    if fmt == "coco":
        return read_coco(path, images)
    if fmt == "cvat":
        return read_cvat(path, images, occluded, OCCLUDED_LABEL)
    raise ValueError(f"format: expected one of {', '.join(FORMATS)}, found {fmt!r}")


def export_rules(rules: dict, fmt: str) -> LabelRules:
    """The label rules of a dataset's args: labelme's coordinates are over the image as displayed by default (labelme
    shows a photo upright), COCO's and CVAT's over the image as stored; CVAT's occluded shapes may be ignored."""
    options = {"coords": "displayed" if fmt == "labelme" else "stored", **rules}
    options["ignore"] = [*options.get("ignore", ()), OCCLUDED_LABEL]
    return make_rules(**options)


def raise_problems(problems: list[str], what: str) -> None:
    """A DataError listing the first SHOWN ``problems`` of ``what`` (and how many more), when there are any."""
    if problems:
        more = f"\n  ... and {len(problems) - SHOWN} more" if len(problems) > SHOWN else ""
        raise DataError(f"{len(problems)} problem(s) in {what}:\n  " + "\n  ".join(problems[:SHOWN]) + more)


class AnnotatedScans(torch.utils.data.Dataset):
    """The scans of an annotation export with their masks drawn by ``rules``; see the module docstring.

    ``scans``: the export's :class:`Scan` records; ``image_mode``: the PIL mode of the images; ``transform``
    (optional) maps each Entry; ``cache``: a decoded-scan cache (left None, ``data.cache`` fills it in).
    """

    def __init__(
        self,
        scans: list[Scan],
        rules: LabelRules,
        image_mode: str = "RGB",
        transform: Callable | None = None,
        cache: DecodedCache | str | None = None,
    ):
        self.scans, self.rules, self.image_mode, self.transform = scans, rules, image_mode, transform
        self.cache = open_cache(cache)
        self.names = [scan.name for scan in scans]
        self.headers: list | None = None  # (stored (H, W), EXIF orientation) of each image, read once

    def __len__(self) -> int:
        return len(self.scans)

    def image_headers(self) -> list[tuple[tuple[int, int], int]]:
        """(stored (H, W), EXIF orientation) of every image, from headers; a DataError listing every image that
        does not read or is of another size than its export states."""
        if self.headers is None:
            found, problems = [], []
            for scan in self.scans:
                try:
                    stored, turn = header(scan)
                except DataError as error:
                    problems.append(str(error))
                    continue
                problem = size_problem(scan, stored, turn, self.rules)
                problems += [problem] if problem else []
                found.append((stored, turn))
            raise_problems(problems, "the images of the export")
            self.headers = found
        return self.headers

    def sizes(self) -> list[tuple[int, int]]:
        """True (H, W) of every scan as displayed, from image headers."""
        return [displayed(stored, turn) for stored, turn in self.image_headers()]

    def read_image(self, index: int) -> torch.Tensor:
        """Scan ``index``'s image, uint8 [C, H, W] as displayed (through the cache when there is one)."""
        scan = self.scans[index]
        if scan.image is not None:
            return cached_image(self.cache, scan.image, self.image_mode)

        def decode() -> torch.Tensor:
            return read_image(scan.source(), self.image_mode, scan.label())

        if self.cache is None:
            return decode()
        return self.cache.read([scan.file, scan.name, "imageData"], [scan.digest], f"image:{self.image_mode}", decode)

    def read_mask(self, index: int) -> torch.Tensor:
        """Scan ``index``'s mask [H, W] (uint8; int64 past 255), drawn by the rules, through the cache when there
        is one (keyed by the scan's content, the rules and the image file's stamp)."""
        scan = self.scans[index]

        def draw() -> torch.Tensor:
            stored, turn = header(scan)
            problem = size_problem(scan, stored, turn, self.rules)
            if problem:
                raise DataError(problem)
            return rasterise(scan, self.rules, stored, turn)

        if self.cache is None:
            return draw()
        try:
            stamp = file_stamp(os.stat(scan.image)) if scan.image is not None else []
        except OSError as error:
            raise DataError(f"{scan.label()}: cannot read ({error})") from None
        source = ["annotations", os.path.abspath(scan.file), scan.name]
        return self.cache.read(source, [scan.digest, stamp], f"mask:annotations:{self.rules.key()[:16]}", draw)

    def load(self, index: int) -> Entry:
        """Scan ``index`` decoded, with its mask (no transform); a DataError naming the file when they differ in
        size."""
        image, mask = self.read_image(index), self.read_mask(index)
        if tuple(mask.shape) != tuple(image.shape[1:]):
            raise DataError(
                f"{self.scans[index].label()}: decodes to {tuple(image.shape[1:])} (H, W) but its header says "
                f"{tuple(mask.shape)}; the file is damaged"
            )
        return Entry(name=self.names[index], image=image, mask=mask)

    def __getitem__(self, index: int) -> Entry:
        entry = self.load(index)
        return self.transform(entry) if self.transform is not None else entry


def open_export(fmt: str, path, classes, images=None, occluded: str = "draw", **rules) -> AnnotatedScans:
    """The dataset of the export ``path`` in format ``fmt`` (see :func:`read_export`) drawn by ``classes`` and the
    rules' args (:func:`srforge.data.annotations.shapes.make_rules`; ``image_mode``, ``transform`` and ``cache`` go
    to :class:`AnnotatedScans`); a DataError listing every problem of the export (malformed shapes, missing images,
    unknown labels) before anything is read."""
    dataset_args = {k: rules.pop(k) for k in ("image_mode", "transform", "cache") if k in rules}
    label_rules = export_rules({"classes": classes, **rules}, fmt)
    scans, problems = read_export(fmt, path, images, occluded)
    raise_problems(problems + unknown_labels(scans, label_rules), str(path))
    return AnnotatedScans(scans, label_rules, **dataset_args)


class LabelmeExport(AnnotatedScans):
    """A folder of labelme JSON files (``root``), by one line of YAML: ``class:
    "srforge.data.annotations:LabelmeExport", args: {root: DIR, classes: [background, ...]}``; the other args are
    :func:`open_export`'s."""

    def __init__(self, root, classes, **args):
        made = open_export("labelme", root, classes, **args)
        super().__init__(made.scans, made.rules, made.image_mode, made.transform, made.cache)


class CocoExport(AnnotatedScans):
    """A COCO instances JSON (``annotations``) with its images (``images``, default beside it), by one line of
    YAML: ``class: "srforge.data.annotations:CocoExport", args: {annotations: FILE, classes: [...]}``."""

    def __init__(self, annotations, classes, images=None, **args):
        made = open_export("coco", annotations, classes, images, **args)
        super().__init__(made.scans, made.rules, made.image_mode, made.transform, made.cache)


class CvatExport(AnnotatedScans):
    """A CVAT for images 1.1 XML (``annotations``) with its images (``images``, default beside it), by one line
    of YAML: ``class: "srforge.data.annotations:CvatExport", args: {annotations: FILE, classes: [...]}``;
    ``occluded``: draw (default), ignore or skip occluded shapes."""

    def __init__(self, annotations, classes, images=None, occluded: str = "draw", **args):
        made = open_export("cvat", annotations, classes, images, occluded, **args)
        super().__init__(made.scans, made.rules, made.image_mode, made.transform, made.cache)
