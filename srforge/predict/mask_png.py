"""The PNG writer of prediction masks: 8-bit gray, every row unfiltered, zlib's run-length strategy at level 1.

PIL's PNG writer picks a row filter for every row of an 8-bit gray image by trying all five (adaptive filtering) and
lets no caller choose. On a mask -- long runs of one class id -- that search is most of the encode and buys nothing:
unfiltered rows under zlib's run-length strategy come out smaller than PIL's default level 6. On the full-size
synthetic scan's mask (benchmarks/bench_loader.py) this writer takes about a third of the time of PIL at level 1 with
the same strategy, for fewer bytes than PIL's default. A PNG needs only four kinds of chunk for that, written here.
"""

from __future__ import annotations

import struct
import zlib

import numpy as np

SIGNATURE = b"\x89PNG\r\n\x1a\n"
IDAT_BYTES = 1 << 20  # compressed bytes per IDAT chunk (a chunk may hold 2**31 - 1; readers handle any split)


def _chunk(kind: bytes, data: bytes) -> bytes:
    """One PNG chunk: length, type, data, and the CRC-32 of type and data."""
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(data, zlib.crc32(kind)))


def gray_png(array: np.ndarray, text: dict[str, str] | None = None) -> bytes:
    """The PNG file of ``array`` (uint8 [H, W]), with a tEXt chunk for each key and value of ``text`` (Latin-1).

    Reads back bit for bit with any PNG reader (PIL, libpng) as 8-bit gray; ``text`` appears in PIL's ``info``.
    """
    if not isinstance(array, np.ndarray) or array.dtype != np.uint8 or array.ndim != 2 or 0 in array.shape:
        found = f"{array.dtype} {list(array.shape)}" if isinstance(array, np.ndarray) else type(array).__name__
        raise ValueError(f"gray_png: expected a uint8 array [H, W] with H, W >= 1, found {found}")
    height, width = array.shape
    rows = np.empty((height, width + 1), np.uint8)
    rows[:, 0] = 0  # each row's filter type: None
    rows[:, 1:] = array
    packer = zlib.compressobj(1, zlib.DEFLATED, 15, 9, zlib.Z_RLE)
    stream = packer.compress(rows) + packer.flush()
    parts = [SIGNATURE, _chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0))]
    for key, value in (text or {}).items():
        parts.append(_chunk(b"tEXt", key.encode("latin-1") + b"\0" + value.encode("latin-1")))
    parts += [_chunk(b"IDAT", stream[i : i + IDAT_BYTES]) for i in range(0, len(stream), IDAT_BYTES)]
    parts.append(_chunk(b"IEND", b""))
    return b"".join(parts)
