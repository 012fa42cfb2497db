"""Inputs for the prediction tests: a random-weight checkpoint (no training needed) and tiny scan archives."""

import io
import tarfile
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import torch_threads
from PIL import Image

from srforge.models import UNet
from srforge.runtime.checkpoint import save_checkpoint


def random_checkpoint(path: Path, class_names=("paper", "ink", "margin"), seed: int = 0, **extra) -> Path:
    """A checkpoint of a random 3-class UNet (base 4, depth 2: divisor 4), written to ``path``."""
    torch.manual_seed(seed)
    args = {"in_channels": 3, "num_classes": 3, "base_channels": 4, "depth": 2}
    model = UNet(**args)
    payload = {
        "model": model.state_dict(),
        "model_args": args,
        "size_divisor": model.size_divisor,
        "class_names": list(class_names),
        "ignore_index": 255,
        "config": {},
    }
    return save_checkpoint({**payload, **extra}, path)


def png(array: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(array).save(buffer, format="PNG")
    return buffer.getvalue()


def scan(i: int, h: int | None = None, w: int | None = None) -> np.ndarray:
    """Random RGB noise uint8 [H, W, 3] of a size that is rarely a multiple of 4."""
    rng = np.random.default_rng(i)
    return rng.integers(0, 256, (h or 9 + i % 7, w or 15 + 5 * (i % 9), 3), dtype=np.uint8)


def members(n: int, **size) -> dict[str, bytes]:
    return {f"{'sub/' if i % 3 == 0 else ''}scan_{i:03d}.png": png(scan(i, **size)) for i in range(n)}


def write_folder(root: Path, files: dict[str, bytes]) -> Path:
    for name, data in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(data)
    return root


def write_zip(path: Path, files: dict[str, bytes]) -> Path:
    with zipfile.ZipFile(path, "w") as zf:
        for name, data in files.items():
            zf.writestr(name, data)
    return path


def write_tar(path: Path, files: dict[str, bytes], links: dict[str, str] | None = None) -> Path:
    """A .tar (or .tar.gz by its name) of ``files``, plus symbolic-link members ``links`` (name -> target)."""
    with tarfile.open(path, "w:gz" if path.name.endswith(".gz") else "w") as tf:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
        for name, target in (links or {}).items():
            info = tarfile.TarInfo(name)
            info.type, info.linkname = tarfile.SYMTYPE, target
            tf.addfile(info)
    return path


@pytest.fixture(scope="module")
def one_thread():
    """Torch on one thread for a test module: on a small shared machine a second OpenMP thread waiting for a busy
    core made tiny convs many times slower. Use as ``pytestmark = pytest.mark.usefixtures("one_thread")``."""
    with torch_threads(1):
        yield


def output_files(out: Path) -> dict[str, bytes]:
    """Every output file under ``out`` but the reports, by relative path: masks, overlays, probabilities."""
    return {
        p.relative_to(out).as_posix(): p.read_bytes()
        for p in sorted(out.rglob("*"))
        if p.is_file() and not p.name.startswith("report.")
    }
