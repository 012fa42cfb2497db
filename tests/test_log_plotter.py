"""benchmarks/log_plotter.py, the independent renderer of bench_transfer's test scans: LAS curves through lasio,
scans from (seed, i) alone, masks exact under every randomisation, wrap-around and log tracks, the LAS split."""

import sys
from pathlib import Path

import numpy as np
import pytest

lasio = pytest.importorskip("lasio", reason="the las extra (lasio) reads and writes the test's LAS file")
pytest.importorskip("matplotlib", reason="the bench extra (matplotlib) draws the scans")
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import log_plotter  # noqa: E402

SCALE = 0.02  # 64-256 x 10-13 px


def write_las(path: Path, n: int = 600) -> Path:
    """A LAS file (lasio) of ``n`` depths at 0.5 ft: GR with spikes beyond any scale and a null run, a
    resistivity spanning three decades, and a constant curve no plotter would draw."""
    rng = np.random.default_rng(7)
    depth = np.arange(n) * 0.5 + 1000.0
    gr = 60 + 20 * np.sin(depth / 7) + rng.normal(0, 3, n)
    gr[::150] = 400.0  # far beyond any scale of its 1-99% range: wrapped, backed up or pegged
    gr[100:130] = np.nan
    res = 10 ** (1.5 + np.sin(depth / 11) * 1.4)
    las = lasio.LASFile()
    las.well["WELL"].value = "TEST 1"
    las.append_curve("DEPT", depth, unit="ft")
    las.append_curve("GR", gr, unit="gAPI")
    las.append_curve("ILD", res, unit="ohm.m")
    las.append_curve("FLAT", np.full(n, 3.0), unit="")
    with open(path, "w") as handle:
        las.write(handle, version=2.0)
    return path


@pytest.fixture(scope="module")
def well(tmp_path_factory):
    return log_plotter.read_well(write_las(tmp_path_factory.mktemp("las") / "test.las"))


def test_las_curves_are_read_through_lasio_and_scaled_as_a_plotter_would(well):
    assert well.name == "TEST 1" and well.unit == "ft" and len(well.depth) == 600
    kinds = {c.name: c.kind for c in well.curves}
    assert kinds == {"GR": "linear", "ILD": "log"}  # FLAT is constant: not drawn
    gr = next(c for c in well.curves if c.name == "GR")
    assert np.isnan(gr.values[100:130]).all() and np.isfinite(gr.values[:100]).all()


def test_the_las_split_keeps_every_depth_once_in_order(tmp_path):
    source = write_las(tmp_path / "whole.las", n=501)
    assert log_plotter.split_las(source, 0.6, tmp_path / "a.las", tmp_path / "b.las") == (301, 200)
    whole, a, b = (lasio.read(str(tmp_path / name)) for name in ("whole.las", "a.las", "b.las"))
    assert np.array_equal(np.concatenate([a.index, b.index]), whole.index)
    assert a.index[-1] < b.index[0] and float(b.well["STRT"].value) == b.index[0]
    joined = np.concatenate([a["GR"], b["GR"]])
    assert np.array_equal(np.isnan(joined), np.isnan(whole["GR"]))
    assert np.allclose(joined[~np.isnan(joined)], whole["GR"][~np.isnan(whole["GR"])])


def test_a_scan_depends_only_on_seed_and_index(well, tmp_path):
    image, mask = log_plotter.render_scan(well, 3, 5, SCALE)
    again, mask_again = log_plotter.render_scan(well, 3, 5, SCALE)
    assert np.array_equal(image, again) and np.array_equal(mask, mask_again)
    assert image.dtype == np.uint8 and image.shape == (*mask.shape, 3) and set(np.unique(mask)) <= {0, 1}
    other, _ = log_plotter.render_scan(well, 4, 5, SCALE)
    assert other.shape != image.shape or not np.array_equal(other, image)
    small = log_plotter.write_scans(well, tmp_path / "small", 2, seed=3, scale=SCALE)
    large = log_plotter.write_scans(well, tmp_path / "large", 4, seed=3, scale=SCALE)
    for sub in ("images", "masks"):
        for name in ("00000.png", "00001.png"):
            assert (small / sub / name).read_bytes() == (large / sub / name).read_bytes()
    assert len(list((large / "images").glob("*.png"))) == 4


def test_the_mask_rule_is_coverage_of_at_least_one_half():
    layer = np.zeros((3, 4, 4), np.float32)
    layer[..., 3] = [[0.0, 0.49, 0.5, 1.0], [0.2, 0.2, 0.2, 0.2], [1.0, 1.0, 0.0, 0.51]]
    assert log_plotter.curve_mask(layer).tolist() == [[0, 0, 1, 1], [0, 0, 0, 0], [1, 1, 0, 1]]


SCANS = range(14)


@pytest.fixture(scope="module")
def layers(well):
    return [log_plotter.scan_layers(well, 11, i, SCALE) for i in SCANS]


def test_the_scans_cover_every_randomisation(layers):
    plans = [item["plan"] for item in layers]
    for flag in ("turned", "flip_depth", "flip_value", "labels_over", "colour"):
        assert {p["style"][flag] for p in plans} == {False, True}, flag
    traces = [t for p in plans for b in p["bands"] if b["kind"] == "track" for t in b["traces"]]
    assert {t["beyond"] for t in traces} == {"wrap", "backup", "peg"}
    assert {b["scale"] for p in plans for b in p["bands"] if b["kind"] == "track"} == {"linear", "log"}
    assert any(p["header"] for p in plans) and not all(p["header"] for p in plans)
    assert len({t["dashes"] for t in traces}) >= 3 and any(t["amplified"] for t in traces)
    degrade = [p["degrade"] for p in plans]
    assert any(d["jpeg"] for d in degrade) and any(d["grey"] for d in degrade) and any(d["stains"] for d in degrade)
    assert any(d["fold_period"] for d in degrade) and len({p["style"]["skew"] for p in plans}) == len(plans)


@pytest.mark.parametrize("i", SCANS)
def test_curve_ink_lands_exactly_on_the_mask(layers, i):
    """With and without the curve layer, the composite differs on every mask pixel (where anything shows, i.e.
    not under a black line) and nowhere else, grid, header and labels under or over it notwithstanding."""
    item = layers[i]
    mask = log_plotter.curve_mask(item["curves"]).astype(bool)
    with_curves, without = log_plotter.compose(item), log_plotter.compose(item, with_curves=False)
    changed = np.abs(with_curves - without).max(axis=-1) > 0
    visible = without.max(axis=-1) > 0.05
    assert mask.any()
    assert not (changed & ~mask).any(), "ink outside the mask"
    assert not (mask & visible & ~changed).any(), "a mask pixel without curve ink"


def test_labels_over_the_curves_leave_their_pixels_in_the_mask(layers):
    over = [item for item in layers if item["plan"]["style"]["labels_over"]]
    covered = sum(int(((item["over"][..., 3] > 0.5) & (log_plotter.curve_mask(item["curves"]) == 1)).sum())
                  for item in over)  # fmt: skip
    assert covered > 0  # text printed over curve pixels, which stay curve pixels (the mask is the curve layer's)


def test_the_degradations_move_no_pixel_of_the_mask(well, layers):
    image, mask = log_plotter.render_scan(well, 11, 0, SCALE)
    assert np.array_equal(mask, log_plotter.curve_mask(layers[0]["curves"]))
    clean = (np.clip(log_plotter.compose(layers[0]), 0, 1) * 255 + 0.5).astype(np.uint8)
    assert image.shape == clean.shape and not np.array_equal(image, clean)


def test_wrap_around_backup_and_peg_positions():
    u = np.array([0.2, 0.9, 1.3, 2.4, 0.5, -0.25, -1.5, np.nan])
    main, backup, breaks = log_plotter.wrapped(u.copy(), "wrap")
    assert backup is None and np.allclose(main[:7], [0.2, 0.9, 0.3, 0.4, 0.5, 0.75, 0.5]) and np.isnan(main[7])
    assert breaks.tolist() == [2, 3, 4, 5, 6]  # the trace is lifted at every jump to the other edge
    main, backup, _ = log_plotter.wrapped(u.copy(), "backup")
    assert np.allclose(main[[0, 1, 4]], [0.2, 0.9, 0.5]) and np.isnan(main[[2, 3, 5, 6, 7]]).all()
    assert np.allclose(backup[[2, 3, 5, 6]], [0.3, 1.0, 0.75, 0.0]) and np.isnan(backup[[0, 1, 4, 7]]).all()
    main, backup, _ = log_plotter.wrapped(u.copy(), "peg")
    assert np.allclose(main[:7], [0.2, 0.9, 1.0, 1.0, 0.5, 0.0, 0.0])


def test_every_trace_stays_inside_its_track_though_values_leave_the_scale(layers, well):
    beyond = 0
    for item in layers:
        plan = item["plan"]
        for x, y, trace, _ in log_plotter.curve_traces(plan, well):
            band = next(b for b in plan["bands"] if any(t is trace for t in b.get("traces", [])))
            finite = y[np.isfinite(y)]
            assert ((finite >= band["y0"] - 1e-9) & (finite <= band["y1"] + 1e-9)).all()
        for band in (b for b in plan["bands"] if b["kind"] == "track"):
            span = slice(plan["window"]["start"], plan["window"]["start"] + plan["window"]["count"])
            for trace in band["traces"]:
                u = log_plotter.normalised(trace["curve"].values[span], trace)
                beyond += int(((u > 1) | (u < 0)).sum())
    assert beyond > 0  # values did leave their scales, and were wrapped, backed up or pegged into the track


def test_log_tracks_are_logarithmic_with_decade_lines(layers):
    bands = [b for item in layers for b in item["plan"]["bands"] if b.get("scale") == "log"]
    assert bands and all(t["curve"].name == "ILD" for b in bands for t in b["traces"])
    trace = {"scale": "log", "left": 1.0, "right": 1000.0}
    assert np.allclose(log_plotter.normalised(np.array([1.0, 10.0, 100.0, 1000.0]), trace), [0, 1 / 3, 2 / 3, 1])
    assert np.isnan(log_plotter.normalised(np.array([0.0, -1.0]), trace)).all()
    band = {**bands[0], "y0": 0.0, "y1": 30.0, "traces": [{**bands[0]["traces"][0], "divisions": 3}]}
    minor, heavy = log_plotter.value_lines(band, flip=False)
    assert len(minor) == 24 and np.allclose(heavy, [10.0, 20.0])
    assert np.isclose(minor[0], 10 * np.log10(2))


def test_gaps_in_a_curve_are_lifted_pens(well):
    plan = log_plotter.plan_scan(well, 0, 0, SCALE)
    window = {"start": 90, "count": 50, "pps": 1.0}
    plan |= {"window": window, "x": (0.0, 49.0), "style": {**plan["style"], "flip_depth": False}}
    band = {"kind": "track", "y0": 0.0, "y1": 10.0, "scale": "linear", "traces": []}
    gr = next(c for c in well.curves if c.name == "GR")
    band["traces"].append({"curve": gr, "scale": "linear", "left": 0.0, "right": 1000.0, "beyond": "peg",
                           "dashes": None, "amplified": False})  # fmt: skip
    plan["bands"] = [band]
    ((x, y, _, _),) = log_plotter.curve_traces(plan, well)
    assert np.isnan(y[10:40]).all() and np.isfinite(y[:10]).all() and np.isfinite(y[40:]).all()
