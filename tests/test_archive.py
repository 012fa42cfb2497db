"""ScanArchive: folders, zips and tars read in place; unsafe and clashing members refused, never opened."""

import hashlib
import io
import os
import tarfile
import tracemalloc
import zipfile
import zlib
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import same
from PIL import Image

from srforge.data.archive import ScanArchive, needed_bytes
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
    from srforge.predict.outputs import output_paths

    archive = ScanArchive(
        _zip(tmp_path / "v.zip", {"scan.v1.png": _png(_rgb(4, 4)), "scan.v2.png": _png(_rgb(4, 4, 1))})
    )
    assert archive.names == ["scan.v1.png", "scan.v2.png"] and not archive.rejected
    masks = {output_paths(tmp_path, name)["mask"] for name in archive.names}
    assert masks == {tmp_path / "masks" / "scan.v1.png", tmp_path / "masks" / "scan.v2.png"}


def _zip_deflated(path: Path, members: dict[str, bytes]) -> Path:
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        for name, data in members.items():
            zf.writestr(name, data)
    return path


def _png_with_chunk_before_pixels(array: np.ndarray, chunk_bytes: int) -> bytes:
    """A PNG whose pixel data (IDAT) sits after an ancillary chunk of ``chunk_bytes`` zeros."""
    png = _png(array)
    ihdr_end = 8 + 8 + 13 + 4  # signature, IHDR length+type, IHDR data, CRC
    kind, body = b"zeRo", bytes(chunk_bytes)
    chunk = len(body).to_bytes(4, "big") + kind + body + zlib.crc32(kind + body).to_bytes(4, "big")
    return png[:ihdr_end] + chunk + png[ihdr_end:]


@pytest.mark.parametrize("kind", ["zip", "tar.gz"])
def test_a_member_padded_with_zeros_is_read_only_as_far_as_its_header_allows(tmp_path, kind):
    image = _rgb(5, 9)
    bomb = _png(image) + bytes(32 << 20)  # a 45-pixel scan followed by 32 MB of zeros
    members = {"bomb.png": bomb, "z.png": GOOD["a.png"]}
    path = _zip_deflated(tmp_path / "b.zip", members) if kind == "zip" else _tar(tmp_path / "b.tar.gz", members, "w:gz")
    assert path.stat().st_size < 200_000
    with ScanArchive(path) as archive:
        tracemalloc.start()
        try:
            data = archive.read_bytes(range(len(archive)))
            decoded = archive.read(0, "RGB", data[0])
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        assert peak < 12 << 20, f"peak {peak:,} bytes for a 32 MB member"
        assert len(data[0]) == needed_bytes(5, 9, "RGB") < len(bomb)
        assert same(decoded, torch.from_numpy(image).permute(2, 0, 1).contiguous())
        assert data[1] == GOOD["a.png"] and same(archive.read(1), read_image(io.BytesIO(GOOD["a.png"])))


def test_a_member_whose_pixels_lie_beyond_the_bound_fails_saying_why(tmp_path):
    padded = _png_with_chunk_before_pixels(_rgb(5, 9), 6 << 20)
    assert same(read_image(io.BytesIO(padded)), read_image(io.BytesIO(_png(_rgb(5, 9)))))  # a valid PNG
    with ScanArchive(_zip_deflated(tmp_path / "p.zip", {"padded.png": padded})) as archive:
        with pytest.raises(DataError, match=r"p\.zip:padded\.png: the member is longer than an image of its declared"):
            archive.read(0)


def test_needed_bytes_follows_the_declared_size_and_mode():
    assert needed_bytes(10, 20, "RGB") - needed_bytes(10, 20, "L") == 4 * 10 * 20 * 2
    assert needed_bytes(10, 20, "I;16") == needed_bytes(10, 20, "LA")  # 2 bytes a pixel, either way
    assert needed_bytes(0, 0, "RGB") == needed_bytes(0, 0, "weird") > 0


@pytest.mark.parametrize("kind", ["zip", "tar.gz", "tar"])
def test_a_truncated_archive_is_called_damaged_not_unknown(kind, tmp_path):
    import io
    import tarfile
    import zipfile

    from srforge.data.archive import archive_kind

    path = tmp_path / f"scans.{kind}"
    payload = np.random.default_rng(0).integers(0, 256, 4096, dtype=np.uint8).tobytes()
    if kind == "zip":
        with zipfile.ZipFile(path, "w") as zf:
            zf.writestr("a.png", payload)
    else:
        with tarfile.open(path, "w:gz" if kind == "tar.gz" else "w") as tf:
            info = tarfile.TarInfo("a.png")
            info.size = len(payload)
            tf.addfile(info, io.BytesIO(payload))
    data = path.read_bytes()
    path.write_bytes(data[: 300 if kind != "tar.gz" else 20])
    with pytest.raises(ValueError, match=r"starts as a .*(zip|tar).* truncated or damaged"):
        archive_kind(path)
