"""Memory on a CUDA device: what one more padded pixel costs a model, and the pixel budget that fits.

Fixed costs (weights, cuDNN and cuBLAS workspaces) are measured apart from the cost per padded pixel, so that a
budget is (free memory x fraction) / bytes per pixel, shared by the processes that use one device.
"""

from __future__ import annotations

import torch

from srforge.runtime.device import autocast
from srforge.runtime.distributed import environment


def budget_from_memory(free_bytes: int, bytes_per_pixel: float, divisor: int, fraction: float = 0.5) -> int:
    """Padded pixels per batch that fit in ``fraction`` of ``free_bytes`` at ``bytes_per_pixel``, at least one
    2d x 2d tile (d = ``divisor``). The rest of the memory absorbs fragmentation and the allocator's caching."""
    return max(4 * divisor**2, int(free_bytes * fraction / max(bytes_per_pixel, 1.0)))


@torch.inference_mode()
def activation_bytes_per_pixel(model: torch.nn.Module, device: torch.device, precision: str) -> float:
    """Peak CUDA bytes one more padded pixel costs in ``model``'s forward pass under ``precision``.

    Measured once from two inputs of one height and two widths (8d x 32d and 8d x 64d, d = the size divisor),
    so the fixed costs (weights, cuDNN workspaces) cancel: (peak_2 - peak_1) / (pixels_2 - pixels_1).
    """
    d = model.size_divisor
    peaks = []
    for width in (32 * d, 32 * d, 64 * d):  # the first run is a warm-up: cuBLAS/cuDNN workspaces stay allocated
        image = torch.zeros((1, model.in_channels, 8 * d, width), dtype=torch.uint8, device=device)
        sizes = torch.tensor([[8 * d, width]], device=device)
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        base = torch.cuda.memory_allocated(device)
        with autocast(device, precision):
            logits = model(image, sizes)
        logits.argmax(1)
        torch.cuda.synchronize(device)
        peaks.append(torch.cuda.max_memory_allocated(device) - base)
        del image, sizes, logits
    # A floor: the input, the logits and the uint8 class map alone take this much per pixel, whatever the probe saw.
    floor = model.in_channels + 4.0 * model.num_classes + 1
    return max(floor, (peaks[2] - peaks[1]) / (8 * d * 32 * d))


def processes_per_device() -> int:
    """How many of this machine's processes share one CUDA device (more ranks than GPUs share them)."""
    devices = torch.cuda.device_count() if torch.cuda.is_available() else 1
    return -(-environment().local_world // max(1, devices))


# At most this many padded pixels per batch on CUDA, however much memory is free: 2**27 is 16 full-size scans of
# 640 x 12,800; larger batches add nothing to GPU occupancy but hold gigabytes of decoded scans on the host.
MAX_CUDA_PIXELS = 2**27


def cuda_pixel_budget(model: torch.nn.Module, device: torch.device, precision: str, sharing: int = 1) -> int:
    """The default pixel budget on a CUDA device: half its free memory, divided among the ``sharing`` processes
    that use the device, over the model's bytes per pixel; at most MAX_CUDA_PIXELS."""
    per_pixel = activation_bytes_per_pixel(model, device, precision)
    torch.cuda.empty_cache()
    free, _ = torch.cuda.mem_get_info(device)
    budget = budget_from_memory(free, per_pixel, model.size_divisor, fraction=0.5 / max(1, sharing))
    return min(MAX_CUDA_PIXELS, budget)
