"""Device choices (srforge.runtime.device): a device that is not there is named with the ones there are."""

import pytest
import torch


def test_resolve_device_names_the_devices_there_are(monkeypatch):
    from srforge.runtime.device import resolve_device

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 1)
    assert resolve_device("cuda:1") == torch.device("cuda", 1)
    # Always indexed (torch.cuda.set_device refuses a bare "cuda"): the current device.
    assert resolve_device("cuda") == torch.device("cuda", 1) and resolve_device("auto") == torch.device("cuda", 1)
    with pytest.raises(ValueError, match=r"no device 'cuda:7': this machine has cuda:0 to cuda:1; use one of those"):
        resolve_device("cuda:7")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ValueError, match=r"no device 'cuda': this machine has no CUDA device; use cpu"):
        resolve_device("cuda")
    assert resolve_device("cpu") == torch.device("cpu")
