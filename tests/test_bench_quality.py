"""benchmarks/bench_quality.py, run as a user runs it (``--quick --resolution``): every recipe trains and is scored,
each at the real pixels of the whole scans' epochs, and the scores it writes agree with one another."""

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from PIL import Image

ROOT = Path(__file__).resolve().parents[1]
DEFAULT = "pixel budget (the default)"


def _sizes(folder: Path) -> list[tuple[int, int]]:
    sizes = []
    for path in sorted((folder / "images").glob("*.png")):
        with Image.open(path) as image:
            sizes.append((image.height, image.width))
    return sizes


def _consistent(fg_iou: float, thirds: list[float]) -> bool:
    """The foreground IoU pools the pixels of every scan: a ratio of sums, so it lies between the width thirds'
    (each pooled over its own scans), whatever their weights."""
    scored = [t for t in thirds if not math.isnan(t)]
    return len(thirds) == 3 and bool(scored) and min(scored) - 1e-9 <= fg_iou <= max(scored) + 1e-9


@pytest.mark.slow
def test_quick_mode_trains_and_scores_every_recipe(tmp_path):
    out, work = tmp_path / "quality.json", tmp_path / "work"
    script = [sys.executable, str(ROOT / "benchmarks" / "bench_quality.py")]
    env = {**os.environ, "OMP_NUM_THREADS": str(torch.get_num_threads())}  # this process's share of the cores
    done = subprocess.run(
        [*script, "--quick", "--resolution", "--work", str(work), "--out", str(out)],
        capture_output=True, text=True, timeout=900, cwd=tmp_path, env=env,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(out.read_text())
    setting = result["setting"]
    (ch, cw), (rh, rw) = setting["crop"], setting["resize"]
    crops, resized = f"random {ch} x {cw} crops, batches of {setting['crop_batch']}", f"resized to {rh} x {rw}"
    names = [r["recipe"] for r in result["rows"]]
    assert names == [DEFAULT, "size-grouped batches of 4", "batch 1", crops, resized]  # the optional ones left out
    for row in result["rows"]:
        assert row["steps"] >= 1 and 0 <= row["whole"]["fg_iou"] <= 1 and len(row["whole"]["thirds"]) == 3
    assert sum("tiled" in r for r in result["rows"]) == 1  # the crop recipe, scored whole and by tiles
    assert result["rows"][0]["recipe"] == DEFAULT
    # three models (mixed resolutions, rescaled, the default run's) scored at each of three resolutions
    scored = {(r["way"], r["factor"]) for r in result["resolution"]}
    assert scored == {(way, f) for way in ("mixed", "rescaled", "single") for f in (0.5, 1.0, 2.0)}
    assert "| pixel budget (the default) |" in done.stdout and "| 2.0x |" in done.stdout

    # every recipe gets the real pixels of the whole scans' epochs, to within half of one of its own epochs
    sizes = _sizes(work / f"binary_0_scale{setting['scale']:g}" / f"train_{setting['train_scans']}")
    assert len(sizes) == setting["train_scans"]
    whole = sum(h * w for h, w in sizes) * setting["epochs"]
    for row in result["rows"]:
        if row["recipe"] == crops:
            per_epoch = sum(min(h, ch) * min(w, cw) for h, w in sizes)
        elif row["recipe"] == resized:
            per_epoch = len(sizes) * rh * rw
        else:
            per_epoch = whole / setting["epochs"]
        assert abs(row["epochs"] * per_epoch - whole) <= per_epoch / 2 + 1, row["recipe"]
    assert next(r for r in result["rows"] if r["recipe"] == crops)["epochs"] > setting["epochs"]  # crops: more

    # the scores: binary, so the foreground IoU is class 1's; pooled over the scans, between the thirds' IoUs
    for row in result["rows"]:
        for how in ("whole", "tiled"):
            if how in row:
                assert row[how]["fg_iou"] == pytest.approx(row[how]["class_iou"][1]), (row["recipe"], how)
                assert _consistent(row[how]["fg_iou"], row[how]["thirds"]), (row["recipe"], how, row[how])
    for row in result["resolution"]:
        assert _consistent(row["fg_iou"], row["thirds"]), row


def test_the_benchmarks_arithmetic_holds_in_process():
    """bench_quality.self_test() itself, without the script's process (the slow test below runs --self-test)."""
    if str(ROOT / "benchmarks") not in sys.path:
        sys.path.insert(0, str(ROOT / "benchmarks"))
    import bench_quality

    assert bench_quality.self_test() == []


@pytest.mark.slow
def test_the_benchmarks_own_arithmetic_holds_on_hand_computed_cases():
    """Recipes at equal real pixels, and the Score: 4/5 foreground IoU, class IoUs 1/3 and 2/3, thirds 2/3, NaN, 1."""
    script = [sys.executable, str(ROOT / "benchmarks" / "bench_quality.py"), "--self-test"]
    done = subprocess.run(script, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and "every check held" in done.stdout, done.stdout + done.stderr[-2000:]
