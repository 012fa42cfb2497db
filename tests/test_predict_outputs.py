"""One scan's files in the prediction output folder (srforge.predict.outputs): a file srforge did not write is never
overwritten nor taken for a finished scan, a damaged output or another model's is predicted again, an output
that cannot be written fails that scan only.
"""

import json
import shutil

import numpy as np
import pytest
from predict_fixtures import (
    members,
    one_thread,  # noqa: F401  (a fixture)
    png,
    random_checkpoint,
    scan,
    write_folder,
    write_zip,
)
from test_cli_predict import predict, rows

from srforge.predict.outputs import model_of

pytestmark = pytest.mark.usefixtures("one_thread")


def ground_truth(h: int, w: int) -> bytes:
    """A user's mask: a complete PNG of the scan's size that srforge did not write."""
    return png(np.ones((h, w), np.uint8))


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


def test_a_name_too_long_to_write_fails_that_scan_only_and_reruns(tmp_path, ckpt):
    longest = "y" * 251 + ".png"  # 255 characters: the file fits, and so does its temporary name (a short one)
    too_long = "x" * 300 + ".png"  # a zip member's name has no such limit; its mask's file name does
    source = write_zip(tmp_path / "s.zip", {**members(3), longest: png(scan(2)), too_long: png(scan(1))})
    for _ in range(2):  # the rerun meets the same member and goes on as well
        assert predict(ckpt, source, tmp_path / "out") == 1
        report = rows(tmp_path / "out")
        assert report[too_long]["status"] == "failed" and "File name too long" in report[too_long]["error"]
        assert [report[n]["status"] for n in [*members(3), longest]] in (["ok"] * 4, ["skipped"] * 4)
    assert (tmp_path / "out" / "masks" / longest).is_file()


def test_a_folder_named_like_an_output_fails_one_scan_and_reruns(tmp_path, ckpt):
    source = write_folder(
        tmp_path / "in", {"d.tif": png(scan(0)), "d.png/inner.png": png(scan(1)), "e.png": png(scan(2))}
    )
    for workers in ("0", "2"):
        assert predict(ckpt, source, tmp_path / "out", "--workers", workers) == 1
        report = rows(tmp_path / "out")
        statuses = sorted(r["status"] for r in report.values())
        assert statuses[0] == "failed" and len(report) == 3 and report["e.png"]["status"] in ("ok", "skipped")
        failed = next(r for r in report.values() if r["status"] == "failed")
        assert "cannot write the outputs" in failed["error"] and "masks/d.png" in failed["error"]
