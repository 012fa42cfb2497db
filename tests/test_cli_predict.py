"""srforge-predict, the command (srforge.cli.predict): every number checked and named, unusable options and inputs
exit status 2 or 1, a full disk named, a masks folder warned about, the report named by its absolute path; a
killed run leaves no process behind, a preempted one writes its report.
"""

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import numpy as np
import pytest
from helpers import scan_folder
from PIL import Image
from predict_fixtures import (
    members,
    one_thread,  # noqa: F401  (a fixture)
    random_checkpoint,
    write_folder,
    write_tar,
)

from srforge.cli import main_predict
from srforge.train import train

ROOT = Path(__file__).resolve().parents[1]


PREDICT = [sys.executable, str(ROOT / "scripts" / "predict.py")]


ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}


pytestmark = pytest.mark.usefixtures("one_thread")


def predict(ckpt, source, out, *extra) -> int:
    args = ["--checkpoint", str(ckpt), "--input", str(source), "--output", str(out), "--no-progress"]
    return main_predict([*args, *extra])


def rows(out: Path) -> dict[str, dict]:
    return {r["name"]: r for r in json.loads((out / "report.json").read_text())["scans"]}


@contextlib.contextmanager
def tmpfs(path: Path, options: str):
    """A small tmpfs at ``path`` (needs root and mount rights; the test is skipped otherwise)."""
    path.mkdir(parents=True, exist_ok=True)
    if os.geteuid() != 0 or subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(path)]).returncode:
        pytest.skip("mounting a tmpfs needs root")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


def _labelled(folder) -> None:
    for sub in ("images", "masks"):
        (folder / sub).mkdir(parents=True)
    rng = np.random.default_rng(0)
    for i, (h, w) in enumerate([(9, 13), (12, 20)]):
        Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)).save(folder / "images" / f"s{i}.png")
        Image.fromarray(rng.integers(0, 3, (h, w), dtype=np.uint8)).save(folder / "masks" / f"s{i}.png")


# -- options and inputs ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "option, value",
    [
        ("--max-batch", "-1"),
        ("--max-batch", "two"),
        ("--max-pixels", "0"),
        ("--max-pixels", "-5"),
        ("--tile-overlap", "-3"),
        ("--workers", "-1"),
    ],
)
def test_every_number_is_checked_and_named(tmp_path, ckpt, capsys, option, value):
    source = write_folder(tmp_path / "in", members(2))
    assert predict(ckpt, source, tmp_path / "out", option, value) == 2
    assert f"argument {option}: expected an integer >= " in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_a_budget_below_one_tile_is_exit_2(tmp_path, ckpt, capsys):
    source = write_folder(tmp_path / "in", members(2))
    assert predict(ckpt, source, tmp_path / "out", "--max-pixels", "5") == 2
    assert "max_pixels=5 is below one 8x8 tile" in capsys.readouterr().err


def test_empty_inputs_are_exit_1(tmp_path, ckpt, capsys):
    (tmp_path / "empty").mkdir()
    with zipfile.ZipFile(tmp_path / "empty.zip", "w"):
        pass
    for source in (tmp_path / "empty", tmp_path / "empty.zip"):
        assert predict(ckpt, source, tmp_path / "out") == 1
        assert f"no scans found in {source}" in capsys.readouterr().err


def test_fewer_class_names_than_classes_is_exit_2(tmp_path, capsys):
    source = write_folder(tmp_path / "in", members(2))
    short = random_checkpoint(tmp_path / "short.pt", class_names=["paper", "ink"])
    assert predict(short, source, tmp_path / "out") == 2
    assert "2 class names for a model of 3 classes" in capsys.readouterr().err


def test_predicting_a_masks_folder_or_a_dataset_root_is_warned_about(tmp_path, capsys):
    from test_train import tiny_config

    train(tiny_config(tmp_path / "run", epochs=1))
    root = scan_folder(tmp_path / "data", n=3)
    ckpt = str(tmp_path / "run" / "best.pt")
    cases = ((root / "masks", "looks like a folder of masks"), (root, "looks like a labelled dataset's root"))
    for given, said in cases:
        out = tmp_path / f"out_{given.name}"
        assert main_predict(["--checkpoint", ckpt, "--input", str(given), "--output", str(out), "--no-progress"]) == 0
        assert said in capsys.readouterr().err


@pytest.mark.slow
def test_a_full_disk_is_named_and_exit_1(tmp_path, ckpt, capsys):
    source = write_folder(tmp_path / "in", members(40, h=60, w=200))
    with tmpfs(tmp_path / "small", "size=64k") as out:
        assert predict(ckpt, source, out, "--workers", "0") == 1
        err = capsys.readouterr().err
        assert f"no space left on {out}" in err and "Traceback" not in err
        assert len(list((out / "masks").rglob("*.png"))) < 40
        for mask in (out / "masks").rglob("*.png"):  # whatever was written is whole
            assert mask.read_bytes().endswith(b"IEND\xaeB`\x82")


def test_predict_names_its_report_by_an_absolute_path(tmp_path, monkeypatch, capsys):
    random_checkpoint(tmp_path / "m.pt")
    _labelled(tmp_path / "data")
    monkeypatch.chdir(tmp_path)
    assert main_predict(["--checkpoint", "m.pt", "--input", "data/images", "--output", "out", "--workers", "0"]) == 0
    assert f"report: {tmp_path / 'out' / 'report.json'}" in capsys.readouterr().out


# -- killed and preempted runs --------------------------------------------------------------------------------------
def _children(pid: int) -> list[int]:
    """Running children of ``pid`` (zombies, which have ended, left out)."""
    found = []
    for entry in os.listdir("/proc"):
        try:
            fields = Path(f"/proc/{entry}/stat").read_bytes().rsplit(b")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[1]) == pid and fields[0] not in (b"Z", b"X"):
            found.append(int(entry))
    return found


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_bytes().rsplit(b")", 1)[1].split()[0] not in (b"Z", b"X")
    except OSError:
        return False


def _start(ckpt, source, out, *extra, capture: bool = True) -> subprocess.Popen:
    """The predict script in a subprocess; ``capture=False`` sends its output nowhere (an orphaned worker would
    hold captured pipes open, and reading them would wait for it instead of failing the test)."""
    args = [*PREDICT, "--checkpoint", str(ckpt), "--input", str(source), "--output", str(out), "--no-progress"]
    pipe = subprocess.PIPE if capture else subprocess.DEVNULL
    return subprocess.Popen([*args, *extra], env=ENV, stdout=pipe, stderr=pipe, text=True)


def _wait_for(condition, proc: subprocess.Popen, seconds: float = 120) -> None:
    deadline = time.time() + seconds
    while not condition() and proc.poll() is None and time.time() < deadline:
        time.sleep(0.01)
    assert proc.poll() is None, "the run ended before the test could stop it: give it more scans"


@pytest.mark.slow
@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="reads the process tree from /proc")
def test_a_killed_predict_leaves_no_decoding_worker_behind(tmp_path, ckpt):
    source = write_tar(tmp_path / "many.tar.gz", members(150, h=60, w=200))
    proc = _start(ckpt, source, tmp_path / "out", "--workers", "1", "--max-pixels", "12000", capture=False)
    _wait_for(lambda: _children(proc.pid), proc)
    workers = _children(proc.pid)
    proc.kill()
    proc.wait(timeout=60)
    deadline = time.time() + 5
    while any(map(_alive, workers)) and time.time() < deadline:
        time.sleep(0.05)
    assert not any(map(_alive, workers)), f"decoding workers {workers} outlived their SIGKILLed parent"


@pytest.mark.slow
@pytest.mark.parametrize("sent, status, said", [(signal.SIGTERM, 143, "SIGTERM"), (signal.SIGINT, 130, "Ctrl-C")])
def test_sigterm_and_ctrl_c_write_the_report_with_the_scans_not_reached_stopped(tmp_path, ckpt, sent, status, said):
    files = members(150, h=60, w=200)
    source = write_tar(tmp_path / "many.tar.gz", files)
    out = tmp_path / "out"
    proc = _start(ckpt, source, out, "--workers", "1", "--max-pixels", "12000")
    _wait_for(lambda: any((out / "masks").rglob("*.png")), proc)
    proc.send_signal(sent)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == status, err[-2000:]
    assert f"stopped by {said}; the report marks the scans not reached as stopped: {out / 'report.json'}" in err
    assert "Traceback" not in err
    report = json.loads((out / "report.json").read_text())
    statuses = [r["status"] for r in report["scans"]]
    assert sorted(r["name"] for r in report["scans"]) == sorted(files)
    assert set(statuses) == {"ok", "stopped"} and statuses.count("stopped") > 0 and report["summary"]["stopped_early"]
    assert len(list((out / "masks").rglob("*.png"))) == statuses.count("ok")  # every ok scan is written, no more
    assert not list(out.rglob("*.srforge-tmp")) and not (out / ".srforge.lock").exists()
