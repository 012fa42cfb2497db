"""What evaluation reads: true masks (a labelled folder or archive, or a masks folder), the scans beside them, and
predicted masks (srforge-predict's output folder, or any folder of masks).

A scan goes by its stem (srforge.data.naming.scan_stem): ``images/a/b.jpg``, ``masks/a/b.png`` and a
prediction ``a/b.png`` are the scan ``a/b``. Pairs are made by that name only; a scan without its partner is
an error row, never skipped in silence.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterable
from concurrent.futures import Executor
from pathlib import Path

import torch

from srforge.data.archive import ScanArchive
from srforge.data.images import DataError, read_image, read_mask
from srforge.data.naming import LAYOUT, list_images, scan_stem


def layout_prefix(names: Iterable[str], path: Path) -> str:
    """The folder of an archive that holds ``images/`` and ``masks/`` side by side ('' at the top, or 'x/' for
    an archive of a folder ``x``): the shortest one; a DataError naming the layout when there is none."""
    tops: dict[str, set[str]] = {}
    for name in names:
        parts = name.split("/")
        for depth, part in enumerate(parts[:-1]):
            if part in ("images", "masks"):
                tops.setdefault("".join(p + "/" for p in parts[:depth]), set()).add(part)
    both = sorted((p for p, found in tops.items() if found == {"images", "masks"}), key=len)
    if both:
        return both[0]
    found = "only images/" if any("images" in f for f in tops.values()) else "no images/ folder"
    raise DataError(
        f"{path}: no ground-truth masks: expected a labelled layout {LAYOUT}, found {found} with a masks/ "
        "beside it; evaluate needs both (score a folder of predictions with --predictions DIR --masks DIR)"
    )


class ImageView:
    """The scans of a labelled archive that have a true mask: a read-only ScanArchive for predict_archive, with
    names relative to ``images/``. Index j of the view is index ``index[j]`` of the whole archive."""

    def __init__(self, base: ScanArchive, start: str, keep: set[str]):
        self.base, self.path, self.kind, self.sequential = base, base.path, base.kind, base.sequential
        self.index = [i for i, n in enumerate(base.names) if n.startswith(start) and scan_stem(n[len(start) :]) in keep]
        self.names = [base.names[i][len(start) :] for i in self.index]
        self.rejected = [(n[len(start) :], why) for n, why in base.rejected if n.startswith(start)]

    def __len__(self) -> int:
        return len(self.names)

    def label(self, j: int) -> str:
        return self.base.label(self.index[j])

    def size(self, j: int) -> tuple[int, int]:
        return self.base.size(self.index[j])

    def read(self, j: int, mode: str = "RGB", data=None) -> torch.Tensor:
        return self.base.read(self.index[j], mode, data)

    def read_bytes(self, indices: Iterable[int]) -> dict:
        back = {self.index[j]: j for j in indices}
        return {back[i]: data for i, data in self.base.read_bytes(back).items()}

    def in_archive_order(self, indices: Iterable[int]) -> list[int]:
        back = {self.index[j]: j for j in indices}
        return [back[i] for i in self.base.in_archive_order(back)]

    def close(self) -> None:
        self.base.close()

    def __enter__(self) -> ImageView:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def read_mask_bytes(data: bytes, label: str) -> torch.Tensor:
    """A mask member's bytes decoded as :func:`srforge.data.images.read_mask` decodes a file (it reads paths
    only): through a temporary file, with errors naming ``label``, the member."""
    with tempfile.TemporaryDirectory(prefix="srforge-mask-") as tmp:
        path = Path(tmp) / "mask.png"
        path.write_bytes(data)
        try:
            return read_mask(path)
        except DataError as error:
            raise DataError(str(error).replace(str(path), label)) from None


class LabelledArchive:
    """True masks and scans of a labelled folder, .zip or .tar (``<prefix>images/`` with ``<prefix>masks/``).

    ``names``: the scans with both an image and a mask (stems, sorted); ``unpaired``: {stem: error} for an image
    without its mask or a mask without its image; ``images``: the :class:`ImageView` of the paired scans.
    """

    def __init__(self, path: Path):
        self.path = Path(path)
        self.base = ScanArchive(self.path)
        try:
            prefix = layout_prefix([n for n in self.base.names] + [n for n, _ in self.base.rejected], self.path)
        except DataError:
            self.base.close()
            raise
        start, mstart = prefix + "images/", prefix + "masks/"
        scans = {scan_stem(n[len(start) :]): n for n in self.base.names if n.startswith(start)}
        self.masks = {scan_stem(n[len(mstart) :]): i for i, n in enumerate(self.base.names) if n.startswith(mstart)}
        self.names = sorted(set(scans) & set(self.masks))
        self.unpaired = {s: f"{self.path}: {start}{scans[s]} has no mask at {mstart}{s}.png" for s in scans}
        self.unpaired.update({s: f"{self.path}: {mstart}{s}.png has no scan in {start}" for s in self.masks})
        for stem in self.names:
            del self.unpaired[stem]
        self.images = ImageView(self.base, start, set(self.names))
        self.view_index = {scan_stem(n): j for j, n in enumerate(self.images.names)}

    def label(self, name: str) -> str:
        return self.base.label(self.masks[name])

    def read(self, names: list[str], pool: Executor) -> dict[str, torch.Tensor | Exception]:
        """{name: the true mask [H, W] or the error reading it} (a .tar.gz read in archive order)."""
        indices = {self.masks[n]: n for n in names}
        if self.base.kind == "folder":
            return dict(zip(names, pool.map(lambda n: _attempt(read_mask, self.label(n)), names)))
        data = self.base.read_bytes(indices)

        def decode(i: int):
            raw = data[i]
            return raw if isinstance(raw, Exception) else _attempt(read_mask_bytes, raw, self.label(indices[i]))

        return dict(zip((indices[i] for i in data), pool.map(decode, list(data))))

    def image(self, name: str) -> torch.Tensor | None:
        """The scan as RGB uint8 [3, H, W] (for pictures), or None when it does not read."""
        try:
            return self.images.read(self.view_index[name], "RGB")
        except Exception:  # a picture is a courtesy: its scan's failure is reported where it is predicted
            return None

    def close(self) -> None:
        self.base.close()


def _attempt(read, *args):
    try:
        return read(*args)
    except Exception as error:  # one file's error is that scan's row
        return error


def mask_folder(path: Path) -> Path:
    """The folder that holds the masks of ``path``: ``path/masks`` when ``path`` is a dataset root (images/ and
    masks/) or srforge-predict's output (report.json and masks/), else ``path`` itself."""
    inner = path / "masks"
    if inner.is_dir() and ((path / "images").is_dir() or (path / "report.json").is_file()):
        return inner
    return path


class MaskFolder:
    """True masks in a folder (a dataset root's masks/, or the folder itself), matched by stem; scans for the
    pictures from the root's images/ when there is one."""

    def __init__(self, path: Path):
        self.path = Path(path)
        if not self.path.is_dir():
            raise FileNotFoundError(f"--masks {path}: not a folder (expected true masks, or a root with masks/)")
        self.folder = mask_folder(self.path)
        found, problems = list_images(self.folder)
        if problems:
            raise DataError(f"{len(problems)} clashing file(s) in {self.folder}:\n  " + "\n  ".join(problems))
        if not found:
            raise DataError(f"--masks {path}: no mask files (.png ...) in {self.folder}")
        self.files, self.names, self.unpaired = found, sorted(found), {}
        scans = self.path / "images"
        self.scans = list_images(scans)[0] if self.folder != self.path and scans.is_dir() else {}

    def label(self, name: str) -> str:
        return str(self.files[name])

    def read(self, names: list[str], pool: Executor) -> dict[str, torch.Tensor | Exception]:
        return dict(zip(names, pool.map(lambda n: _attempt(read_mask, self.files[n]), names)))

    def image(self, name: str) -> torch.Tensor | None:
        path = self.scans.get(name)
        result = _attempt(read_image, path, "RGB") if path is not None else None
        return result if isinstance(result, torch.Tensor) else None

    def close(self) -> None:
        pass


class ExportTruths:
    """True masks from an annotation export (labelme folder, COCO JSON, CVAT XML: ``fmt``), rasterised by the
    class names ``classes`` (their order is the ids') with ``ignore_index`` for ignored labels; the interface of
    :class:`LabelledArchive` (``images`` for checkpoint mode: the export's image files, which must then lie in one
    folder and carry their scans' names). ``options``: the dataset's other args (ignore, line_width, ...)."""

    def __init__(self, path: Path, fmt: str, classes: list[str], ignore_index: int, images=None, **options):
        from srforge.data.annotations import open_export

        self.path = Path(path)
        self.dataset = open_export(fmt, self.path, list(classes), images, ignore_index=ignore_index, **options)
        self.names, self.unpaired = sorted(self.dataset.names), {}
        self.index = {name: i for i, name in enumerate(self.dataset.names)}
        self._images: ImageView | None = None

    @property
    def images(self) -> ImageView:
        """The export's scans as a read-only archive for predict_archive: their common folder, with every scan's image
        named by the scan (a DataError naming one that is not, or an image embedded in its JSON)."""
        if self._images is None:
            self._images = export_images(self.dataset)
        return self._images

    def label(self, name: str) -> str:
        scan = self.dataset.scans[self.index[name]]
        return f"{scan.file}: {name}"

    def read(self, names: list[str], pool: Executor) -> dict[str, torch.Tensor | Exception]:
        return dict(zip(names, pool.map(lambda n: _attempt(self.dataset.read_mask, self.index[n]), names)))

    def image(self, name: str) -> torch.Tensor | None:
        result = _attempt(self.dataset.read_image, self.index[name])
        return result if isinstance(result, torch.Tensor) else None

    def close(self) -> None:
        if self._images is not None:
            self._images.close()


def export_images(dataset) -> ImageView:
    """An :class:`ImageView` of the image files of an export's dataset: the folder that holds them all, each image
    at ``<scan name>.<suffix>`` there (what srforge-predict names its output by); a DataError otherwise."""
    scans = dataset.scans
    embedded = [s.file for s in scans if s.image is None]
    if embedded:
        raise DataError(
            f"{embedded[0]}: its image is embedded (imageData), which checkpoint mode cannot predict from a folder; "
            "predict the images with srforge-predict and score with --predictions DIR --labels ..."
        )
    folder = Path(os.path.commonpath([str(s.image.parent.absolute()) for s in scans])) if scans else Path(".")
    named = [s for s in scans if scan_stem(s.image.absolute().relative_to(folder)) != s.name]
    if named:
        raise DataError(
            f"{named[0].file}: scan {named[0].name!r} has its image at {named[0].image}, not at "
            f"{folder}/{named[0].name}.<suffix>; predict with srforge-predict and score with --predictions DIR --labels"
        )
    view = ImageView(ScanArchive(folder), "", set(dataset.names))
    view.rejected = []  # the export's own files (JSON, XML) and other images are no scans of it
    return view


class Predictions:
    """Predicted masks in a folder (srforge-predict's output, or any folder of masks), matched by stem.

    ``failed``: {stem: error} for scans srforge-predict's report lists as not predicted (given by the caller).
    """

    def __init__(self, path: Path, failed: dict[str, str] | None = None):
        self.path = Path(path)
        if not self.path.is_dir():
            raise FileNotFoundError(f"--predictions {path}: not a folder of predicted masks")
        self.folder = mask_folder(self.path)
        self.files, problems = list_images(self.folder)
        if problems:
            raise DataError(f"{len(problems)} clashing file(s) in {self.folder}:\n  " + "\n  ".join(problems))
        self.failed = dict(failed or {})

    def read(self, name: str) -> torch.Tensor | Exception:
        """The predicted mask [H, W] of scan ``name``, or the error to report for it."""
        if name in self.failed:
            return DataError(self.failed[name])
        path = self.files.get(name)
        if path is None:
            return DataError(f"no prediction for scan {name!r}: expected {self.folder / (name + '.png')}")
        return _attempt(read_mask, path)

    def label(self, name: str) -> str:
        return str(self.files.get(name, self.folder / f"{name}.png"))
