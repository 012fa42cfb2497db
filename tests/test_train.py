"""srforge.train: ``train(cfg)`` on a user's Dataset (TinyStrips and tiny_config, which the other training
tests use too), what a run records, a non-finite loss, two processes under torchrun, compile inside DDP,
activation checkpointing from the config, the warnings about the model's padding and the rescaling."""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import run_once_more_after_native_abort
from torch.utils.data import Dataset

from srforge.config import ConfigError, resolve
from srforge.models import UNet
from srforge.runtime.checkpoint import load_checkpoint
from srforge.train import NonFiniteLossError, train
from srforge.train.from_config import set_checkpointing

ROOT = Path(__file__).resolve().parents[1]
TRAIN = [sys.executable, str(ROOT / "scripts" / "train.py")]


class TinyStrips(Dataset):
    """A user's Dataset defined in the test: dict samples, its own field names, no sizes()."""

    def __init__(self, n=10, nan_at=None, float_images=False):
        self.n, self.nan_at, self.float_images = n, nan_at, float_images

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        rng = np.random.default_rng(i)
        h, w = 12 + i % 5, 20 + 7 * i
        labels = np.zeros((h, w), np.int64)
        labels[h // 2, 2 : w - 2] = 1
        pixels = np.where(labels == 1, 30, 220) + rng.integers(0, 20, (h, w))
        scan = np.repeat(pixels[None], 3, 0).astype(np.uint8)
        if self.float_images:
            scan = scan.astype(np.float32) / 255
            if i == self.nan_at:
                scan[:, 0, 0] = np.nan
        return {"id": f"strip_{i:03d}", "scan": scan, "labels": labels}


class OptionalClasses(TinyStrips):
    """A user's Dataset whose ``classes`` is optional: srforge leaves it to the class."""

    def __init__(self, n=10, classes=None):
        super().__init__(n)
        self.classes = classes


def test_a_dataset_whose_classes_are_optional_is_built_with_its_own_default(tmp_path):
    from srforge.train.from_config import build_data

    cfg = tiny_config(tmp_path / "run").to_dict()
    cfg["data"]["dataset"] = {"class": "test_train:OptionalClasses", "args": {"n": 10}}
    data = build_data(resolve(cfg).data, num_classes=2, seed=0, run_dir=tmp_path, class_names=["paper", "ink"])
    assert data.train.dataset.classes is None


def tiny_config(run_dir, **train):
    return resolve(
        {
            "run": {"dir": str(run_dir), "seed": 3},
            "data": {
                "dataset": {"class": "test_train:TinyStrips", "args": {"n": 10}},
                "fields": {"image": "scan", "mask": "labels", "name": "id"},
                "batch_size": 3,
                "augment": {"hflip": 0.5},
            },
            "model": {"base_channels": 4, "depth": 2, "class_names": ["paper", "ink"]},
            "train": {"epochs": 4, "lr": 0.01, "warmup_steps": 2, **train},
        }
    )


def test_custom_dataset_in_one_line_trains_and_caches_sizes(tmp_path):
    summary = train(tiny_config(tmp_path / "run", epochs=2))
    run = tmp_path / "run"
    assert (run / "sizes_cache.json").is_file()  # no sizes(): measured once
    assert len(json.loads((run / "sizes_cache.json").read_text())["entries"]) == 10
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["epoch"] for r in rows] == [1, 2] and summary["epoch"] == 2
    assert 0 <= rows[-1]["val_mean_iou"] <= 1
    ckpt = load_checkpoint(run / "last.pt")
    assert ckpt["class_names"] == ["paper", "ink"] and ckpt["size_divisor"] == 4 and ckpt["epoch"] == 2


def test_non_finite_loss_names_the_step_and_samples(tmp_path):
    cfg = tiny_config(tmp_path / "nan", epochs=1)
    cfg["data"]["dataset"]["args"] = {"n": 10, "nan_at": 4, "float_images": True}
    cfg["data"]["augment"] = {}
    with pytest.raises(NonFiniteLossError, match=r"non-finite loss nan at step \d+ .*strip_004.*skip_nonfinite"):
        train(cfg)
    cfg["train"]["skip_nonfinite"] = True
    cfg["run"]["dir"] = str(tmp_path / "skip")
    summary = train(cfg)
    assert np.isfinite(summary["train_loss"])
    best = load_checkpoint(tmp_path / "skip" / "best.pt")
    assert all(torch.isfinite(v).all() for v in best["model"].values() if v.is_floating_point())


def test_metrics_csv_has_every_column_when_validation_is_not_every_epoch(tmp_path):
    train(tiny_config(tmp_path / "run", epochs=3, val_every=2))
    lines = (tmp_path / "run" / "metrics.csv").read_text().splitlines()
    header = lines[0].split(",")
    assert "val_mean_iou" in header and "val_iou_1" in header and len(lines) == 4
    assert all(len(line.split(",")) == len(header) for line in lines[1:])
    rows = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert ["val_mean_iou" in r for r in rows] == [False, True, True]  # epoch 2, and the last epoch


def _overrides(tmp_path, epochs=4):
    data = tmp_path / "scans"
    return [
        f"run.dir={tmp_path / 'run'}",
        f"data.synthetic.root={data}",
        f"data.dataset.args.root={data}",
        "data.synthetic.n=10",
        "data.synthetic.scale=0.03",
        "model.base_channels=4",
        "model.depth=3",
        f"train.epochs={epochs}",
        "train.lr=0.01",
        "train.warmup_steps=2",
    ]


def torchrun_two(script, *args: str, cwd, fresh: tuple[Path, ...], **env: str) -> subprocess.CompletedProcess:
    """``script args`` in 2 processes under torchrun (gloo on the CPU), one thread each, srforge importable; Python's
    stacks are dumped on a fatal signal (faulthandler) so that a crash says where it was. ``fresh``: the folders the
    run writes (its run folder, data it generates); the one retry after a native abort removes them first, since an
    abort at teardown leaves a finished run there that train.py (rightly) refuses to replace."""
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", str(script), *args]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT), "PYTHONFAULTHANDLER": "1", **env}
    return run_once_more_after_native_abort(command, fresh=fresh, cwd=cwd, env=env)


def torchrun_custom_dataset(run_dir: Path, *overrides: str) -> subprocess.CompletedProcess:
    """scripts/train.py on configs/custom_dataset.yaml in 2 processes: 10 scans in batches of 2, base 4, 2 epochs."""
    common = ["data.dataset.args.n=10", "data.batch_size=2", "model.base_channels=4", "train.epochs=2"]
    config = ["--config", str(ROOT / "configs" / "custom_dataset.yaml"), f"run.dir={run_dir}"]
    return torchrun_two(ROOT / "scripts" / "train.py", *config, *common, *overrides, cwd=ROOT, fresh=(run_dir,))


@pytest.mark.slow
def test_two_processes_with_torchrun_gloo(tmp_path):
    done = torchrun_custom_dataset(tmp_path / "ddp")
    assert done.returncode == 0, done.stderr[-3000:]
    rows = [json.loads(line) for line in (tmp_path / "ddp" / "metrics.jsonl").read_text().splitlines()]
    # Only rank 0 writes; 8 training scans in batches of 2 = 4 batches, 2 per rank per epoch.
    assert [r["epoch"] for r in rows] == [1, 2] and [r["step"] for r in rows] == [2, 4]
    assert done.stdout.count("srforge: done.") == 1  # rank 0 alone speaks
    ckpt = load_checkpoint(tmp_path / "ddp" / "last.pt")
    assert not any(k.startswith("module.") for k in ckpt["model"])


SLOW_GENERATOR = """
import os, sys, time
import srforge.synthetic as synthetic

real = synthetic.make_welllog_scans


def slow(*args, **kwargs):  # rank 0 generates the data, slower than the collective timeout
    time.sleep(float(os.environ["SRFORGE_TEST_GENERATION_DELAY_S"]))
    return real(*args, **kwargs)


synthetic.make_welllog_scans = slow
from srforge.cli import main_train

sys.exit(main_train())
"""


@pytest.mark.slow
def test_ddp_survives_data_generation_longer_than_the_collective_timeout(tmp_path):
    """Rank 0 generates for 14 s under a 10 s train.dist_timeout_s: generation happens before the group starts,
    the other rank polls the folder, so no collective waits on it (a barrier after init would time out). The
    timeout leaves the training's own collectives room on two loaded cores (at 5 s they timed out now and then)."""
    script = tmp_path / "train_slow_generation.py"
    script.write_text(SLOW_GENERATOR)
    started = time.perf_counter()
    done = torchrun_two(
        script,
        "--config",
        str(ROOT / "configs" / "quickstart.yaml"),
        *_overrides(tmp_path, epochs=1),
        "data.max_pixels=null",
        "data.batch_size=2",
        "train.dist_timeout_s=10",
        cwd=tmp_path,
        fresh=(tmp_path / "run", tmp_path / "scans"),  # a retry generates the scans again, as the test expects
        SRFORGE_TEST_GENERATION_DELAY_S="14",
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert time.perf_counter() - started > 14  # the delay did happen
    assert done.stdout.count("generating 10 synthetic") == 1  # one generator on this machine (local rank 0)
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["epoch"] for r in rows] == [1] and "val_mean_iou" in rows[0]
    assert load_checkpoint(tmp_path / "run" / "last.pt")["config"]["train"]["dist_timeout_s"] == 10


@pytest.mark.slow
def test_compile_goes_inside_ddp_and_matches_eager_gradients(tmp_path, monkeypatch):
    """wrap_for_training compiles the UNet in place, then DDP wraps it (DDP's hooks stay outside the graph), with
    no buffer sync per forward. Run in a one-process gloo group through the aot_eager backend (Dynamo and AOT autograd
    with DDP's graph splitting, no C++ compiler): gradients match the eager model's."""
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    from srforge.train.from_config import wrap_for_training

    real_compile = torch.nn.Module.compile
    monkeypatch.setattr(torch.nn.Module, "compile", lambda self, **kw: real_compile(self, backend="aot_eager", **kw))
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        torch.manual_seed(0)
        eager = UNet(base_channels=4, depth=2)
        model = UNet(base_channels=4, depth=2)
        model.load_state_dict(eager.state_dict())
        net = wrap_for_training(model, compile=True, world=2, device=torch.device("cpu"))
        assert isinstance(net, DistributedDataParallel) and net.module is model
        assert not getattr(net, "forward_sync_buffers", getattr(net, "broadcast_buffers", True))
        assert list(model.state_dict()) == list(eager.state_dict())  # no _orig_mod. prefix in checkpoints
        image = torch.randint(0, 256, (2, 3, 16, 24), dtype=torch.uint8)
        sizes = torch.tensor([[16, 24], [11, 17]])
        for module in (net, eager):
            module(image, sizes).float().square().mean().backward()
        for (name, a), b in zip(model.named_parameters(), eager.parameters()):
            assert torch.allclose(a.grad, b.grad, atol=1e-5, rtol=1e-4), name
    finally:
        dist.destroy_process_group()
        torch._dynamo.reset()


def test_image_mode_is_recorded_in_the_checkpoint(tmp_path):
    train(tiny_config(tmp_path / "rgb", epochs=1))
    assert load_checkpoint(tmp_path / "rgb" / "last.pt")["image_mode"] == "RGB"  # TinyStrips has no image_mode
    cfg = tiny_config(tmp_path / "gray", epochs=1)
    cfg["data"]["dataset"]["class"] = "test_train:GrayStrips"
    train(cfg)
    assert load_checkpoint(tmp_path / "gray" / "last.pt")["image_mode"] == "L"


class GrayStrips(TinyStrips):
    image_mode = "L"  # what the images were decoded in, as SegmentationFolder(image_mode=...) records it


def test_model_checkpointing_in_a_config_trains_and_a_model_without_it_is_refused(tmp_path, capsys):
    cfg = tiny_config(tmp_path / "ck", epochs=1)
    cfg["model"]["checkpointing"] = True
    assert train(cfg)["epoch"] == 1
    assert "in fp32, checkpointing" in capsys.readouterr().out
    with pytest.raises(ConfigError, match="model.checkpointing: Conv2d has no checkpointing attribute"):
        set_checkpointing(torch.nn.Conv2d(3, 2, 1), True)


def test_deep_padding_and_tiny_rescaling_are_warned_about(tmp_path, capsys):
    cfg = tiny_config(tmp_path / "deep", epochs=1)
    cfg["model"]["depth"] = 4  # divisor 16 on scans of 12-16 x 20-83 px
    cfg["data"]["augment"] = {"scale": [0.1, 0.2]}
    train(resolve(cfg))
    out = capsys.readouterr().out
    assert "warning: the model's size divisor 16 pads the training scans to" in out
    assert "warning: data.augment.scale=[0.1, 0.2] shrinks every training scan to at most 3 px" in out
