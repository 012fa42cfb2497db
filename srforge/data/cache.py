"""The decoded-scan cache (``data.cache``): each scan decoded once, read back at memory speed ever after.

A full-size PNG scan costs a core a tenth of a second or more to decode; its decoded pixels, mapped from the page
cache, cost about what copying them does (docs/performance.md, "Host data path"). The first time a file is read
through a :class:`DecodedCache`, its decoded, oriented tensor (uint8; int64 for a 16-bit mask) is written into the
cache folder as a ``.npy`` file; every later read of the unchanged file maps that entry into memory (copy-on-write:
the caller may change the tensor, the entry stays as it is) instead of decoding::

    FOLDER/.srforge-cache            the marker: the folder is srforge's alone (a folder without it is refused)
    FOLDER/ab/ab12...ef.npy          one entry a source and decoding: [C, H, W] image ([H, W, C] for a
                                     channels-last cache) or [H, W] mask, then the line
                                     "\\nsrforge-cache {JSON}\\n" after the array (np.load reads exactly the array)

An image entry is stored in the layout its batch takes (``train.channels_last``: [H, W, C], else [C, H, W] planes),
so that a hit costs the collate one straight copy into its batch slot: copying a [C, H, W] view of [H, W, C] pixels
into a [C, H, W] slot is a transpose, about 7x slower than the straight copy on a full-size scan.

An entry serves a read only when the key in its trailer is the one asked for: the source (absolute path, or archive
and member), its byte size, modification time, status change time and inode (:func:`file_stamp`: a file rewritten
with its old size and modification time still changes the last two), the decoding (``image:RGB``, ``mask``), the
image layout, :data:`DECODE_VERSION` and PIL's version. Anything else -- a changed file, another mode, an entry cut
short, a damaged header or trailer, an entry whose (H, W) is not the one the file's header gives, an entry that is
not a regular file (a link, a FIFO) -- is decoded again and its entry written anew (its name depends on the source,
decoding and layout only, so a changed file replaces its entry). Rescaling, cropping and augmentation are per epoch
and never cached. The pixels themselves carry no checksum: entries are written whole or not at all, so only damage
from outside could change them.

Every promise of decoding holds through the cache: a file that fails to decode is never cached, so it fails every
time with the same DataError; the warnings its decoding gave (a multi-page TIFF, a JPEG mask) are kept in the trailer
and given again on every hit; an entry larger than ``PIL.Image.MAX_IMAGE_PIXELS`` allows is decoded again, so a
decompression bomb is refused as before.

Entries are written atomically (:func:`srforge.atomic.atomic_write`), so DataLoader workers and torchrun ranks that
share one folder never read half an entry. ``max_gb`` is the folder's budget: past it no entry is added and one
:class:`CacheWarning` says so (once for every process that built the cache, whatever its workers); reads go on. The
count of the folder is renewed every ``RECOUNT_EVERY`` entries a process adds, so processes that fill one folder
together may pass the budget by what they add between two counts. A full disk, or a folder that cannot be written,
stops the adding the same way, never the training.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import stat
import threading
import time
import uuid
import warnings
from collections.abc import Callable
from pathlib import Path

import numpy as np
import PIL
import torch
from PIL import Image

from srforge.atomic import TEMP_SUFFIX, atomic_write, atomic_write_text, no_space
from srforge.data.images import DataError, DataWarning, read_image, read_mask, read_size

MARKER = ".srforge-cache"
DECODE_VERSION = 2  # raise when decoding changes what a file decodes to: every entry is then decoded again
TRAILER = b"\nsrforge-cache "
TRAILER_MAX = 1 << 16  # the most bytes a trailer may take (a key holds a path)
RECOUNT_EVERY = 32  # entries a process adds between two counts of the folder's bytes (with a budget)
STALE_S = 3600  # a temporary file or a stop note this old is a killed process's: swept when a cache opens
STOP_NOTE = ".stopped-"  # FOLDER/.stopped-<reason>-<token>: the stop was said by some process of this cache
ENTRY_DTYPES = (np.dtype(np.uint8), np.dtype(np.int64))


class CacheWarning(UserWarning):
    """The decoded-scan cache stopped adding entries (budget reached, disk full, folder not writable)."""


def folder_bytes(root: Path) -> int:
    """Bytes of the entries (``*.npy``) in the cache folder ``root``."""
    total = 0
    for sub in os.scandir(root):
        if sub.is_dir(follow_symlinks=False):
            for entry in os.scandir(sub.path):
                if entry.name.endswith(".npy"):
                    total += entry.stat(follow_symlinks=False).st_size
    return total


def _sweep(root: Path) -> None:
    """Remove what killed processes left: temporary entries and stop notes older than STALE_S."""
    old = time.time() - STALE_S
    for top, _, files in os.walk(root):
        for name in files:
            if name.endswith(TEMP_SUFFIX) or name.startswith(STOP_NOTE):
                path = os.path.join(top, name)
                try:
                    if os.stat(path).st_mtime < old:
                        os.unlink(path)
                except OSError:
                    pass  # gone already, or another process's to sweep


def claim_folder(root: Path) -> None:
    """Make ``root`` a cache folder (create it, write the marker) unless it is one; a folder that holds anything
    else (srforge's temporaries aside) is a DataError: the cache never writes among someone else's files."""
    if (root / MARKER).is_file():
        return
    if root.exists() and not root.is_dir():
        raise DataError(f"data.cache: {root} is a file; expected a folder for the decoded-scan cache")
    if root.is_dir():
        others = sorted(p.name for p in root.iterdir() if not p.name.endswith(TEMP_SUFFIX))
        if others:
            raise DataError(
                f"data.cache: {root} is not a decoded-scan cache (no {MARKER} marker in it) and holds "
                f"{len(others)} other file(s), e.g. {others[0]!r}; expected an empty or new folder, or one srforge "
                "made: choose another folder"
            )
    root.mkdir(parents=True, exist_ok=True)
    atomic_write_text(root / MARKER, json.dumps({"srforge": "decoded-scan cache", "version": DECODE_VERSION}))


class DecodedCache:
    """Decoded scans under ``root`` (see the module docstring); ``max_gb``: the folder's budget (None: none).

    ``read_image(path, mode)`` and ``read_mask(path)`` are :func:`srforge.data.images.read_image` and
    ``read_mask`` through the cache; ``read(source, stamp, decoding, decode)`` caches any decoding of any source.
    ``stopped`` names why this process adds no more entries (None while it does). ``channels_last``: image
    entries hold [H, W, C] pixels, the layout of a channels-last batch (else [C, H, W] planes); an image read
    is [C, H, W] either way.
    """

    def __init__(self, root, max_gb: float | None = None, channels_last: bool = False):
        if max_gb is not None and not (max_gb > 0 and math.isfinite(max_gb)):
            raise ValueError(
                f"data.cache_max_gb: expected a finite size in GB > 0 (or null for no budget), found {max_gb}"
            )
        self.root = Path(root).absolute()
        self.max_bytes = None if max_gb is None else int(max_gb * 1e9)
        self.channels_last = bool(channels_last)
        self.stopped: str | None = None
        self.token = uuid.uuid4().hex[:12]  # this cache's processes (and their forked workers) say a stop once
        self.used: int | None = None  # the folder's bytes at the last count, plus what this process added since
        self.added_since_count = 0
        self.lock = threading.Lock()
        try:
            claim_folder(self.root)
            _sweep(self.root)
        except OSError as error:
            if no_space(error) is None:
                raise DataError(f"data.cache: cannot make the cache folder {self.root} ({error})") from error
            self.stop("disk", f"no space left on {self.root}")

    def __getstate__(self) -> dict:  # a spawned DataLoader worker gets everything but the lock
        return {k: v for k, v in self.__dict__.items() if k != "lock"}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state, lock=threading.Lock())

    def __repr__(self) -> str:
        budget = "no budget" if self.max_bytes is None else f"max {self.max_bytes / 1e9:g} GB"
        layout = ", channels last" if self.channels_last else ""
        return f"DecodedCache({str(self.root)!r}, {budget}{layout})"

    # -- reading ----------------------------------------------------------------------------------------
    def read_image(self, path, mode: str = "RGB") -> torch.Tensor:
        """:func:`srforge.data.images.read_image` of the file ``path``: uint8 [C, H, W] (contiguous, or a view of
        [H, W, C] pixels for a channels-last cache or a scan just decoded)."""
        return self.read_file(path, f"image:{mode}", lambda: read_image(path, mode))

    def read_mask(self, path) -> torch.Tensor:
        """:func:`srforge.data.images.read_mask` of the file ``path``: [H, W] class ids."""
        return self.read_file(path, "mask", lambda: read_mask(path))

    def read_file(self, path, decoding: str, decode: Callable[[], torch.Tensor]) -> torch.Tensor:
        """``decode()`` of the file ``path`` through the cache; a file that cannot be stat-ed, or is not a regular
        file, is decoded (which says why it cannot be read). An entry serves only a file whose header gives the
        entry's (H, W)."""
        try:
            info = os.stat(path)
        except (OSError, TypeError, ValueError):
            return decode()
        if not stat.S_ISREG(info.st_mode):
            return decode()
        return self.read([os.path.abspath(path)], file_stamp(info), decoding, decode, size=lambda: read_size(path))

    def read(
        self, source: list, stamp: list, decoding: str, decode: Callable[[], torch.Tensor], size=None
    ) -> torch.Tensor:
        """``decode()`` (an image [C, H, W] when ``decoding`` starts with ``image``, else a mask [H, W]) through
        the cache: ``source`` names what is decoded (JSON-able), ``stamp`` changes when it changes; ``size``, when
        given, returns the (H, W) the source's header says, which a served entry must have."""
        image = decoding.startswith("image")
        layout = ("hwc" if self.channels_last else "chw") if image else None
        name = hashlib.sha256(json.dumps([source, decoding, layout]).encode()).hexdigest()
        entry = self.root / name[:2] / f"{name}.npy"
        key = {
            "source": source,
            "stamp": stamp,
            "decoding": decoding,
            "layout": layout,
            "version": DECODE_VERSION,
            "pil": PIL.__version__,
        }
        found = load_entry(entry, key)
        if found is not None and size is not None and entry_size(found[0], layout) != _header_size(size):
            found = None  # an entry of another shape than its file: decoded again, and the entry written anew
        if found is not None:
            pixels, said = found
            for message in said:
                warnings.warn(message, DataWarning, stacklevel=3)
            tensor = torch.from_numpy(pixels)
            return tensor.permute(2, 0, 1) if layout == "hwc" else tensor
        caught: list = []
        try:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always", DataWarning)
                tensor = decode()
        finally:  # given on as if never caught (a failed decoding's too), and kept for every later hit
            for w in caught:
                warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
        said = [str(w.message) for w in caught if issubclass(w.category, DataWarning)]
        if self.stopped is None:
            self.store(entry, key, (tensor.permute(1, 2, 0) if layout == "hwc" else tensor).numpy(), said)
        return tensor

    # -- writing ----------------------------------------------------------------------------------------
    def store(self, entry: Path, key: dict, pixels: np.ndarray, said: list[str]) -> None:
        """Write one entry atomically, within the budget; a full disk or an unwritable folder stops the adding."""
        trailer = TRAILER + json.dumps({"key": key, "warnings": said}).encode() + b"\n"
        size = pixels.nbytes + len(trailer) + 128  # 128: the .npy header
        if not self.room(size):
            return

        def write(f) -> None:
            np.lib.format.write_array(f, np.ascontiguousarray(pixels), allow_pickle=False)
            f.write(trailer)

        try:
            with self.lock:  # one write at a time in a process: its count of the folder stays right
                atomic_write(entry, write)
        except OSError as error:
            full = no_space(error) is not None
            self.stop("disk" if full else "unwritable", f"no space left on {self.root}" if full else f"{error}")
            return
        self.used = None if self.used is None else self.used + size
        self.added_since_count += 1

    def room(self, size: int) -> bool:
        """Whether ``size`` more bytes stay within the budget (counting the folder anew every RECOUNT_EVERY
        entries, and before refusing); past it, the adding stops."""
        if self.max_bytes is None:
            return True
        if self.used is None or self.added_since_count >= RECOUNT_EVERY or self.used + size > self.max_bytes:
            self.used, self.added_since_count = folder_bytes(self.root), 0
        if self.used + size <= self.max_bytes:
            return True
        self.stop(
            "budget",
            f"its entries take {self.used / 1e9:.2f} GB of the {self.max_bytes / 1e9:g} GB data.cache_max_gb allows",
        )
        return False

    def stop(self, reason: str, why: str) -> None:
        """Add no more entries in this process, and say so once for this cache (``reason``: budget, disk,
        unwritable); reads go on, and so does training."""
        self.stopped = reason
        try:
            os.close(os.open(self.root / f"{STOP_NOTE}{reason}-{self.token}", os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        except FileExistsError:
            return  # another worker of this cache said it
        except OSError:
            pass  # a full or read-only disk: say it from this process
        warnings.warn(
            f"data.cache: {self.root}: {why}; srforge adds no more decoded scans to the cache and reads the rest by "
            "decoding them (training goes on; cached scans are still read from the cache)",
            CacheWarning,
            stacklevel=4,
        )


def file_stamp(info: os.stat_result) -> list[int]:
    """What changes whenever a file's content may have: byte size, modification time, and the status change time
    and inode, which ``cp -p``, ``rsync -t``, ``tar x`` and an edit in place change even where they keep the size
    and restore the modification time."""
    return [info.st_size, info.st_mtime_ns, info.st_ctime_ns, info.st_ino]


def entry_size(pixels: np.ndarray, layout: str | None) -> tuple[int, int]:
    """(H, W) of an entry's array: [C, H, W] (chw), [H, W, C] (hwc) or a mask [H, W]."""
    shape = pixels.shape
    return tuple(shape[1:3]) if layout == "chw" else tuple(shape[:2])


def _header_size(size: Callable[[], tuple[int, int]]) -> tuple[int, int] | None:
    try:
        return tuple(size())
    except DataError:
        return None  # a header that cannot be read: no entry serves it, and decoding says why


def _open_regular(entry: Path):
    """``entry`` opened for reading when it is a regular file (no link followed, and a FIFO or device neither
    waited on nor read); None otherwise."""
    fd = os.open(entry, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0))
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        return None
    return os.fdopen(fd, "rb")


def load_entry(entry: Path, key: dict) -> tuple[np.ndarray, list[str]] | None:
    """(the entry's array mapped copy-on-write, the warnings its decoding gave) when ``entry`` is a whole regular
    file whose trailer holds ``key``; None when it is missing, not a regular file (a link, a FIFO), damaged, cut
    short, of another key, or over PIL's pixel limit."""
    try:
        f = _open_regular(entry)
        if f is None:
            return None
        with f:
            return _read_entry(f, key)
    except (OSError, ValueError, TypeError):  # missing, unreadable, a damaged header or trailer
        return None


def _read_entry(f, key: dict) -> tuple[np.ndarray, list[str]] | None:
    """:func:`load_entry` of the open file ``f``: the array is mapped from this file, not from its name."""
    version = np.lib.format.read_magic(f)
    if version not in ((1, 0), (2, 0)):
        return None
    read_header = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
    shape, fortran, dtype = read_header(f)
    offset = f.tell()
    if fortran or dtype not in ENTRY_DTYPES or len(shape) not in (2, 3):
        return None
    f.seek(offset + math.prod(shape) * dtype.itemsize)
    trailer = f.read(TRAILER_MAX)
    stored = json.loads(trailer[len(TRAILER) : -1]) if trailer.startswith(TRAILER) and trailer[-1:] == b"\n" else {}
    if not isinstance(stored, dict) or stored.get("key") != key:
        return None
    limit = Image.MAX_IMAGE_PIXELS
    height, width = shape[1:] if key.get("layout") == "chw" else shape[:2]
    if limit is not None and height * width > limit:
        return None  # decoded again, so that PIL refuses it as a decompression bomb
    pixels = np.memmap(f, dtype=dtype, mode="c", offset=offset, shape=shape)
    return pixels, [str(m) for m in stored.get("warnings", [])]


def open_cache(cache, max_gb: float | None = None, channels_last: bool = False) -> DecodedCache | None:
    """``cache`` as a DecodedCache: a folder path (``data.cache``) with the budget ``max_gb`` and the image layout
    of ``channels_last``, a DecodedCache as it is, or None (no cache)."""
    if cache is None or isinstance(cache, DecodedCache):
        return cache
    return DecodedCache(cache, max_gb, channels_last)


def cached_image(cache: DecodedCache | None, path, mode: str = "RGB") -> torch.Tensor:
    """:func:`srforge.data.images.read_image` of ``path``, through ``cache`` when there is one."""
    return read_image(path, mode) if cache is None else cache.read_image(path, mode)


def cached_mask(cache: DecodedCache | None, path) -> torch.Tensor:
    """:func:`srforge.data.images.read_mask` of ``path``, through ``cache`` when there is one."""
    return read_mask(path) if cache is None else cache.read_mask(path)
