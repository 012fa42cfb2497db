"""Curves from LAS files through lasio: files and globs, what is usable, clean errors naming the file, curves
placed from a depth window with wrap-around, logarithmic tracks, the config key and the CLI option."""

import sys

import numpy as np
import pytest

from srforge.cli import main_make_synthetic
from srforge.config import ConfigError, resolve
from srforge.extras import MissingExtraError
from srforge.runtime.distributed import Processes
from srforge.synthetic import (
    LasError,
    curve_look,
    draw_style,
    folder_settings,
    las_files,
    load_wells,
    make_welllog_scans,
    scan_layers,
    welllog_scan,
)
from srforge.synthetic.curves import track_positions, track_scale
from srforge.synthetic.draw import PlottedCurve, curve_coverage
from srforge.synthetic.las import is_logarithmic, las_window
from srforge.synthetic.prepare import prepare_synthetic_data
from srforge.synthetic.scan import plot_curves

lasio = pytest.importorskip("lasio", reason="the las extra (lasio) writes and reads the tests' LAS files")

N = 3000


def write_las(path, n=N, curves=None):
    """A LAS file written with lasio: depth 1000 ft on at 0.5 ft, and the given curves (default: a ramp, a
    gamma-ray-like curve with a gap, a resistivity over three decades, a constant)."""
    rng = np.random.default_rng(0)
    if curves is None:
        gr = 60 + 30 * np.sin(np.arange(n) / 40) + rng.normal(0, 3, n)
        gr[100:200] = np.nan
        curves = {
            "RAMP": np.arange(n, dtype=float),
            "GR": gr,
            "RES": 10 ** (1 + 1.5 * np.sin(np.arange(n) / 90)),
            "FLAT": np.full(n, 7.0),
        }
    las = lasio.LASFile()
    las.append_curve("DEPT", 1000 + 0.5 * np.arange(n), unit="FT")
    for name, values in curves.items():
        las.append_curve(name, values)
    las.write(str(path), version=2.0)
    return path


@pytest.fixture
def las_file(tmp_path):
    return write_las(tmp_path / "well.las")


def test_the_usable_curves_of_a_file_written_with_lasio(las_file):
    (well,) = load_wells(las_file)
    assert sorted(well.curves) == ["GR", "RAMP", "RES"]  # FLAT takes one value; DEPT is the index
    assert np.array_equal(well.curves["RAMP"], np.arange(N, dtype=float))
    assert np.isnan(well.curves["GR"][150]) and well.samples == N
    assert is_logarithmic(well.curves["RES"]) and not is_logarithmic(well.curves["GR"])
    assert not is_logarithmic(well.curves["RAMP"])  # starts at 0: not positive


def test_paths_and_globs(tmp_path):
    for name in ("b.las", "a.las"):
        write_las(tmp_path / name, n=64)
    a, b = str((tmp_path / "a.las").resolve()), str((tmp_path / "b.las").resolve())
    assert las_files(str(tmp_path / "*.las")) == (a, b)  # sorted
    assert las_files([str(tmp_path / "b.las"), str(tmp_path / "*.las")]) == (b, a)  # in order, once each
    with pytest.raises(LasError, match=r"LAS glob '.*nothing\*\.las' matches no file"):
        las_files(str(tmp_path / "nothing*.las"))
    with pytest.raises(LasError, match=r"LAS file .*gone\.las: expected a LAS file, found nothing there"):
        las_files([a, str(tmp_path / "gone.las")])
    with pytest.raises(LasError, match="found a folder"):
        las_files(str(tmp_path))
    with pytest.raises(LasError, match="empty list"):
        las_files([])


def test_a_file_lasio_cannot_read_or_without_a_usable_curve_is_named(tmp_path):
    bad = tmp_path / "bad.las"
    bad.write_text("a photo of a log, not a LAS file\n")
    with pytest.raises(LasError, match=r"LAS file .*bad\.las: lasio cannot read it"):
        load_wells(bad)
    flat = write_las(tmp_path / "flat.las", n=64, curves={"ONE": np.ones(64), "GAP": np.full(64, np.nan)})
    with pytest.raises(LasError, match=r"flat\.las: no usable curve .*curves found: ONE, GAP"):
        load_wells(flat)
    with pytest.raises(LasError, match=r"flat\.las"):  # before any scan is written
        make_welllog_scans(tmp_path / "out", 2, scale=1 / 16, las=flat)
    assert not (tmp_path / "out").exists()


def test_without_lasio_the_message_names_the_extra(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "lasio", None)  # import lasio raises ImportError
    with pytest.raises(MissingExtraError, match=r"pip install 'srforge-seg\[las\]'"):
        load_wells(write_las(tmp_path / "other.las", n=64))


def test_curves_come_from_a_depth_window_of_the_file(las_file):
    """A window is a contiguous run of the file's samples (the ramp shows where it starts); a plotted curve is
    one of the file's curves, in depth order: the ramp climbs across its track, wrapping or pinned."""
    wells = load_wells(las_file)
    starts = set()
    for seed in range(8):
        window = las_window(np.random.default_rng(seed), wells, 500)
        assert sorted(window) == ["GR", "RAMP", "RES"]
        ramp = window["RAMP"]
        assert np.array_equal(ramp, ramp[0] + np.arange(500)) and 0 <= ramp[0] <= N - 500
        starts.add(ramp[0])
    assert len(starts) == 8
    assert len(las_window(np.random.default_rng(0), wells, 10 * N)["RAMP"]) == N  # a short file: all of it
    ramps = 0
    for index in range(12):
        style = draw_style(index, 0, 1 / 8, randomise=True)
        looks = [curve_look(np.random.default_rng(k), 1 / 8, True) for k in range(sum(style.curves_per_track))]
        plotted, _, flips = plot_curves(np.random.default_rng([0, index]), style, [str(las_file)], looks)
        assert {c.name for c in plotted} <= {"GR", "RAMP", "RES"} and 1 <= len(plotted) <= len(looks)
        for c in plotted:
            if c.name == "RAMP":
                ramps += 1
                climb = (1 - c.position if flips[c.track] else c.position) + c.turns
                assert np.all(np.diff(climb) >= -1e-9), index
    assert ramps >= 3


def test_wrap_around_and_pinning():
    values = np.array([0.0, 5.0, 9.9, 12.0, 25.0, -3.0, np.nan])
    position, turns = track_positions(values, 0.0, 10.0, False, wrap=True)
    assert np.allclose(position[:6], [0.0, 0.5, 0.99, 0.2, 0.5, 0.7]) and np.isnan(position[6])
    assert turns[:6].tolist() == [0, 0, 0, 1, 2, -1]
    pinned, none = track_positions(values, 0.0, 10.0, False, wrap=False)
    assert np.allclose(pinned[:6], [0.0, 0.5, 0.99, 1.0, 1.0, 0.0]) and not none.any()
    log, log_turns = track_positions(np.array([1.0, 100.0, 3000.0, -1.0]), 0.0, 3.0, True, wrap=True)
    assert np.allclose(log[:3], [0.0, 2 / 3, np.log10(3000) / 3 - 1]) and log_turns[2] == 1 and np.isnan(log[3])


def test_a_wrapping_curve_jumps_to_the_other_edge_instead_of_crossing_the_track():
    # A ramp over 2.5 track widths: three runs, no vertical line at the wraps.
    x = np.arange(100, dtype=float)
    position, turns = track_positions(x, 0.0, 40.0, False, wrap=True)
    curve = PlottedCurve(0, x, position, turns, "RAMP", 0.0, 40.0)
    look = curve_look(np.random.default_rng(0), 1.0, False)
    drawn = curve_coverage(curve, look.__class__("solid", 1, look.ink, 1, 1, 0, True), 21, 100)
    per_column = drawn.sum(axis=0)
    assert per_column.max() <= 3  # a line across the 21 rows would ink them all in one column
    rows = drawn.argmax(axis=0)  # the top inked row of each column
    assert rows[0] == 0 and rows[38] >= 18 and rows[41] <= 1 and rows[78] >= 18 and rows[81] <= 1


def test_logarithmic_scales_are_whole_decades():
    values = 10 ** np.random.default_rng(1).uniform(-0.3, 2.8, 500)
    for seed in range(20):
        lo, hi = track_scale(np.random.default_rng(seed), values, True)
        assert lo == int(lo) and hi == int(hi) and hi - lo >= 1


def test_scans_with_las_curves_are_reproducible_and_differ_from_the_own_curves(las_file):
    a = welllog_scan(3, seed=2, scale=1 / 8, las=str(las_file), randomise=True)
    b = welllog_scan(3, seed=2, scale=1 / 8, las=[str(las_file)], randomise=True)
    own = welllog_scan(3, seed=2, scale=1 / 8, randomise=True)
    assert np.array_equal(a[0], b[0]) and np.array_equal(a[1], b[1])
    assert not np.array_equal(a[1], own[1]) and a[1].shape == own[1].shape
    layers = scan_layers(3, seed=2, scale=1 / 8, las=str(las_file), randomise=True)
    assert (layers.coverage > 0).any()


def test_the_config_key_generates_from_las_files_and_names_bad_ones(tmp_path, las_file, capsys):
    root = tmp_path / "scans"
    overrides = [f"data.synthetic.root={root}", "data.synthetic.n=2", "data.synthetic.scale=0.05"]
    cfg = resolve({}, [*overrides, f"data.synthetic.las=[{las_file}]"])
    prepare_synthetic_data(cfg.data.synthetic, Processes())
    assert folder_settings(root)["las"] and "generating 2" in capsys.readouterr().out
    for las, found in ((tmp_path / "gone.las", "found nothing there"), (tmp_path / "x*.las", "matches no file")):
        cfg = resolve({}, [*overrides, f"data.synthetic.las={las}"])
        with pytest.raises(ConfigError, match=rf"data\.synthetic\.las: LAS .*{found}"):
            prepare_synthetic_data(cfg.data.synthetic, Processes())
    with pytest.raises(ConfigError, match=r"data\.synthetic\.las: expected a LAS path or glob"):
        resolve({}, [*overrides, "data.synthetic.las=[3]"])


def test_the_cli_takes_las_files(tmp_path, las_file, capsys):
    out = tmp_path / "out"
    assert main_make_synthetic([str(out), "-n", "2", "--scale", "0.05", "--las", str(las_file), "--randomise"]) == 0
    image, mask = welllog_scan(1, scale=0.05, las=str(las_file), randomise=True)
    from srforge.data import SegmentationFolder

    assert np.array_equal(SegmentationFolder(out, num_classes=2)[1].mask.numpy(), mask)
    assert main_make_synthetic([str(tmp_path / "o2"), "-n", "1", "--las", str(tmp_path / "no.las")]) == 2
    assert "no.las: expected a LAS file, found nothing there" in capsys.readouterr().err
