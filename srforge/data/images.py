"""Decoding scans and masks: one image library for training and prediction.

Every PIL failure becomes a :class:`DataError` that names the file (or the archive member), so a bad scan
deep inside a dataset or an archive is reported by name, never as a bare traceback from PIL.

Images and masks are read the way viewers show them: an EXIF orientation tag (a phone photo turned on its
side, a scan stored upside down) is applied on decoding, and sizes read from headers are the displayed sizes,
so a mask drawn over the picture in any viewer lines up with the decoded image.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import torch
from PIL import Image, UnidentifiedImageError

SUFFIXES = (".png", ".jpg", ".jpeg", ".tif", ".tiff", ".bmp")

ORIENTATION_TAG = 0x0112  # EXIF: 1 as stored; 2-8 mirrored and/or turned (see TRANSPOSES)
# Orientation -> the transpose that shows the stored pixels upright, as every viewer does.
TRANSPOSES = {
    2: Image.Transpose.FLIP_LEFT_RIGHT,
    3: Image.Transpose.ROTATE_180,
    4: Image.Transpose.FLIP_TOP_BOTTOM,
    5: Image.Transpose.TRANSPOSE,
    6: Image.Transpose.ROTATE_270,
    7: Image.Transpose.TRANSVERSE,
    8: Image.Transpose.ROTATE_90,
}
QUARTER_TURNS = (5, 6, 7, 8)  # orientations whose displayed width is the stored height


class DataError(ValueError):
    """A data file is missing, unreadable or inconsistent with its partner; the message names the file."""


def open_image(source, label=None) -> Image.Image:
    """Open lazily (header only) a path or binary file; every PIL failure becomes a DataError naming
    ``label`` (default: the path), e.g. ``archive.zip:scans/a.png`` for an archive member."""
    label = source if label is None else label
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            return Image.open(source)
    except (Image.DecompressionBombError, Image.DecompressionBombWarning) as error:
        raise DataError(
            f"{label}: {error} If the file is trusted, raise the limit before loading, e.g. "
            "`PIL.Image.MAX_IMAGE_PIXELS = 500_000_000` (None disables the check)."
        ) from error
    except (UnidentifiedImageError, OSError, ValueError) as error:
        raise DataError(
            f"{label}: cannot read as an image ({error}); the file is corrupt, empty or not an image"
        ) from error


def orientation(image: Image.Image) -> int:
    """The EXIF orientation of an opened, not yet decoded image (1-8; 1 when it has none or an invalid one).

    Read from the header only: for a PNG, the eXIf chunk before the pixel data (``getexif`` would decode the
    pixels to look for one after them), so that sizes from headers and decoded images always agree.
    """
    try:
        if image.format == "PNG":
            exif = Image.Exif()
            if image.info.get("exif"):
                exif.load(image.info["exif"])
        else:
            exif = image.getexif()
        value = exif.get(ORIENTATION_TAG, 1)
    except Exception:  # a damaged EXIF block: shown as stored, as viewers do
        return 1
    return value if value in TRANSPOSES else 1


def upright(image: Image.Image, turn: int) -> Image.Image:
    """A decoded ``image`` as displayed under EXIF orientation ``turn`` (the same image for 1)."""
    if turn not in TRANSPOSES:
        return image
    turned = image.transpose(TRANSPOSES[turn])
    image.close()
    return turned


class DataWarning(UserWarning):
    """A file that decodes but may not hold what was meant (a multi-page TIFF, a lossy mask); names the file."""


def _decode(source, label=None) -> Image.Image:
    label = source if label is None else label
    image = open_image(source, label)
    pages = getattr(image, "n_frames", 1)
    if pages > 1:
        warnings.warn(f"{label}: has {pages} pages; srforge reads the first one only", DataWarning, stacklevel=3)
    turn = orientation(image)  # before load(): the same header read_size looks at
    try:
        image.load()
    except (OSError, ValueError, SyntaxError) as error:  # truncated or damaged pixel data
        image.close()
        raise DataError(f"{label}: cannot decode ({error}); the file is truncated or corrupt") from error
    # Some decoders (Pillow's TIFF, from version 11) turn the pixels themselves and drop the tag.
    return upright(image, turn) if orientation(image) == turn else image


def read_image(source, mode: str = "RGB", label=None) -> torch.Tensor:
    """Decode an image (a path, or a binary file named by ``label`` in errors) to uint8 [C, H, W] in PIL
    ``mode`` (RGB: C=3, L: C=1, RGBA: C=4).

    16-bit (and 32-bit integer) grayscale is scaled by its full range (value / 257), so a given raw
    value maps to the same 8-bit value in every file. Palette images are expanded through their palette.
    """
    label = source if label is None else label
    with _decode(source, label) as image:  # closed at once: a TIFF would otherwise hold its file open
        return _to_uint8_chw(image, mode, label)


def _to_uint8_chw(image: Image.Image, mode: str, label) -> torch.Tensor:
    if image.mode.startswith("I") or image.mode == "F":
        values = np.asarray(image, dtype=np.float64)
        top = 65535.0 if image.mode != "F" else 1.0 if values.max(initial=0) <= 1 else 255.0
        image = Image.fromarray(np.clip(values / top * 255 + 0.5, 0, 255).astype(np.uint8), "L")
    try:
        array = np.asarray(image.convert(mode))
    except ValueError as error:
        raise DataError(f"{label}: cannot convert mode {image.mode} to {mode} ({error})") from error
    array = array[:, :, None] if array.ndim == 2 else array
    return torch.from_numpy(array.copy()).permute(2, 0, 1).contiguous()


def read_mask(path) -> torch.Tensor:
    """Decode a mask file to [H, W] class indices (palette masks give their indices, as in VOC).

    8-bit masks (grayscale, palette, bilevel) give uint8, which holds up to 255 classes with 255 as the ignore
    value and moves an eighth of int64's bytes through workers, shared memory and the host-to-device copy;
    16- and 32-bit masks give int64. :class:`srforge.data.adapter.FieldView` gives every mask of a dataset one
    dtype.
    """
    path = Path(path)
    with _decode(path) as image:
        if image.format == "JPEG":
            warnings.warn(
                f"{path}: a JPEG mask is lossy (class ids change along every edge); save masks as PNG",
                DataWarning,
                stacklevel=2,
            )
        return _mask_indices(image, path)


def _mask_indices(image: Image.Image, path: Path) -> torch.Tensor:
    if image.mode == "LA":
        image = image.getchannel("L")
    if image.mode not in ("1", "L", "P") and not image.mode.startswith("I"):
        raise DataError(
            f"{path}: mask has mode {image.mode}; save masks as single-channel class indices "
            "(8- or 16-bit grayscale or palette PNG)"
        )
    array = np.asarray(image)
    return torch.from_numpy(array.astype(np.uint8 if array.dtype in (np.uint8, np.bool_) else np.int64))


def read_size(source, label=None) -> tuple[int, int]:
    """(H, W) of an image path or binary file as displayed (EXIF orientation applied), from its header only."""
    with open_image(source, label) as image:
        width, height = image.size
        if image.format == "TIFF":  # the stored size: Pillow may already report a turned TIFF's as displayed
            width, height = image.tag_v2.get(256, width), image.tag_v2.get(257, height)
        if orientation(image) in QUARTER_TURNS:
            width, height = height, width
    return height, width


def invalid_mask_values(mask: torch.Tensor, num_classes: int, ignore_index: int) -> list[int]:
    """The distinct values of ``mask`` ([H, W] integer) that are neither a class in [0, num_classes) nor
    ``ignore_index``, sorted; empty when the mask is valid. The one rule for mask values, wherever checked."""
    values = torch.unique(mask)
    bad = values[((values < 0) | (values >= num_classes)) & (values != ignore_index)]
    return [int(v) for v in bad.tolist()]
