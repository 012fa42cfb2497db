"""Atomic writes (srforge.atomic): a failed cleanup never hides the error that stopped the write."""

import errno
from pathlib import Path

import pytest

from srforge.atomic import atomic_write


def test_a_failed_cleanup_never_hides_the_error_that_stopped_the_write(tmp_path, monkeypatch):
    def unlink(self, missing_ok=False):
        raise OSError(errno.EROFS, "Read-only file system", str(self))

    def write(f):
        raise RuntimeError("the real error")

    monkeypatch.setattr(Path, "unlink", unlink)
    with pytest.raises(RuntimeError, match="the real error") as caught:
        atomic_write(tmp_path / "x.bin", write)
    assert not isinstance(caught.value.__context__, OSError)


def test_a_link_planted_at_a_temporary_name_is_never_written_through(tmp_path, monkeypatch):
    """Whoever can write into a shared folder can plant links at the names srforge's temporary files take; the
    write creates its file exclusively, so it draws another name and the link's target is left as it was."""
    import os

    import srforge.atomic as atomic

    victim = tmp_path / "victim.txt"
    victim.write_text("mine")
    target = tmp_path / "shared" / "entry.npy"
    target.parent.mkdir()
    tokens = iter(["aaaaaaaaaaaa", "bbbbbbbbbbbb"])
    monkeypatch.setattr(atomic.secrets, "token_hex", lambda n: next(tokens))
    planted = [f".entry.npy.{os.getpid()}.srforge-tmp", ".entry.npy.aaaaaaaaaaaa.srforge-tmp"]  # the old name too
    for name in planted:
        (target.parent / name).symlink_to(victim)
    atomic_write(target, lambda f: f.write(b"\x93NUMPY..."))
    assert victim.read_text() == "mine" and target.read_bytes() == b"\x93NUMPY..."
    assert all((target.parent / name).is_symlink() for name in planted)


def test_a_target_name_at_the_file_systems_limit_gets_a_temporary_name_that_fits(tmp_path):
    target = tmp_path / ("x" * 251 + ".png")  # 255 bytes
    atomic_write(target, lambda f: f.write(b"png"))
    assert target.read_bytes() == b"png" and sorted(p.name for p in tmp_path.iterdir()) == [target.name]
