"""Host syncs in training: at most one read from the device per step, counted over 20 steps of the real trainer.

On a GPU every call SyncCounter counts waits for the queue of launched kernels to drain. The test runs on the CPU,
where no call waits, so it counts the calls themselves, from everywhere a training step goes (the trainer, the loss,
the metrics, the model's forward), and leaves out the places that touch host tensors only, on a GPU machine too:
the data pipeline (datasets, collation and the DataLoader run on the host, in workers), building the model (on the
host, before it moves), the optimizer (AdamW keeps its step counts in CPU tensors unless ``capturable``/``fused``),
``scores()`` (it takes a confusion matrix already copied to the host) and the UNet's ``check_sizes``, which reads
size values only when they are in host memory (``sizes_readable``; the trainer hands the model device sizes).
"""

import sys

import numpy as np
import pytest
import torch
from torch.utils.data import Dataset

from srforge.config import resolve
from srforge.train import train

sync_counter = pytest.importorskip("sync_counter", reason="tests/sync_counter.py comes with the host-only size check")
if not hasattr(__import__("srforge.models.unet", fromlist=["x"]), "sizes_readable"):
    pytest.skip("needs the UNet that reads sizes only in host memory (sizes_readable)", allow_module_level=True)

HOST_FILES = ("/srforge/data/", "/torch/utils/data/", "/torch/optim/")
HOST_FUNCTIONS = {("metrics.py", "scores"), ("unet.py", "check_sizes"), ("from_config.py", "build_model")}


class DeviceReads(sync_counter.SyncCounter):
    """SyncCounter, leaving out calls made from the host-only places listed in the module docstring."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        frame = sys._getframe(1)
        while frame is not None:
            path, name = frame.f_code.co_filename, frame.f_code.co_name
            if any(part in path for part in HOST_FILES) or (path.rsplit("/", 1)[-1], name) in HOST_FUNCTIONS:
                return func(*args, **(kwargs or {}))
            frame = frame.f_back
        return super().__torch_function__(func, types, args, kwargs)


class Strips(Dataset):
    """25 tiny scans of a few sizes: 20 training batches of 1 and 5 validation scans."""

    def __len__(self):
        return 25

    def __getitem__(self, i):
        h, w = 8 + i % 3, 16 + 4 * (i % 4)
        mask = np.zeros((h, w), np.uint8)
        mask[h // 2] = 1
        image = np.repeat(np.where(mask == 1, 30, 220)[None], 3, 0).astype(np.uint8)
        return {"image": image, "mask": mask, "name": f"s{i}"}


def _cfg(run_dir, **train):
    return resolve(
        {
            "run": {"dir": str(run_dir), "seed": 0, "device": "cpu"},
            "data": {
                "dataset": {"class": "test_trainer_host_syncs:Strips"},
                "batch_size": 1,
                "augment": {"hflip": 0.5},
            },
            "model": {"base_channels": 4, "depth": 2},
            "train": {"epochs": 1, "dice_weight": 1.0, **train},
        }
    )


@pytest.mark.slow
def test_at_most_one_device_read_per_training_step(tmp_path):
    with DeviceReads() as reads:
        summary = train(_cfg(tmp_path / "run"))
    assert summary["step"] == 20
    # 20 steps: one read each (whether the loss is finite, the bar's totals every log_every steps in the same
    # transfer). Epoch end: the summed totals and the confusion matrix of training, the same two of validation.
    assert reads.total <= 20 + 4, reads.counts
    assert not {"bool_mask_getitem", "nonzero", "bincount"} & set(reads.counts)


def test_the_counter_sees_what_the_old_step_did(tmp_path):
    """The count can fail: a loss read with .item() and a confusion matrix by boolean indexing are both seen."""
    with DeviceReads() as reads:
        x = torch.randn(4)
        x.sum().item()
        x[x > 0]
        bool(x.any())
    assert reads.counts == {"item": 1, "bool_mask_getitem": 1, "__bool__": 1}
