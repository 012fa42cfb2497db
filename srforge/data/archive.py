"""ScanArchive: the scans of a folder (recursive), a .zip, or a .tar / .tar.gz, read in place.

Nothing is extracted and nothing is written: sizes come from each member's header (PIL opens lazily),
pixels from the member's bytes. Every member is checked before it is listed, and a member that could
lead a reader outside the archive -- an absolute path, a ``..`` component, a symlink, a hardlink, a
device or FIFO -- is never opened: it goes to ``rejected`` with the reason. So does a member whose name
without its suffix repeats an earlier one (``a.png`` and ``a.jpg`` would both predict into ``a.png``),
and a file that is not an image by its suffix. Hidden files and folders (``.name``) are passed over,
as SegmentationFolder does.

A .tar.gz has no random access: reading a member means decompressing everything before it. Callers
that read many members take them through :meth:`ScanArchive.read_bytes` in archive order.

A member is read with a bound, never whole on trust: a small image followed by 600 MB of zeros deflates to
well under a megabyte. Its header (read from the first bytes) declares the image's size and mode, and no
more than :func:`needed_bytes` of it are read: ``NEED_FACTOR`` times the decoded size plus ``NEED_ALLOWANCE``
for metadata and compression overhead. An image decodes from that prefix (trailing bytes are ignored); one
whose data lies beyond it fails as that scan, saying so.

With a decoded-scan cache (``cache``, :mod:`srforge.data.cache`) :meth:`ScanArchive.read` decodes each scan once: a
member is keyed by the archive's path, byte size and modification time and the member's name.
"""

from __future__ import annotations

import contextlib
import functools
import io
import os
import stat
import tarfile
import zipfile
import zlib
from collections.abc import Iterable
from pathlib import Path, PurePosixPath

import torch
from PIL import Image, ImageMode

from srforge.data.cache import DecodedCache, cached_image, file_stamp
from srforge.data.images import SUFFIXES, DataError, open_image, read_image, read_size
from srforge.data.naming import is_hidden, posix_name, scan_stem

ARCHIVE_KINDS = "a folder, a .zip, or a .tar / .tar.gz / .tgz / .tar.bz2 / .tar.xz"

# How much of a member may be read per decoded byte its header declares, plus a fixed allowance: generous
# for every format srforge reads (LZW-compressed noise grows 1.5x; a 16-bit RGB PNG opens as 8-bit RGB).
NEED_FACTOR = 4
NEED_ALLOWANCE = 4 << 20
# The header is looked for in the first HEADER_FIRST bytes, then in twice as many, up to HEADER_LAST (no
# image needs less than that); past it (a TIFF may keep its header at the end, a PNG big metadata before
# its pixels) the header is read in a second pass over the member that keeps no bytes.
HEADER_FIRST = 1 << 16
HEADER_LAST = NEED_ALLOWANCE
READ_CHUNK = 1 << 20


def needed_bytes(height: int, width: int, mode: str) -> int:
    """The most bytes an encoded image of this size and PIL mode may take: NEED_FACTOR x its decoded
    size (bands x bytes per sample per pixel) + NEED_ALLOWANCE."""
    try:
        layout = ImageMode.getmode(mode)
        per_pixel = len(layout.bands) * int(layout.typestr[-1])
    except (KeyError, ValueError):  # a mode PIL has no layout for: assume the widest, 4 bands of 4 bytes
        per_pixel = 16
    return NEED_FACTOR * height * width * per_pixel + NEED_ALLOWANCE


def _header_need(source, label: str) -> int | DataError | None:
    """needed_bytes from the header in ``source`` (a binary file); None when no header can be read from it,
    the DataError when the header declares a decompression bomb."""
    try:
        with open_image(source, label) as image:
            width, height = image.size
            return needed_bytes(height, width, image.mode)
    except DataError as error:
        if isinstance(error.__cause__, (Image.DecompressionBombError, Image.DecompressionBombWarning)):
            return error
        return None


def unsafe_name(name: str) -> str | None:
    """Why a name from a file srforge did not write (an archive member, an export's image) must not be used as a
    relative path under a folder (None when it is safe): absolute, with a '..' part, or with an empty part."""
    parts = posix_name(name).split("/")
    if name.startswith(("/", "\\")) or (len(name) > 1 and name[1] == ":"):
        return "absolute path"
    if ".." in parts:
        return "'..' component"
    if not name or any(not p for p in parts[:-1]):
        return "empty path component"
    return None


# What reading a damaged, encrypted or oddly compressed member can raise, besides DataError: zipfile raises
# RuntimeError for encrypted members and NotImplementedError for unknown compression, gzip EOFError.
_MEMBER_ERRORS = (OSError, EOFError, RuntimeError, NotImplementedError, zipfile.BadZipFile, tarfile.TarError)


def archive_kind(path: Path) -> str:
    """'folder', 'zip' or 'tar'; ValueError saying what is accepted otherwise."""
    if path.is_dir():
        return "folder"
    if not path.exists():
        raise FileNotFoundError(f"input not found: {path} (expected {ARCHIVE_KINDS})")
    if zipfile.is_zipfile(path):
        return "zip"
    if _is_tar(path):
        return "tar"
    damaged = _damaged_archive(path)
    if damaged:
        raise ValueError(
            f"{path} starts as a {damaged} but cannot be read as one: it is truncated or damaged; copy it again"
        )
    raise ValueError(f"{path} is neither a folder, a zip nor a tar archive (expected {ARCHIVE_KINDS})")


def _is_tar(path: Path) -> bool:
    try:
        return tarfile.is_tarfile(path)
    except (EOFError, OSError, tarfile.TarError):  # a gzip stream cut short raises instead of answering
        return False


# The first bytes of the archive formats srforge reads: a file that starts so but does not open is damaged.
_MAGIC = {b"PK\x03\x04": "zip archive", b"PK\x05\x06": "zip archive", b"\x1f\x8b": "gzip-compressed tar archive"}


def _damaged_archive(path: Path) -> str | None:
    """The kind of archive ``path`` starts as (by its first bytes, or a tar header at byte 257), if any."""
    try:
        with open(path, "rb") as f:
            head = f.read(265)
    except OSError:
        return None
    for magic, kind in _MAGIC.items():
        if head.startswith(magic):
            return kind
    return "tar archive" if head[257:262] == b"ustar" else None


class ScanArchive:
    """The scans under ``path`` (folder, .zip or .tar[.gz]), read-only.

    ``names[i]`` is scan i's relative posix path (``a/b.jpg``), sorted; ``rejected`` lists
    ``(name, reason)`` for members refused (see the module docstring). ``exclude`` is a folder to leave
    out of a folder walk (a prediction output folder inside the input). Use as a context manager.

    ``size(i)`` -> (H, W) from the header; ``read(i, mode)`` -> uint8 [C, H, W] in PIL ``mode``;
    ``read_bytes(indices)`` -> {i: bytes} in archive order; ``in_archive_order(indices)`` sorts indices
    so (a .tar.gz is cheap to read only that way). Each raises DataError naming the member. ``cache``: a
    :class:`srforge.data.cache.DecodedCache` that ``read`` goes through, or None.
    """

    def __init__(self, path, exclude=None, cache: DecodedCache | None = None):
        self.path = Path(path)
        self.kind = archive_kind(self.path)
        self.cache = cache
        self.sequential = False  # a compressed tar: members are cheap to read only in archive order
        self.rejected: list[tuple[str, str]] = []
        self._handle = None
        self._cut: dict[int, int] = {}  # scan -> bytes read, for members longer than their header allows
        members: Iterable[tuple[str, object, str | None]]  # (name, key to read it, reason to refuse)
        try:
            if self.kind == "folder":
                members = sorted(
                    self._walk(Path(exclude).resolve() if exclude is not None else None), key=lambda m: m[0]
                )
            elif self.kind == "zip":
                self._handle = zipfile.ZipFile(self.path)
                members = [(info.filename, info, self._zip_problem(info)) for info in self._handle.infolist()]
            else:
                self._handle = tarfile.open(self.path, "r:*")
                self.sequential = not isinstance(self._handle.fileobj, io.BufferedReader)
                members = [(m.name, m, self._tar_problem(m)) for m in self._handle.getmembers()]
        except (*_MEMBER_ERRORS, zlib.error) as error:  # a damaged or truncated archive (gzip raises EOFError)
            self.close()
            raise DataError(
                f"{self.path}: cannot list the archive ({type(error).__name__}: {error}); it is damaged or truncated"
            ) from error
        self._index(members)

    # -- listing --------------------------------------------------------------------------------------
    def _walk(self, exclude: Path | None) -> Iterable[tuple[str, object, str | None]]:
        for top, dirs, files in os.walk(self.path):  # followlinks=False: a linked folder is not entered
            top_path = Path(top)
            for d in list(dirs):
                if (top_path / d).is_symlink():
                    dirs.remove(d)
                    yield (top_path / d).relative_to(self.path).as_posix(), None, "symlink (not followed)"
                elif exclude is not None and (top_path / d).resolve() == exclude:
                    dirs.remove(d)
            for f in files:
                full = top_path / f
                info = full.lstat()
                reason = None
                if stat.S_ISLNK(info.st_mode):
                    reason = "symlink (not followed)"
                elif not stat.S_ISREG(info.st_mode):
                    reason = "not a regular file (device, FIFO or socket)"
                yield full.relative_to(self.path).as_posix(), full, reason

    @staticmethod
    def _zip_problem(info: zipfile.ZipInfo) -> str | None:
        if info.is_dir():
            return "directory"
        kind = stat.S_IFMT(info.external_attr >> 16)
        if kind == stat.S_IFLNK:
            return "symlink (not followed)"
        if kind and kind != stat.S_IFREG:
            return "not a regular file (device, FIFO or socket)"
        return None

    @staticmethod
    def _tar_problem(member: tarfile.TarInfo) -> str | None:
        if member.isdir():
            return "directory"
        if member.issym():
            return f"symlink to {member.linkname!r} (not followed)"
        if member.islnk():
            return f"hardlink to {member.linkname!r} (not followed)"
        if not member.isfile():
            return "not a regular file (device, FIFO or socket)"
        return None

    def _index(self, members: Iterable[tuple[str, object, str | None]]) -> None:
        """Keep the safe image members (the first of a clashing pair in archive order), sorted by name;
        record the rest in ``rejected``."""
        kept: dict[str, tuple[str, object]] = {}  # output stem -> (name, key)
        for name, key, reason in members:
            reason = reason or unsafe_name(name)
            if reason == "directory":
                continue
            if reason is None and is_hidden(name):
                continue  # hidden, like SegmentationFolder
            suffix, stem = PurePosixPath(posix_name(name)).suffix, scan_stem(name)
            if reason is None and suffix.lower() not in SUFFIXES:
                reason = f"not a scan: suffix {suffix or '(none)'!r} is not one of {', '.join(SUFFIXES)}"
            if reason is None and stem in kept:
                reason = f"same output name as {kept[stem][0]!r} (both would write {stem}.png); rename one"
            if reason is not None:
                self.rejected.append((name, reason))
                continue
            kept[stem] = (name, key)
        ordered = sorted(kept.values(), key=lambda member: member[0])
        self.names = [name for name, _ in ordered]
        self._keys = [key for _, key in ordered]

    # -- reading --------------------------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self.names)

    def label(self, i: int) -> str:
        """Where scan i lives, for messages: the file path, or archive:member."""
        return str(self._keys[i]) if self.kind == "folder" else f"{self.path}:{self.names[i]}"

    def _stream(self, i: int):
        key = self._keys[i]
        if self.kind == "folder":
            return open(key, "rb")
        if self.kind == "zip":
            return self._handle.open(key)
        return self._handle.extractfile(key)

    def size(self, i: int) -> tuple[int, int]:
        """(H, W) of scan i from its header."""
        if self.kind == "folder":
            return read_size(self._keys[i])
        try:
            with self._stream(i) as stream:
                return read_size(stream, self.label(i))
        except _MEMBER_ERRORS as error:
            raise DataError(f"{self.label(i)}: cannot read the member ({type(error).__name__}: {error})") from error

    def in_archive_order(self, indices: Iterable[int]) -> list[int]:
        """``indices`` sorted by position in the archive: the order that reads a .tar.gz in one forward pass."""
        return sorted(indices, key=lambda i: self._keys[i].offset_data if self.kind == "tar" else i)

    def read_bytes(self, indices: Iterable[int]) -> dict[int, bytes | DataError]:
        """{i: the bytes of scan i, at most what its header allows (see the module docstring), or the DataError
        that reading it raised}, read in archive order."""
        out: dict[int, bytes | DataError] = {}
        for i in self.in_archive_order(indices):
            try:
                with self._stream(i) as stream:
                    out[i] = self._read_bounded(i, stream)
            except _MEMBER_ERRORS as error:
                out[i] = DataError(
                    f"{self.label(i)}: cannot read the member ({type(error).__name__}: {error}); "
                    "it is damaged, encrypted or compressed in a way zipfile/tarfile cannot read"
                )
        return out

    def _read_bounded(self, i: int, stream) -> bytes | DataError:
        """Scan i's bytes from ``stream``, forward only (a .tar.gz member cannot be re-read cheaply): the first
        bytes until the header reads, then up to needed_bytes; records in ``_cut`` a member longer than that."""
        buffer = bytearray()
        need: int | None = None
        look_at = HEADER_FIRST
        while True:
            target = need if need is not None else look_at
            if len(buffer) >= target:
                if need is not None:
                    if stream.read(1):
                        self._cut[i] = len(buffer)
                    return bytes(buffer)
                found = _header_need(io.BytesIO(buffer), self.label(i))
                if isinstance(found, DataError):
                    return found
                if found is None and look_at >= HEADER_LAST:
                    with self._stream(i) as second:  # a header far in: PIL seeks to it without keeping the bytes
                        found = _header_need(second, self.label(i))
                    if not isinstance(found, int):
                        return found or DataError(
                            f"{self.label(i)}: cannot read as an image (no image header in its first "
                            f"{HEADER_LAST:,} bytes, nor anywhere PIL looks)"
                        )
                if found is None:
                    look_at *= 2
                else:
                    need = max(found, len(buffer))
                continue
            piece = stream.read(min(target - len(buffer), READ_CHUNK))
            if not piece:
                return bytes(buffer)
            buffer += piece

    def read(self, i: int, mode: str = "RGB", data: bytes | DataError | None = None) -> torch.Tensor:
        """Scan i decoded to uint8 [C, H, W] in PIL ``mode``; ``data`` are its bytes when already read."""
        if self.kind == "folder":
            return cached_image(self.cache, self._keys[i], mode)
        if self.cache is None:
            return self.decode_member(i, mode, data)
        source = [str(self.path.absolute()), self.names[i]]
        decode = functools.partial(self.decode_member, i, mode, data)
        return self.cache.read(source, file_stamp(self.path.stat()), f"image:{mode}", decode)

    def decode_member(self, i: int, mode: str = "RGB", data: bytes | DataError | None = None) -> torch.Tensor:
        """Member i (of a zip or tar) decoded, not through the cache; ``data`` are its bytes when already read."""
        data = self.read_bytes([i])[i] if data is None else data
        if isinstance(data, DataError):
            raise data
        try:
            return read_image(io.BytesIO(data), mode, label=self.label(i))
        except DataError as error:
            if i not in self._cut:
                raise
            raise DataError(
                f"{self.label(i)}: the member is longer than an image of its declared size can need, so only its "
                f"first {self._cut[i]:,} bytes were read (srforge.data.archive.needed_bytes), and they do not "
                f"decode: {error}"
            ) from error

    def close(self) -> None:
        if self._handle is not None:
            with contextlib.suppress(Exception):
                self._handle.close()

    def __enter__(self) -> ScanArchive:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
