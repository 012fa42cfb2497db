"""Randomised scans: every property varies, each scan reproducible from (seed, i) alone, the mask exact under
every randomisation (the curve layer's coverage, moved only by the skew), the folder's settings. The generator's
speed is benchmarks/bench_synthetic.py's to measure, not a test's."""

import dataclasses
import json

import numpy as np
import pytest

from srforge.config import resolve
from srforge.runtime.distributed import Processes
from srforge.synthetic import (
    SETTINGS_FILE,
    Scanner,
    draw_style,
    folder_settings,
    make_welllog_scans,
    scan_layers,
    welllog_scan,
)
from srforge.synthetic.degrade import skew
from srforge.synthetic.prepare import prepare_synthetic_data
from tests.test_synthetic_las import write_las

EIGHTH = 1 / 8


def _bytes(root):
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*.png"))}


@pytest.fixture(scope="module")
def las_file(tmp_path_factory):
    return str(write_las(tmp_path_factory.mktemp("las") / "well.las"))


def test_every_property_varies_across_scans():
    styles = [draw_style(i, 0, EIGHTH, randomise=True) for i in range(80)]
    assert {len(s.tracks) for s in styles} == {1, 2, 3, 4}
    assert len({s.grid_step for s in styles}) > 5 and {s.heavy_every for s in styles} == {0, 2, 4, 5, 10}
    assert any(s.header == 0 for s in styles) and any(s.header > 0 for s in styles)
    assert any(any(s.logarithmic) for s in styles) and any(s.grid_dotted for s in styles)
    assert len({s.font_px for s in styles}) > 5 and len({round(s.paper[0]) for s in styles}) > 20
    assert any(s.panel for s in styles) and any(not s.panel for s in styles)
    assert any(s.curve_labels for s in styles) and any(not s.curve_labels for s in styles)
    scanners = [s.scanner for s in styles]
    for field in ("skew", "blur", "illumination", "noise", "gamma"):
        assert len({getattr(sc, field) for sc in scanners}) > 40, field
    for field in ("stains", "folds", "grey", "jpeg"):
        values = {getattr(sc, field) for sc in scanners}
        assert len(values) > 1 and (0 in values or False in values), field
    assert any(sc.downsample > 1 for sc in scanners) and any(sc.downsample == 1 for sc in scanners)
    classic = [draw_style(i, 0, EIGHTH, randomise=False) for i in range(20)]
    assert {s.heavy_every for s in classic} == {5} and not any(s.scanner.jpeg for s in classic)


def test_inks_include_grey_and_colour_and_widths_span_one_to_four_px():
    layers = [scan_layers(i, 0, EIGHTH, randomise=True) for i in range(30)]
    inks = np.concatenate([layer.inked[layer.coverage > 0] for layer in layers])
    spread = inks.max(axis=1) - inks.min(axis=1)
    grey = spread < 1
    assert (grey & (inks.mean(axis=1) > 60)).any() and (inks.max(axis=1) < 50).any()  # grey, near-black
    assert (spread > 60).mean() > 0.1  # colours
    from srforge.synthetic import curve_look

    widths = {curve_look(np.random.default_rng(k), EIGHTH, True).width for k in range(200)}
    assert widths == {1, 2, 3, 4}


@pytest.mark.parametrize("las", [False, True])
def test_reproducible_from_seed_and_index_and_growing_keeps_the_first_scans(tmp_path, las_file, las):
    options = dict(scale=EIGHTH, seed=3, randomise=True, las=las_file if las else None)
    three = _bytes(make_welllog_scans(tmp_path / "three", 3, workers=1, **options)[0].parents[1])
    five = _bytes(make_welllog_scans(tmp_path / "five", 5, workers=2, **options)[0].parents[1])
    assert len(three) == 6 and len(five) == 10 and all(five[k] == v for k, v in three.items())
    other = _bytes(make_welllog_scans(tmp_path / "other", 3, workers=1, **{**options, "seed": 4})[0].parents[1])
    assert all(other[k] != v for k, v in three.items())
    image, mask = welllog_scan(4, **options)
    assert np.array_equal(image, welllog_scan(4, **options)[0]) and np.array_equal(mask, welllog_scan(4, **options)[1])


def _check_layers(layers):
    """The curve layer inks only curve pixels, every curve pixel carries one of the curves' inks, and the mask as
    written is exactly the coverage moved by the scanner's skew."""
    covered = layers.coverage > 0
    assert np.array_equal(layers.inked[~covered], layers.under[~covered])  # nothing but curves was inked
    inks = np.unique(layers.inked[covered], axis=0)
    assert len(inks) <= sum(layers.style.curves_per_track)  # each curve pixel: its curve's ink, nothing else
    changed = np.any(layers.inked != layers.under, axis=2)
    assert (covered & ~changed).mean() < 0.02 * max(covered.mean(), 1e-9) + 1e-3  # inked where ink == paper only
    _, moved = skew(np.zeros((*layers.coverage.shape, 3), np.float32), layers.coverage, layers.style.scanner, (0,) * 3)
    assert np.array_equal(layers.mask, moved)


@pytest.mark.parametrize("classes", ["binary", "multiclass"])
def test_masks_are_exact_under_every_randomisation(las_file, classes):
    for index in range(16):
        for las in (None, las_file):
            _check_layers(scan_layers(index, 1, EIGHTH, classes, las=las, randomise=True))
    _check_layers(scan_layers(2, 0, 1 / 16, classes))  # the classic look too


def test_nothing_drawn_over_the_curves_or_done_by_the_scanner_changes_the_mask(las_file):
    """Text, stains, folds, illumination, blur, resolution loss, gamma, noise, greyscale and JPEG change the image
    and never the mask; without skew the mask is the coverage itself."""
    off = Scanner()
    for index in range(12):
        layers = scan_layers(index, 5, EIGHTH, las=las_file, randomise=True)
        style = layers.style
        geometry_only = dataclasses.replace(
            style, labels=False, scanner=Scanner(skew=style.scanner.skew, shear=style.scanner.shear)
        )
        bare = scan_layers(index, 5, EIGHTH, las=las_file, randomise=True, style=geometry_only)
        assert np.array_equal(bare.mask, layers.mask) and np.array_equal(bare.coverage, layers.coverage)
        flat_style = dataclasses.replace(style, scanner=off)
        flat = scan_layers(index, 5, EIGHTH, las=las_file, randomise=True, style=flat_style)
        assert np.array_equal(flat.mask, flat.coverage) and np.array_equal(flat.coverage, layers.coverage)
        if style.scanner != geometry_only.scanner:
            assert not np.array_equal(bare.image, layers.image)


def test_curves_stay_visible_on_average():
    dark, light = [], []
    for index in range(24):
        image, mask = welllog_scan(index, 0, EIGHTH, randomise=True)
        gray = image.astype(float).mean(axis=2)
        dark.append(gray[mask > 0].mean())
        light.append(gray[mask == 0].mean())
    assert np.mean(dark) < np.mean(light) - 40 and np.mean(np.array(dark) < np.array(light)) > 0.9


def test_a_changed_setting_redraws_the_folder_and_never_serves_stale_scans(tmp_path, las_file, capsys):
    root = tmp_path / "scans"
    base = [f"data.synthetic.root={root}", "data.synthetic.n=3", "data.synthetic.scale=0.05"]
    randomised = "data.synthetic.randomise=true"
    variants = [[], [randomised], [randomised, f"data.synthetic.las={las_file}"]]
    for extra in variants:
        cfg = resolve({}, base + extra)
        prepare_synthetic_data(cfg.data.synthetic, Processes())
        s = cfg.data.synthetic
        direct = make_welllog_scans(tmp_path / "direct", 3, scale=0.05, randomise=s.randomise, las=s.las or None)
        assert _bytes(root) == _bytes(direct[0].parents[1])
        assert folder_settings(root)["randomise"] == s.randomise and bool(folder_settings(root)["las"]) == bool(s.las)
    out = capsys.readouterr().out
    assert out.count("generating 3") == 3 and out.count("drawn with other settings and are redone") == 2
    prepare_synthetic_data(resolve({}, base + variants[-1]).data.synthetic, Processes())
    assert "generating" not in capsys.readouterr().out  # the same settings: nothing to do
    (root / SETTINGS_FILE).unlink()  # scans without settings: an older srforge drew them
    prepare_synthetic_data(resolve({}, base + variants[-1]).data.synthetic, Processes())
    assert "are redone" in capsys.readouterr().out and json.loads((root / SETTINGS_FILE).read_text())["las"]


def test_growing_n_keeps_the_scans_there(tmp_path):
    root = tmp_path / "scans"
    base = [f"data.synthetic.root={root}", "data.synthetic.scale=0.05", "data.synthetic.randomise=true"]
    prepare_synthetic_data(resolve({}, base + ["data.synthetic.n=2"]).data.synthetic, Processes())
    kept = (root / "images" / "scan_00001.png").stat().st_mtime_ns
    prepare_synthetic_data(resolve({}, base + ["data.synthetic.n=4"]).data.synthetic, Processes())
    assert (root / "images" / "scan_00001.png").stat().st_mtime_ns == kept and len(_bytes(root)) == 8
