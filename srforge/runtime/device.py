"""Device and precision choices shared by training and prediction."""

from __future__ import annotations

import contextlib

import torch


def resolve_device(name: str | torch.device) -> torch.device:
    """``"auto"`` -> cuda when available, else cpu; anything else as ``torch.device`` reads it.

    A CUDA device always comes back with its index (``cuda`` -> ``cuda:<current device>``), because
    ``torch.cuda.set_device`` and per-device events need one. A name torch does not know, or a CUDA device this
    machine does not have (``cuda:7`` on a machine with one GPU, any ``cuda`` without one), is a ValueError that
    says which devices there are.
    """
    if isinstance(name, str) and name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    try:
        device = torch.device(name)
    except (RuntimeError, TypeError) as exc:
        raise ValueError(f"{name!r} is not a device ({exc}); expected auto, cpu, cuda or cuda:N.") from None
    if device.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if (device.index or 0) >= count:
            have = f"cuda:0 to cuda:{count - 1}; use one of those, auto or cpu" if count else "no CUDA device; use cpu"
            raise ValueError(f"no device {name!r}: this machine has {have}.")
        if device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())
    return device


def autocast(device: torch.device, precision: str):
    """A context that runs under ``precision`` (fp32 | bf16 | fp16) on ``device``: autocast for the last two."""
    if precision == "fp32":
        return contextlib.nullcontext()
    return torch.autocast(device.type, dtype=torch.bfloat16 if precision == "bf16" else torch.float16)


def cpu_has_native_bf16() -> bool:
    """Whether this machine's CPU computes bf16 natively (avx512_bf16 or AMX, read from /proc/cpuinfo).

    Without it bf16 on the CPU is emulated, many times slower than fp32. False where /proc/cpuinfo cannot be read.
    """
    try:
        with open("/proc/cpuinfo") as f:
            flags = f.read()
    except OSError:
        return False
    return "avx512_bf16" in flags or "amx_bf16" in flags
