"""Batch-layout pictures: the batches drawn are the trainer's, and their colours count their pixels."""

from pathlib import Path

import numpy as np
import pytest
from helpers import labels, rgb
from PIL import Image

import srforge.data.layout_plot as layout_plot
from srforge.cli import main_check_data
from srforge.config import load_config
from srforge.data.layout_plot import (
    COLORS,
    HIST_WIDTH,
    MARGIN,
    batch_layout,
    canvas_size,
    draw_batch_layout,
    plot_batch_layout,
    totals,
)
from srforge.data.sampling import SizeGroupedBatchSampler, size_stratified_split

# 16 scans, H 5-21, W 9-40: with divisor 8 each needs its own gutter, and batches pad to different maxima.
SIZES = [(5 + (7 * i) % 17, 9 + (11 * i) % 32) for i in range(16)]


def _counts(image: Image.Image, box) -> dict[str, int]:
    pixels = np.asarray(image.crop(box)).reshape(-1, 3)
    return {name: int((pixels == COLORS[name]).all(axis=1).sum()) for name in ("scan", "gutter", "padding")}


def _trainer_batches(sizes, seed=0, val_fraction=0.25, **sampler_args):
    """The epoch-0 batches of (H, W) sizes, built as srforge.train.trainer builds them."""
    train, _ = size_stratified_split(sizes, val_fraction, seed=seed)
    train_sizes = [sizes[i] for i in train]
    sampler = SizeGroupedBatchSampler(train_sizes, divisor=8, shuffle=True, seed=seed, **sampler_args)
    sampler.set_epoch(0)
    return [np.array([train_sizes[i] for i in batch]) for batch in sampler]


def test_each_drawn_batch_counts_exactly_its_real_gutter_and_padding_pixels_at_scale_1():
    layout = batch_layout(SIZES, batch_size=3, divisor=8, val_fraction=0.25, seed=0)
    image, boxes = draw_batch_layout(layout, num_batches=4, scale=1)
    expected = _trainer_batches(SIZES, batch_size=3)
    assert len(boxes) == 4 and len(layout.batches) == len(expected)
    for box, batch, sizes in zip(boxes, layout.batches, expected):
        aligned = -(-sizes // 8) * 8
        hp, wp = aligned.max(axis=0)
        real, slots = int(sizes.prod(axis=1).sum()), int(aligned.prod(axis=1).sum())
        counts = _counts(image, box)
        assert counts == {"scan": real, "gutter": slots - real, "padding": len(sizes) * hp * wp - slots}
        assert box[2] - box[0] == wp and box[3] - box[1] == len(sizes) * hp + (len(sizes) - 1) * 2
        assert batch.waste == pytest.approx((counts["gutter"] + counts["padding"]) / counts["scan"])
    assert any(_counts(image, box)["padding"] for box in boxes)  # these sizes do need batch padding


def test_at_a_scale_dividing_the_divisor_slots_and_gutters_end_where_the_collate_puts_them():
    layout = batch_layout(SIZES, batch_size=3, divisor=8, val_fraction=0.25)
    image, boxes = draw_batch_layout(layout, num_batches=2, scale=2)
    for box, batch in zip(boxes, layout.batches):
        hp, wp = batch.shape
        drawn = -(-batch.sizes // 2)  # a true extent covers ceil(extent / 2) drawn pixels
        counts = _counts(image, box)
        assert counts["scan"] == int(drawn.prod(axis=1).sum())
        assert counts["scan"] + counts["gutter"] == int((batch.aligned // 2).prod(axis=1).sum())
        assert sum(counts.values()) == len(batch.indices) * (hp // 2) * (wp // 2)


def test_a_pixel_budget_draws_the_budgeted_batches():
    layout = batch_layout(SIZES, max_pixels=3000, divisor=8, val_fraction=0.25)
    expected = _trainer_batches(SIZES, max_pixels=3000)
    assert [b.sizes.tolist() for b in layout.batches] == [s.tolist() for s in expected]
    assert all(len(b.indices) == 1 or len(b.indices) * b.shape[0] * b.shape[1] <= 3000 for b in layout.batches)
    assert len({len(b.indices) for b in layout.batches}) > 1  # the budget, not a count, cut them


def test_totals_compare_with_the_floor_and_random_batches():
    layout = batch_layout(SIZES * 4, batch_size=4, divisor=8, val_fraction=0.25)
    text = "\n".join(totals(layout, 4))
    drawn = layout.batches[:4]
    drawn_waste = sum(b.alignment + b.padding for b in drawn) / sum(b.real for b in drawn)
    for figure in (drawn_waste, layout.floor, layout.random_waste):
        assert f"{figure:.1%}" in text
    epoch = sum(b.alignment + b.padding for b in layout.batches) / sum(b.real for b in layout.batches)
    assert layout.floor <= epoch < layout.random_waste  # grouping beats random; nothing beats alignment alone
    same = batch_layout([(10, 20)] * 12, batch_size=4, divisor=8, val_fraction=None)
    assert same.val == [] and same.floor == pytest.approx(same.random_waste) == pytest.approx(16 * 24 / 200 - 1)


def _on_line(pixel, color) -> bool:
    """Whether an RGB pixel lies on the segment from white to ``color`` (a histogram cell of one split only)."""
    white, color, pixel = (np.array(c, dtype=float) for c in ((255, 255, 255), color, pixel))
    t = (white - pixel) @ (white - color) / ((white - color) @ (white - color))
    return 0.3 <= t <= 1.0 and np.abs(white + t * (color - white) - pixel).max() <= 1


def test_the_histogram_colours_train_and_validation_sizes():
    def cells(layout):
        image, _ = draw_batch_layout(layout, num_batches=1, scale=1)
        x0 = image.width - MARGIN - HIST_WIDTH
        panel = np.asarray(image)[:, x0 : x0 + HIST_WIDTH].reshape(-1, 3)
        return {tuple(p) for p in np.unique(panel, axis=0)}

    split = cells(batch_layout(SIZES, batch_size=3, divisor=8, val_fraction=0.25))
    assert any(_on_line(c, COLORS["val"]) for c in split) and any(_on_line(c, COLORS["train"]) for c in split)
    unsplit = cells(batch_layout(SIZES, batch_size=3, divisor=8, val_fraction=None))
    assert not any(_on_line(c, COLORS["val"]) for c in unsplit) and any(_on_line(c, COLORS["train"]) for c in unsplit)


def test_the_picture_is_written_atomically_at_its_size(tmp_path):
    layout = plot_batch_layout(SIZES, tmp_path / "layout.png", num_batches=3, batch_size=3, divisor=8, scale=1)
    with Image.open(tmp_path / "layout.png") as image:
        assert image.format == "PNG" and image.mode == "RGB"
        assert image.size == canvas_size(layout, 1, 3)
        drawn, _ = draw_batch_layout(layout, 3, 1)
        assert np.array_equal(np.asarray(image), np.asarray(drawn))
    assert [p.name for p in tmp_path.iterdir()] == ["layout.png"]
    with pytest.raises(ValueError, match="num_batches >= 1"):
        draw_batch_layout(layout, 0)


def test_check_data_plot_draws_the_folder_with_the_trainer_defaults(make_pair, tmp_path, capsys):
    root = tmp_path / "data"
    for i, (h, w) in enumerate(SIZES[:10]):
        make_pair(f"scan_{i}", rgb(h, w, i), labels(h, w, 2, i), root=root)
    out = tmp_path / "pictures" / "layout.png"
    assert main_check_data([str(root), "--plot", str(out), "--divisor", "8", "--batch-size", "3"]) == 0
    printed = capsys.readouterr().out
    assert "10 pairs checked" in printed and f"wrote {out}: waste of these" in printed
    layout = batch_layout(SIZES[:10], batch_size=3, divisor=8, val_fraction=0.2)
    with Image.open(out) as image:
        assert image.size == canvas_size(layout, 1, 4)  # these tiny scans fit at 1:1
    budget = tmp_path / "budget.png"
    assert main_check_data([str(root), "--plot", str(budget), "--divisor", "8", "--max-pixels", "3000"]) == 0
    plot_batch_layout(SIZES[:10], tmp_path / "library.png", max_pixels=3000, divisor=8, val_fraction=0.2)
    with Image.open(budget) as cli, Image.open(tmp_path / "library.png") as library:
        assert np.array_equal(np.asarray(cli), np.asarray(library))


def test_check_data_plot_reports_a_folder_it_cannot_batch(make_pair, tmp_path, capsys):
    root = make_pair("a", rgb(8, 8), None, root=tmp_path / "data")  # an image without its mask
    assert main_check_data([str(root), "--plot", str(tmp_path / "x.png")]) == 1
    assert "cannot draw" in capsys.readouterr().err and not (tmp_path / "x.png").exists()


def test_check_data_plot_with_a_config_draws_what_its_trainer_forms(make_pair, tmp_path):
    config = Path(__file__).resolve().parents[1] / "configs" / "quickstart.yaml"
    cfg = load_config(config)
    root = tmp_path / "data"
    for i, (h, w) in enumerate(SIZES[:10]):
        make_pair(f"scan_{i}", rgb(h, w, i), labels(h, w, 2, i), root=root)
    assert main_check_data([str(root), "--config", str(config), "--plot", str(tmp_path / "cli.png")]) == 0
    data = cfg["data"]
    plot_batch_layout(
        SIZES[:10],
        tmp_path / "quickstart.png",
        batch_size=data["batch_size"],
        max_pixels=data["max_pixels"],
        divisor=2 ** cfg["model"]["depth"],
        val_fraction=data["val_fraction"],
        seed=cfg["run"]["seed"],
    )
    with Image.open(tmp_path / "cli.png") as cli, Image.open(tmp_path / "quickstart.png") as quickstart:
        assert np.array_equal(np.asarray(cli), np.asarray(quickstart))


def test_a_picture_too_large_to_draw_is_refused_before_allocating(tmp_path):
    layout = layout_plot.batch_layout([(12, 20), (16, 9), (7, 30)], batch_size=1, divisor=2**16, val_fraction=None)
    with pytest.raises(ValueError, match=r"at 1:1 would be 66,000 x 196,754 px, more than 64,000,000 pixels"):
        layout_plot.draw_batch_layout(layout, 3, scale=1)
