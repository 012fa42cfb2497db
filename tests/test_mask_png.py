"""The mask PNG writer: what PIL reads back is the mask bit for bit, its text chunks included, whatever the size."""

import io
import zlib

import numpy as np
import pytest
from PIL import Image

import srforge.predict.mask_png as mask_png
from srforge.predict.mask_png import gray_png
from srforge.predict.outputs import read_complete, write_png
from srforge.synthetic import welllog_scan


def read_back(data: bytes) -> Image.Image:
    Image.open(io.BytesIO(data)).verify()  # every chunk's CRC, and the chunk sequence
    image = Image.open(io.BytesIO(data))
    image.load()
    return image


@pytest.mark.parametrize("shape", [(1, 1), (1, 37), (23, 1), (13, 29)])
def test_what_pil_reads_back_is_the_mask_bit_for_bit(shape):
    mask = np.random.default_rng(sum(shape)).integers(0, 256, shape, dtype=np.uint8)
    image = read_back(gray_png(mask, {"srforge": "model=ab12", "note": "caf\xe9"}))
    assert image.mode == "L" and image.size == (shape[1], shape[0])
    assert np.array_equal(np.asarray(image), mask)
    assert image.info["srforge"] == "model=ab12" and image.info["note"] == "caf\xe9"


def test_a_view_and_a_long_stream_in_many_idat_chunks_read_back(monkeypatch):
    monkeypatch.setattr(mask_png, "IDAT_BYTES", 7)
    base = np.random.default_rng(0).integers(0, 4, (40, 60), dtype=np.uint8)
    view = base[::2, 5:50]  # not contiguous
    data = gray_png(view)
    assert data.count(b"IDAT") > 3
    assert np.array_equal(np.asarray(read_back(data)), view)


def chunks(data: bytes) -> list[tuple[bytes, bytes]]:
    """(type, data) of every chunk of a PNG file."""
    found, at = [], 8
    while at < len(data):
        length = int.from_bytes(data[at : at + 4], "big")
        found.append((data[at + 4 : at + 8], data[at + 8 : at + 8 + length]))
        at += 12 + length
    return found


@pytest.mark.parametrize("classes", ["binary", "multiclass"])
def test_a_mask_takes_at_most_a_tenth_more_bytes_than_pil_at_its_default_level(classes):
    _, mask = welllog_scan(1, seed=0, scale=0.25, classes=classes)
    buffer = io.BytesIO()
    Image.fromarray(mask, "L").save(buffer, format="PNG")  # level 6, adaptive row filters: the writer before
    ours = gray_png(mask)
    assert np.array_equal(np.asarray(read_back(ours)), mask)
    assert len(ours) <= 1.1 * len(buffer.getvalue())
    stream = zlib.decompress(b"".join(data for kind, data in chunks(ours) if kind == b"IDAT"))
    assert stream[:: mask.shape[1] + 1] == bytes(mask.shape[0])  # every row unfiltered
    assert [kind for kind, _ in chunks(ours)] == [b"IHDR", b"IDAT", b"IEND"]


@pytest.mark.parametrize("bad", [np.zeros((3, 4), np.int64), np.zeros((3, 4, 1), np.uint8), np.zeros((0, 4), np.uint8)])
def test_anything_but_a_uint8_plane_is_refused_naming_what_it_is(bad):
    with pytest.raises(ValueError, match=r"gray_png: expected a uint8 array \[H, W\].*found " + str(bad.dtype)):
        gray_png(bad)


def test_prediction_writes_masks_with_it_and_finds_them_complete(tmp_path):
    mask = np.arange(6 * 9, dtype=np.uint8).reshape(6, 9) % 3
    write_png(tmp_path / "m.png", mask, "L", "ab12")
    assert (tmp_path / "m.png").read_bytes() == gray_png(mask, {"srforge": "model=ab12"})
    assert np.array_equal(read_complete(tmp_path / "m.png", (6, 9), "L", "ab12"), mask)
    assert read_complete(tmp_path / "m.png", (6, 9), "L", "other") is None
