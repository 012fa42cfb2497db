"""Resuming a run (--resume, train(cfg, resume=...)): the same bits as a run never stopped, from an epoch's end or
mid-epoch, with rescaled scans, accumulated updates and dropout (each update's own generator), the CUDA RNG state
given to the current device; a copied run resumed in the copy; resumes that would change the model or the data,
or cut another world size's epoch, refused before anything is written.
"""

import json
import shutil
import sys
from pathlib import Path

import pytest
import torch
from helpers import scan_folder
from test_cli_train import _snapshot
from test_model_create import TinyNet, _config
from test_train import tiny_config

from srforge.cli import main_train
from srforge.config import resolve
from srforge.runtime.checkpoint import load_checkpoint
from srforge.train import train


def assert_same_end(straight: Path, resumed: Path, epochs: int = 4) -> dict:
    """Both runs' last.pt at epoch ``epochs`` and the same step, with bit-identical weights; the first's content."""
    a, b = load_checkpoint(straight / "last.pt"), load_checkpoint(resumed / "last.pt")
    assert a["epoch"] == b["epoch"] == epochs and a["step"] == b["step"]
    for key in a["model"]:
        assert torch.equal(a["model"][key], b["model"][key]), key
    return a


# -- exact resume ---------------------------------------------------------------------------------------------------
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


def test_a_sigint_during_the_optimizer_step_waits_for_the_step_and_the_resume_is_exact(tmp_path, monkeypatch):
    """A real SIGINT while the scheduler steps (after the weights moved, before the step is counted): held until the
    update and its counts are whole, so last.pt counts exactly the updates its weights have."""
    import os
    import signal

    train(tiny_config(tmp_path / "straight"))
    real_step, calls = torch.optim.lr_scheduler.LambdaLR.step, []

    def step_interrupted(self, *args, **kwargs):
        calls.append(1)
        if len(calls) == 6:  # the LambdaLR's first step is its construction: this is update 5, epoch 2
            os.kill(os.getpid(), signal.SIGINT)
        return real_step(self, *args, **kwargs)

    monkeypatch.setattr(torch.optim.lr_scheduler.LambdaLR, "step", step_interrupted)
    with pytest.raises(KeyboardInterrupt):
        train(tiny_config(tmp_path / "cut"))
    monkeypatch.setattr(torch.optim.lr_scheduler.LambdaLR, "step", real_step)
    saved = load_checkpoint(tmp_path / "cut" / "last.pt")
    assert (saved["epoch"], saved["batches_done"], saved["step"]) == (1, 2, 5)
    assert saved["scheduler"]["last_epoch"] == saved["step"]  # the schedule counted the step it took
    train(tiny_config(tmp_path / "cut"), resume=tmp_path / "cut")
    assert_same_end(tmp_path / "straight", tmp_path / "cut")


def test_exact_resume_with_rescaled_scans_is_bit_identical_too(tmp_path):
    """data.augment.scale: factors per (seed, epoch, sample) and batches by each epoch's sizes resume exactly."""

    def rescaled(run_dir, **options):
        cfg = tiny_config(run_dir, **options)
        return resolve({**cfg, "data": {**cfg["data"], "augment": {"hflip": 0.5, "scale": [0.7, 1.4]}}})

    train(rescaled(tmp_path / "straight"))
    train(rescaled(tmp_path / "stopped", stop_after=2))
    train(rescaled(tmp_path / "stopped"), resume=tmp_path / "stopped")
    assert_same_end(tmp_path / "straight", tmp_path / "stopped")


@pytest.mark.slow
def test_accumulation_resumes_exactly_and_the_schedule_counts_updates(tmp_path):
    """8 training scans in batches of 3 (3 batches an epoch), 2 batches an update: 2 updates an epoch, 8 in 4
    epochs, and the cosine schedule over 8 steps ends at lr x min_lr_ratio."""
    train(tiny_config(tmp_path / "straight", accumulate=2))
    train(tiny_config(tmp_path / "stopped", accumulate=2, stop_after=2))
    train(tiny_config(tmp_path / "stopped", accumulate=2), resume=tmp_path / "stopped")
    a = load_checkpoint(tmp_path / "straight" / "last.pt")
    b = load_checkpoint(tmp_path / "stopped" / "last.pt")
    assert a["step"] == b["step"] == 8
    assert all(torch.equal(a["model"][k], b["model"][k]) for k in a["model"])
    rows = [json.loads(x) for x in (tmp_path / "straight" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [2, 4, 6, 8] and rows[-1]["lr"] == pytest.approx(0.01 * 0.01)


def dropout_config(run_dir, **train):
    """tiny_config with dropout before the UNet's head (model.args.dropout): the model draws in every update."""
    cfg = tiny_config(run_dir, **train)
    return resolve({**cfg, "model": {**cfg["model"], "args": {"dropout": 0.5}}})


@pytest.mark.slow
@pytest.mark.parametrize("make", [tiny_config, dropout_config], ids=["plain", "dropout"])
def test_a_ctrl_c_inside_an_update_saves_its_start_and_the_resumed_run_redoes_it(tmp_path, monkeypatch, make):
    """With dropout, the masks come from each batch's own generator (run seed, step, rank, batch), so the redone
    update draws the masks the straight run drew, though the cut one had drawn its first batch's already."""
    import srforge.train.assemble as trainer

    train(make(tmp_path / "straight", accumulate=2))
    real_loss, calls = trainer.segmentation_loss, []

    def interrupt(*args, **kwargs):
        calls.append(1)
        if len(calls) == 6:  # 3 training batches and 1 validation batch an epoch: epoch 2, its first update's second
            raise KeyboardInterrupt
        return real_loss(*args, **kwargs)

    monkeypatch.setattr(trainer, "segmentation_loss", interrupt)
    with pytest.raises(KeyboardInterrupt):
        train(make(tmp_path / "cut", accumulate=2))
    monkeypatch.setattr(trainer, "segmentation_loss", real_loss)
    saved = load_checkpoint(tmp_path / "cut" / "last.pt")
    assert (saved["epoch"], saved["batches_done"], saved["step"]) == (1, 0, 2)  # the update boundary before it
    train(make(tmp_path / "cut", accumulate=2), resume=tmp_path / "cut")
    a = assert_same_end(tmp_path / "straight", tmp_path / "cut")
    if make is dropout_config:  # ... and dropout did draw: without it the same run ends elsewhere
        train(tiny_config(tmp_path / "plain", accumulate=2))
        c = load_checkpoint(tmp_path / "plain" / "last.pt")
        assert not all(torch.equal(a["model"][k], c["model"][k]) for k in a["model"])


def test_an_updates_generator_is_its_own_per_step_and_rank_and_leaves_the_runs_as_it_was():
    from srforge.train.rng import update_randomness

    def draws(step, rank, part="batch 0"):
        with update_randomness(7, step, rank, torch.device("cpu"), part):
            return torch.rand(4)

    torch.manual_seed(0)
    before = torch.get_rng_state()
    first = draws(3, 0)
    assert torch.equal(torch.get_rng_state(), before)  # the run's generator is where it was
    assert torch.equal(draws(3, 0), first)
    assert not torch.equal(draws(3, 1), first)  # each rank its own masks
    assert not torch.equal(draws(4, 0), first)  # each update its own
    assert not torch.equal(draws(3, 0, "batch 1"), first)  # and each of its batches


def test_a_resume_that_turns_dropout_or_ink_on_or_off_changes_the_model_and_is_refused(tmp_path):
    """Runs written before UNet had ``dropout`` and ``ink`` do not name them: where one side does not, it is off."""
    from srforge.config import ConfigError
    from srforge.train.prepare import resume_checkpoint

    run = tmp_path / "run"
    train(tiny_config(run, epochs=1))
    plain = load_checkpoint(run / "last.pt")
    assert "dropout" not in plain["model_args"] and "ink" not in plain["model_args"]
    assert resume_checkpoint(run, tiny_config(run).model, plain) is plain
    with pytest.raises(ConfigError, match=r"model\.args\.dropout=0\.5 \(the checkpoint has 0\.0\)"):
        resume_checkpoint(run, dropout_config(run).model, plain)
    inked = tiny_config(run)
    with pytest.raises(ConfigError, match=r"model\.args\.ink=True \(the checkpoint has False\)"):
        resume_checkpoint(run, resolve({**inked, "model": {**inked["model"], "args": {"ink": True}}}).model, plain)
    dropping = {**plain, "model_args": {**plain["model_args"], "dropout": 0.5}}
    with pytest.raises(ConfigError, match=r"model\.args\.dropout=0\.0 \(the checkpoint has 0\.5\)"):
        resume_checkpoint(run, tiny_config(run).model, dropping)
    assert resume_checkpoint(run, dropout_config(run).model, dropping) is dropping


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


@pytest.mark.slow
def test_resuming_a_copied_run_writes_into_the_copy(trained, tmp_path, capsys):
    copy = tmp_path / "copy"
    shutil.copytree(trained, copy)
    original = _snapshot(trained)
    assert main_train(["--resume", str(copy), "train.epochs=2"]) == 0
    assert f"resuming {copy} at epoch 2" in capsys.readouterr().out
    assert _snapshot(trained) == original
    assert load_checkpoint(copy / "last.pt")["epoch"] == 2
    assert f"dir: {copy}" in (copy / "config.yaml").read_text()
    # a checkpoint file: its own folder; run.dir on the command line: there
    moved = tmp_path / "moved"
    shutil.copytree(trained, moved)
    assert main_train(["--resume", str(moved / "last.pt"), "train.epochs=2"]) == 0
    assert load_checkpoint(moved / "last.pt")["epoch"] == 2
    elsewhere = tmp_path / "elsewhere"
    assert main_train(["--resume", str(copy), "train.epochs=3", f"run.dir={elsewhere}"]) == 0
    assert load_checkpoint(elsewhere / "last.pt")["epoch"] == 3 and load_checkpoint(copy / "last.pt")["epoch"] == 2
    assert _snapshot(trained) == original


# -- resumes refused ------------------------------------------------------------------------------------------------
def test_resume_that_changes_num_classes_fails_before_writing(tmp_path, capsys):
    run = tmp_path / "run"
    train(tiny_config(run, epochs=1))
    before = {p.name: p.read_bytes() for p in run.iterdir() if p.is_file()}
    code = main_train(["--resume", str(run), "model.num_classes=3", "model.class_names=[a, b, c]"])
    err = capsys.readouterr().err
    assert code == 2, err
    assert "model.num_classes=3 (the checkpoint has 2)" in err and "A resumed run keeps its model" in err
    assert {p.name: p.read_bytes() for p in run.iterdir() if p.is_file()} == before  # config.yaml included


class FiveByFive(TinyNet):
    """TinyNet whose first conv became 5 x 5 (the code changed between a run and its resume)."""

    def __init__(self, in_channels=3, num_classes=2, width=8):
        super().__init__(in_channels, num_classes, width)
        self.encoder[0] = torch.nn.Conv2d(in_channels, width, 5, padding=2)


def test_resuming_after_the_models_code_changed_is_exit_2_and_config_yaml_stays(tmp_path, capsys, monkeypatch):
    root = scan_folder(tmp_path / "data", n=6)
    cfg = _config(tmp_path / "run", root)
    cfg["train"]["epochs"] = 1
    train(resolve(cfg))
    before = (tmp_path / "run" / "config.yaml").read_text()
    import test_model_create

    monkeypatch.setattr(test_model_create, "TinyNet", FiveByFive)
    assert main_train(["--resume", str(tmp_path / "run"), "train.epochs=2"]) == 2
    err = capsys.readouterr().err
    assert "--resume: the checkpoint's weights do not fit the test_trainer_resume.FiveByFive built now" in err
    assert "size mismatch for encoder.0.weight" in err and "Traceback" not in err
    assert (tmp_path / "run" / "config.yaml").read_text() == before
    assert load_checkpoint(tmp_path / "run" / "last.pt")["epoch"] == 1


@pytest.mark.slow
def test_a_mid_epoch_checkpoint_of_two_processes_is_not_resumed_by_one(tmp_path):
    run = tmp_path / "run"
    train(tiny_config(run, epochs=2, stop_after=1))
    ckpt = torch.load(run / "last.pt", weights_only=True)
    assert ckpt["world"] == 1
    ckpt.update(world=2, batches_done=1)
    torch.save(ckpt, run / "last.pt")
    with pytest.raises(ValueError, match=r"written in the middle of epoch 2 by 2 process\(es\), and this run has 1"):
        train(tiny_config(run, epochs=2), resume=run)
    ckpt.update(batches_done=0)  # at an epoch's end the batches are dealt anew: any number of processes may resume
    torch.save(ckpt, run / "last.pt")
    assert train(tiny_config(run, epochs=2), resume=run)["epoch"] == 2


@pytest.mark.slow
def test_a_resume_on_other_data_is_refused_unless_asked_and_other_changes_are_said(tmp_path, capsys):
    run = tmp_path / "run"
    train(tiny_config(run, epochs=2, stop_after=1))
    other = tiny_config(run, epochs=2)
    other["data"]["dataset"]["args"]["n"] = 12
    with pytest.raises(ValueError, match=r"other data than the checkpoint's \(data.dataset.args.n: 10 -> 12\)"):
        train(resolve(other), resume=run)
    assert load_checkpoint(run / "last.pt")["epoch"] == 1
    assert main_train(["--resume", str(run), "data.dataset.args.n=12", "train.lr=0.02"]) == 2
    assert main_train(["--resume", str(run), "data.dataset.args.n=12", "train.lr=0.02", "--allow-changes"]) == 0
    out = capsys.readouterr().out
    assert "resuming with a changed config: data.dataset.args.n: 10 -> 12" in out and "train.lr: 0.01 -> 0.02" in out
