"""A run folder is one run's, and a run survives what stops it: a folder holding a run refused (--resume,
--overwrite), two runs at once refused, SIGTERM and a killed DataLoader worker leave a resumable last.pt, a
second interrupt while it is written, and epochs that teach nothing (all masks ignored, every batch skipped)."""

import json
import os
import re
import shutil
import signal
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from test_train import ROOT, TRAIN, TinyStrips, tiny_config
from torch.utils.data import get_worker_info

import srforge.train.assemble as step_module
import srforge.train.trainer as state_module
from srforge.cli import main_train
from srforge.config import resolve
from srforge.runtime.checkpoint import load_checkpoint
from srforge.train import RunExistsError, train
from srforge.train.stop import worker_lost


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
    cfg["data"]["dataset"]["class"] = "test_train_workflow:Strips"
    cfg["data"]["dataset"]["args"] = {"n": 10, **args}
    return cfg


def config_file(path: Path, cfg) -> str:
    path.write_text(yaml.safe_dump(cfg))
    return str(path)


def snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


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


# -- a run folder that holds a run ----------------------------------------------------------------------------
def test_a_finished_run_folder_is_refused_until_resume_or_overwrite(tmp_path, capsys):
    run = tmp_path / "run"
    train(config(run, epochs=2))
    (run / "notes.txt").write_text("the user's own file")
    (run / "tensorboard").mkdir()
    (run / "tensorboard" / "events.out.tfevents.1").write_text("the old run's curves")
    before = snapshot(run)
    capsys.readouterr()

    again = config_file(tmp_path / "again.yaml", config(run, epochs=3))
    assert main_train(["--config", again]) == 2
    err = capsys.readouterr().err
    assert f"{run} already holds a run (last.pt, best.pt, metrics.jsonl)" in err, err
    assert f"--resume {run}" in err and "--overwrite" in err and "run.dir=OTHER_FOLDER" in err
    with pytest.raises(RunExistsError, match="train\\(cfg, overwrite=True\\)"):  # the Python API refuses too
        train(config(run, epochs=3))
    assert snapshot(run) == before  # nothing written, the lock file included

    assert main_train(["--resume", str(run), "--overwrite"]) == 2  # overwriting the run it continues: refused
    assert "overwriting would remove the run that --resume continues" in capsys.readouterr().err
    assert main_train(["--resume", str(run), "train.epochs=3"]) == 0  # --resume continues it
    assert epochs_logged(run) == [1, 2, 3]

    fresh = config_file(tmp_path / "fresh.yaml", config(run, epochs=1))
    assert main_train(["--config", fresh, "--overwrite"]) == 0  # --overwrite starts over
    assert epochs_logged(run) == [1] and len((run / "metrics.csv").read_text().splitlines()) == 2
    assert load_checkpoint(run / "last.pt")["epoch"] == load_checkpoint(run / "best.pt")["epoch"] == 1
    assert not (run / "tensorboard").exists() and (run / "notes.txt").read_text() == "the user's own file"


# -- two runs at once -------------------------------------------------------------------------------------------
def test_a_second_run_into_a_folder_in_use_is_refused_and_the_first_completes(tmp_path, capsys):
    run, trace, release = tmp_path / "run", tmp_path / "reads.txt", tmp_path / "release"
    held = config(run, epochs=2, trace=str(trace), hold_at=1, release=str(release))
    first = start_train(tmp_path, config_file(tmp_path / "first.yaml", held), "first.log")
    try:
        wait_for_reads(trace, 1, first, tmp_path / "first.log")  # the folder is held before the first sample
        lock, before = (run / ".srforge.lock").read_bytes(), snapshot(run)
        second = config_file(tmp_path / "second.yaml", config(run, epochs=5))
        assert main_train(["--config", second]) == 2
        err = capsys.readouterr().err
        assert f"this run folder is in use by process {first.pid} on " in err and "train.py" in err, err
        assert main_train(["--config", second, "--overwrite"]) == 2  # not even --overwrite
        assert main_train(["--resume", str(run)]) == 2 and f"process {first.pid}" in capsys.readouterr().err
        assert snapshot(run) == before and (run / ".srforge.lock").read_bytes() == lock  # nothing written
        release.touch()
        assert first.wait(timeout=120) == 0, (tmp_path / "first.log").read_text()[-2000:]
    finally:
        stop(first)
    assert epochs_logged(run) == [1, 2] and load_checkpoint(run / "last.pt")["epoch"] == 2
    assert "epochs: 2" in (run / "config.yaml").read_text()


# -- preemption -------------------------------------------------------------------------------------------------
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


# -- epochs that teach nothing ---------------------------------------------------------------------------------
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


class RemovesTheRunFolder:
    """A hook that deletes the run folder under the running train (as a careless `rm -r runs/x` would)."""

    def after_step(self):
        if self.trainer.step == 1 and self.trainer.run_dir.exists():
            shutil.rmtree(self.trainer.run_dir)


def test_a_run_folder_removed_under_a_running_train_stops_it_saying_what_was_lost(tmp_path, capsys):
    run = tmp_path / "run"
    cfg = tiny_config(run, epochs=3)
    cfg["train"]["hooks"] = [{"class": "test_train_workflow:RemovesTheRunFolder"}]
    config_file = tmp_path / "cfg.yaml"
    config_file.write_text(yaml.safe_dump(cfg))
    assert main_train(["--config", str(config_file)]) == 1
    err = capsys.readouterr().err
    assert f"{run} (or its .srforge.lock) was removed while this run was writing into it" in err
    assert "this run stops without writing best.pt" in err and "Traceback" not in err
    assert not (run / "last.pt").exists() and not (run / "metrics.jsonl").exists()


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


def test_a_lost_torchrun_peer_is_a_message_with_how_to_resume_not_a_traceback(tmp_path):
    from test_train import torchrun_two

    script = tmp_path / "peer_gone.py"
    script.write_text(PEER_GONE)
    args = ["--config", str(ROOT / "configs" / "custom_dataset.yaml"), f"run.dir={tmp_path / 'ddp'}",
            "data.dataset.args.n=12", "data.batch_size=2", "model.base_channels=4", "train.epochs=2"]  # fmt: skip
    done = torchrun_two(script, *args, cwd=ROOT)
    assert done.returncode != 0
    said = done.stdout + done.stderr
    assert "another process of this torchrun job stopped ([gloo/transport/tcp/pair.cc:534] Connection reset" in said
    assert f"{tmp_path / 'ddp' / 'last.pt'} holds the end of epoch 1" in said and "--nproc_per_node=2" in said
    assert "srforge/train/trainer.py" not in said  # no traceback of srforge's
    assert load_checkpoint(tmp_path / "ddp" / "last.pt")["epoch"] == 1
    # last.pt holds an epoch's end, so any number of processes may continue it: one, here
    assert main_train([*args, "--resume", str(tmp_path / "ddp")]) == 0
    assert load_checkpoint(tmp_path / "ddp" / "last.pt")["epoch"] == 2


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


def test_a_run_stopped_before_its_first_checkpoint_is_requeued_by_resume(tmp_path, capsys):
    run = tmp_path / "run"
    config_file = tmp_path / "cfg.yaml"
    config_file.write_text(yaml.safe_dump(tiny_config(run, epochs=1)))
    run.mkdir()
    (run / "config.yaml").write_text(config_file.read_text())  # what a run stopped during its first epoch leaves
    assert main_train(["--resume", str(run)]) == 0
    assert f"{run.resolve()} holds no checkpoint yet" in capsys.readouterr().out
    assert load_checkpoint(run / "last.pt")["epoch"] == 1
    (run / "last.pt").unlink()  # best.pt written, then the disk was full at last.pt
    assert main_train(["--resume", str(run)]) == 2
    err = capsys.readouterr().err
    assert f"{(run / 'best.pt').resolve()} does: continue from it with --resume {run / 'best.pt'}" in err


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
