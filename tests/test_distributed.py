"""Starting the process group: the GPU is bound before init and handed over as device_id, with the configured
timeout; a single process on cuda:N binds GPU N. No GPU here: torch's calls are replaced by recorders."""

import datetime

import pytest
import torch
import torch.distributed as dist

from srforge.runtime import distributed
from srforge.runtime.distributed import Processes


def test_cuda_rank_binds_its_gpu_before_init_and_passes_device_id_and_timeout(monkeypatch):
    calls = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "set_device", lambda device: calls.append(("set_device", device)))
    monkeypatch.setattr(dist, "is_initialized", lambda: any(c[0] == "init" for c in calls))

    def init_process_group(backend=None, timeout=None, device_id=None):  # torch >= 2.3 takes device_id
        calls.append(("init", {"backend": backend, "timeout": timeout, "device_id": device_id}))

    monkeypatch.setattr(dist, "init_process_group", init_process_group)
    started = distributed.start(Processes(rank=3, world=4, local_rank=1), timeout_s=7)
    gpu = torch.device("cuda", 1)
    assert calls[0] == ("set_device", gpu)
    assert calls[1] == ("init", {"backend": "nccl", "timeout": datetime.timedelta(seconds=7), "device_id": gpu})
    assert started == Processes(3, 4, 1, gpu, owns_group=True)


def test_cpu_ranks_use_gloo_and_one_process_starts_nothing(monkeypatch):
    calls = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(dist, "is_initialized", lambda: False)
    monkeypatch.setattr(dist, "init_process_group", lambda **kw: calls.append(kw))
    assert distributed.start(Processes(), timeout_s=7) == Processes() and calls == []
    started = distributed.start(Processes(rank=0, world=2, local_rank=0), timeout_s=2.5)
    assert calls == [{"backend": "gloo", "timeout": datetime.timedelta(seconds=2.5)}]
    assert started.device == torch.device("cpu") and started.owns_group


def test_run_device_cpu_keeps_ranks_on_gloo_and_a_rank_without_its_own_gpu_is_refused(monkeypatch):
    calls = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "set_device", lambda device: calls.append(("set_device", device)))
    monkeypatch.setattr(dist, "is_initialized", lambda: False)
    monkeypatch.setattr(dist, "init_process_group", lambda **kw: calls.append(("init", kw)))
    started = distributed.start(Processes(rank=1, world=2, local_rank=1), timeout_s=3, device_name="cpu")
    assert started.device == torch.device("cpu")
    assert calls == [("init", {"backend": "gloo", "timeout": datetime.timedelta(seconds=3)})]
    calls.clear()
    with pytest.raises(ValueError, match="local rank 2 has no GPU.*nproc_per_node"):
        distributed.start(Processes(rank=2, world=3, local_rank=2), timeout_s=3)
    assert calls == []  # refused before binding a GPU or joining a group


def test_single_process_on_cuda_n_binds_gpu_n(monkeypatch):
    from srforge.train.from_config import single_process_device

    bound = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "set_device", bound.append)
    assert single_process_device("cuda:1") == torch.device("cuda", 1) and bound == [torch.device("cuda", 1)]
    assert single_process_device("cpu") == torch.device("cpu") and len(bound) == 1


@pytest.mark.parametrize("command", ["predict", "evaluate"])
def test_predict_and_evaluate_end_the_process_group_they_ran_in(tmp_path, monkeypatch, command):
    """A process that exits with a gloo group still running can abort in gloo's threads ("terminate called without
    an active exception"); the commands end the group first, whatever they returned."""
    from predict_fixtures import random_checkpoint

    from srforge.cli import main_evaluate, main_predict

    random_checkpoint(tmp_path / "m.pt")
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        main = main_predict if command == "predict" else main_evaluate
        args = ["--checkpoint", str(tmp_path / "m.pt"), "--input", str(tmp_path / "none"), "--output", str(tmp_path)]
        assert main(args) != 0  # the input is missing: the group ends on this way out too
        assert not dist.is_initialized()
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
