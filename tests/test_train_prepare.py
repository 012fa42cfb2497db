"""Before a run starts (srforge.train.prepare): the run folder is one run's -- a folder holding a run refused until
--resume or --overwrite, a second run into a folder in use refused while the first completes, a read-only folder
named -- and a killed run's temporary files swept.
"""

import subprocess
from pathlib import Path

import pytest
from test_train import tiny_config
from test_trainer_faults import (
    _config_file,
    _tmpfs,
    config,
    config_file,
    epochs_logged,
    start_train,
    stop,
    wait_for_reads,
)

from srforge.cli import main_train
from srforge.runtime.checkpoint import load_checkpoint
from srforge.train import RunExistsError, train


def snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


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


@pytest.mark.slow
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


def test_a_read_only_run_folder_is_named_with_exit_2(tmp_path, capsys):
    with _tmpfs(tmp_path / "ro", "1m") as ro:
        (ro / "run").mkdir()
        subprocess.run(["mount", "-o", "remount,ro", ro], check=True)
        code = main_train(["--config", str(_config_file(tmp_path, ro / "run", epochs=1))])
        err = capsys.readouterr().err
        assert code == 2, err
        assert f"run.dir: cannot write into {ro / 'run'}" in err and "Traceback" not in err
