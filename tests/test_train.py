"""Training: the script end to end, a custom Dataset, exact resume, torchrun, config errors, faults."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from torch.utils.data import Dataset

from srforge.config import resolve
from srforge.runtime.checkpoint import load_checkpoint, model_from_checkpoint
from srforge.train import NonFiniteLossError, train

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


def assert_same_end(straight: Path, resumed: Path, epochs: int = 4) -> dict:
    """Both runs' last.pt at epoch ``epochs`` and the same step, with bit-identical weights; the first's content."""
    a, b = load_checkpoint(straight / "last.pt"), load_checkpoint(resumed / "last.pt")
    assert a["epoch"] == b["epoch"] == epochs and a["step"] == b["step"]
    for key in a["model"]:
        assert torch.equal(a["model"][key], b["model"][key]), key
    return a


def test_exact_resume_gives_bit_identical_weights(tmp_path):
    train(tiny_config(tmp_path / "straight"))
    train(tiny_config(tmp_path / "stopped", stop_after=2))
    assert load_checkpoint(tmp_path / "stopped" / "last.pt")["epoch"] == 2
    train(tiny_config(tmp_path / "stopped"), resume=tmp_path / "stopped")
    a = assert_same_end(tmp_path / "straight", tmp_path / "stopped")
    # ... and the test can fail: another seed gives other weights.
    train(
        resolve(
            {**tiny_config(tmp_path / "other"), "run": {"dir": str(tmp_path / "other"), "seed": 4, "device": "auto"}}
        )
    )
    c = load_checkpoint(tmp_path / "other" / "last.pt")
    assert not all(torch.equal(a["model"][k], c["model"][k]) for k in a["model"])


def test_resume_after_an_interrupt_mid_epoch_is_exact_too(tmp_path, monkeypatch):
    import srforge.train.assemble as trainer

    train(tiny_config(tmp_path / "straight"))
    real_loss, calls = trainer.segmentation_loss, []

    def interrupt_in_epoch_two(*args, **kwargs):
        calls.append(1)
        if len(calls) == 6:  # 3 training batches and 1 validation batch an epoch: epoch 2, second batch
            raise KeyboardInterrupt
        return real_loss(*args, **kwargs)

    monkeypatch.setattr(trainer, "segmentation_loss", interrupt_in_epoch_two)
    with pytest.raises(KeyboardInterrupt):
        train(tiny_config(tmp_path / "cut"))
    monkeypatch.setattr(trainer, "segmentation_loss", real_loss)
    saved = load_checkpoint(tmp_path / "cut" / "last.pt")
    assert (saved["epoch"], saved["batches_done"], saved["step"]) == (1, 1, 4)
    train(tiny_config(tmp_path / "cut"), resume=tmp_path / "cut")
    a = load_checkpoint(tmp_path / "straight" / "last.pt")["model"]
    b = load_checkpoint(tmp_path / "cut" / "last.pt")["model"]
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_exact_resume_with_rescaled_scans_is_bit_identical_too(tmp_path):
    """data.augment.scale: factors per (seed, epoch, sample) and batches by each epoch's sizes resume exactly."""

    def rescaled(run_dir, **options):
        cfg = tiny_config(run_dir, **options)
        return resolve({**cfg, "data": {**cfg["data"], "augment": {"hflip": 0.5, "scale": [0.7, 1.4]}}})

    train(rescaled(tmp_path / "straight"))
    train(rescaled(tmp_path / "stopped", stop_after=2))
    train(rescaled(tmp_path / "stopped"), resume=tmp_path / "stopped")
    assert_same_end(tmp_path / "straight", tmp_path / "stopped")


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


def test_mask_values_beyond_num_classes_name_the_sample(tmp_path):
    cfg = tiny_config(tmp_path / "run", epochs=1)
    cfg["model"]["num_classes"] = 1
    cfg["model"]["class_names"] = None
    with pytest.raises(
        ValueError, match=r"TinyStrips\[\d+\] \('strip_\d+'\): mask values \[1\] are not classes of model.num_classes=1"
    ):
        train(cfg)


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


def test_train_script_end_to_end(tmp_path):
    done = subprocess.run(
        [*TRAIN, "--config", str(ROOT / "configs" / "quickstart.yaml"), *_overrides(tmp_path)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    run = tmp_path / "run"
    assert (tmp_path / "scans" / "images").is_dir()  # generated when missing
    assert "epochs: 4" in (run / "config.yaml").read_text()
    rows = (run / "metrics.csv").read_text().splitlines()
    header, values = rows[0].split(","), [dict(zip(rows[0].split(","), r.split(","))) for r in rows[1:]]
    assert len(values) == 4 and "val_mean_iou" in header
    assert float(values[-1]["train_loss"]) < float(values[0]["train_loss"])
    for name in ("last.pt", "best.pt"):
        ckpt = load_checkpoint(run / name)
        model = model_from_checkpoint(ckpt)
        assert model.size_divisor == 8 and ckpt["class_names"] == ["background", "curve"]
        assert ckpt["config"]["train"]["epochs"] == 4
    assert "best validation mean IoU" in done.stdout


def test_config_errors_from_the_command_line(tmp_path):
    def run(*args):
        return subprocess.run([*TRAIN, *args], capture_output=True, text=True, timeout=120, cwd=ROOT)

    unknown = run("--config", "configs/quickstart.yaml", "train.epoch=3")
    assert unknown.returncode == 2 and "Did you mean 'train.epochs'" in unknown.stderr
    wrong = run("--config", "configs/quickstart.yaml", "train.epochs=many")
    assert wrong.returncode == 2 and "train.epochs: expected int, found str 'many'" in wrong.stderr
    missing = run("--config", str(tmp_path / "missing.yaml"))
    assert missing.returncode == 2 and f"Config file not found: {tmp_path / 'missing.yaml'}" in missing.stderr


def test_ctrl_c_writes_last_pt_and_the_run_resumes(tmp_path):
    args = [*TRAIN, "--config", str(ROOT / "configs" / "quickstart.yaml"), *_overrides(tmp_path, epochs=50)]
    # A shell that starts jobs in the background makes them ignore SIGINT, and Python then installs no
    # KeyboardInterrupt handler: give the child the default disposition, as a terminal would.
    proc = subprocess.Popen(
        args,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=tmp_path,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    metrics = tmp_path / "run" / "metrics.jsonl"
    deadline = time.time() + 240
    while not metrics.exists() and time.time() < deadline and proc.poll() is None:
        time.sleep(0.2)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err[-2000:]
    assert "interrupted; wrote" in out
    ckpt = load_checkpoint(tmp_path / "run" / "last.pt")
    assert ckpt["epoch"] >= 1
    resumed = subprocess.run(
        [*TRAIN, "--resume", str(tmp_path / "run"), "train.stop_after=1"],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert load_checkpoint(tmp_path / "run" / "last.pt")["epoch"] == ckpt["epoch"] + 1


def torchrun_two(script, *args: str, cwd, **env: str) -> subprocess.CompletedProcess:
    """``script args`` in 2 processes under torchrun (gloo on the CPU), one thread each, srforge importable."""
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", str(script), *args]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT), **env}
    return subprocess.run(command, capture_output=True, text=True, timeout=300, cwd=cwd, env=env)


def test_two_processes_with_torchrun_gloo(tmp_path):
    done = torchrun_two(
        ROOT / "scripts" / "train.py",
        "--config",
        str(ROOT / "configs" / "custom_dataset.yaml"),
        f"run.dir={tmp_path / 'ddp'}",
        "data.dataset.args.n=10",
        "data.batch_size=2",
        "model.base_channels=4",
        "train.epochs=2",
        cwd=ROOT,
    )
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


def test_ddp_survives_data_generation_longer_than_the_collective_timeout(tmp_path):
    """Rank 0 generates for 8 s under a 5 s train.dist_timeout_s: generation happens before the group starts,
    the other rank polls the folder, so no collective waits on it (a barrier after init would time out)."""
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
        "train.dist_timeout_s=5",
        cwd=tmp_path,
        SRFORGE_TEST_GENERATION_DELAY_S="8",
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert time.perf_counter() - started > 8  # the delay did happen
    assert done.stdout.count("generating 10 synthetic") == 1  # one generator on this machine (local rank 0)
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["epoch"] for r in rows] == [1] and "val_mean_iou" in rows[0]
    assert load_checkpoint(tmp_path / "run" / "last.pt")["config"]["train"]["dist_timeout_s"] == 5


def test_resume_gives_the_current_device_its_cuda_rng_state(tmp_path, monkeypatch):
    """A checkpoint holds the CUDA RNG state of its process's device; a resume gives it to the current device.

    No GPU here: torch.cuda's RNG calls are replaced by recorders, and torch.cuda.is_available answers True to the
    RNG module alone (the optimizer asks too, and would then look for a driver), so that the trainer takes its
    CUDA RNG path while training on the CPU (run.device=cpu). tests/test_cuda.py resumes such a checkpoint on a GPU.
    """
    run = tmp_path / "run"
    train(tiny_config(run, epochs=2, stop_after=1))
    ckpt = load_checkpoint(run / "last.pt")
    assert "cuda" not in ckpt["rng"]  # saved without CUDA
    states = [torch.full((16,), i, dtype=torch.uint8) for i in range(4)]
    ckpt["rng"]["cuda"] = states[0]
    torch.save(ckpt, run / "last.pt")

    restored, device = [], {"index": 0}
    monkeypatch.setattr(
        torch.cuda, "is_available", lambda: sys._getframe(1).f_code.co_filename.endswith("srforge/train/rng.py")
    )
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)  # a run on the GPU has its context open
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: device["index"])
    monkeypatch.setattr(torch.cuda, "set_rng_state", lambda state, device="cuda": restored.append(state))
    monkeypatch.setattr(torch.cuda, "get_rng_state", lambda device="cuda": states[device_index()])
    monkeypatch.setattr(torch.cuda, "set_rng_state_all", None)  # the old call must not be made
    monkeypatch.setattr(torch.cuda, "get_rng_state_all", None)

    def device_index():
        return device["index"]

    cfg = tiny_config(run, epochs=2)
    cfg["run"]["device"] = "cpu"
    summary = train(cfg, resume=run)
    assert summary["epoch"] == 2 and len(restored) == 1 and torch.equal(restored[0], states[0])
    saved = load_checkpoint(run / "last.pt")["rng"]["cuda"]
    assert isinstance(saved, torch.Tensor) and torch.equal(saved, states[0])  # the current device's state only


def test_train_and_validation_loss_are_the_same_quantity_on_the_same_batch(tmp_path):
    """The training pass's loss (taken before the step) equals validation's on the same batch and weights, Dice
    included."""
    from helpers import run_pass, stepping_trainer
    from torch.utils.data import DataLoader

    from srforge.data.collate import AlignedCollate
    from srforge.data.field_view import FieldView

    fields = {"image": "scan", "mask": "labels", "name": "id"}
    view = FieldView(TinyStrips(n=3), fields, num_classes=2)
    loader = DataLoader(view, batch_size=3, collate_fn=AlignedCollate(4, pad={"image": 0, "mask": 255}))

    def losses(dice):
        trainer = stepping_trainer(tmp_path / f"run{dice}", "test_train:TinyStrips", fields=fields, dice_weight=dice)
        trainer.val_loader = loader
        val = trainer.validate(trainer.model)["loss"]
        trainer.start_pass()
        run_pass(trainer, loader)
        return float(trainer.totals[0] / trainer.totals[1]), val

    train_loss, val_loss = losses(0.5)
    assert abs(train_loss - val_loss) < 1e-6
    # ... and the comparison can fail: without the Dice term the same weights' loss differs.
    assert abs(losses(0.0)[1] - train_loss) > 1e-3


def test_compile_goes_inside_ddp_and_matches_eager_gradients(tmp_path, monkeypatch):
    """wrap_for_training compiles the UNet in place, then DDP wraps it (DDP's hooks stay outside the graph), with
    no buffer sync per forward. Run in a one-process gloo group through the aot_eager backend (Dynamo and AOT autograd
    with DDP's graph splitting, no C++ compiler): gradients match the eager model's."""
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    from srforge.models import UNet
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
