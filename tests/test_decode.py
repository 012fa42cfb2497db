"""The fast decoder (torchvision.io's libjpeg-turbo) against PIL: the same tensors bit for bit, the same errors
naming the same files, the same warnings, over every hostile and odd-mode file the project knows. The damaged PNGs
(a bad IDAT checksum) are there too: torchvision's decode_png crashes the process on them, so PNGs stay with PIL,
and this corpus would crash the test run if they were ever handed to it."""

import io
import struct
import warnings
import zlib

import numpy as np
import pytest
import torch
from PIL import Image

from srforge.data import images
from srforge.data.images import decode_fast, read_image, read_image_pil

ORIENTATION = 0x0112


def _saved(array, fmt, mode=None, **options) -> bytes:
    buffer = io.BytesIO()
    picture = Image.fromarray(array, mode) if mode else Image.fromarray(array)
    if "palette" in options:
        picture.putpalette(options.pop("palette"))
    picture.save(buffer, format=fmt, **options)
    return buffer.getvalue()


def _exif(turn: int) -> bytes:
    exif = Image.Exif()
    exif[ORIENTATION] = turn
    return exif.tobytes()


def _bad_idat_crc(png: bytes) -> bytes:
    at = png.index(b"IDAT") - 4
    length = struct.unpack(">I", png[at : at + 4])[0]
    crc = at + 8 + length
    return png[:crc] + bytes(b ^ 0xFF for b in png[crc : crc + 4]) + png[crc + 4 :]


def _cmyk_jpeg(smooth) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(smooth).convert("CMYK").save(buffer, format="JPEG")
    return buffer.getvalue()


def _two_frames(smooth, fmt) -> bytes:
    buffer = io.BytesIO()
    frames = [Image.fromarray(smooth), Image.fromarray(255 - smooth)]
    frames[0].save(buffer, format=fmt, save_all=True, append_images=frames[1:])
    return buffer.getvalue()


def corpus() -> dict[str, bytes]:
    """Every kind of file srforge meets: the fast decoder's own (8-bit RGB, RGBA, gray PNG and JPEG, interlaced,
    progressive, every chroma subsampling) and all it must leave to PIL (palette, transparency, 1- and 16-bit,
    CMYK, EXIF turns, several frames, TIFF, BMP), damaged files (cut short, a bad checksum, garbage, empty)."""
    rng = np.random.default_rng(0)
    noise = rng.integers(0, 256, (13, 21, 3), dtype=np.uint8)
    smooth = np.clip(np.add.outer(np.arange(13), np.arange(21))[..., None] * [9, 5, 2], 0, 255).astype(np.uint8)
    gray, rgba = smooth[..., 0], np.dstack([noise, smooth[..., :1]])
    files = {
        "rgb.png": _saved(noise, "PNG"),
        "rgb-level9-interlaced.png": _saved(noise, "PNG", compress_level=9, interlace=1),
        "gray.png": _saved(gray, "PNG"),
        "rgba.png": _saved(rgba, "PNG"),
        "la.png": _saved(np.dstack([gray, gray]), "PNG", mode="LA"),
        "palette.png": _saved(gray % 4, "PNG", mode="P", palette=list(range(0, 240, 20)) + [0] * 756),
        "palette-transparent.png": _saved(gray % 4, "PNG", mode="P", palette=[9] * 768, transparency=2),
        "rgb-transparent.png": _saved(noise, "PNG", transparency=(1, 2, 3)),
        "bilevel.png": _saved(gray > 60, "PNG"),
        "gray16.png": _saved((gray.astype(np.uint16) * 250), "PNG"),
        "rgb-turned-6.png": _saved(noise, "PNG", exif=_exif(6)),
        "rgb-turned-1.png": _saved(noise, "PNG", exif=_exif(1)),
        "animated.png": _two_frames(smooth, "PNG"),
        "rgb-420.jpg": _saved(smooth, "JPEG", quality=80),
        "rgb-444.jpg": _saved(noise, "JPEG", quality=95, subsampling=0),
        "rgb-422-restarts.jpg": _saved(smooth, "JPEG", subsampling=1, restart_marker_blocks=1),
        "progressive.jpg": _saved(smooth, "JPEG", progressive=True),
        "gray.jpg": _saved(gray, "JPEG"),
        "cmyk.jpg": _cmyk_jpeg(smooth),
        "turned-3.jpg": _saved(smooth, "JPEG", exif=_exif(3)),
        "turned-8.jpg": _saved(smooth, "JPEG", exif=_exif(8)),
        "two-pages.tif": _two_frames(smooth, "TIFF"),
        "rgb.bmp": _saved(noise, "BMP"),
        "empty.png": b"",
        "garbage.png": b"not an image at all",
    }
    for name in ("rgb.png", "rgb-420.jpg", "progressive.jpg", "gray.png"):
        data = files[name]
        files[f"cut-half-{name}"] = data[: len(data) // 2]
        files[f"cut-end-{name}"] = data[:-2]
    files["bad-idat-crc.png"] = _bad_idat_crc(files["rgb.png"])
    for seed in range(8):  # bytes changed in the entropy-coded data: libjpeg decodes some (with gray), refuses others
        data = bytearray(files["rgb-444.jpg"])
        for at in np.random.default_rng(seed).integers(len(data) // 2, len(data) - 2, 3):
            data[at] ^= 0x5A
        files[f"corrupt-{seed}.jpg"] = bytes(data)
    files["trailing-garbage.png"] = files["rgb.png"] + b"\0" * 100
    return files


# What the fast decoder must take (the rest it must leave to PIL), so that the comparison cannot pass by PIL alone.
FAST = {"RGB": {"rgb-420.jpg", "rgb-444.jpg", "rgb-422-restarts.jpg", "progressive.jpg", "gray.jpg"}, "L": {"gray.jpg"}}


def outcome(read, *args):
    """(tensor, None, warnings) or (None, 'Type: message', warnings) of ``read(*args)``."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            result, error = read(*args), None
        except Exception as exc:  # noqa: BLE001 - what PIL raises is what the fast path must raise
            result, error = None, f"{type(exc).__name__}: {exc}"
    return result, error, sorted(str(w.message) for w in caught)


def same_outcome(fast, reference) -> None:
    assert fast[1:] == reference[1:]
    if reference[0] is not None:
        assert fast[0].dtype == reference[0].dtype and fast[0].shape == reference[0].shape
        assert torch.equal(fast[0], reference[0])


@pytest.mark.parametrize("mode", ["RGB", "L", "RGBA"])
def test_the_whole_corpus_decodes_the_same_both_ways(tmp_path, mode):
    taken, failed = set(), set()
    for name, data in corpus().items():
        path = tmp_path / name
        path.write_bytes(data)
        for source in (path, str(path)):
            same_outcome(outcome(read_image, source, mode), outcome(read_image_pil, source, mode))
        if outcome(read_image_pil, path, mode)[1] is not None:
            failed.add(name)
        label = f"archive.zip:{name}"
        same_outcome(
            outcome(read_image, io.BytesIO(data), mode, label), outcome(read_image_pil, io.BytesIO(data), mode, label)
        )
        if outcome(decode_fast, path, mode)[0] is not None:
            taken.add(name)
    corrupt = {name for name in taken if name.startswith("corrupt-")}  # decoded by libjpeg as by PIL, gray and all
    assert taken - corrupt == FAST.get(mode, set())
    if mode == "RGB":  # the damaged JPEGs meet both outcomes: decoded (the same pixels), refused (the same error)
        assert corrupt and {n for n in failed if n.startswith("corrupt-")}


def test_errors_name_the_file_and_a_bomb_is_refused_before_decoding(tmp_path, monkeypatch):
    path = tmp_path / "scan.png"
    path.write_bytes(corpus()["cut-half-rgb.png"])
    with pytest.raises(images.DataError, match=rf"{path}: cannot decode .*truncated or corrupt"):
        read_image(path)
    path.write_bytes(corpus()["rgb.png"])
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 100)  # 273 px: over 2x the limit
    monkeypatch.setattr(images, "FAST_DECODERS", {})  # nothing but PIL may say why
    with pytest.raises(images.DataError, match=rf"{path}: .*MAX_IMAGE_PIXELS"):
        read_image(path)
    monkeypatch.undo()
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 200)  # between 1x and 2x: PIL only warns, srforge refuses
    with pytest.raises(images.DataError, match="MAX_IMAGE_PIXELS"):
        read_image(path)


@pytest.mark.parametrize("name", ["rgb.png", "rgb-444.jpg"])
def test_an_image_is_a_view_of_its_decoded_pixels_without_copies(tmp_path, name):
    path = tmp_path / name
    path.write_bytes(corpus()[name])
    for read in (read_image, read_image_pil):
        image = read(path)
        assert image.shape == (3, 13, 21) and image.stride() == (1, 21 * 3, 3)
        assert image.permute(1, 2, 0).is_contiguous()  # [H, W, C] as decoded: no transpose was made


def test_without_torchvision_decoders_pil_decodes_everything(tmp_path, monkeypatch):
    path = tmp_path / "rgb.jpg"
    path.write_bytes(corpus()["rgb-444.jpg"])
    expected = read_image(path)
    monkeypatch.setattr(images, "FAST_DECODERS", {})
    assert decode_fast(path) is None and torch.equal(read_image(path), expected)


def test_a_png_whose_idat_is_damaged_after_the_header_checks_fails_as_before(tmp_path):
    data = corpus()["rgb.png"]
    at = data.index(b"IDAT") + 4
    broken = data[:at] + zlib.compress(b"\xff" * 50)[:30] + data[at + 30 :]
    path = tmp_path / "broken.png"
    path.write_bytes(broken)
    same_outcome(outcome(read_image, path, "RGB"), outcome(read_image_pil, path, "RGB"))
    assert outcome(read_image, path, "RGB")[1].startswith("DataError")
