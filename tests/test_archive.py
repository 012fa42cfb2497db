"""ScanArchive: folders, zips and tars read in place; unsafe and clashing members refused, never opened."""

import hashlib
import io
import os
import tarfile
import zipfile
from pathlib import Path

import numpy as np
import pytest
from helpers import same
from PIL import Image

from srforge.data.archive import ScanArchive
from srforge.data.images import DataError, read_image


def _png(array: np.ndarray, mode: str | None = None, fmt: str = "PNG") -> bytes:
    buffer = io.BytesIO()
    (Image.fromarray(array, mode) if mode else Image.fromarray(array)).save(buffer, format=fmt)
    return buffer.getvalue()


def _rgb(h, w, seed=0):
    return np.random.default_rng(seed).integers(0, 256, (h, w, 3), dtype=np.uint8)


GOOD = {
    "a.png": _png(_rgb(5, 9)),
    "sub/b.jpg": _png(_rgb(7, 4, 1), fmt="JPEG"),
    "deep16.png": _png(np.arange(60, dtype=np.uint16).reshape(6, 10) * 1000),
}


def _zip(path: Path, members: dict[str, bytes], symlinks: dict[str, str] = {}) -> Path:
    with zipfile.ZipFile(path, "w") as zf:
        for name, data in members.items():
            zf.writestr(name, data)
        for name, target in symlinks.items():
            info = zipfile.ZipInfo(name)
            info.external_attr = 0o120777 << 16  # S_IFLNK: how zip stores a symlink
            zf.writestr(info, target)
    return path


def _tar(path: Path, members: dict[str, bytes], mode="w", links: dict[str, tuple[bytes, str]] = {}) -> Path:
    with tarfile.open(path, mode) as tf:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
        for name, (kind, target) in links.items():
            info = tarfile.TarInfo(name)
            info.type, info.linkname = kind, target
            tf.addfile(info)
    return path


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.mark.parametrize("kind", ["zip", "tar", "tar.gz"])
def test_archive_members_decode_like_read_image_and_are_never_written(tmp_path, kind):
    folder = tmp_path / "scans"
    for name, data in GOOD.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_bytes(data)
    path = tmp_path / f"scans.{kind}"
    _zip(path, GOOD) if kind == "zip" else _tar(path, GOOD, "w:gz" if kind == "tar.gz" else "w")
    before, mtime = _digest(path), path.stat().st_mtime_ns
    with ScanArchive(path) as archive, ScanArchive(folder) as plain:
        assert archive.names == plain.names == sorted(GOOD)
        assert archive.sequential == (kind == "tar.gz") and not plain.rejected and not archive.rejected
        for i, name in enumerate(archive.names):
            for mode in ("RGB", "L"):
                expected = read_image(folder / name, mode)
                assert same(archive.read(i, mode), expected) and same(plain.read(i, mode), expected)
            assert archive.size(i) == plain.size(i) == tuple(expected.shape[1:])
        chunk = archive.read_bytes(range(len(archive)))
        assert chunk == {i: GOOD[n] for i, n in enumerate(archive.names)}
    assert _digest(path) == before and path.stat().st_mtime_ns == mtime
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["scans", f"scans.{kind}"])  # nothing extracted


def test_unsafe_and_clashing_members_are_rejected_with_reasons(tmp_path):
    members = {
        **GOOD,
        "../escape.png": GOOD["a.png"],
        "/abs.png": GOOD["a.png"],
        "a.jpg": GOOD["a.png"],
        "notes.txt": b"hello",
        ".hidden/c.png": GOOD["a.png"],
    }
    zipped = _zip(tmp_path / "x.zip", members, symlinks={"link.png": "/etc/passwd"})
    tarred = _tar(
        tmp_path / "x.tar",
        members,
        links={
            "link.png": (tarfile.SYMTYPE, "/etc/passwd"),
            "hard.png": (tarfile.LNKTYPE, "a.png"),
            "dev.png": (tarfile.CHRTYPE, ""),
        },
    )
    for path in (zipped, tarred):
        with ScanArchive(path) as archive:
            assert archive.names == sorted(GOOD)
            reasons = dict(archive.rejected)
            assert "'..' component" in reasons["../escape.png"]
            assert "absolute path" in reasons["/abs.png"]
            assert "same output name as 'a.png'" in reasons["a.jpg"]
            assert "not a scan" in reasons["notes.txt"] and ".hidden/c.png" not in reasons
            assert "symlink" in reasons["link.png"]
    assert "hardlink" in dict(ScanArchive(tarred).rejected)["hard.png"]
    assert "device" in dict(ScanArchive(tarred).rejected)["dev.png"]


def test_folder_symlinks_are_not_followed_and_output_folder_is_left_out(tmp_path):
    outside = tmp_path / "secret.png"
    outside.write_bytes(GOOD["a.png"])
    folder = tmp_path / "scans"
    (folder / "linked").mkdir(parents=True)
    (folder / "a.png").write_bytes(GOOD["a.png"])
    (folder / "out" / "masks").mkdir(parents=True)
    (folder / "out" / "masks" / "a.png").write_bytes(GOOD["a.png"])
    os.symlink(outside, folder / "link.png")
    os.symlink(tmp_path, folder / "linked" / "up")
    archive = ScanArchive(folder, exclude=folder / "out")
    assert archive.names == ["a.png"]
    assert dict(archive.rejected) == {"link.png": "symlink (not followed)", "linked/up": "symlink (not followed)"}


def test_bad_members_raise_data_errors_that_name_them(tmp_path):
    whole = GOOD["a.png"]
    members = {"empty.png": b"", "text.png": b"not an image at all", "cut.png": whole[: len(whole) // 2]}
    with ScanArchive(_zip(tmp_path / "bad.zip", members)) as archive:
        assert archive.names == ["cut.png", "empty.png", "text.png"]
        assert archive.size(0) == (5, 9)  # a truncated file still has its header ...
        for i, name in enumerate(archive.names):
            with pytest.raises(DataError, match=rf"bad\.zip:{name}: cannot (decode|read)") as error:
                archive.read(i)  # ... but no scan decodes
            assert "/proc/self/fd" not in str(error.value)
            if name != "cut.png":
                with pytest.raises(DataError, match=rf"bad\.zip:{name}: cannot read as an image"):
                    archive.size(i)


def test_missing_input_and_non_archives_are_clear_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="input not found"):
        ScanArchive(tmp_path / "nope.zip")
    (tmp_path / "plain.txt").write_text("x")
    with pytest.raises(ValueError, match="neither a folder, a zip nor a tar"):
        ScanArchive(tmp_path / "plain.txt")


def test_a_truncated_tar_gz_is_a_data_error_naming_it(tmp_path):
    whole = _tar(tmp_path / "whole.tar.gz", {f"s{i}.png": _png(_rgb(40, 40, i)) for i in range(6)}, mode="w:gz")
    cut = tmp_path / "cut.tar.gz"
    cut.write_bytes(whole.read_bytes()[: whole.stat().st_size // 2])
    with pytest.raises(DataError, match=r"cut.tar.gz: cannot list the archive .*damaged or truncated"):
        ScanArchive(cut)


def test_dots_inside_a_stem_keep_scans_apart(tmp_path):
    from srforge.engine.predictor import output_paths

    archive = ScanArchive(
        _zip(tmp_path / "v.zip", {"scan.v1.png": _png(_rgb(4, 4)), "scan.v2.png": _png(_rgb(4, 4, 1))})
    )
    assert archive.names == ["scan.v1.png", "scan.v2.png"] and not archive.rejected
    masks = {output_paths(tmp_path, name)["mask"] for name in archive.names}
    assert masks == {tmp_path / "masks" / "scan.v1.png", tmp_path / "masks" / "scan.v2.png"}
