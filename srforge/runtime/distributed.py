"""Several processes under ``torchrun``: where this process stands, the process group, and what ranks share.

:func:`environment` is the one reader of torchrun's variables (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``,
``LOCAL_WORLD_SIZE``). Training starts its group with :func:`start` (nccl on CUDA, gloo on CPU, bound to this
rank's device); prediction joins one with :func:`join` (gloo whatever the device: only small Python objects
travel, and its collectives may wait as long as the slowest process writes). Both go through one
``init_process_group`` call.

The group starts only once everything a rank may wait for without talking to the others is done (the synthetic
data, above all), so that ``train.dist_timeout_s`` bounds collectives, never a rank's solitary work.
"""

from __future__ import annotations

import datetime
import os
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

# Prediction's collectives wait this long for the slowest process (the default, 30 min, could end a long
# archive's final barrier while one process still writes its last scans).
PREDICT_TIMEOUT = datetime.timedelta(hours=24)


@dataclass(frozen=True)
class Processes:
    """Where this process stands: rank among ``world`` processes, its rank among ``local_world`` on this machine,
    and (once the group has started) its device."""

    rank: int = 0
    world: int = 1
    local_rank: int = 0
    device: torch.device | None = None
    owns_group: bool = False  # this process started the group, so it ends it
    local_world: int = 1

    @property
    def main(self) -> bool:
        """The process that writes files and shows the progress bar."""
        return self.rank == 0


def _int_env(name: str, default: int) -> int:
    try:
        return int(os.environ.get(name, default))
    except ValueError:
        return default


def environment() -> Processes:
    """Rank, world size, local rank and local world size as ``torchrun`` sets them; (0, 1, 0, 1) without it."""
    if "RANK" not in os.environ or "WORLD_SIZE" not in os.environ:
        return Processes(local_world=max(1, _int_env("LOCAL_WORLD_SIZE", 1)))
    rank = int(os.environ["RANK"])
    return Processes(
        rank,
        int(os.environ["WORLD_SIZE"]),
        _int_env("LOCAL_RANK", rank),
        local_world=max(1, _int_env("LOCAL_WORLD_SIZE", 1)),
    )


def _init_group(backend: str, timeout: datetime.timedelta, device: torch.device | None = None) -> bool:
    """Start the process group unless one runs; True when this call started it. ``device`` binds NCCL to this
    rank's GPU from the first collective on."""
    if dist.is_initialized():
        return False
    options: dict[str, Any] = {"backend": backend, "timeout": timeout}
    if device is not None and device.type == "cuda":
        options["device_id"] = device
    dist.init_process_group(**options)
    return True


def start(processes: Processes, timeout_s: float, device_name: str = "auto") -> Processes:
    """Start the training group (nccl on CUDA, gloo on CPU) when launched by torchrun; returns it with its device.

    Each process takes ``cuda:LOCAL_RANK`` unless ``device_name`` (``run.device``) is ``cpu``, or there is no GPU.
    A single process returns ``processes`` unchanged (its device is chosen from ``run.device``).
    """
    if processes.world == 1:
        return processes
    use_cuda = torch.cuda.is_available() and not str(device_name).startswith("cpu")
    if use_cuda and processes.local_rank >= torch.cuda.device_count():
        raise ValueError(
            f"run.device: local rank {processes.local_rank} has no GPU of its own ({torch.cuda.device_count()} "
            "visible); start at most one process per GPU (torchrun --nproc_per_node) or set run.device=cpu"
        )
    device = torch.device("cuda", processes.local_rank) if use_cuda else torch.device("cpu")
    if use_cuda:
        torch.cuda.set_device(device)  # also when the group already exists: later CUDA work lands on this GPU
    owns = _init_group("nccl" if use_cuda else "gloo", datetime.timedelta(seconds=timeout_s), device)
    return Processes(processes.rank, processes.world, processes.local_rank, device, owns, processes.local_world)


def join() -> None:
    """Join prediction's process group (gloo; a no-op for one process or when a group runs)."""
    if environment().world > 1:
        _init_group("gloo", PREDICT_TIMEOUT)


def stop() -> None:
    """End the process group, if one is running (at the end of training, and on any error)."""
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def rank_device(device: str) -> str:
    """The device this process predicts on: under torchrun, "auto" and "cuda" mean cuda:LOCAL_RANK."""
    processes = environment()
    if processes.world > 1 and device in ("auto", "cuda") and torch.cuda.is_available():
        return f"cuda:{processes.local_rank % torch.cuda.device_count()}"
    return device


def _running() -> bool:
    return dist.is_available() and dist.is_initialized()


def reduce_sum(tensor: torch.Tensor) -> torch.Tensor:
    """Sum ``tensor`` in place across ranks (no-op in one process); returns it."""
    if _running():
        dist.all_reduce(tensor)
    return tensor


def reduce_min(tensor: torch.Tensor) -> torch.Tensor:
    """Minimum of ``tensor`` in place across ranks (no-op in one process); returns it."""
    if _running():
        dist.all_reduce(tensor, op=dist.ReduceOp.MIN)
    return tensor


def gather(obj: Any) -> list[Any]:
    """Every process's ``obj``, in rank order (``[obj]`` for one process)."""
    if not _running() or dist.get_world_size() == 1:
        return [obj]
    out: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


def barrier() -> None:
    """Wait for every rank (no-op in one process)."""
    if _running() and dist.get_world_size() > 1:
        dist.barrier()
