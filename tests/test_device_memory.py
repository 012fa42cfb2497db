"""Memory on a device (srforge.runtime.device_memory): peaks measured on the CPU from torch's allocator, the step's
arithmetic and the auto budget, the processes that share a device, what counts as running out of memory, the
CUDA budget of prediction. No GPU here: torch.cuda's memory calls are simulated.
"""

import os

import torch

from srforge.constants import CPU_PIXELS
from srforge.runtime import device_memory as mem
from srforge.runtime.device_memory import budget_from_memory

CPU = torch.device("cpu")


def test_cpu_peak_is_every_allocation_summed_in_time_order():
    def run():
        a = torch.empty(10_000_000, dtype=torch.uint8)
        b = torch.empty(30_000_000, dtype=torch.uint8)  # both held: 40 MB
        del a, b
        torch.empty(20_000_000, dtype=torch.uint8)  # after both are freed: 20 MB

    peak = mem.peak_bytes(run, CPU)
    assert 40_000_000 <= peak < 40_100_000


def test_the_profilers_own_console_lines_are_dropped_and_nothing_else(capfd):
    with mem.quiet_profiler():
        os.write(2, b"USDT:2026 profiler_start\na warning the user must see\n")
    err = capfd.readouterr().err
    assert "a warning the user must see" in err and "USDT" not in err


def test_step_memory_arithmetic_and_the_auto_budget_on_a_simulated_80_gb_card(monkeypatch):
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (80 * 10**9, 141 * 10**9))
    free = mem.free_memory(torch.device("cuda", 0))
    assert free == 80 * 10**9
    memory = mem.StepMemory(bytes_per_pixel=2000.0, fixed_bytes=2e9, device="cuda:0", precision="bf16")
    assert memory.peak(10**6) == 2e9 + 2e9 and memory.fitting(4e9) == 10**6 and memory.fitting(1e9) == 0
    # One process: 75% of 80 GB = 60 GB; less the 2 GB fixed part, at 2 KB a pixel: 29 Mpx.
    share = mem.planning_share(free, "cuda")
    assert share == 60e9
    assert mem.auto_budget(memory, share, "cuda", 32) == (29_000_000, 29_000_000)
    # Two processes on the device share it: 30 GB each, 14 Mpx.
    assert mem.auto_budget(memory, mem.planning_share(free, "cuda", sharing=2), "cuda", 32) == (14_000_000,) * 2
    # Plenty of memory: at most MAX_CUDA_PIXELS per batch, though a single scan may use the whole capacity.
    budget, capacity = mem.auto_budget(mem.StepMemory(10.0, 0.0, "cuda:0", "bf16"), share, "cuda", 32)
    assert budget == mem.MAX_CUDA_PIXELS and capacity == 6_000_000_000
    # The CPU: half the available RAM, at most 2**22.
    assert mem.auto_budget(memory, mem.planning_share(8 * 10**9, "cpu"), "cpu", 32) == (1_000_000, 1_000_000)
    assert mem.auto_budget(memory, mem.planning_share(10**12, "cpu"), "cpu", 32)[0] == CPU_PIXELS


def test_processes_on_one_device_share_it(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    assert mem.processes_per_device() == 2
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "8")  # 8 ranks on 2 GPUs: 4 share each
    assert mem.processes_per_device() == 4
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    assert mem.processes_per_device() == 1


def test_out_of_memory_errors_are_recognised():
    assert mem.is_out_of_memory(torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"))
    assert mem.is_out_of_memory(RuntimeError("cuDNN error: CUDNN_STATUS_ALLOC_FAILED"))
    assert mem.is_out_of_memory(RuntimeError("CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling cublasCreate"))
    assert not mem.is_out_of_memory(RuntimeError("shape mismatch"))
    # the CPU allocator's failure too
    text = "[enforce fail at alloc_cpu.cpp:121] data. DefaultCPUAllocator: can't allocate memory: you tried to allocate"
    assert mem.is_out_of_memory(RuntimeError(text + " 8589934592 bytes. Error code 12 (Cannot allocate memory)"))
    assert not mem.is_out_of_memory(RuntimeError("mat1 and mat2 shapes cannot be multiplied"))


def test_the_cuda_budget_is_free_memory_over_bytes_per_pixel():
    assert budget_from_memory(80 * 2**30, 1024, 32) == 40 * 2**20  # half of 80 GiB at 1 KiB a pixel
    assert budget_from_memory(2**20, 10**9, 32) == 4 * 32**2  # never below one 2d x 2d tile


def test_the_cuda_budget_is_capped_and_shared_by_the_processes_on_one_device(monkeypatch):
    from srforge.runtime import device_memory as dev

    monkeypatch.setattr(dev, "activation_bytes_per_pixel", lambda *args: 1.0)  # a probe that saw almost nothing
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device: (140 * 2**30, 143 * 2**30))
    model = torch.nn.Module()
    model.size_divisor = 32
    assert dev.cuda_pixel_budget(model, torch.device("cuda"), "fp32") == dev.MAX_CUDA_PIXELS  # not 7e10 pixels
    monkeypatch.setattr(dev, "activation_bytes_per_pixel", lambda *args: 4096.0)
    alone = dev.cuda_pixel_budget(model, torch.device("cuda"), "fp32")
    assert alone == 140 * 2**30 // 2 // 4096
    assert dev.cuda_pixel_budget(model, torch.device("cuda"), "fp32", sharing=4) == alone // 4
