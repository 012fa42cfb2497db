"""Memory: what one more padded pixel costs a model, the pixel budget that fits a device, and running out of it.

Prediction (forward only) and training (forward, loss and backward) both follow one model: a step's peak memory
is a fixed part plus a part per padded pixel,

    peak(P) = fixed + bytes_per_pixel * P          P = padded pixels of the batch (B x Hp x Wp)

Both parts are measured, never guessed: the step runs on two inputs of one height and two widths (wide enough
that the activations set the peak, :func:`measure_step_memory`), and the difference of their peaks over the
difference of their pixels is the cost per pixel; whatever the larger input holds beyond that (gradients,
workspaces) is the fixed part. On CUDA the peaks come from the caching allocator
(``max_memory_allocated``); on the CPU from the profiler's record of every allocation and free of torch's CPU
allocator (``torch.profiler`` with ``profile_memory``), summed in time order. A budget is then the memory a step
may take (a fraction of what is free, shared by the processes on one device) less the fixed part, over the cost
per pixel.
"""

from __future__ import annotations

import os
import sys
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch

from srforge.constants import CPU_PIXELS
from srforge.runtime.device import autocast
from srforge.runtime.distributed import environment, reduce_min

# cuBLAS and cuDNN report a failed allocation as a plain RuntimeError with one of these in its message, and so does
# torch's CPU allocator ("DefaultCPUAllocator: can't allocate memory: you tried to allocate N bytes").
ALLOCATION_FAILURES = ("out of memory", "ALLOC_FAILED", "can't allocate memory")


def is_out_of_memory(error: BaseException) -> bool:
    """Whether ``error`` is the device running out of memory (then a smaller batch or tile may fit): CUDA's
    OutOfMemoryError, cuBLAS / cuDNN failing to allocate, or the CPU allocator failing (a memory limit)."""
    return isinstance(error, torch.cuda.OutOfMemoryError) or (
        isinstance(error, RuntimeError) and any(text in str(error) for text in ALLOCATION_FAILURES)
    )


# The share of the free memory one job's step may plan to fill, by (job, device type): the rest absorbs the caching
# allocator's fragmentation as batch shapes vary, and other processes. Training plans from its measured step (fixed
# part and cost per pixel) and redoes a batch that does not fit in parts (srforge.train.trainer); prediction plans
# from the forward's cost per pixel alone and splits a batch that does not fit, so it keeps more in reserve.
MEMORY_FRACTIONS = {("train", "cuda"): 0.75, ("train", "cpu"): 0.5, ("predict", "cuda"): 0.5, ("predict", "cpu"): 0.5}


def planning_share(free_bytes: int, device_type: str, sharing: int = 1, job: str = "train") -> float:
    """The bytes one process's step of ``job`` (train | predict) may plan to fill: its MEMORY_FRACTIONS of the
    free memory (CUDA's free memory, or the available RAM on the CPU), divided among the ``sharing`` processes
    that use the device (or the machine's RAM). Training and prediction both budget from this one estimate."""
    fraction = MEMORY_FRACTIONS[job, "cuda" if device_type == "cuda" else "cpu"]
    return free_bytes * fraction / max(1, sharing)


def budget_from_memory(free_bytes: int, bytes_per_pixel: float, divisor: int, sharing: int = 1) -> int:
    """Padded pixels per prediction batch that fit in :func:`planning_share` of ``free_bytes`` at
    ``bytes_per_pixel``, at least one 2d x 2d tile (d = ``divisor``)."""
    share = planning_share(free_bytes, "cuda", sharing, job="predict")
    return max(4 * divisor**2, int(share / max(bytes_per_pixel, 1.0)))


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
    """The default prediction pixel budget on a CUDA device: its share of the free memory for prediction
    (:func:`planning_share`), divided among the ``sharing`` processes that use the device, over the model's bytes
    per pixel; at most MAX_CUDA_PIXELS."""
    per_pixel = activation_bytes_per_pixel(model, device, precision)
    torch.cuda.empty_cache()
    free, _ = torch.cuda.mem_get_info(device)
    budget = budget_from_memory(free, per_pixel, model.size_divisor, sharing=sharing)
    return min(MAX_CUDA_PIXELS, budget)


# -- training: the step's measured memory, and the budget data.max_pixels: auto derives from it ---------------------


def pixels_text(pixels: float) -> str:
    """'8.2 Mpx' (or '12,288 px' below 0.1 Mpx), as the console shows budgets and scans."""
    return f"{pixels / 1e6:.1f} Mpx" if pixels >= 1e5 else f"{int(pixels):,} px"


@dataclass(frozen=True)
class StepMemory:
    """A training step's measured memory: ``peak(P) = fixed_bytes + bytes_per_pixel * P`` on ``device``.

    ``bytes_per_pixel``: the activations kept for backward, per padded pixel. ``fixed_bytes``: what the step
    holds whatever the input -- gradients, workspaces, and the optimizer's state (``optimizer_bytes``, part of
    ``fixed_bytes``), which the probe cannot see because it takes no optimizer step; the weights are resident
    before the step and are not counted. ``precision`` and ``checkpointing`` say what was measured.
    """

    bytes_per_pixel: float
    fixed_bytes: float
    device: str
    precision: str
    checkpointing: bool = False
    optimizer_bytes: float = 0.0

    def peak(self, pixels: float) -> float:
        """Bytes a step over ``pixels`` padded pixels takes at its peak, beyond the resident weights."""
        return self.fixed_bytes + self.bytes_per_pixel * pixels

    def fitting(self, memory_bytes: float) -> int:
        """The most padded pixels whose step fits in ``memory_bytes`` (0 when not even the fixed part does)."""
        return max(0, int((memory_bytes - self.fixed_bytes) / max(self.bytes_per_pixel, 1.0)))

    def describe(self) -> str:
        """'1.8 KB per padded pixel in bf16 (checkpointing), 0.4 GB fixed'."""
        how = f"{self.precision}, checkpointing" if self.checkpointing else self.precision
        return f"{self.bytes_per_pixel / 1e3:.2f} KB per padded pixel in {how}, {self.fixed_bytes / 1e9:.2f} GB fixed"


def peak_bytes(run: Callable[[], object], device: torch.device) -> int:
    """Peak bytes allocated while ``run()`` runs on ``device``, beyond what was allocated before it.

    CUDA: ``max_memory_allocated`` after a reset, less ``memory_allocated`` before. CPU: every allocation and
    free of torch's CPU allocator recorded by ``torch.profiler`` (``profile_memory=True``) and summed in time
    order; the profiler's own console lines are kept off the console.
    """
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        base = torch.cuda.memory_allocated(device)
        run()
        torch.cuda.synchronize(device)
        return torch.cuda.max_memory_allocated(device) - base
    from torch.profiler import ProfilerActivity, profile

    with quiet_profiler(), profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        run()
    events = sorted((e.start_ns(), e.nbytes()) for e in prof.profiler.kineto_results.events() if e.name() == "[memory]")
    held = peak = 0
    for _, nbytes in events:
        held += nbytes
        peak = max(peak, held)
    return peak


# Lines the profiler writes to stderr on every start and stop (and one about a missing GPU): not the user's concern.
PROFILER_NOISE = ("USDT:", "gpuGetDeviceCount")


@contextmanager
def quiet_profiler() -> Iterator[None]:
    """Collect what is written to file descriptor 2 meanwhile (the profiler writes from C++) and write back every
    line but the profiler's own start/stop notices, so that no warning or error is lost."""
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile(mode="w+b") as caught:
        os.dup2(caught.fileno(), 2)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            caught.seek(0)
            lines = caught.read().splitlines(keepends=True)
            kept = [line for line in lines if not any(noise.encode() in line for noise in PROFILER_NOISE)]
            if kept:
                os.write(2, b"".join(kept))


def probe_shapes(divisor: int, device: torch.device) -> tuple[tuple[int, int], tuple[int, int]]:
    """The two (H, W) inputs the probe measures first: one height, two widths, multiples of ``divisor``.

    256 x 1,024 and 256 x 2,048 px on CUDA; 128 x 512 and 128 x 1,024 on the CPU, where a base-32 step over them
    takes seconds. Both rounded up to the divisor, so a deep model gets a few rows at its deepest level. Where they
    are too small for the activations to set the peak, :func:`measure_step_memory` doubles them.
    """
    height, width = (256, 1024) if device.type == "cuda" else (128, 512)
    height, width = -(-height // divisor) * divisor, -(-width // divisor) * divisor
    return (height, width), (height, 2 * width)


# A step peaks either where the most activations are held (mid-backward) or where the weights' gradients are (late
# in the backward, when few activations are left). Below some input size the second is the higher peak, and it grows
# more slowly with the pixels than the first: two inputs there measure too few bytes per pixel. With checkpointing
# (few activations a pixel) that size is large: at 128 x 512 and 128 x 1,024 px a depth-5 base-16 UNet measured 651
# B/px, base 32 973 B/px, against 778 and 1,538 from 128 x 1,024 up (791 for base 16 between 1 and 2 Mpx in a
# Trainer step); its activations at the smaller input, 43 and 64 MB, were then under twice the gradients (31 and
# 82 MB). So the inputs are doubled until the smaller one's activations are at least ACTIVATIONS_OVER_GRADIENTS
# times the gradients, at most PROBE_DOUBLINGS times.
ACTIVATIONS_OVER_GRADIENTS = 2.0
PROBE_DOUBLINGS = 3


def measure_step_memory(
    run_at: Callable[[int, int], object], divisor: int, device: torch.device, precision: str, **facts
) -> StepMemory:
    """The StepMemory of ``run_at(height, width)`` (one training step over a single [H, W] input) on ``device``.

    Runs once on the smaller input of :func:`probe_shapes` as a warm-up (cuBLAS / cuDNN workspaces and the
    gradients' first allocation), then measures the peaks of both inputs: bytes per pixel = (peak_2 - peak_1) /
    (pixels_2 - pixels_1), fixed = peak_2 - bytes per pixel x pixels_2 (at least 0), plus
    ``facts["optimizer_bytes"]``. While the smaller input's activations (bytes per pixel x its pixels) are under
    ACTIVATIONS_OVER_GRADIENTS x ``facts["gradient_bytes"]``, both widths are doubled and measured again (see
    above). ``facts`` may also name ``checkpointing``.
    """
    small, large = probe_shapes(divisor, device)
    run_at(*small)
    gradients = float(facts.get("gradient_bytes", 0.0))
    for doubling in range(PROBE_DOUBLINGS + 1):
        peaks = [peak_bytes(lambda shape=shape: run_at(*shape), device) for shape in (small, large)]
        pixels = [small[0] * small[1], large[0] * large[1]]
        per_pixel = max(1.0, (peaks[1] - peaks[0]) / (pixels[1] - pixels[0]))
        if per_pixel * pixels[0] >= ACTIVATIONS_OVER_GRADIENTS * gradients or doubling == PROBE_DOUBLINGS:
            break
        small, large = large, (large[0], 2 * large[1])
    optimizer = float(facts.get("optimizer_bytes", 0.0))
    fixed = max(0.0, peaks[1] - per_pixel * pixels[1]) + optimizer
    return StepMemory(
        per_pixel, fixed, str(device), precision, bool(facts.get("checkpointing", False)), optimizer_bytes=optimizer
    )


def free_memory(device: torch.device) -> int:
    """Bytes this process may still take on ``device``: CUDA's free memory once the cache is emptied (what the
    allocator holds unused counts as free), or the available RAM on the CPU (MemAvailable of /proc/meminfo,
    else free physical pages)."""
    if device.type == "cuda":
        torch.cuda.empty_cache()
        return int(torch.cuda.mem_get_info(device)[0])
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def auto_budget(memory: StepMemory, share: float, device_type: str, divisor: int) -> tuple[int, int]:
    """``data.max_pixels: auto`` from the step's measured ``memory`` and the bytes it may fill (``share``, from
    :func:`planning_share`): (budget, capacity).

    capacity: the most padded pixels whose step fits in ``share``. budget: that, at most MAX_CUDA_PIXELS on CUDA
    or CPU_PIXELS on the CPU, and at least one d x d block (d = ``divisor``) so that the sampler always has a
    budget. A scan above the budget but within the capacity still trains, as a batch of its own; one above the
    capacity cannot.
    """
    capacity = memory.fitting(share)
    cap = MAX_CUDA_PIXELS if device_type == "cuda" else CPU_PIXELS
    return max(divisor**2, min(cap, capacity)), capacity


def smallest_across_ranks(values: list[int], device: torch.device) -> list[int]:
    """The smallest of every rank's ``values``, element by element (one all-reduce MIN; ``values`` themselves in
    one process), so that every rank cuts the same batches and takes the same decisions."""
    agreed = reduce_min(torch.tensor([float(v) for v in values], dtype=torch.float64, device=device))
    return [int(v) for v in agreed.tolist()]
