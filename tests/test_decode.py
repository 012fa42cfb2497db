"""The fast decoders (torchvision.io's libjpeg-turbo for JPEG, pyspng's libspng for PNG where the ``fast`` extra is
installed) against PIL: the same tensors bit for bit, the same errors naming the same files, the same warnings, over
every hostile and odd-mode file the project knows. The damaged PNGs (a bad IDAT checksum) are there too: torchvision's
decode_png crashes the process on them, so it is never used, and this corpus would crash the test run if it were."""

import io
import struct
import sys
import warnings
import zlib

import numpy as np
import pytest
import torch
from PIL import Image

from srforge.data import images
from srforge.data.images import decode_fast, png_end, read_image, read_image_pil

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


def _chunk(kind: bytes, body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))


def _scanlines(rows: np.ndarray) -> bytes:
    return np.hstack([np.zeros((len(rows), 1), np.uint8), rows]).tobytes()  # filter type 0 on every row


def _png(rows: np.ndarray, width: int, depth: int, colour: int, after: bytes = b"", idat: bytes | None = None) -> bytes:
    """A PNG written chunk by chunk (valid checksums): ``rows`` the bytes of its unfiltered scanlines (uint8 [H, N]),
    the IHDR ``width``, bit ``depth`` and ``colour`` type; ``after``: chunks after IDAT; ``idat``: its data as given."""
    ihdr = struct.pack(">IIBBBBB", width, len(rows), depth, colour, 0, 0, 0)
    pixels = zlib.compress(_scanlines(rows)) if idat is None else idat
    return b"\x89PNG\r\n\x1a\n" + _chunk(b"IHDR", ihdr) + _chunk(b"IDAT", pixels) + after + _chunk(b"IEND", b"")


def _odd_pngs(noise, gray) -> dict[str, bytes]:
    """PNGs PIL reads in a mode pyspng must not be asked for, or with chunks pyspng would not see as PIL does."""
    nibbles, rgb = gray[:, :20] // 16, noise.reshape(13, -1)
    return {
        "rgb16.png": _png((rgb.astype(">u2") * 257).view(np.uint8), 21, 16, 2),
        "gray4.png": _png(nibbles[:, ::2] * 16 + nibbles[:, 1::2], 20, 4, 0),
        "text-after-idat.png": _png(rgb, 21, 8, 2, after=_chunk(b"tEXt", b"note\0after")),
        "short-phys-after-idat.png": _png(rgb, 21, 8, 2, after=_chunk(b"pHYs", b"\0")),
        "broken-deflate-valid-crc.png": _png(rgb, 21, 8, 2, idat=zlib.compress(b"\xff" * 50)[:30]),
    }


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
        **_odd_pngs(noise, gray),
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


# What the fast decoders must take (the rest they must leave to PIL), so that the comparison cannot pass by PIL alone.
HAVE_PYSPNG = images._pyspng() is not None
PLAIN_PNGS = {"rgb.png", "rgb-level9-interlaced.png", "gray.png", "rgba.png", "rgb-turned-1.png"} | {
    "trailing-garbage.png"
}
FAST = {
    "RGB": {"rgb-420.jpg", "rgb-444.jpg", "rgb-422-restarts.jpg", "progressive.jpg", "gray.jpg"}
    | (PLAIN_PNGS if HAVE_PYSPNG else set()),
    "L": {"gray.jpg"} | ({"gray.png"} if HAVE_PYSPNG else set()),
    "RGBA": PLAIN_PNGS if HAVE_PYSPNG else set(),
}


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


def test_a_png_pyspng_fails_on_is_decoded_again_by_pil_and_fails_naming_the_file(tmp_path):
    pyspng = pytest.importorskip("pyspng")
    data = corpus()["broken-deflate-valid-crc.png"]
    assert png_end(data) == len(data)  # every checksum right: pyspng is asked, and fails
    with pytest.raises(RuntimeError):
        pyspng.load(data, "RGB")
    path = tmp_path / "scan.png"
    path.write_bytes(data)
    with pytest.raises(images.DataError, match=rf"^{path}: cannot decode .*truncated or corrupt"):
        read_image(path)
    same_outcome(outcome(read_image, path, "RGB"), outcome(read_image_pil, path, "RGB"))


def test_without_pyspng_pil_decodes_every_png(tmp_path, monkeypatch):
    path = tmp_path / "rgb.png"
    path.write_bytes(corpus()["rgb.png"])
    expected = read_image_pil(path)
    monkeypatch.setitem(sys.modules, "pyspng", None)  # `import pyspng` raises ImportError
    assert images._pyspng() is None and decode_fast(path) is None
    assert torch.equal(read_image(path), expected)


@pytest.mark.xfail(strict=True, reason="pyspng checks no Adler-32: a crafted PNG with right chunk CRCs decodes")
def test_a_png_whose_deflate_checksum_alone_is_wrong_fails_as_with_pil(tmp_path):
    pytest.importorskip("pyspng")
    rows = np.arange(13 * 63, dtype=np.uint8).reshape(13, 63)
    good = zlib.compress(_scanlines(rows))
    path = tmp_path / "scan.png"
    path.write_bytes(_png(rows, 21, 8, 2, idat=good[:-1] + bytes([good[-1] ^ 1])))  # the Adler-32 changed
    same_outcome(outcome(read_image, path, "RGB"), outcome(read_image_pil, path, "RGB"))
