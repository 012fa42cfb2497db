"""Device and precision choices shared by training and prediction."""

from __future__ import annotations

import contextlib

import torch


def resolve_device(name: str | torch.device) -> torch.device:
    """``"auto"`` -> cuda when available, else cpu; anything else as ``torch.device`` reads it."""
    if isinstance(name, str) and name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def autocast(device: torch.device, precision: str):
    """A context that runs under ``precision`` (fp32 | bf16 | fp16) on ``device``: autocast for the last two."""
    if precision == "fp32":
        return contextlib.nullcontext()
    return torch.autocast(device.type, dtype=torch.bfloat16 if precision == "bf16" else torch.float16)
