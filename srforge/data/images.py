"""Decoding scans and masks: one image library for training and prediction.

Every PIL failure becomes a :class:`DataError` that names the file (or the archive member), so a bad scan
deep inside a dataset or an archive is reported by name, never as a bare traceback from PIL.

Images and masks are read the way viewers show them: an EXIF orientation tag (a phone photo turned on its
side, a scan stored upside down) is applied on decoding, and sizes read from headers are the displayed sizes,
so a mask drawn over the picture in any viewer lines up with the decoded image.

Decoding is PIL's, except where a faster decoder gives the same tensor bit for bit: an RGB or grayscale JPEG shown
as stored (no EXIF turn, one frame) is decoded by torchvision.io's libjpeg-turbo, and an 8-bit RGB, RGBA or gray PNG
shown as stored by pyspng (libspng; the ``fast`` extra, imported on first use: without it PNGs stay with PIL).
:func:`fast_decoder` says which files, ``FAST_MODES`` in which modes. PIL opens every file first, so its checks (the
decompression-bomb refusal, what is an image) come first; a file the fast decoder fails on is decoded again by PIL,
so a damaged file fails with PIL's error, naming it, as it always has. An image is
returned as a [C, H, W] view of the decoded [H, W, C] buffer: no copy after decoding, and the one copy a batch
needs is the collate's (:class:`srforge.data.collate.AlignedCollate`).
"""

from __future__ import annotations

import functools
import io
import os
import stat
import warnings
import zlib
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

# format -> (mode stored, mode asked) -> the fast decoder's mode that gives PIL's pixels bit for bit. JPEG: the
# torchvision.io read mode, the same as stored or gray replicated into RGB, exactly PIL's convert("RGB"). PNG: the
# pyspng output format, which replicates gray, adds an opaque alpha or drops it exactly as PIL's convert does (not
# RGB to L: PIL's weights); torchvision 0.29's decode_png is not used: it crashes the process (SIGSEGV) on a damaged
# PNG (a bad IDAT checksum, or corrupt deflate data under a valid one: 16 of 20 such files).
FAST_MODES = {
    "JPEG": {
        ("RGB", "RGB"): "UNCHANGED",
        ("L", "L"): "UNCHANGED",
        ("L", "RGB"): "RGB",
    },
    "PNG": {
        ("L", "L"): "L",
        **{(stored, asked): asked for stored in ("RGB", "RGBA", "L") for asked in ("RGB", "RGBA")},
    },
}
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


@functools.cache
def _jpeg_op():
    """torchvision.io's CPU JPEG decoder (libjpeg-turbo), the op its ``decode_jpeg`` calls (the wrapper is deprecated
    since torchvision 0.29 and warns on every call), and its read modes; None without it: PIL then decodes every JPEG.
    Imported when a JPEG is first decoded: importing torchvision costs a process about a second (its ops import
    torch._dynamo), which a run that reads no JPEG need not pay."""
    try:
        import torchvision.io as tvio

        return torch.ops.image.decode_jpeg, tvio.ImageReadMode
    except (ImportError, AttributeError, RuntimeError):
        return None


def _decode_jpeg(data: torch.Tensor, mode: str) -> torch.Tensor:
    """The JPEG ``data`` (uint8 [N]) decoded by libjpeg-turbo in ``mode`` (a FAST_MODES["JPEG"] read mode's name)
    as uint8 [C, H, W]."""
    decode, modes = _jpeg_op()
    return decode(data, modes[mode].value)


def _pyspng():
    """pyspng (the ``fast`` extra), imported when a PNG is first decoded; None without it: PIL decodes every PNG."""
    try:
        import pyspng
    except ImportError:
        return None
    return pyspng


def png_end(data) -> int | None:
    """The offset just past IEND's checksum when the PNG ``data`` (bytes or a buffer) is a sequence of chunks,
    every checksum right, ending in IEND, with nothing but IDAT after the first IDAT and no animation: only then may
    pyspng decode it (the bytes up to that offset). pyspng checks no checksum (neither CRC nor Adler-32) where PIL
    refuses a broken deflate stream, and PIL's handlers of chunks after the pixels may fail where pyspng's do not:
    such files go to PIL (None). What is left: a file whose chunk checksums are right but whose deflate data fails
    its own Adler-32 check is decoded here where PIL refuses it (a crafted file: damage after writing breaks a
    chunk checksum)."""
    at, pixels = len(PNG_SIGNATURE), False
    view = memoryview(data)
    while at + 12 <= len(data):
        length, kind = int.from_bytes(view[at : at + 4], "big"), bytes(view[at + 4 : at + 8])
        end = at + 8 + length
        if end + 4 > len(data) or zlib.crc32(view[at + 4 : end]) != int.from_bytes(view[end : end + 4], "big"):
            return None
        if kind == b"IEND":
            return end + 4 if pixels else None
        if kind == b"acTL" or (pixels and kind != b"IDAT"):
            return None
        pixels, at = pixels or kind == b"IDAT", end + 4
    return None


def _decode_png(data: torch.Tensor, mode: str) -> torch.Tensor:
    """The PNG ``data`` (uint8 [N]) decoded by pyspng in ``mode`` (a FAST_MODES["PNG"] format) as a [C, H, W] view
    of its [H, W, C] pixels; a ValueError for a file :func:`png_end` refuses."""
    view = memoryview(data.numpy())
    end = png_end(view)
    if end is None:
        raise ValueError("not a plain PNG: PIL decodes it")
    pixels = _pyspng().load(bytes(view[:end]), mode)  # pyspng takes bytes only: a copy of the PNG itself, no more
    return torch.from_numpy(pixels[:, :, None] if pixels.ndim == 2 else pixels).permute(2, 0, 1)


# format -> its fast decoder(encoded uint8 [N], mode) -> uint8 [C, H, W]; a format not here is PIL's alone.
FAST_DECODERS = {"JPEG": _decode_jpeg, "PNG": _decode_png}


class DataError(ValueError):
    """A data file is missing, unreadable or inconsistent with its partner; the message names the file."""


def open_image(source, label=None) -> Image.Image:
    """Open lazily (header only) a path or binary file; every PIL failure becomes a DataError naming
    ``label`` (default: the path), e.g. ``archive.zip:scans/a.png`` for an archive member."""
    label = source if label is None else label
    if isinstance(source, (str, os.PathLike)):
        try:
            kind = os.stat(source).st_mode
        except OSError:
            kind = None  # PIL says what is wrong with it
        if kind is not None and not stat.S_ISREG(kind):
            raise DataError(
                f"{label}: not a regular file (a folder, FIFO, socket or device); srforge reads images and masks "
                "from regular files only: replace it with the image file"
            )
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


def fast_decoder(image: Image.Image, mode: str):
    """The mode in which ``FAST_DECODERS[image.format]`` decodes the opened, not yet decoded ``image`` to exactly
    what PIL gives in ``mode``, or None where PIL must decode it: not a JPEG or a PNG (or a PNG without pyspng), not
    8 bits a channel as stored (CMYK, palette, 16-bit, gray with alpha), asked in another mode (RGB to L: PIL's
    weights), a transparent colour, more than one frame, or an EXIF turn to apply."""
    tile = image.tile[0] if len(image.tile) == 1 else None
    raw = tile.args[0] if tile is not None and isinstance(tile.args, tuple) else getattr(tile, "args", None)
    fast = FAST_MODES.get(image.format, {}).get((image.mode, mode)) if image.format in FAST_DECODERS else None
    if fast is not None and (_pyspng() if image.format == "PNG" else _jpeg_op()) is None:
        return None
    if fast is None or raw != image.mode or "transparency" in image.info or getattr(image, "n_frames", 1) > 1:
        return None
    return fast if orientation(image) == 1 else None


def _encoded(source, image: Image.Image) -> torch.Tensor | None:
    """The whole encoded file as uint8 [N], read once from the file PIL opened (shared, not copied, with a BytesIO);
    None when the file does not read whole."""
    if isinstance(source, io.BytesIO):
        return torch.frombuffer(source.getbuffer(), dtype=torch.uint8)
    size = image.fp.seek(0, os.SEEK_END)
    image.fp.seek(0)  # PIL reads every file from its start too
    data = torch.empty(size, dtype=torch.uint8)
    return data if image.fp.readinto(data.numpy()) == size else None


def decode_fast(source, mode: str = "RGB", label=None) -> torch.Tensor | None:
    """``read_image(source, mode)`` through torchvision.io where :func:`fast_decoder` allows it: uint8 [C, H, W], a
    view of the decoded [H, W, C] buffer; None where PIL must decode the file (or the fast decoder fails on it: PIL
    then says why). What opening the file raises (a DataError naming ``label``, default the path) is raised here."""
    with open_image(source, label) as image:
        read_mode = fast_decoder(image, mode)
        if read_mode is None:
            return None
        try:
            data = _encoded(source, image)
            return None if data is None else FAST_DECODERS[image.format](data, read_mode)
        except (RuntimeError, ValueError, OSError):  # damaged: PIL decodes it again and says why
            return None


def read_image_pil(source, mode: str = "RGB", label=None) -> torch.Tensor:
    """:func:`read_image` by PIL alone, for every file: the reference the fast decoder is held to."""
    label = source if label is None else label
    with _decode(source, label) as image:  # closed at once: a TIFF would otherwise hold its file open
        return _to_uint8_chw(image, mode, label)


def read_image(source, mode: str = "RGB", label=None) -> torch.Tensor:
    """Decode an image (a path, or a binary file named by ``label`` in errors) to uint8 [C, H, W] in PIL
    ``mode`` (RGB: C=3, L: C=1, RGBA: C=4), a view of the decoded [H, W, C] pixels (channels-last strides).

    16-bit (and 32-bit integer) grayscale is scaled by its full range (value / 257), so a given raw
    value maps to the same 8-bit value in every file. Palette images are expanded through their palette.
    The same tensor as PIL's, faster where :func:`fast_decoder` allows (see the module docstring).
    """
    fast = decode_fast(source, mode, label)
    return fast if fast is not None else read_image_pil(source, mode, label)


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
    # PIL hands its pixels out read-only: one copy makes them the tensor's own; [C, H, W] is a view of them.
    return torch.from_numpy(array.copy()).permute(2, 0, 1)


def read_mask(path) -> torch.Tensor:
    """Decode a mask file to [H, W] class indices (palette masks give their indices, as in VOC).

    8-bit masks (grayscale, palette, bilevel) give uint8, which holds up to 255 classes with 255 as the ignore
    value and moves an eighth of int64's bytes through workers, shared memory and the host-to-device copy;
    16- and 32-bit masks give int64. :class:`srforge.data.field_view.FieldView` gives every mask of a dataset one
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


def mask_values(mask: torch.Tensor) -> list[int]:
    """The distinct values of ``mask`` ([H, W] integer), sorted; a count per byte value for 8-bit masks (a tenth of
    the time of ``torch.unique``'s sort on a full-size scan)."""
    if mask.dtype == torch.uint8:
        return torch.bincount(mask.reshape(-1), minlength=256).nonzero().flatten().tolist()
    return [int(v) for v in torch.unique(mask).tolist()]


def invalid_mask_values(mask: torch.Tensor, num_classes: int, ignore_index: int) -> list[int]:
    """The distinct values of ``mask`` ([H, W] integer) that are neither a class in [0, num_classes) nor
    ``ignore_index``, sorted; empty when the mask is valid. The one rule for mask values, wherever checked.

    A mask whose smallest and largest values are classes is valid at the cost of one pass (no sort): the common
    case, checked for every scan of every epoch."""
    if mask.numel() == 0:
        return []
    low, high = torch.aminmax(mask.to(torch.uint8) if mask.dtype == torch.bool else mask)
    if low >= 0 and high < num_classes:
        return []
    outside = mask[((mask < 0) | (mask >= num_classes)) & (mask != ignore_index)]
    return [int(v) for v in torch.unique(outside).tolist()]
