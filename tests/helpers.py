"""Helpers shared by the tests: deep comparison, tiny images and masks written to disk, a subprocess run once more
after a native abort."""

import shutil
import subprocess
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import torch
from PIL import Image


@contextmanager
def torch_threads(count: int) -> Iterator[None]:
    """Torch's intra-op threads set to ``count`` inside the block, restored after."""
    before = torch.get_num_threads()
    torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def same(a, b) -> bool:
    """Deep equality that compares tensors by dtype, shape and values, and Entries by batch state too."""
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return (
            isinstance(a, torch.Tensor)
            and isinstance(b, torch.Tensor)
            and a.dtype == b.dtype
            and a.shape == b.shape
            and bool(torch.equal(a, b))
        )
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return isinstance(a, np.ndarray) and isinstance(b, np.ndarray) and a.dtype == b.dtype and np.array_equal(a, b)
    if isinstance(a, Mapping):
        if type(a) is not type(b) or list(a.keys()) != list(b.keys()):
            return False
        if getattr(a, "is_batched", None) != getattr(b, "is_batched", None):
            return False
        return all(same(a[k], b[k]) for k in a.keys())
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    return type(a) is type(b) and a == b


def write(path: Path, array: np.ndarray, mode: str | None = None, palette: list[int] | None = None) -> Path:
    """Save an array as an image file (format from the suffix), creating folders; returns the path."""
    path.parent.mkdir(parents=True, exist_ok=True)
    image = Image.fromarray(array, mode) if mode else Image.fromarray(array)
    if palette is not None:
        image.putpalette(palette)
    image.save(path)
    return path


def rgb(h: int, w: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (h, w, 3), dtype=np.uint8)


def labels(h: int, w: int, classes: int = 3, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, classes, (h, w), dtype=np.uint8)


def scan_folder(root: Path, n: int = 8) -> Path:
    """``n`` image/mask pairs of 18-22 x 24-59 px under ``root`` (deep enough for model.depth's default check)."""
    for i in range(n):
        h, w = 18 + i % 5, 24 + 5 * i
        write(root / "images" / f"s{i}.png", rgb(h, w, i))
        write(root / "masks" / f"s{i}.png", labels(h, w, 2, i))
    return root


def odd_scans(folder: Path) -> dict[str, tuple[int, int]]:
    """Three RGB scans of sizes that are no multiple of 4, as PNG; {name: (H, W)}."""
    sizes = {"a": (19, 30), "b": (22, 41), "c": (13, 9)}
    for i, (name, (h, w)) in enumerate(sizes.items()):
        write(folder / f"{name}.png", rgb(h, w, i))
    return sizes


def stepping_trainer(run_dir: Path, dataset: str, *, num_classes: int = 2, fields=None, **train):
    """A Trainer over a tiny test Dataset (``dataset``: its import path) whose optimizer is SGD(lr=1) at a constant
    rate and no gradient clipping, so that one update's weights are the start less its gradient: for tests that
    drive :meth:`Trainer.run_step` over batches of their own."""
    from srforge.config import resolve
    from srforge.runtime.distributed import environment
    from srforge.train import Trainer

    cfg = resolve(
        {
            "run": {"dir": str(run_dir), "seed": 0},
            "data": {
                "dataset": {"class": dataset, "args": {}},
                "batch_size": 3,
                **({"fields": fields} if fields else {}),
            },
            "model": {"base_channels": 4, "depth": 2, "num_classes": num_classes},
            "train": {"grad_clip": None, **train},
        }
    )
    Path(run_dir).mkdir(parents=True, exist_ok=True)
    from srforge.runtime.device_memory import StepMemory
    from srforge.train import pixel_budget

    real = pixel_budget.probe_memory
    pixel_budget.probe_memory = lambda *args, **kw: StepMemory(500.0, 0.0, "cpu", "fp32")
    try:  # the probe is tested on its own (tests/test_pixel_budget.py): these trainers only step
        trainer = Trainer.from_config(cfg, environment(), Path(run_dir))
    finally:
        pixel_budget.probe_memory = real
    trainer.optimizer = torch.optim.SGD(trainer.model.parameters(), lr=1.0)
    trainer.scheduler = torch.optim.lr_scheduler.LambdaLR(trainer.optimizer, lambda s: 1.0)
    return trainer


def run_pass(trainer, batches) -> None:
    """Every optimizer update of ``trainer`` over ``batches`` (collated), as an epoch's training pass runs them."""
    it = iter(batches)
    while trainer.run_step(it):
        pass


# A native abort seen about once in 20 runs on a loaded 2-core machine, in a process whose Python code raised
# nothing (torch's C++ side, during gloo's start or teardown): such a run is started once more, and said.
NATIVE_ABORT = "terminate called without an active exception"


def run_once_more_after_native_abort(
    command: list[str], fresh: tuple[Path, ...], **kwargs
) -> subprocess.CompletedProcess:
    """``command`` run to its end (``kwargs`` to subprocess.run; by default stdout and stderr captured as text, 300 s
    at most), and run once more, with the folders ``fresh`` removed first, when it died of :data:`NATIVE_ABORT` with
    no Python error before it: the torchrun tests' guard against that abort."""
    kwargs = {"capture_output": True, "text": True, "timeout": 300, **kwargs}
    done = subprocess.run(command, **kwargs)
    if (
        done.returncode != 0
        and NATIVE_ABORT in done.stderr
        and "Traceback (most recent call last)" not in (done.stderr.split(NATIVE_ABORT)[0])
    ):
        print(f"a native abort ({NATIVE_ABORT}); running once more. Its stderr:\n{done.stderr[-4000:]}")
        for folder in fresh:
            shutil.rmtree(folder, ignore_errors=True)
        done = subprocess.run(command, **kwargs)
    return done
