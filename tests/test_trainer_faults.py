"""A run survives what stops it (srforge.train.stop and the Trainer's last.pt): Ctrl-C and SIGTERM mid-epoch or
while a checkpoint is written, a second interrupt, a killed DataLoader worker, a lost torchrun peer, a full disk,
a run folder removed under the run; epochs that teach nothing (all masks ignored, every batch skipped) end with a
clear error.
"""

import contextlib
import errno
import json
import os
import re
import shutil
import signal
import subprocess
import time
import uuid
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from test_train import ROOT, TRAIN, TinyStrips, tiny_config
from torch.utils.data import get_worker_info

import srforge.train.assemble as step_module
import srforge.train.trainer as state_module
import srforge.train.trainer as trainer
from srforge.atomic import DiskFullError
from srforge.cli import main_train
from srforge.runtime.checkpoint import load_checkpoint
from srforge.train import train
from srforge.train.stop import worker_lost


@contextlib.contextmanager
def _tmpfs(path, size):
    """A tmpfs of ``size`` mounted at ``path`` (root only); skips the test where mounting is not permitted."""
    path.mkdir(parents=True, exist_ok=True)
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", f"srforge-{uuid.uuid4().hex[:8]}", path])
    if done.returncode != 0:
        pytest.skip("mount -t tmpfs is not permitted here")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", path])


def _config_file(tmp_path, run_dir, **train):
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(tiny_config(run_dir, **train)))
    return path


class Strips(TinyStrips):
    """TinyStrips with ``sizes()`` (so no sample is read before training starts) and faults on demand: a ``trace``
    file that gains a line per sample read; at the ``hold_at``-th read a pause until the file ``release`` exists
    (60 s at most) -- a run caught mid-epoch, for the test to act; every mask all 255; every image all NaN; a
    DataLoader worker that SIGKILLs itself at index ``kill_at``, once (``kill_marker`` remembers it)."""

    def __init__(
        self,
        n=10,
        trace=None,
        hold_at=None,
        release=None,
        kill_at=None,
        kill_marker=None,
        all_ignore=False,
        all_nan=False,
    ):
        super().__init__(n, float_images=all_nan)
        self.trace, self.hold_at, self.release, self.reads = trace, hold_at, release, 0
        self.kill_at, self.kill_marker, self.all_ignore, self.all_nan = kill_at, kill_marker, all_ignore, all_nan

    def sizes(self):
        return [(12 + i % 5, 20 + 7 * i) for i in range(self.n)]

    def __getitem__(self, i):
        if i == self.kill_at and get_worker_info() is not None and not Path(self.kill_marker).exists():
            Path(self.kill_marker).touch()
            os.kill(os.getpid(), signal.SIGKILL)  # as the out-of-memory killer would
        sample = super().__getitem__(i)
        if self.all_ignore:
            sample["labels"][:] = 255
        if self.all_nan:
            sample["scan"][:] = np.nan
        if self.trace:
            with open(self.trace, "a") as f:
                f.write(f"{i}\n")
        self.reads += 1
        deadline = time.time() + 60
        while self.reads == self.hold_at and not Path(str(self.release)).exists() and time.time() < deadline:
            time.sleep(0.01)  # where a signal lands, in this test's children
        return sample


def config(run_dir, epochs=3, **args):
    cfg = tiny_config(run_dir, epochs=epochs)
    cfg["data"]["dataset"]["class"] = "test_trainer_faults:Strips"
    cfg["data"]["dataset"]["args"] = {"n": 10, **args}
    return cfg


def config_file(path: Path, cfg) -> str:
    path.write_text(yaml.safe_dump(cfg))
    return str(path)


def epochs_logged(run: Path) -> list[int]:
    return [json.loads(line)["epoch"] for line in (run / "metrics.jsonl").read_text().splitlines()]


def same_weights(a: Path, b: Path) -> bool:
    wa, wb = load_checkpoint(a)["model"], load_checkpoint(b)["model"]
    return wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)


def start_train(tmp_path: Path, cfg_path: str, log: str) -> subprocess.Popen:
    """``scripts/train.py --config cfg_path`` in a child that imports this module's Strips, with this process's
    thread count (so that its arithmetic is the same bits as a run in this process); output to tmp_path/log."""
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT / "tests"), os.environ.get("PYTHONPATH", "")]),
        "OMP_NUM_THREADS": str(torch.get_num_threads()),
    }
    with open(tmp_path / log, "w") as out:
        return subprocess.Popen(
            [*TRAIN, "--config", cfg_path], stdout=out, stderr=subprocess.STDOUT, cwd=tmp_path, env=env
        )


def wait_for_reads(trace: Path, count: int, proc: subprocess.Popen, log: Path, timeout: float = 120) -> None:
    """Until the child has read ``count`` samples (lines of ``trace``); fails if it ends first or takes too long."""
    deadline = time.time() + timeout
    while not trace.exists() or len(trace.read_text().splitlines()) < count:
        assert proc.poll() is None, f"the run ended early ({proc.returncode}): {log.read_text()[-2000:]}"
        assert time.time() < deadline, "the run read too few samples in time"
        time.sleep(0.02)


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.kill()
    proc.wait(timeout=30)


# -- interrupts -----------------------------------------------------------------------------------------------------
def test_ctrl_c_while_best_pt_is_written_leaves_best_pt_right_after_resume(tmp_path, monkeypatch):
    run = tmp_path / "run"
    real_save, best_writes = trainer.save_checkpoint, []

    def interrupt_second_best_write(payload, path):
        if path.name == "best.pt":
            best_writes.append(payload["epoch"])
            if len(best_writes) == 2:
                raise KeyboardInterrupt  # the moment best.pt is being written (atomic: the old one stays)
        return real_save(payload, path)

    monkeypatch.setattr(trainer, "save_checkpoint", interrupt_second_best_write)
    with pytest.raises(KeyboardInterrupt):
        train(tiny_config(run))
    monkeypatch.setattr(trainer, "save_checkpoint", real_save)
    assert best_writes == [1, 2] and load_checkpoint(run / "best.pt")["epoch"] == 1
    summary = train(tiny_config(run, stop_after=1), resume=run)  # ends after epoch 2 again
    best, last = load_checkpoint(run / "best.pt"), load_checkpoint(run / "last.pt")
    assert summary["epoch"] == 2 and best["epoch"] == last["epoch"] == 2
    assert best["best_metric"] == summary["best_mean_iou"] == summary["val_mean_iou"]
    assert all(torch.equal(best["model"][k], last["model"][k]) for k in best["model"])


def test_a_ctrl_c_inside_torch_save_of_best_pt_stops_the_run_cleanly_after_both_files(tmp_path, monkeypatch):
    """A real SIGINT in the middle of torch.save: held until best.pt and last.pt are whole, then the run stops as
    on any Ctrl-C (KeyboardInterrupt, not torch's zip-writer RuntimeError), the epoch's metrics row written."""
    run = tmp_path / "run"
    real_save = torch.save

    def save_interrupted(obj, f, *args, **kwargs):
        if getattr(f, "name", "").startswith(str(run / ".best.pt")):
            os.kill(os.getpid(), signal.SIGINT)  # lands while torch.save writes its zip
        return real_save(obj, f, *args, **kwargs)

    monkeypatch.setattr(torch, "save", save_interrupted)
    with pytest.raises(KeyboardInterrupt):
        train(tiny_config(run, epochs=3))
    best, last = load_checkpoint(run / "best.pt"), load_checkpoint(run / "last.pt")
    assert best["epoch"] == last["epoch"] == 1 and last["batches_done"] == 0
    rows = (run / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(row)["epoch"] for row in rows] == [1]


@pytest.mark.slow
def test_sigterm_mid_epoch_writes_last_pt_and_the_resumed_run_is_bit_identical(tmp_path, capsys):
    run, trace, log = tmp_path / "run", tmp_path / "reads.txt", tmp_path / "cut.log"
    # Epoch 1 reads 8 training and 2 validation samples, batches of 3: the 14th read is epoch 2's second batch.
    held = config(run, trace=str(trace), hold_at=14, release=str(tmp_path / "never"))
    cut = start_train(tmp_path, config_file(tmp_path / "cut.yaml", held), log.name)
    try:
        wait_for_reads(trace, 14, cut, log)
        cut.send_signal(signal.SIGTERM)
        assert cut.wait(timeout=120) == 143, log.read_text()[-2000:]
    finally:
        stop(cut)
    out, saved = log.read_text(), load_checkpoint(run / "last.pt")
    assert (saved["epoch"], saved["batches_done"], saved["step"]) == (1, 1, 4)
    assert f"interrupted; wrote {run / 'last.pt'} at epoch 2, batch 1 (SIGTERM). Continue with --resume {run}" in out
    assert "Traceback" not in out
    assert main_train(["--resume", str(run), "data.dataset.args.hold_at=null", "--allow-changes"]) == 0
    assert f"resuming {run} at epoch 2, step 4" in capsys.readouterr().out
    train(config(tmp_path / "straight"))
    assert same_weights(run / "last.pt", tmp_path / "straight" / "last.pt")


def _interrupt_at_the_sixth_loss(monkeypatch):
    """A Ctrl-C at the 6th loss computed: 3 training batches and 1 validation batch an epoch, so epoch 2, batch 2."""
    real_loss, calls = step_module.segmentation_loss, []

    def loss(*args, **kwargs):
        calls.append(1)
        if len(calls) == 6:
            raise KeyboardInterrupt
        return real_loss(*args, **kwargs)

    monkeypatch.setattr(step_module, "segmentation_loss", loss)


@pytest.mark.slow
def test_a_second_ctrl_c_while_last_pt_is_written_waits_for_the_write(tmp_path, monkeypatch, capsys):
    run, real_save = tmp_path / "run", state_module.save_checkpoint
    _interrupt_at_the_sixth_loss(monkeypatch)

    def save_with_a_second_ctrl_c(payload, path):
        if payload["batches_done"]:  # the interrupted run's save, mid-epoch
            signal.raise_signal(signal.SIGINT)
        return real_save(payload, path)

    monkeypatch.setattr(state_module, "save_checkpoint", save_with_a_second_ctrl_c)
    with pytest.raises(KeyboardInterrupt):
        train(config(run))
    saved = load_checkpoint(run / "last.pt")
    assert (saved["epoch"], saved["batches_done"], saved["step"]) == (1, 1, 4)
    out = capsys.readouterr().out
    assert f"interrupted; wrote {run / 'last.pt'} at epoch 2, batch 1 (Ctrl-C)" in out
    assert f"SIGINT came while {run / 'last.pt'} was written; it was written in full first" in out
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # the handlers are back


@pytest.mark.slow
def test_an_interrupted_write_of_last_pt_says_what_last_pt_still_holds(tmp_path, monkeypatch, capsys):
    run, real_save = tmp_path / "run", state_module.save_checkpoint
    _interrupt_at_the_sixth_loss(monkeypatch)

    def save_cut_short(payload, path):
        if payload["batches_done"]:
            raise KeyboardInterrupt  # however it came: the write did not happen
        return real_save(payload, path)

    monkeypatch.setattr(state_module, "save_checkpoint", save_cut_short)
    with pytest.raises(KeyboardInterrupt):
        train(config(run))
    out = capsys.readouterr().out
    assert (
        f"interrupted again while {run / 'last.pt'} was written: it was NOT updated and still holds the end of "
        f"epoch 1, not epoch 2, batch 1; --resume {run} repeats the batches since" in out
    )
    assert "interrupted; wrote" not in out and not list(run.glob(".*.srforge-tmp"))
    saved = load_checkpoint(run / "last.pt")
    assert (saved["epoch"], saved["batches_done"]) == (1, 0)
    monkeypatch.undo()
    assert train(config(run), resume=run)["epoch"] == 3


# -- lost workers and peers -----------------------------------------------------------------------------------------
def test_a_killed_dataloader_worker_writes_last_pt_and_exits_3(tmp_path, capsys):
    run = tmp_path / "run"
    cfg = config(run, epochs=2, kill_at=0, kill_marker=str(tmp_path / "killed"))
    cfg["data"]["num_workers"] = 1
    assert main_train(["--config", config_file(tmp_path / "c.yaml", cfg)]) == 3
    err = capsys.readouterr().err
    # the signal's name is known when torch's SIGCHLD handler saw the death (as here, at once), else "died"
    assert re.search(r"srforge-train: error: DataLoader worker \(pid \d+\) (was killed by signal Killed|died)", err)
    assert "most likely out of memory" in err and "data.num_workers (now 1)" in err
    assert f"wrote {run / 'last.pt'} at epoch 1" in err and f"continue with --resume {run}" in err
    assert "Traceback" not in err and (run / "last.pt").is_file()
    assert main_train(["--resume", str(run)]) == 0
    assert epochs_logged(run)[-1] == 2


def test_what_torch_says_of_a_dead_worker_is_read_into_one_sentence():
    killed = RuntimeError("DataLoader worker (pid 4242) is killed by signal: Killed. ")
    assert worker_lost(killed) == "DataLoader worker (pid 4242) was killed by signal Killed, most likely out of memory"
    try:  # the iterator's own message, raised from the handler's: the signal is read off the cause
        raise RuntimeError("DataLoader worker (pid(s) 4242, 4243) exited unexpectedly") from killed
    except RuntimeError as error:
        assert worker_lost(error).startswith("DataLoader worker (pid 4242, 4243) was killed by signal Killed")
    code = RuntimeError("DataLoader worker (pid 7) exited unexpectedly with exit code 1. Details are lost ...")
    assert worker_lost(code) == "DataLoader worker (pid 7) exited unexpectedly with exit code 1"
    term = RuntimeError("DataLoader worker (pid 7) is killed by signal: Terminated. ")
    assert worker_lost(term) == "DataLoader worker (pid 7) was killed by signal Terminated"  # no memory hint
    assert worker_lost(RuntimeError("CUDA error: an illegal memory access")) is None


PEER_GONE = """
import os, sys
import torch
from srforge.models import UNet

real_forward, seen = UNet.forward, []


def forward(self, image, sizes=None):  # rank 1 loses its peer in epoch 2, as gloo reports a rank that was killed
    if torch.is_grad_enabled():
        seen.append(1)
        if os.environ["RANK"] == "1" and len(seen) == 7:  # 3 in the memory probe, 3 batches an epoch
            raise RuntimeError("[gloo/transport/tcp/pair.cc:534] Connection reset by peer (simulated)")
    return real_forward(self, image, sizes)


UNet.forward = forward
from srforge.cli import main_train
from srforge.config import resolve

sys.exit(main_train())
"""


@pytest.mark.slow
def test_a_lost_torchrun_peer_is_a_message_with_how_to_resume_not_a_traceback(tmp_path):
    from test_train import torchrun_two

    script = tmp_path / "peer_gone.py"
    script.write_text(PEER_GONE)
    args = ["--config", str(ROOT / "configs" / "custom_dataset.yaml"), f"run.dir={tmp_path / 'ddp'}",
            "data.dataset.args.n=12", "data.batch_size=2", "model.base_channels=4", "train.epochs=2"]  # fmt: skip
    done = torchrun_two(script, *args, cwd=ROOT, fresh=(tmp_path / "ddp",))
    assert done.returncode != 0
    said = done.stdout + done.stderr
    assert "another process of this torchrun job stopped ([gloo/transport/tcp/pair.cc:534] Connection reset" in said
    assert f"{tmp_path / 'ddp' / 'last.pt'} holds the end of epoch 1" in said and "--nproc_per_node=2" in said
    assert "srforge/train/trainer.py" not in said  # no traceback of srforge's
    assert load_checkpoint(tmp_path / "ddp" / "last.pt")["epoch"] == 1
    # last.pt holds an epoch's end, so any number of processes may continue it: one, here
    assert main_train([*args, "--resume", str(tmp_path / "ddp")]) == 0
    assert load_checkpoint(tmp_path / "ddp" / "last.pt")["epoch"] == 2


# -- epochs that teach nothing --------------------------------------------------------------------------------------
def test_masks_that_ignore_every_pixel_end_with_a_clear_error(tmp_path, capsys):
    run = tmp_path / "run"
    assert main_train(["--config", config_file(tmp_path / "c.yaml", config(run, epochs=2, all_ignore=True))]) == 2
    err = capsys.readouterr().err
    assert "no training pixel has a class: every mask of the training set is data.ignore_index=255 (epoch 1" in err, err
    assert not (run / "best.pt").exists() and not (run / "last.pt").exists()


def test_every_batch_skipped_as_non_finite_ends_with_a_clear_error(tmp_path, capsys):
    run = tmp_path / "run"
    cfg = config(run, epochs=2, all_nan=True)
    cfg["train"]["skip_nonfinite"] = True
    cfg["data"]["augment"] = {}
    assert main_train(["--config", config_file(tmp_path / "c.yaml", cfg)]) == 1
    err = capsys.readouterr().err
    assert "every batch of epoch 1 was skipped as non-finite (3 batches, train.skip_nonfinite=true)" in err, err
    assert not (run / "best.pt").exists() and not (run / "last.pt").exists()


# -- the disk and the run folder ------------------------------------------------------------------------------------
def test_a_full_disk_is_one_clear_line_and_exit_1(tmp_path, capsys):
    with _tmpfs(tmp_path / "small", "48k") as small:
        code = main_train(["--config", str(_config_file(tmp_path, small / "run", epochs=1))])
        err = capsys.readouterr().err
        assert code == 1, err
        assert f"no space left on {small / 'run'}" in err and "Traceback" not in err
        assert not list((small / "run").glob(".*.srforge-tmp"))  # the failed write left no temporary file


def test_a_full_disk_simulated_names_the_checkpoint(tmp_path, monkeypatch, capsys):
    """The same without a tmpfs: every checkpoint write raises ENOSPC, as torch.save would on a full disk."""

    def full(payload, path):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(trainer, "save_checkpoint", full)
    with pytest.raises(DiskFullError, match=r"no space left on .*best\.pt"):
        train(tiny_config(tmp_path / "run", epochs=1))
    code = main_train(["--config", str(_config_file(tmp_path, tmp_path / "run2", epochs=1))])
    assert code == 1 and "srforge-train: error: no space left on" in capsys.readouterr().err


class RemovesTheRunFolder:
    """A hook that deletes the run folder under the running train (as a careless `rm -r runs/x` would)."""

    def after_step(self):
        if self.trainer.step == 1 and self.trainer.run_dir.exists():
            shutil.rmtree(self.trainer.run_dir)


def test_a_run_folder_removed_under_a_running_train_stops_it_saying_what_was_lost(tmp_path, capsys):
    run = tmp_path / "run"
    cfg = tiny_config(run, epochs=3)
    cfg["train"]["hooks"] = [{"class": "test_trainer_faults:RemovesTheRunFolder"}]
    config_file = tmp_path / "cfg.yaml"
    config_file.write_text(yaml.safe_dump(cfg))
    assert main_train(["--config", str(config_file)]) == 1
    err = capsys.readouterr().err
    assert f"{run} (or its .srforge.lock) was removed while this run was writing into it" in err
    assert "this run stops without writing best.pt" in err and "Traceback" not in err
    assert not (run / "last.pt").exists() and not (run / "metrics.jsonl").exists()
