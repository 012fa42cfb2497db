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
"""

from __future__ import annotations

import contextlib
import io
import os
import stat
import tarfile
import zipfile
import zlib
from collections.abc import Iterable
from pathlib import Path, PurePosixPath

import torch

from srforge.data.images import SUFFIXES, DataError, read_image, read_size
from srforge.data.naming import is_hidden, posix_name, scan_stem

ARCHIVE_KINDS = "a folder, a .zip, or a .tar / .tar.gz / .tgz / .tar.bz2 / .tar.xz"


def _unsafe(name: str) -> str | None:
    """Why a member name must not be used as a relative path (None when it is safe)."""
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
    if tarfile.is_tarfile(path):
        return "tar"
    raise ValueError(f"{path} is neither a folder, a zip nor a tar archive (expected {ARCHIVE_KINDS})")


class ScanArchive:
    """The scans under ``path`` (folder, .zip or .tar[.gz]), read-only.

    ``names[i]`` is scan i's relative posix path (``a/b.jpg``), sorted; ``rejected`` lists
    ``(name, reason)`` for members refused (see the module docstring). ``exclude`` is a folder to leave
    out of a folder walk (a prediction output folder inside the input). Use as a context manager.

    ``size(i)`` -> (H, W) from the header; ``read(i, mode)`` -> uint8 [C, H, W] in PIL ``mode``;
    ``read_bytes(indices)`` -> {i: bytes} in archive order; ``in_archive_order(indices)`` sorts indices
    so (a .tar.gz is cheap to read only that way). Each raises DataError naming the member.
    """

    def __init__(self, path, exclude=None):
        self.path = Path(path)
        self.kind = archive_kind(self.path)
        self.sequential = False  # a compressed tar: members are cheap to read only in archive order
        self.rejected: list[tuple[str, str]] = []
        self._handle = None
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
            reason = reason or _unsafe(name)
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

    def read_bytes(self, indices: Iterable[int]) -> dict[int, bytes]:
        """{i: the raw bytes of scan i}, read in archive order."""
        out = {}
        for i in self.in_archive_order(indices):
            try:
                with self._stream(i) as stream:
                    out[i] = stream.read()
            except _MEMBER_ERRORS as error:
                out[i] = DataError(
                    f"{self.label(i)}: cannot read the member ({type(error).__name__}: {error}); "
                    "it is damaged, encrypted or compressed in a way zipfile/tarfile cannot read"
                )
        return out

    def read(self, i: int, mode: str = "RGB", data: bytes | DataError | None = None) -> torch.Tensor:
        """Scan i decoded to uint8 [C, H, W] in PIL ``mode``; ``data`` are its bytes when already read."""
        if self.kind == "folder":
            return read_image(self._keys[i], mode)
        data = self.read_bytes([i])[i] if data is None else data
        if isinstance(data, DataError):
            raise data
        return read_image(io.BytesIO(data), mode, label=self.label(i))

    def close(self) -> None:
        if self._handle is not None:
            with contextlib.suppress(Exception):
                self._handle.close()

    def __enter__(self) -> ScanArchive:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
