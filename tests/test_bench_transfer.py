"""benchmarks/bench_transfer.py's variants: every one can have its run folder (a file name the OS takes), no two share
one, and only the runs that read unlabelled scans are told apart by how many the renderer drew a set."""

import json
import math
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("lasio", reason="the las extra (lasio): bench_transfer's renderer reads LAS files")
pytest.importorskip("matplotlib", reason="the bench extra (matplotlib) draws the renderer's scans")
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import bench_transfer  # noqa: E402

NAME_MAX = 255  # bytes in one file name on Linux's file systems (ext4, xfs, tmpfs)


def _variants() -> list[dict]:
    unlabelled = {"other seed": [Path("u/dev/images")], "test images": [Path("sets/dev/images")]}
    return bench_transfer.variants(Path("train.las"), unlabelled, epochs=12)


def test_every_run_folder_name_fits_and_is_its_own():
    setting = bench_transfer.Setting(unlabelled_scans=1000)  # the longest key a run is likely to be given
    trained = [v for v in _variants() if v["kind"] != "threshold"]  # the threshold trains nothing
    assert {v["kind"] for v in trained} == {"srforge", "renderer"}
    folders = [bench_transfer.run_folder(v, setting, 1) for v in trained]
    too_long = [f for f in folders if len(f.encode()) > NAME_MAX]
    assert not too_long, f"run folder names over {NAME_MAX} bytes: {too_long}"
    assert len(set(folders)) == len(folders), sorted(f for f in folders if folders.count(f) > 1)
    # the renderer's plain and ink-input models keep the folders earlier runs gave them (--reuse finds them)
    key = bench_transfer.run_key(setting, 1)
    assert f"renderer_{bench_transfer.renderer_version()}_{key}" in folders
    assert f"renderer_{bench_transfer.renderer_version()}_ink_{key}" in folders
    assert f"renderer_{bench_transfer.renderer_version()}_dropout0.1_{key}" in folders  # the key's name and value
    assert f"renderer_{bench_transfer.renderer_version()}_epochs24_{key}" in folders  # twice the run's 12 epochs
    assert f"renderer_{bench_transfer.renderer_version()}_epochs24_dropout0.1_{key}" in folders  # in override order
    assert f"renderer_{bench_transfer.renderer_version()}_epochs36_{key}" in folders  # three times
    assert f"renderer_{bench_transfer.renderer_version()}_epochs48_{key}" in folders


def test_only_runs_that_read_unlabelled_scans_name_their_number():
    setting = bench_transfer.Setting(unlabelled_scans=72)
    every = _variants()
    readers = [v for v in every if bench_transfer.reads_unlabelled(v["overrides"])]
    assert readers and len(readers) < len(every)
    assert all(v in readers for v in every if "self-training" in v["name"])
    assert not any(v["kind"] == "renderer" for v in readers)  # the renderer's own models are shared by every N
    assert bench_transfer.run_key(setting, 0, True).endswith("_u72")
    assert "_u" not in bench_transfer.run_key(setting, 0)
    # a teacher is always a run that reads unlabelled scans (train_variant finds its folder by that key)
    named = {v["name"]: v for v in every}
    teachers = {v["teacher"] for v in every if v.get("teacher")}
    assert teachers and all(bench_transfer.reads_unlabelled(named[t]["overrides"]) for t in teachers)


def test_reuse_keeps_another_run_only_with_its_stamp(tmp_path):
    teacher = tmp_path / "teacher.pt"
    teacher.write_bytes(b"first round")
    overrides = ["train.epochs=24", f"train.self_training.teacher={teacher}"]
    stamp = bench_transfer.training_stamp(overrides)
    assert stamp == bench_transfer.training_stamp(list(overrides))  # the same run, the same stamp
    assert stamp != bench_transfer.training_stamp(["train.epochs=36", overrides[1]])
    run = tmp_path / "run"
    run.mkdir()
    done = run / "bench_transfer_seconds.json"
    assert not bench_transfer.reusable(done, "srforge", stamp)  # never finished
    done.write_text(json.dumps({"seconds": 5.0, "stamp": stamp}))
    assert not bench_transfer.reusable(done, "srforge", stamp)  # no best.pt
    (run / "best.pt").write_bytes(b"model")
    assert bench_transfer.reusable(done, "srforge", stamp)
    teacher.write_bytes(b"a retrained first round")  # a teacher that changed makes another student
    assert not bench_transfer.reusable(done, "srforge", bench_transfer.training_stamp(overrides))
    done.write_text(json.dumps({"seconds": 5.0}))  # a record from before stamps: a renderer's model alone is kept
    assert bench_transfer.reusable(done, "renderer", stamp) and not bench_transfer.reusable(done, "srforge", stamp)


def test_the_diagnosis_removes_small_pieces_and_scores_as_the_evaluator():
    """A 5 x 8 scan: a true curve along row 1 (columns 0-7); predicted, that curve's columns 0-5 (one 8-connected
    piece of 6 px, with (2, 5) diagonal to it: 7 px) and a lone mark at (4, 7). Pieces under 2 px go: the lone mark.
    IoU 6 / 9 (the diagonal pixel is not curve, columns 6-7 are missed); tolerance precision 7 / 7 (the diagonal
    pixel is 1 px from the curve), recall 8 / 8 (columns 6-7 lie within 2 px of (1, 5) and (2, 5))."""
    pytest.importorskip("scipy", reason="the bench extra (scipy): the diagnosis labels pieces")
    import transfer_diagnosis

    truth = np.zeros((5, 8), bool)
    truth[1, :] = True
    marks = np.zeros((5, 8), bool)
    marks[1, :6] = True
    marks[2, 5] = marks[4, 7] = True
    kept = transfer_diagnosis.without_pieces(marks, 2)
    assert kept.sum() == 7 and not kept[4, 7] and kept[2, 5]
    assert transfer_diagnosis.summary(transfer_diagnosis.curve_figures(kept, truth)) == "0.667 / 1.0000 (1.000, 1.000)"
    assert transfer_diagnosis.without_pieces(marks, 8).sum() == 0


def test_the_diagnosis_splits_the_teachers_paper_by_ink():
    """A 5 x 7 scan, a true curve along row 0: the teacher is sure of paper (p(curve) 0.05) everywhere but (0, 0).
    The curve pixels it calls paper are (0, 1)-(0, 6); the far pixels (more than 2 px from every curve pixel in
    either axis) are rows 3-4. Each pixel's ink value is its column / 10 plus its row."""
    pytest.importorskip("scipy", reason="the bench extra (scipy): the diagnosis dilates the curves")
    import transfer_diagnosis

    truth = np.zeros((5, 7), bool)
    truth[0] = True
    curve = np.full((5, 7), 0.05)
    curve[0, 0] = 0.95
    ink = np.arange(7)[None, :] / 10 + np.arange(5)[:, None]
    on, off = transfer_diagnosis.paper_inks(curve, truth, ink)
    assert on.tolist() == [0.1, 0.2, 0.3, 0.4, 0.5, 0.6]
    assert sorted(off.tolist()) == sorted((ink[3:].ravel()).tolist())
    curve[4, 6] = 0.2  # p(paper) 0.8: not sure enough
    assert sorted(transfer_diagnosis.paper_inks(curve, truth, ink)[1].tolist()) == sorted(ink[3:].ravel().tolist())[:-1]
    dot = np.zeros((5, 7), bool)  # one curve pixel: "far" is more than 2 px away in either axis, a 5 x 5 square
    dot[0, 0] = True
    far = transfer_diagnosis.paper_inks(np.zeros((5, 7)), dot, ink)[1].tolist()
    assert ink[2, 2] not in far and ink[3, 0] in far and ink[0, 3] in far and len(far) == 35 - 9


def test_the_diagnosis_finds_straight_rows_and_track_edges():
    """Runs along rows, counted by hand: row 0 holds runs of 3 and 1, row 2 one of 5, and (1, 5), above that run's
    end, is a run of 1 (rows do not join). Track edges, unskewed in a 12-row scan: a track from y 0.6 to 9.6 lies in
    rows 0 and 9 (row r covers [r, r + 1)), so rows 0-2 and 7-11 are marked; a depth band marks nothing. Skewed
    by asin(0.04) in a 12 x 101 scan (centre (50.5, 6)), the edge at y 6.5 crosses column x at 6 + (x + 0.5 - 50.5)
    * 0.04 + 0.5 * cos: 4.4996 in column 0 (rows 2-6), 6.4996 in column 50 (rows 4-8), 8.4996 in column 100 (rows
    6-10)."""
    pytest.importorskip("scipy", reason="the bench extra (scipy): the diagnosis labels runs")
    import transfer_diagnosis

    mask = np.zeros((4, 6), bool)
    mask[0, [0, 1, 2, 4]] = True
    mask[2, 1:6] = True
    mask[1, 5] = True
    runs = transfer_diagnosis.horizontal_runs(mask)
    assert runs[0].tolist() == [3, 3, 3, 0, 1, 0]
    assert runs[1].tolist() == [0, 0, 0, 0, 0, 1]
    assert runs[2].tolist() == [0, 5, 5, 5, 5, 5] and not runs[3].any()
    plan = {
        "style": {"skew": 0.0},
        "bands": [{"kind": "track", "y0": 0.6, "y1": 9.6}, {"kind": "depth", "y0": 4.0, "y1": 5.0}],
    }
    edges = transfer_diagnosis.track_edges(plan, (12, 3))
    assert np.flatnonzero(edges[:, 0]).tolist() == [0, 1, 2, 7, 8, 9, 10, 11]
    assert (edges == edges[:, :1]).all()  # unskewed: whole rows
    skewed = {"style": {"skew": math.degrees(math.asin(0.04))}, "bands": [{"kind": "track", "y0": 6.5, "y1": 6.5}]}
    edges = transfer_diagnosis.track_edges(skewed, (12, 101))
    for column, rows in ((0, [2, 3, 4, 5, 6]), (50, [4, 5, 6, 7, 8]), (100, [6, 7, 8, 9, 10])):
        assert np.flatnonzero(edges[:, column]).tolist() == rows


def test_the_third_round_is_taught_by_the_student_trained_twice_as_long():
    named = {v["name"]: v for v in _variants()}
    thirds = [v for v in named.values() if "third round" in v["name"] and "students trained twice as long" in v["name"]]
    assert thirds
    for third in thirds:
        teacher = named[third["teacher"]]
        assert teacher["name"].endswith(f"and a student trained twice as long ({third['name'].rsplit('(', 1)[1]}")
        assert "train.epochs=24" in teacher["overrides"] and "second round" in teacher["name"]


def test_the_diagnosis_picks_runs_by_parts_of_their_name(tmp_path):
    pytest.importorskip("scipy", reason="the bench extra (scipy): the diagnosis labels pieces")
    import transfer_diagnosis

    names = ["gen_own_curves_round1_seed0", "gen_own_curves_round1_seed1", "gen_LAS_curves_round1_seed0",
             "gen_own_curves_round1_seed1_u216"]  # fmt: skip
    for name in [*(f"runs/{n}" for n in names), "sets_abc"]:
        (tmp_path / name).mkdir(parents=True)
    picked = lambda *parts: [r.name for r in transfer_diagnosis.runs_and_sets(tmp_path, list(parts))[0]]  # noqa: E731
    assert picked("round1_seed0") == ["gen_LAS_curves_round1_seed0", "gen_own_curves_round1_seed0"]
    assert picked("own*round1_seed?") == ["gen_own_curves_round1_seed0", "gen_own_curves_round1_seed1",
                                          "gen_own_curves_round1_seed1_u216"]  # fmt: skip
    assert picked("own*seed?", "LAS*seed0") == sorted(names)
    assert picked("own*round1_seed1_u2?6") == ["gen_own_curves_round1_seed1_u216"]
    assert picked("las_CURVES") == ["gen_LAS_curves_round1_seed0"]  # any case, as --variants
    with pytest.raises(SystemExit, match="no run named like"):
        picked("renderer")


def test_variants_are_chosen_by_a_part_of_their_name_or_exactly():
    every = _variants()
    plain = bench_transfer.selected(every, ["=The renderer's own scans (48)"])
    assert [v["name"] for v in plain] == ["the renderer's own scans (48)"]
    parts = {v["name"] for v in bench_transfer.selected(every, ["renderer's own scans (48)"])}
    assert "the renderer's own scans (48)" in parts and "the renderer's own scans (48), twice as wide" in parts
    assert bench_transfer.selected(every, None) == every
    recipe = "curves at a confidence of 0.95 (other"
    both = [v["name"] for v in bench_transfer.selected(every, [recipe])]
    assert [name.split(",")[1] for name in both] == [" own curves", " LAS curves"]
    own = [v["name"] for v in bench_transfer.selected(every, [f"OWN curves*{recipe}"])]
    assert own == both[:1] and own[0].endswith(bench_transfer.RECIPE_ROUNDS[1])
    assert bench_transfer.selected(every, [f"={own[0].replace('own', '*')}"]) == []  # =NAME is taken as it is
