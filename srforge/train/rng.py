"""Random-number state of Python, numpy, torch's CPU and the current CUDA device, saved for exact resume.

Each training process draws on one GPU only (its own, under torchrun), so a checkpoint keeps the state of the
current CUDA device alone, and a resume gives that state back to the current device.

What a model draws in an update (dropout) comes from :func:`update_randomness` instead: a generator seeded by the
update alone, so that an update a Ctrl-C cut short and redid after --resume draws what the straight run drew.
"""

from __future__ import annotations

import contextlib
import random
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch

from srforge.data.crop import sample_seed


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def rng_state() -> dict[str, Any]:
    """Every generator's state as plain data that ``torch.load(weights_only=True)`` accepts."""
    # numpy's state holds an ndarray: stored as a tensor.
    kind, keys, pos, has_gauss, gauss = np.random.get_state()
    state = {
        "torch": torch.get_rng_state(),
        "numpy": {
            "kind": kind,
            "keys": torch.from_numpy(keys.astype(np.int64)),
            "pos": pos,
            "has_gauss": has_gauss,
            "gauss": gauss,
        },
        "python": list(random.getstate()[1]),
        "python_version": random.getstate()[0],
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():  # a CPU run must not open a CUDA context here
        state["cuda"] = torch.cuda.get_rng_state()  # the current device's: uint8 [state bytes]
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore what :func:`rng_state` saved; the CUDA state goes to the current device."""
    torch.set_rng_state(state["torch"])
    n = state["numpy"]
    np.random.set_state((n["kind"], n["keys"].numpy().astype(np.uint32), n["pos"], n["has_gauss"], n["gauss"]))
    random.setstate((state["python_version"], tuple(state["python"]), None))
    if state.get("cuda") is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])


@contextlib.contextmanager
def update_randomness(seed: int, step: int, rank: int, device: torch.device, part: str) -> Iterator[None]:
    """Within it, torch's CPU generator and ``device``'s (when CUDA) start from a seed of (``seed``, ``step``,
    ``rank``, ``part``: which call of the update) alone; after it, both are back where they were, and no other
    generator is touched. A call that draws nothing leaves the run's bits as they were; one that does (a model's
    dropout) draws the same numbers straight or resumed, even when the checkpoint was written in the update's
    middle, and each rank its own."""
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        number = sample_seed(seed, step, rank, f"model/{part}")
        torch.default_generator.manual_seed(number)
        if device.type == "cuda":
            with torch.cuda.device(device):
                torch.cuda.manual_seed(number)
        yield
