"""The input and output of a prediction run (srforge.predict.folders), checked before anything is read or written:
they never overlap, an input is a file or a folder, links in the output and someone else's report are refused,
a read-only output named; one run at a time per output folder.
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest
from predict_fixtures import (
    members,
    one_thread,  # noqa: F401  (a fixture)
    write_folder,
)
from test_cli_predict import predict, tmpfs
from test_predict_outputs import ground_truth

from srforge.predict.folders import hold_output

ROOT = Path(__file__).resolve().parents[1]


pytestmark = pytest.mark.usefixtures("one_thread")


def test_input_and_output_that_overlap_are_refused(tmp_path, ckpt, capsys):
    data = tmp_path / "my_data"
    write_folder(data / "images", members(3))
    write_folder(data / "masks", {"scan_001.png": ground_truth(10, 20)})
    before = {p: p.read_bytes() for p in data.rglob("*") if p.is_file()}
    assert predict(ckpt, data / "images", data) == 2
    err = capsys.readouterr().err
    assert f"--input {data / 'images'} is inside --output {data}" in err and "neither holds nor lies inside" in err
    assert predict(ckpt, data / "masks", data) == 2  # --input out/masks --output out
    assert {p: p.read_bytes() for p in data.rglob("*") if p.is_file()} == before  # nothing written, nothing lost
    # an output equal to the input or inside it
    source = write_folder(tmp_path / "in", members(2))
    for out in (source, source / "predictions"):
        assert predict(ckpt, source, out) == 2
        assert "its masks would be read back as scans" in capsys.readouterr().err
    assert not (source / "predictions").exists() and not (source / "masks").exists()


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["device", "fifo"])
def test_an_input_that_is_not_a_file_or_folder_is_exit_2_at_once(tmp_path, ckpt, kind):
    source = Path("/dev/zero")
    if kind == "fifo":
        source = tmp_path / "pipe"
        os.mkfifo(source)
    script = [sys.executable, str(ROOT / "scripts" / "predict.py"), "--checkpoint", str(ckpt)]
    done = subprocess.run(
        [*script, "--input", str(source), "--output", str(tmp_path / "out")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2 and "is not a regular file or a folder" in done.stderr
    assert "Traceback" not in done.stderr


def test_links_inside_the_output_folder_are_refused(tmp_path, ckpt, capsys):
    source = write_folder(tmp_path / "in", members(2))
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (tmp_path / "out").mkdir()
    os.symlink(elsewhere, tmp_path / "out" / "masks")
    assert predict(ckpt, source, tmp_path / "out") == 2
    assert "out/masks is a symbolic link inside the output folder" in capsys.readouterr().err
    assert not list(elsewhere.iterdir())


def test_a_read_only_output_is_exit_2(tmp_path, ckpt, capsys):
    source = write_folder(tmp_path / "in", members(2))
    with tmpfs(tmp_path / "ro", "ro,size=1m") as out:
        assert predict(ckpt, source, out / "predictions") == 2
    assert "cannot write into --output" in capsys.readouterr().err


def test_someone_elses_report_in_the_output_folder_is_refused(tmp_path, ckpt, capsys):
    source = write_folder(tmp_path / "in", members(2))
    out = tmp_path / "out"
    out.mkdir()
    (out / "report.csv").write_text("id,label\n1,cat\n")
    assert predict(ckpt, source, out) == 2
    assert f"{out / 'report.csv'} is not a report srforge wrote" in capsys.readouterr().err
    assert (out / "report.csv").read_text() == "id,label\n1,cat\n" and not (out / "masks").exists()


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
