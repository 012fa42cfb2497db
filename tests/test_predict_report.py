"""The report of a prediction run (srforge.predict.report): every scan listed whatever the batch cap or --strict, odd
names written truthfully, a report the full disk kept from being written not called written, tiles counted.
"""

import os

import pytest
from predict_fixtures import (
    members,
    one_thread,  # noqa: F401  (a fixture)
    png,
    scan,
    write_folder,
    write_tar,
)
from test_cli_predict import predict, rows

from srforge.atomic import DiskFullError
from srforge.predict import pipeline

pytestmark = pytest.mark.usefixtures("one_thread")


def test_every_scan_is_in_the_report_whatever_the_batch_cap(tmp_path, ckpt):
    source = write_folder(tmp_path / "in", members(7))
    for cap in ("0", "1", "3", "auto"):
        assert predict(ckpt, source, tmp_path / cap, "--max-batch", cap, "--workers", "0") == 0
        assert sorted(rows(tmp_path / cap)) == sorted(members(7))


def test_strict_stops_at_the_first_failure_and_still_lists_every_scan(tmp_path, ckpt):
    source = write_folder(tmp_path / "in", {**members(4), "a_bad.png": b"junk"})
    for workers in ("0", "1"):
        assert predict(ckpt, source, tmp_path / f"out{workers}", "--strict", "--workers", workers) == 1
        report = rows(tmp_path / f"out{workers}")
        assert sorted(report) == sorted([*members(4), "a_bad.png"])
        assert report["a_bad.png"]["status"] == "failed"
        assert {report[n]["status"] for n in members(4)} == {"stopped"}


def test_strict_with_a_rejected_member_still_lists_every_scan(tmp_path, ckpt):

    source = write_tar(tmp_path / "scans.tar", members(3), links={"link.png": "/etc/passwd"})
    assert predict(ckpt, source, tmp_path / "out", "--strict", "--workers", "0") == 1
    report = rows(tmp_path / "out")
    assert sorted(report) == sorted([*members(3), "link.png"])
    assert report["link.png"]["status"] == "rejected"
    assert {report[n]["status"] for n in members(3)} == {"stopped"}


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
