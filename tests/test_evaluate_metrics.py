"""Evaluation metrics computed by hand on tiny masks: confusion, IoU, Dice, precision, recall, tolerance F1 (a disc,
not a square), ignore pixels, an empty class, a scan with no foreground, micro against macro, width thirds, and
counts of a padded batch equal to each scan's alone."""

import math

import numpy as np
import pytest
import torch

from srforge.data.collate import AlignedCollate
from srforge.evaluate.aggregate import macro, micro, results, width_thirds, with_figures
from srforge.evaluate.metrics import batch_counts, disc, figures, per_class

IGNORE = 255


def counts(truth, pred, k=3, tolerance=2):
    """Counts of one scan (lists of rows) as a batch of one."""
    t, p = torch.tensor(truth, dtype=torch.uint8)[None], torch.tensor(pred, dtype=torch.uint8)[None]
    found = batch_counts(p, t, k, IGNORE, tolerance)
    return found["confusion"][0], found["tolerance"][0], found["invalid"][0]


def row(name, truth, pred, k=2, tolerance=2):
    confusion, tolerance_counts, _ = counts(truth, pred, k, tolerance)
    width = len(truth[0])
    return {"name": name, "status": "ok", "height": len(truth), "width": width,
            "confusion": confusion.tolist(), "tolerance": tolerance_counts.tolist()}  # fmt: skip


TRUTH = [[0, 0, 1, 1, IGNORE, 2], [0, 0, 1, 1, 2, 2]]
PRED = [[0, 1, 1, 0, 1, 2], [0, 0, 1, 1, 2, 0]]


def test_confusion_iou_dice_precision_recall_by_hand_and_ignore_pixels_count_nowhere():
    confusion, _, invalid = counts(TRUTH, PRED)
    assert confusion.tolist() == [[3, 1, 0], [1, 3, 0], [1, 0, 2]]  # the ignored pixel (predicted 1) is nowhere
    assert invalid.tolist() == [0, 0]
    found = figures(confusion, counts(TRUTH, PRED)[1], ["bg", "a", "b"])
    by_class = found["per_class"]
    assert by_class["iou"] == pytest.approx({"bg": 3 / 6, "a": 3 / 5, "b": 2 / 3})
    assert by_class["dice"] == pytest.approx({"bg": 6 / 9, "a": 6 / 8, "b": 4 / 5})
    assert by_class["precision"] == pytest.approx({"bg": 3 / 5, "a": 3 / 4, "b": 2 / 2})
    assert by_class["recall"] == pytest.approx({"bg": 3 / 4, "a": 3 / 4, "b": 2 / 3})
    assert found["pixel_accuracy"] == pytest.approx(8 / 11)
    assert found["mean_iou_with_bg"] == pytest.approx((1 / 2 + 3 / 5 + 2 / 3) / 3)
    assert found["mean_iou_without_bg"] == pytest.approx((3 / 5 + 2 / 3) / 2)
    assert found["false_positive_px"] == 1 and found["false_negative_px"] == 2  # off-diagonal in fg columns, fg rows


def test_an_empty_class_is_undefined_and_left_out_of_every_mean():
    confusion, tolerance, _ = counts(TRUTH, PRED, k=4)
    found = figures(confusion, tolerance, ["bg", "a", "b", "never"])
    assert all(math.isnan(found["per_class"][f]["never"]) for f in found["per_class"])
    assert found["mean_iou_without_bg"] == pytest.approx((3 / 5 + 2 / 3) / 2)
    assert found["mean_tol_f1_with_bg"] == pytest.approx(np.nanmean([found["per_class"]["tol_f1"][c] for c in "ab"] +
                                                                     [found["per_class"]["tol_f1"]["bg"]]))  # fmt: skip


def test_a_scan_with_no_foreground():
    clean = [[0] * 5] * 3
    confusion, tolerance, _ = counts(clean, clean, k=2)
    found = figures(confusion, tolerance, ["bg", "fg"])
    assert found["pixel_accuracy"] == 1 and found["per_class"]["iou"]["bg"] == 1
    assert math.isnan(found["mean_iou_without_bg"]) and math.isnan(found["per_class"]["tol_f1"]["fg"])
    spurious = [[0, 1, 0, 0, 0], [0] * 5, [0] * 5]  # one false positive
    confusion, tolerance, _ = counts(clean, spurious, k=2)
    fg = per_class(confusion, tolerance)
    assert fg["iou"][1] == 0 and fg["precision"][1] == 0 and math.isnan(fg["recall"][1])
    assert fg["tol_f1"][1] == 0  # predicted where nothing is: F1 0, not undefined


def line(row_index, h=6, w=8, cls=1):
    mask = [[0] * w for _ in range(h)]
    mask[row_index] = [cls] * w
    return mask


@pytest.mark.parametrize(
    ("offset", "tolerance", "f1"),
    [(0, 0, 1.0), (1, 0, 0.0), (1, 1, 1.0), (2, 1, 0.0), (2, 2, 1.0), (3, 2, 0.0)],
)
def test_tolerance_f1_of_a_1px_curve_predicted_off_by_some_rows(offset, tolerance, f1):
    confusion, tol, _ = counts(line(1), line(1 + offset), k=2, tolerance=tolerance)
    assert per_class(confusion, tol)["tol_f1"][1] == pytest.approx(f1)
    assert per_class(confusion, tol)["iou"][1] == (1.0 if offset == 0 else 0.0)  # IoU alone calls it lost


def test_tolerance_is_a_euclidean_disc_the_distance_transform_threshold():
    truth, pred = [[1, 0, 0], [0, 0, 0], [0, 0, 0]], [[0, 0, 0], [0, 1, 0], [0, 0, 0]]  # sqrt(2) px apart
    for tolerance, hit in ((1, 0), (2, 1)):  # a 3x3 square would count it at 1
        _, tol, _ = counts(truth, pred, k=2, tolerance=tolerance)
        assert tol[1].tolist() == [hit, 1, hit, 1]
    assert disc(2).sum() == 13  # offsets with dy^2 + dx^2 <= 4


def brute_tolerance(truth: np.ndarray, pred: np.ndarray, cls: int, t: float) -> list[int]:
    """[pred near truth, pred, truth near pred, truth] of class ``cls`` by the Euclidean distance to every pixel."""
    valid = truth != IGNORE
    tp, pp = np.argwhere((truth == cls) & valid), np.argwhere((pred == cls) & valid)

    def near(a, b):
        if len(b) == 0:
            return 0
        d = np.sqrt(((a[:, None, :] - b[None, :, :]) ** 2).sum(-1))
        return int((d.min(1) <= t).sum())

    return [near(pp, tp), len(pp), near(tp, pp), len(tp)]


def test_tolerance_counts_equal_a_brute_force_distance_on_random_masks_with_ignore_pixels():
    rng = np.random.default_rng(0)
    for trial in range(4):
        truth = rng.choice([0, 0, 0, 1, 2, IGNORE], size=(9, 13)).astype(np.uint8)
        pred = rng.choice([0, 0, 1, 2], size=(9, 13)).astype(np.uint8)
        _, tol, _ = counts(truth.tolist(), pred.tolist(), k=3, tolerance=trial)
        for cls in range(3):
            assert tol[cls].tolist() == brute_tolerance(truth, pred, cls, trial), (trial, cls)


def test_class_ids_beyond_the_classes_are_counted_as_invalid():
    _, _, invalid = counts([[0, 5, IGNORE]], [[0, 1, 1]], k=2)
    assert invalid.tolist() == [1, 0]
    _, _, invalid = counts([[0, 1, 1]], [[0, 7, 1]], k=2)
    assert invalid.tolist() == [0, 1]


def test_a_padded_batch_counts_each_scan_as_alone():
    rng = np.random.default_rng(1)
    scans = [(rng.integers(0, 3, (h, w)), rng.integers(0, 3, (h, w))) for h, w in ((5, 9), (8, 4), (3, 3))]
    collate = AlignedCollate(1, pad={"truth": IGNORE, "pred": 0})
    batch = collate([{"truth": torch.tensor(t, dtype=torch.uint8), "pred": torch.tensor(p, dtype=torch.uint8)}
                     for t, p in scans])  # fmt: skip
    together = batch_counts(batch["pred"], batch["truth"], 3, IGNORE, 2)
    for b, (t, p) in enumerate(scans):
        confusion, tol, _ = counts(t.tolist(), p.tolist(), k=3, tolerance=2)
        assert torch.equal(together["confusion"][b], confusion) and torch.equal(together["tolerance"][b], tol)


def test_micro_pools_pixels_and_macro_averages_scans():
    names = ["bg", "fg"]
    small = row("small", [[1, 1], [1, 1]], [[1, 1], [1, 1]])  # fg IoU 1
    wide = row("wide", [[1] * 8, [0] * 8], [[1] * 4 + [0] * 4, [0] * 8])  # fg IoU 4 / 8
    rows = with_figures([small, wide], names)
    assert micro(rows, names)["per_class"]["iou"]["fg"] == pytest.approx(8 / 12)
    assert macro(rows, names)["per_class"]["iou"]["fg"] == pytest.approx((1 + 0.5) / 2)
    assert macro(rows, names)["mean_iou_without_bg"] == pytest.approx(0.75)
    assert micro(rows, names)["confusion_matrix"] == [[8, 0], [4, 8]]


def test_width_thirds_split_by_width_and_a_failed_row_is_not_scored():
    names = ["bg", "fg"]
    rows = [row(f"s{w}", [[1] * w], [[1] * w]) for w in (7, 3, 9, 5, 1, 11, 2)]
    rows.append({"name": "broken", "status": "failed", "error": "x", "height": None, "width": None})
    thirds = width_thirds(rows)
    assert [[r["width"] for r in third] for third in thirds] == [[1, 2, 3], [5, 7], [9, 11]]
    found = results(rows, names)
    assert found["scans"] == 8 and found["scored"] == 7 and found["failed"] == 1
    assert [t["widths"] for t in found["by_width_third"]] == [[1, 3], [5, 7], [9, 11]]
    assert found["by_width_third"][2]["micro"]["confusion_matrix"] == [[0, 0], [0, 20]]
