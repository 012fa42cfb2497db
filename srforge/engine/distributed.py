"""Several processes under ``torchrun``: starting and ending the process group, and summing across ranks.

The group starts only once everything a rank may wait for without talking to the others is done (the synthetic
data, above all), so that ``train.dist_timeout_s`` bounds collectives, never a rank's solitary work. On CUDA the
device is chosen before the group starts and handed to it as ``device_id``, so that NCCL binds each rank to its
own GPU from the first collective on.
"""

from __future__ import annotations

import datetime
import inspect
import os
from dataclasses import dataclass

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class Processes:
    """Where this process stands: rank among ``world`` processes, its rank on this machine, and its device."""

    rank: int = 0
    world: int = 1
    local_rank: int = 0
    device: torch.device | None = None
    owns_group: bool = False  # this process started the group, so it ends it

    @property
    def main(self) -> bool:
        """The process that writes files and shows the progress bar."""
        return self.rank == 0


def launched() -> Processes:
    """Rank, world size and local rank as ``torchrun`` sets them in the environment; (0, 1, 0) without it."""
    if "RANK" not in os.environ or "WORLD_SIZE" not in os.environ:
        return Processes()
    rank = int(os.environ["RANK"])
    return Processes(rank, int(os.environ["WORLD_SIZE"]), int(os.environ.get("LOCAL_RANK", rank)))


def start(processes: Processes, timeout_s: float, device_name: str = "auto") -> Processes:
    """Start the process group (nccl on CUDA, gloo on CPU) when launched by torchrun; returns it with its device.

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
    owns = not dist.is_initialized()
    if owns:
        options = {"backend": "nccl" if use_cuda else "gloo", "timeout": datetime.timedelta(seconds=timeout_s)}
        if use_cuda:
            # device_id binds NCCL to this GPU at once; init_process_group has taken it since torch 2.3.
            if "device_id" in inspect.signature(dist.init_process_group).parameters:
                options["device_id"] = device
        dist.init_process_group(**options)
    return Processes(processes.rank, processes.world, processes.local_rank, device, owns)


def stop() -> None:
    """End the process group, if one is running (at the end of training, and on any error)."""
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def reduce_sum(tensor: torch.Tensor) -> torch.Tensor:
    """Sum ``tensor`` in place across ranks (no-op in one process); returns it."""
    if dist.is_available() and dist.is_initialized():
        dist.all_reduce(tensor)
    return tensor


def reduce_min(tensor: torch.Tensor) -> torch.Tensor:
    """Minimum of ``tensor`` in place across ranks (no-op in one process); returns it."""
    if dist.is_available() and dist.is_initialized():
        dist.all_reduce(tensor, op=dist.ReduceOp.MIN)
    return tensor


def barrier() -> None:
    if dist.is_available() and dist.is_initialized():
        dist.barrier()
