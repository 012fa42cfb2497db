"""Prediction: the script on folders, zips and tars, crop-back, bad input, resume after a kill, tiling."""

import io
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from predict_fixtures import one_thread, write_folder, write_tar, write_zip  # noqa: F401  (one_thread: a fixture)
from torch.utils.data import Dataset

from srforge.atomic import TEMP_SUFFIX
from srforge.cli import main_predict
from srforge.config import resolve
from srforge.data.images import read_image
from srforge.predict.predictor import Predictor
from srforge.predict.tiling import tile_spans
from srforge.train import train

ROOT = Path(__file__).resolve().parents[1]
PREDICT = [sys.executable, str(ROOT / "scripts" / "predict.py")]


def strip(i: int, h: int | None = None, w: int | None = None) -> np.ndarray:
    """A dark curve across light noisy paper: uint8 [H, W, 3] (sizes that are rarely multiples of 4)."""
    rng = np.random.default_rng(i)
    h, w = h or 9 + i % 7, w or 15 + 5 * (i % 9)
    ink = np.zeros((h, w), bool)
    ink[(h // 2 + np.round(np.sin(np.arange(w) / 4 + i)).astype(int)) % h, np.arange(w)] = True
    pixels = np.where(ink, 30, 220) + rng.integers(0, 25, (h, w))
    return np.repeat(pixels[:, :, None], 3, 2).astype(np.uint8)


class Strips(Dataset):
    """Training data for the session's checkpoint: the strips above with their curve masks."""

    def __len__(self):
        return 12

    def __getitem__(self, i):
        image = strip(i)
        return {
            "name": f"s{i}",
            "image": image.transpose(2, 0, 1).copy(),
            "mask": (image[:, :, 0] < 100).astype(np.int64),
        }


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    run = tmp_path_factory.mktemp("run")
    train(
        resolve(
            {
                "run": {"dir": str(run), "seed": 0},
                "data": {"dataset": {"class": "test_predict:Strips", "args": {}}, "batch_size": 4, "augment": {}},
                "model": {"base_channels": 4, "depth": 2, "class_names": ["paper", "ink"]},
                "train": {"epochs": 6, "lr": 0.02, "warmup_steps": 2},
            }
        )
    )
    return run / "last.pt"


@pytest.fixture(scope="module")
def predictor(ckpt):
    return Predictor.from_checkpoint(ckpt, device="cpu")


def _png(array: np.ndarray, mode: str | None = None, fmt: str = "PNG") -> bytes:
    buffer = io.BytesIO()
    (Image.fromarray(array, mode) if mode else Image.fromarray(array)).save(buffer, format=fmt)
    return buffer.getvalue()


def scans(n: int, start: int = 0, **size) -> dict[str, bytes]:
    return {f"{'sub/' if i % 3 == 0 else ''}scan_{i:03d}.png": _png(strip(i, **size)) for i in range(start, start + n)}


def alone(predictor: Predictor, image: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(class map [H, W], top-2 probability margin [H, W]) of one scan predicted by itself."""
    probs = predictor.probabilities([image])[0]
    top = probs.topk(2, dim=0).values
    return probs.argmax(0), top[0] - top[1]


def assert_matches_alone(predictor, mask: torch.Tensor, image: torch.Tensor) -> None:
    """The mask equals the scan's own prediction except, at most, where two classes tie to float rounding."""
    expected, margin = alone(predictor, image)
    assert mask.shape == expected.shape
    differ = mask != expected
    assert not differ.any() or margin[differ].max() < 1e-4, f"{int(differ.sum())} pixels differ"


# One thread: on a small shared machine a second OpenMP thread waiting for a busy core made tiny convs 20x slower.
ENV = {**os.environ, "OMP_NUM_THREADS": "1"}


pytestmark = pytest.mark.usefixtures("one_thread")


def run_script(*args, timeout=120):
    return subprocess.run([*PREDICT, *map(str, args)], capture_output=True, text=True, timeout=timeout, env=ENV)


def read_mask(path: Path) -> torch.Tensor:
    with Image.open(path) as image:
        assert image.mode == "L"
        return torch.from_numpy(np.asarray(image).astype(np.int64))


@pytest.mark.slow
def test_script_on_folder_zip_and_tar_equals_predict_scan_by_scan(tmp_path, ckpt, predictor):
    members = scans(14)
    inputs = {
        "folder": write_folder(tmp_path / "scans", members),
        "zip": write_zip(tmp_path / "s.zip", members),
        "tar": write_tar(tmp_path / "s.tar", members),
    }
    for kind, path in inputs.items():
        out = tmp_path / f"out_{kind}"
        extra = ["--overlay", "--probabilities"] if kind == "folder" else ["--max-batch", "0"]  # real batches
        done = run_script("--checkpoint", ckpt, "--input", path, "--output", out, "--no-progress", *extra)
        assert done.returncode == 0, done.stderr[-2000:]
        assert "14 scans: 14 ok, 0 skipped, 0 failed, 0 rejected" in done.stdout
        report = json.loads((out / "report.json").read_text())
        assert [r["name"] for r in report["scans"]] == sorted(members) and report["summary"]["ok"] == 14
        for name, data in members.items():
            image = read_image(tmp_path / "scans" / name)
            mask = read_mask(out / "masks" / Path(name).with_suffix(".png"))
            assert mask.shape == image.shape[1:]  # the scan's exact size, no padding
            assert_matches_alone(predictor, mask, image)
            row = next(r for r in report["scans"] if r["name"] == name)
            assert (row["height"], row["width"]) == tuple(image.shape[1:])
            assert row["fractions"] == pytest.approx([float((mask == c).float().mean()) for c in (0, 1)], abs=1e-5)
        csv_rows = (out / "report.csv").read_text().splitlines()
        assert csv_rows[0] == "name,status,height,width,ms,error,frac_paper,frac_ink" and len(csv_rows) == 15
    probs = np.load(tmp_path / "out_folder" / "probabilities" / "scan_001.npy")
    assert probs.dtype == np.float16 and probs.shape == (2, *strip(1).shape[:2])
    assert np.allclose(probs.astype(np.float32).sum(0), 1, atol=2e-3)
    overlay = Image.open(tmp_path / "out_folder" / "overlays" / "sub" / "scan_000.png")
    assert overlay.mode == "RGB" and overlay.size == strip(0).shape[1::-1]


def test_batched_prediction_never_sees_the_padding(predictor):
    images = [torch.from_numpy(strip(i)).permute(2, 0, 1) for i in range(10)]
    assert max(map(len, predictor.plan([tuple(im.shape[1:]) for im in images]))) > 1  # auto on CPU: small scans batch
    predictor = Predictor(predictor.model, device="cpu", max_batch=None)
    batches = predictor.plan([tuple(im.shape[1:]) for im in images])
    assert max(map(len, batches)) > 1  # they really are batched together
    for image, mask in zip(images, predictor.predict(images)):
        assert_matches_alone(predictor, mask, image)
    float_images = [im.float() / 255 for im in images[:3]]
    assert all(torch.equal(a, b) for a, b in zip(predictor.predict(float_images), predictor.predict(images[:3])))
    with pytest.raises(ValueError, match=r"image 0 must be a tensor \[3, H, W\]"):
        predictor.predict([images[0][:1]])


def _bad_members(tmp_path: Path) -> dict[str, bytes]:
    good = _png(strip(1))
    rgba = np.concatenate([strip(2), np.full((*strip(2).shape[:2], 1), 200, np.uint8)], 2)
    cmyk = io.BytesIO()
    Image.fromarray(strip(4)).convert("CMYK").save(cmyk, format="JPEG")
    palette = Image.fromarray(strip(5)).convert("P")
    pal = io.BytesIO()
    palette.save(pal, format="PNG")
    return {
        "good.png": good,
        "good.jpg": good,
        "deep16.png": _png((strip(3)[:, :, 0].astype(np.uint16) * 257)),
        "rgba.png": _png(rgba, "RGBA"),
        "cmyk.jpg": cmyk.getvalue(),
        "palette.png": pal.getvalue(),
        "empty.png": b"",
        "text.png": b"this is not an image",
        "cut.png": good[: len(good) // 2],
        "notes.txt": b"hello",
        "../escape.png": good,
        "/tmp/abs_escape.png": good,
    }


@pytest.mark.parametrize("kind", ["zip", "tar"])
def test_bad_input_is_reported_per_scan_and_nothing_escapes(tmp_path, ckpt, kind, capsys):
    members = _bad_members(tmp_path)
    box = tmp_path / "box"
    box.mkdir()
    path = (
        write_zip(box / "bad.zip", members)
        if kind == "zip"
        else write_tar(box / "bad.tar", members, links={"link.png": "/etc/passwd"})
    )
    out = box / "out"
    before = sorted(p.name for p in box.iterdir())
    code = main_predict(["--checkpoint", str(ckpt), "--input", str(path), "--output", str(out), "--no-progress"])
    assert code == 1
    assert sorted(p.name for p in box.iterdir()) == sorted(before + ["out"])  # the parent of DIR is unchanged
    assert not Path("/tmp/abs_escape.png").exists() and not (tmp_path / "escape.png").exists()
    status = {
        r["name"]: (r["status"], r["error"] or "") for r in json.loads((out / "report.json").read_text())["scans"]
    }
    for name in ("good.png", "deep16.png", "rgba.png", "cmyk.jpg", "palette.png"):  # converted, not rejected
        assert status[name][0] == "ok", status[name]
        with (
            Image.open(out / "masks" / Path(name).with_suffix(".png")) as mask,
            Image.open(io.BytesIO(members[name])) as scan,
        ):
            assert mask.size == scan.size
    assert status["good.jpg"][0] == "rejected" and "same output name as 'good.png'" in status["good.jpg"][1]
    for name in ("empty.png", "text.png", "cut.png"):
        assert status[name][0] == "failed" and f"{name}: cannot" in status[name][1]
    assert status["notes.txt"][0] == "rejected"
    assert status["../escape.png"] == ("rejected", "'..' component")
    assert status["/tmp/abs_escape.png"] == ("rejected", "absolute path")
    if kind == "tar":
        assert status["link.png"][0] == "rejected" and "symlink" in status["link.png"][1]
    written = sorted(p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file())
    assert written == sorted(
        ["report.csv", "report.json"]
        + [f"masks/{n}" for n in ("good.png", "deep16.png", "rgba.png", "cmyk.png", "palette.png")]
    )
    assert "5 ok, 0 skipped, 3 failed" in capsys.readouterr().out


@pytest.mark.slow
def test_folder_with_a_symlink_runs_as_a_subprocess(tmp_path, ckpt):
    (tmp_path / "secret.png").write_bytes(_png(strip(0)))
    folder = write_folder(tmp_path / "in", scans(2))
    os.symlink(tmp_path / "secret.png", folder / "link.png")
    done = run_script("--checkpoint", ckpt, "--input", folder, "--output", tmp_path / "out", "--no-progress")
    assert done.returncode == 1, done.stderr[-2000:]
    rows = {r["name"]: r for r in json.loads((tmp_path / "out" / "report.json").read_text())["scans"]}
    assert rows["link.png"]["status"] == "rejected" and not (tmp_path / "out" / "masks" / "link.png").exists()
    assert [rows[n]["status"] for n in scans(2)] == ["ok", "ok"]


def test_rerun_skips_complete_scans_and_redoes_broken_ones(tmp_path, ckpt):
    folder = write_folder(tmp_path / "in", scans(6))
    args = ["--checkpoint", str(ckpt), "--input", str(folder), "--output", str(tmp_path / "out"), "--no-progress"]
    assert main_predict(args) == 0
    masks = tmp_path / "out" / "masks"
    stamps = {p: p.stat().st_mtime_ns for p in masks.rglob("*.png")}
    (masks / "scan_001.png").unlink()
    broken = masks / "scan_002.png"
    broken.write_bytes(broken.read_bytes()[:30])  # truncated by some other tool
    (masks / "scan_004.png").write_bytes(_png(np.zeros((3, 3), np.uint8)))  # wrong size
    assert main_predict(args) == 0
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    status = {r["name"]: r["status"] for r in report["scans"]}
    assert status == {
        **{n: "skipped" for n in scans(6)},
        "scan_001.png": "ok",
        "scan_002.png": "ok",
        "scan_004.png": "ok",
    }
    assert all(r["fractions"] and abs(sum(r["fractions"]) - 1) < 1e-4 for r in report["scans"])
    for path, stamp in stamps.items():
        assert (path.stat().st_mtime_ns == stamp) == (path.name not in ("scan_001.png", "scan_002.png", "scan_004.png"))
        assert read_mask(path).shape == strip(int(path.stem[-3:])).shape[:2]
    assert main_predict([*args, "--overwrite"]) == 0
    assert {r["status"] for r in json.loads((tmp_path / "out" / "report.json").read_text())["scans"]} == {"ok"}


@pytest.mark.slow
def test_kill_then_rerun_completes_the_set(tmp_path, ckpt):
    members = scans(150, h=60, w=200)
    path = write_tar(tmp_path / "many.tar.gz", members)
    out = tmp_path / "out"
    args = [*PREDICT, "--checkpoint", str(ckpt), "--input", str(path), "--output", str(out), "--max-pixels", "12000"]
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=ENV)
    deadline = time.time() + 120
    while proc.poll() is None and time.time() < deadline and not any((out / "masks").rglob("*.png")):
        time.sleep(0.01)
    time.sleep(0.05)  # a moment into the run: kill it mid-stream, long before its 150 scans are done
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=60)
    assert proc.returncode == -signal.SIGKILL, "the run finished before it could be killed: give it more scans"
    finished = [p for p in (out / "masks").rglob("*.png")]
    assert 0 < len(finished) < len(members)
    for mask in finished:  # whatever a kill leaves under the final names is whole
        assert read_mask(mask).shape == (60, 200)
    done = subprocess.run(args + ["--no-progress"], capture_output=True, text=True, timeout=180, env=ENV)
    assert done.returncode == 0, done.stderr[-2000:]
    summary = json.loads((out / "report.json").read_text())["summary"]
    assert summary["skipped"] >= len(finished) and summary["ok"] + summary["skipped"] == len(members)
    for name in members:
        assert read_mask(out / "masks" / Path(name).with_suffix(".png")).shape == (60, 200)
    assert not list(out.rglob(f"*{TEMP_SUFFIX}"))


def test_tile_spans_partition_the_axis_on_the_divisor_grid():
    for length in (5, 31, 32, 33, 100, 257):
        for tile, overlap in ((32, 8), (16, 12), (64, 4)):
            spans = tile_spans(length, tile, overlap, 4)
            assert spans[0][2] == 0 and spans[-1][3] == length
            for (s, e, ks, ke), nxt in zip(spans, spans[1:] + [None]):
                assert s % 4 == 0 and 0 < e - s <= tile and s <= ks < ke <= e
                if nxt is not None:
                    assert ke == nxt[2] and nxt[0] < e  # kept ranges abut; tiles overlap


def test_tiled_prediction_agrees_with_whole_scan(predictor, ckpt):
    images = [torch.from_numpy(strip(i, h=24, w=160)).permute(2, 0, 1) for i in range(4)]
    whole = predictor.predict(images)
    tiled = Predictor.from_checkpoint(ckpt, device="cpu", max_pixels=24 * 48)  # tiles 24 x 48, 16 px overlap
    assert tiled.plan([(24, 160)]) == [[0]]
    differ = sum(int((a != b).sum()) for a, b in zip(whole, tiled.predict(images)))
    fraction = differ / sum(m.numel() for m in whole)
    assert fraction < 0.01, f"tiled and whole-scan predictions differ on {fraction:.2%} of the pixels"


def test_exit_codes_for_missing_input_bad_checkpoint_and_strict(tmp_path, ckpt, capsys):
    folder = write_folder(tmp_path / "in", {**scans(3), "bad.png": b"junk"})
    out = str(tmp_path / "out")
    assert main_predict(["--checkpoint", str(ckpt), "--input", str(tmp_path / "nope"), "--output", out]) == 2
    assert f"input not found: {tmp_path / 'nope'}" in capsys.readouterr().err
    fake = tmp_path / "fake.pt"
    torch.save({"weights": torch.zeros(1)}, fake)
    assert main_predict(["--checkpoint", str(fake), "--input", str(folder), "--output", out]) == 2
    assert f"{fake} is not an srforge checkpoint" in capsys.readouterr().err
    assert not Path(out).exists()
    assert (
        main_predict(["--checkpoint", str(ckpt), "--input", str(folder), "--output", out, "--strict", "--no-progress"])
        == 1
    )
    summary = json.loads((Path(out) / "report.json").read_text())["summary"]
    assert summary["stopped_early"] and summary["failed"] == 1 and summary["ok"] == 0  # bad.png sorts first


def test_bf16_autocast_predicts_the_same_shapes_and_nearly_the_same_classes(ckpt):
    images = [torch.from_numpy(strip(i)).permute(2, 0, 1) for i in range(3)]
    fp32 = Predictor.from_checkpoint(ckpt, device="cpu").predict(images)
    bf16 = Predictor.from_checkpoint(ckpt, device="cpu", precision="bf16").predict(images)
    agree = sum(int((a == b).sum()) for a, b in zip(fp32, bf16)) / sum(m.numel() for m in fp32)
    assert [m.shape for m in bf16] == [m.shape for m in fp32] and agree > 0.95
    with pytest.raises(ValueError, match="precision must be fp32, bf16 or fp16"):
        Predictor.from_checkpoint(ckpt, precision="int8")
