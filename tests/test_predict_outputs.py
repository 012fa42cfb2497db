"""Prediction never destroys a user's data: input and output never overlap, a file srforge did not write is never
overwritten nor taken for a finished scan, outputs of another model are predicted again, one run at a time per
output folder; a killed run leaves no process behind, a preempted one writes its report; odd names and full disks
are reported truthfully; tiled scans are named in the report."""

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from predict_fixtures import (  # noqa: F401  (one_thread: a fixture)
    members,
    one_thread,
    png,
    random_checkpoint,
    scan,
    write_folder,
    write_tar,
)
from test_predict_hostile import predict, rows

from srforge.atomic import DiskFullError
from srforge.predict import pipeline
from srforge.predict.folders import hold_output
from srforge.predict.outputs import model_of

ROOT = Path(__file__).resolve().parents[1]
PREDICT = [sys.executable, str(ROOT / "scripts" / "predict.py")]
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return random_checkpoint(tmp_path_factory.mktemp("ckpt") / "random.pt")


def ground_truth(h: int, w: int) -> bytes:
    """A user's mask: a complete PNG of the scan's size that srforge did not write."""
    return png(np.ones((h, w), np.uint8))


# -- 1. the user's data ---------------------------------------------------------------------------------
def test_an_output_folder_holding_the_input_is_refused(tmp_path, ckpt, capsys):
    data = tmp_path / "my_data"
    write_folder(data / "images", members(3))
    write_folder(data / "masks", {"scan_001.png": ground_truth(10, 20)})
    before = {p: p.read_bytes() for p in data.rglob("*") if p.is_file()}
    assert predict(ckpt, data / "images", data) == 2
    err = capsys.readouterr().err
    assert f"--input {data / 'images'} is inside --output {data}" in err and "neither holds nor lies inside" in err
    assert predict(ckpt, data / "masks", data) == 2  # --input out/masks --output out
    assert {p: p.read_bytes() for p in data.rglob("*") if p.is_file()} == before  # nothing written, nothing lost


def test_a_file_srforge_did_not_write_is_never_overwritten_nor_skipped(tmp_path, ckpt):
    source = write_folder(tmp_path / "in", members(4))  # scan_001 is 10 x 20, scan_002 11 x 25
    out = tmp_path / "out"
    user = {
        out / "masks" / "scan_001.png": ground_truth(10, 20),
        out / "probabilities" / "scan_002.npy": b"someone's array",
    }
    for path, data in user.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    for extra in ([], ["--overwrite"]):
        assert predict(ckpt, source, out, "--probabilities", *extra) == 1
        report = rows(out)
        for name, path in (("scan_001.png", "masks/scan_001.png"), ("scan_002.png", "probabilities/scan_002.npy")):
            assert report[name]["status"] == "failed" and report[name]["fractions"] is None
            assert f"{out / path} is not a file srforge wrote" in report[name]["error"]
            assert "never overwrites it, not even with --overwrite" in report[name]["error"]
        assert {report[n]["status"] for n in ("sub/scan_000.png", "sub/scan_003.png")} <= {"ok", "skipped"}
        assert {path: path.read_bytes() for path in user} == user
    assert not (out / "masks" / "scan_002.png").exists()  # nothing of a refused scan is written
    (out / "masks" / "scan_001.png").unlink()  # moved away: now it is predicted
    (out / "probabilities" / "scan_002.npy").unlink()
    assert predict(ckpt, source, out, "--probabilities") == 0
    assert rows(out)["scan_001.png"]["status"] == "ok" and model_of(out / "masks" / "scan_001.png")


def test_someone_elses_report_in_the_output_folder_is_refused(tmp_path, ckpt, capsys):
    source = write_folder(tmp_path / "in", members(2))
    out = tmp_path / "out"
    out.mkdir()
    (out / "report.csv").write_text("id,label\n1,cat\n")
    assert predict(ckpt, source, out) == 2
    assert f"{out / 'report.csv'} is not a report srforge wrote" in capsys.readouterr().err
    assert (out / "report.csv").read_text() == "id,label\n1,cat\n" and not (out / "masks").exists()


def test_a_damaged_output_of_a_reported_scan_is_predicted_again(tmp_path, ckpt):
    source = write_folder(tmp_path / "in", members(3))
    out = tmp_path / "out"
    assert predict(ckpt, source, out) == 0
    mask = out / "masks" / "scan_001.png"
    mask.write_bytes(png(np.zeros((3, 3), np.uint8)))  # damaged after srforge wrote it: its report lists it
    assert predict(ckpt, source, out) == 0
    assert rows(out)["scan_001.png"]["status"] == "ok" and model_of(mask)
    (out / "report.json").unlink()  # without the report's word, an unmarked file is someone else's
    mask.write_bytes(png(np.zeros((3, 3), np.uint8)))
    assert predict(ckpt, source, out) == 1
    assert "is not a file srforge wrote" in rows(out)["scan_001.png"]["error"]


def test_outputs_of_another_model_are_predicted_again_and_of_the_same_weights_skipped(tmp_path, ckpt):
    source = write_folder(tmp_path / "in", members(6))
    out = tmp_path / "out"
    assert predict(ckpt, source, out, "--overlay") == 0
    copy = shutil.copy(ckpt, tmp_path / "copy.pt")  # the same weights in another file: the same model
    assert predict(copy, source, out, "--overlay") == 0
    assert {r["status"] for r in rows(out).values()} == {"skipped"}
    other = random_checkpoint(tmp_path / "other.pt", seed=1)
    renamed = random_checkpoint(tmp_path / "renamed.pt", class_names=("a", "b", "c"))  # same weights, other classes
    for model in (other, renamed):
        assert predict(model, source, out, "--overlay") == 0
        assert {r["status"] for r in rows(out).values()} == {"ok"}  # never skipped under another model's name
        assert predict(model, source, out, "--overlay") == 0
        assert {r["status"] for r in rows(out).values()} == {"skipped"}
    summary = json.loads((out / "report.json").read_text())["summary"]
    assert summary["classes"] == ["a", "b", "c"] and len(summary["model"]) == 32
    assert model_of(out / "overlays" / "scan_001.png") == summary["model"]


# -- 2. one run per output folder ---------------------------------------------------------------------
def test_a_second_run_into_a_held_output_folder_is_exit_2_naming_the_holder(tmp_path, ckpt, capsys):
    source = write_folder(tmp_path / "in", members(2))
    out = tmp_path / "out"
    out.mkdir()
    stale = out / ".stale.png.1234.srforge-tmp"  # a first run's file in flight: never swept by the second
    stale.write_bytes(b"in flight")
    with hold_output(out):
        assert predict(ckpt, source, out) == 2
        assert stale.exists() and not (out / "masks").exists()
    err = capsys.readouterr().err
    assert f"{out}: this output folder is in use by process {os.getpid()}" in err and "choose another folder" in err
    assert predict(ckpt, source, out) == 0  # released: the next run holds it, sweeps, and leaves no lock file
    assert not stale.exists() and not (out / ".srforge.lock").exists()


# -- 3 and 5. killed and preempted runs -----------------------------------------------------------------
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


# -- 6, 7, 8. the report --------------------------------------------------------------------------------
def test_a_name_that_is_not_utf8_is_written_and_reported(tmp_path, ckpt):
    source = tmp_path / "in"
    source.mkdir()
    try:
        (source / os.fsdecode(b"scan_\xff.png")).write_bytes(png(scan(1)))
    except (OSError, UnicodeError):
        pytest.skip("the file system takes no such names")
    write_folder(source, members(2))
    out = tmp_path / "out"
    for status in ("ok", "skipped"):  # the rerun reads the report back and writes it again
        assert predict(ckpt, source, out) == 0
        assert rows(out)["scan_\\xff.png"]["status"] == status
        assert "scan_\\xff.png," + status in (out / "report.csv").read_text(encoding="utf-8")
    assert os.path.isfile(os.path.join(os.fsencode(out), b"masks", b"scan_\xff.png"))


def test_a_report_the_full_disk_kept_from_being_written_is_not_called_written(tmp_path, ckpt, capsys, monkeypatch):
    source = write_folder(tmp_path / "in", members(2))
    out = tmp_path / "out"
    assert predict(ckpt, source, out) == 0  # an older report is there: it must not pass for this run's

    def no_space(out_dir, *args):
        raise DiskFullError(out_dir / "report.json")

    monkeypatch.setattr(pipeline, "write_report", no_space)
    assert predict(ckpt, source, out, "--overwrite") == 1
    err = capsys.readouterr().err
    assert f"no space left on {out / 'report.json'}; the report could not be written either" in err
    assert "holds what was done" not in err


def test_the_report_says_how_many_tiles_each_scan_was_cut_into(tmp_path, ckpt):
    files = {"wide.png": png(scan(0, h=24, w=160)), "small.png": png(scan(1, h=8, w=8))}
    source = write_folder(tmp_path / "in", files)
    out = tmp_path / "out"
    assert predict(ckpt, source, out, "--max-pixels", str(24 * 48)) == 0
    report = rows(out)
    assert report["wide.png"]["tiles"] > 1 and report["small.png"]["tiles"] == 1
    assert predict(ckpt, source, out) == 0
    assert rows(out)["wide.png"]["tiles"] is None  # skipped: not predicted by this run
