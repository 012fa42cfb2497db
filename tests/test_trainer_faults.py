"""Training under faults: Ctrl-C while best.pt is written, leftovers of a kill, a full disk, a read-only run folder,
a resume that would change the model."""

import contextlib
import errno
import json
import os
import signal
import subprocess
import uuid

import pytest
import torch
import yaml
from test_train import TinyStrips, tiny_config

import srforge.train.trainer as trainer
from srforge.atomic import DiskFullError
from srforge.cli import main_train
from srforge.runtime.checkpoint import load_checkpoint
from srforge.train import train


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


def test_temporary_files_of_a_killed_run_are_swept_at_start(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    stale = [run / ".last.pt.4242.srforge-tmp", run / ".metrics.csv.77.srforge-tmp"]
    for path in stale:
        path.write_bytes(b"half a file")
    (run / "notes.txt").write_text("the user's own file stays")
    train(tiny_config(run, epochs=1))
    assert not any(p.exists() for p in stale) and (run / "notes.txt").exists()
    assert not list(run.glob("*.srforge-tmp")) and not list(run.glob(".*.srforge-tmp"))


def test_image_mode_is_recorded_in_the_checkpoint(tmp_path):
    train(tiny_config(tmp_path / "rgb", epochs=1))
    assert load_checkpoint(tmp_path / "rgb" / "last.pt")["image_mode"] == "RGB"  # TinyStrips has no image_mode
    cfg = tiny_config(tmp_path / "gray", epochs=1)
    cfg["data"]["dataset"]["class"] = "test_train_faults:GrayStrips"
    train(cfg)
    assert load_checkpoint(tmp_path / "gray" / "last.pt")["image_mode"] == "L"


class GrayStrips(TinyStrips):
    image_mode = "L"  # what the images were decoded in, as SegmentationFolder(image_mode=...) records it


def test_resume_that_changes_num_classes_fails_before_writing(tmp_path, capsys):
    run = tmp_path / "run"
    train(tiny_config(run, epochs=1))
    before = {p.name: p.read_bytes() for p in run.iterdir() if p.is_file()}
    code = main_train(["--resume", str(run), "model.num_classes=3", "model.class_names=[a, b, c]"])
    err = capsys.readouterr().err
    assert code == 2, err
    assert "model.num_classes=3 (the checkpoint has 2)" in err and "A resumed run keeps its model" in err
    assert {p.name: p.read_bytes() for p in run.iterdir() if p.is_file()} == before  # config.yaml included


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


def test_a_read_only_run_folder_is_named_with_exit_2(tmp_path, capsys):
    with _tmpfs(tmp_path / "ro", "1m") as ro:
        (ro / "run").mkdir()
        subprocess.run(["mount", "-o", "remount,ro", ro], check=True)
        code = main_train(["--config", str(_config_file(tmp_path, ro / "run", epochs=1))])
        err = capsys.readouterr().err
        assert code == 2, err
        assert f"run.dir: cannot write into {ro / 'run'}" in err and "Traceback" not in err
