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
