"""Careless and hostile prediction runs: every number checked, one bad scan never stops the run, unusable inputs
and outputs refused with exit status 2, a full disk reported by name."""

import contextlib
import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import torch
from predict_fixtures import members, png, random_checkpoint, scan, write_folder, write_zip

from srforge.cli import main_predict
from srforge.predict.predictor import Predictor
from srforge.runtime.device_memory import budget_from_memory

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return random_checkpoint(tmp_path_factory.mktemp("ckpt") / "random.pt")


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


def test_every_scan_is_in_the_report_whatever_the_batch_cap(tmp_path, ckpt):
    source = write_folder(tmp_path / "in", members(7))
    for cap in ("0", "1", "3", "auto"):
        assert predict(ckpt, source, tmp_path / cap, "--max-batch", cap, "--workers", "0") == 0
        assert sorted(rows(tmp_path / cap)) == sorted(members(7))


def test_a_name_too_long_to_write_fails_that_scan_only_and_reruns(tmp_path, ckpt):
    long_name = "x" * 251 + ".png"  # 255 characters: the file fits, its temporary name does not
    source = write_zip(tmp_path / "s.zip", {**members(3), long_name: png(scan(1))})
    for _ in range(2):  # the rerun meets the same member and goes on as well
        assert predict(ckpt, source, tmp_path / "out") == 1
        report = rows(tmp_path / "out")
        assert report[long_name]["status"] == "failed" and "File name too long" in report[long_name]["error"]
        assert [report[n]["status"] for n in members(3)] in (["ok"] * 3, ["skipped"] * 3)


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


def test_output_equal_to_or_inside_the_input_is_refused(tmp_path, ckpt, capsys):
    source = write_folder(tmp_path / "in", members(2))
    for out in (source, source / "predictions"):
        assert predict(ckpt, source, out) == 2
        assert "its masks would be read back as scans" in capsys.readouterr().err
    assert not (source / "predictions").exists() and not (source / "masks").exists()


def test_empty_inputs_are_exit_1(tmp_path, ckpt, capsys):
    (tmp_path / "empty").mkdir()
    with zipfile.ZipFile(tmp_path / "empty.zip", "w"):
        pass
    for source in (tmp_path / "empty", tmp_path / "empty.zip"):
        assert predict(ckpt, source, tmp_path / "out") == 1
        assert f"no scans found in {source}" in capsys.readouterr().err


def test_links_inside_the_output_folder_are_refused(tmp_path, ckpt, capsys):
    source = write_folder(tmp_path / "in", members(2))
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (tmp_path / "out").mkdir()
    os.symlink(elsewhere, tmp_path / "out" / "masks")
    assert predict(ckpt, source, tmp_path / "out") == 2
    assert "out/masks is a symbolic link inside the output folder" in capsys.readouterr().err
    assert not list(elsewhere.iterdir())


def test_fewer_class_names_than_classes_is_exit_2(tmp_path, capsys):
    source = write_folder(tmp_path / "in", members(2))
    short = random_checkpoint(tmp_path / "short.pt", class_names=["paper", "ink"])
    assert predict(short, source, tmp_path / "out") == 2
    assert "2 class names for a model of 3 classes" in capsys.readouterr().err


def test_image_mode_comes_from_the_checkpoint(tmp_path):
    recorded = random_checkpoint(tmp_path / "new.pt", image_mode="YCbCr")
    plain = random_checkpoint(tmp_path / "plain.pt")
    assert Predictor.from_checkpoint(recorded, device="cpu").image_mode == "YCbCr"
    assert Predictor.from_checkpoint(plain, device="cpu").image_mode == "RGB"


def test_a_read_only_output_is_exit_2(tmp_path, ckpt, capsys):
    source = write_folder(tmp_path / "in", members(2))
    with tmpfs(tmp_path / "ro", "ro,size=1m") as out:
        assert predict(ckpt, source, out / "predictions") == 2
    assert "cannot write into --output" in capsys.readouterr().err


def test_a_full_disk_is_named_and_exit_1(tmp_path, ckpt, capsys):
    source = write_folder(tmp_path / "in", members(40, h=60, w=200))
    with tmpfs(tmp_path / "small", "size=64k") as out:
        assert predict(ckpt, source, out, "--workers", "0") == 1
        err = capsys.readouterr().err
        assert f"no space left on {out}" in err and "Traceback" not in err
        assert len(list((out / "masks").rglob("*.png"))) < 40
        for mask in (out / "masks").rglob("*.png"):  # whatever was written is whole
            assert mask.read_bytes().endswith(b"IEND\xaeB`\x82")


def test_strict_stops_at_the_first_failure_and_still_lists_every_scan(tmp_path, ckpt):
    source = write_folder(tmp_path / "in", {**members(4), "a_bad.png": b"junk"})
    for workers in ("0", "1"):
        assert predict(ckpt, source, tmp_path / f"out{workers}", "--strict", "--workers", workers) == 1
        report = rows(tmp_path / f"out{workers}")
        assert sorted(report) == sorted([*members(4), "a_bad.png"])
        assert report["a_bad.png"]["status"] == "failed"
        assert {report[n]["status"] for n in members(4)} == {"stopped"}


def test_strict_with_a_rejected_member_still_lists_every_scan(tmp_path, ckpt):
    from predict_fixtures import write_tar

    source = write_tar(tmp_path / "scans.tar", members(3), links={"link.png": "/etc/passwd"})
    assert predict(ckpt, source, tmp_path / "out", "--strict", "--workers", "0") == 1
    report = rows(tmp_path / "out")
    assert sorted(report) == sorted([*members(3), "link.png"])
    assert report["link.png"]["status"] == "rejected"
    assert {report[n]["status"] for n in members(3)} == {"stopped"}


def test_the_cuda_budget_is_free_memory_over_bytes_per_pixel():
    assert budget_from_memory(80 * 2**30, 1024, 32) == 40 * 2**20  # half of 80 GiB at 1 KiB a pixel
    assert budget_from_memory(2**20, 10**9, 32) == 4 * 32**2  # never below one 2d x 2d tile


def test_the_cuda_budget_is_capped_and_shared_by_the_processes_on_one_device(monkeypatch):
    from srforge.runtime import device_memory as dev

    monkeypatch.setattr(dev, "activation_bytes_per_pixel", lambda *args: 1.0)  # a probe that saw almost nothing
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device: (140 * 2**30, 143 * 2**30))
    model = torch.nn.Module()
    model.size_divisor = 32
    assert dev.cuda_pixel_budget(model, torch.device("cuda"), "fp32") == dev.MAX_CUDA_PIXELS  # not 7e10 pixels
    monkeypatch.setattr(dev, "activation_bytes_per_pixel", lambda *args: 4096.0)
    alone = dev.cuda_pixel_budget(model, torch.device("cuda"), "fp32")
    assert alone == 140 * 2**30 // 2 // 4096
    assert dev.cuda_pixel_budget(model, torch.device("cuda"), "fp32", sharing=4) == alone // 4

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "8")  # 8 ranks on 2 GPUs: 4 share each
    assert dev.processes_per_device() == 4
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    assert dev.processes_per_device() == 1
