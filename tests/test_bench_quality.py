"""benchmarks/bench_quality.py: every recipe trains and is scored (--quick), at equal real pixels seen."""

import importlib.util
import json
import math
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("bench_quality", ROOT / "benchmarks" / "bench_quality.py")
bench = importlib.util.module_from_spec(spec)
sys.modules["bench_quality"] = bench  # dataclasses look their module up there
spec.loader.exec_module(bench)


def test_every_recipe_gets_the_same_real_pixels():
    setting = bench.Setting(epochs=12, crop=(24, 128), resize=(32, 512))
    sizes = [(30 + i % 11, 200 + 37 * i) for i in range(20)]
    whole = sum(h * w for h, w in sizes) * setting.epochs
    for recipe in bench.recipes(setting):
        epochs = bench.epochs_for(recipe, setting, sizes)
        if recipe.serves == "crop":
            per_epoch = sum(min(h, 24) * min(w, 128) for h, w in sizes)
        elif recipe.serves == "resize":
            per_epoch = len(sizes) * 32 * 512
        else:
            per_epoch = whole / setting.epochs
        # rounded to whole epochs: within half an epoch of the whole scans' pixels
        assert abs(epochs * per_epoch - whole) <= per_epoch / 2 + 1, recipe.name


def test_the_score_pools_pixels_and_splits_by_width_third():
    score = bench.Score(3)
    truth = np.array([[0, 1, 2, 0]], np.uint8)
    score.add(truth, np.array([[0, 2, 2, 1]], np.uint8), third=0)  # fg: 2 hits, 1 false positive
    score.add(truth, truth, third=2)
    assert math.isclose(score.foreground_iou(), 4 / 5)
    assert score.class_iou()[2] == 2 / 3 and score.class_iou()[1] == 1 / 3
    first, middle, last = score.third_iou()
    assert first == 2 / 3 and math.isnan(middle) and last == 1.0


def test_quick_mode_trains_and_scores_every_recipe(tmp_path, capsys):
    out = tmp_path / "quality.json"
    assert bench.main(["--quick", "--resolution", "--work", str(tmp_path / "work"), "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    names = [r["recipe"] for r in result["rows"]]
    assert names == [r.name for r in bench.recipes(bench.Setting(**{**result["setting"]})) if not r.optional]
    for row in result["rows"]:
        assert row["steps"] >= 1 and 0 <= row["whole"]["fg_iou"] <= 1 and len(row["whole"]["thirds"]) == 3
    assert sum("tiled" in r for r in result["rows"]) == 1  # the crop recipe, scored whole and by tiles
    assert result["rows"][0]["recipe"] == "pixel budget (the default)"
    # three models (mixed resolutions, rescaled, the default run's) scored at each of three resolutions
    scored = {(r["way"], r["factor"]) for r in result["resolution"]}
    assert scored == {(way, f) for way in ("mixed", "rescaled", "single") for f in (0.5, 1.0, 2.0)}
    printed = capsys.readouterr().out
    assert "| pixel budget (the default) |" in printed and "| 2.0x |" in printed
