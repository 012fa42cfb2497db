"""The fast counts (only the pixels where truth and prediction differ, one gather per offset of the disc) against
brute force: the confusion matrix by a loop over pixels, the tolerance counts by dilating each class's mask with
the disc of radius T (every offset dy^2 + dx^2 <= T^2, shifted and OR-ed), for T = 0..4, on padded batches of
scans of several sizes, whatever the padding of the prediction, for uint8 and int64 masks and any ignore_index."""

import numpy as np
import pytest
import torch

from srforge.data.collate import AlignedCollate
from srforge.evaluate.metrics import batch_counts, disc, disc_offsets


def brute_dilate(mask: np.ndarray, radius: int) -> np.ndarray:
    """bool [H, W]: pixels with a True pixel of ``mask`` at an offset of the disc of ``radius``."""
    h, w = mask.shape
    out = np.zeros_like(mask)
    for dy in range(-radius, radius + 1):
        for dx in range(-radius, radius + 1):
            if dy * dy + dx * dx > radius * radius:
                continue
            shifted = np.zeros_like(mask)  # shifted[y, x] = mask[y + dy, x + dx], False outside
            shifted[max(0, -dy) : h - max(0, dy), max(0, -dx) : w - max(0, dx)] = mask[
                max(0, dy) : h - max(0, -dy), max(0, dx) : w - max(0, -dx)
            ]
            out |= shifted
    return out


def brute_counts(truth: np.ndarray, pred: np.ndarray, k: int, ignore: int, radius: int) -> dict:
    """One scan's confusion [K, K], tolerance [K, 4] and invalid [2] by brute force."""
    labelled = truth != ignore
    valid_truth = labelled & (truth >= 0) & (truth < k)
    fits = (pred >= 0) & (pred < k)
    valid = valid_truth & fits
    confusion = np.zeros((k, k), np.int64)
    for t, p in zip(truth[valid], pred[valid]):
        confusion[t, p] += 1
    tolerance = np.zeros((k, 4), np.int64)
    for c in range(k):
        true, guess = (truth == c) & valid, (pred == c) & valid
        near_true, near_guess = brute_dilate(true, radius), brute_dilate(guess, radius)
        tolerance[c] = [(guess & near_true).sum(), guess.sum(), (true & near_guess).sum(), true.sum()]
    invalid = [int((labelled & ~valid_truth).sum()), int((valid_truth & ~fits).sum())]
    return {"confusion": confusion, "tolerance": tolerance, "invalid": np.array(invalid)}


def scans(rng, k: int, ignore: int, dtype) -> list[dict]:
    """Scans of several sizes: curves and blobs of the classes, a prediction a pixel or two off, ignore pixels,
    a few ids beyond the classes, one scan all background."""
    found = []
    for j, (h, w) in enumerate([(9, 13), (12, 7), (5, 16), (11, 11)]):
        truth = rng.choice(list(range(k)) + [0, 0, ignore], size=(h, w))
        pred = np.where(
            rng.random((h, w)) < 0.6, np.roll(truth, rng.integers(-2, 3), axis=1), rng.integers(0, k, (h, w))
        )
        pred = np.where(pred == ignore, 0, pred)
        if j == 1:
            truth[0, 0], pred[1, 1] = k + 1, k + 2  # ids the classes lack: counted as invalid
        if j == 3:
            truth[:], pred[:] = 0, 0
        found.append({"truth": torch.from_numpy(truth).to(dtype), "pred": torch.from_numpy(pred).to(dtype)})
    return found


@pytest.mark.parametrize("radius", [0, 1, 2, 3, 4])
@pytest.mark.parametrize("pred_pad", ["ignore", "zero"])
def test_fast_counts_equal_brute_force_disc_dilation_on_a_padded_batch(radius, pred_pad):
    rng = np.random.default_rng(radius)
    k, ignore = 3, 255
    items = scans(rng, k, ignore, torch.uint8)
    batch = AlignedCollate(1, pad={"truth": ignore, "pred": ignore if pred_pad == "ignore" else 0})(items)
    found = batch_counts(batch["pred"], batch["truth"], k, ignore, radius)
    for b, item in enumerate(items):
        expected = brute_counts(item["truth"].numpy(), item["pred"].numpy(), k, ignore, radius)
        for key, value in expected.items():
            assert found[key][b].tolist() == value.tolist(), (radius, b, key)


@pytest.mark.parametrize(
    ("dtype", "ignore", "k"),
    [(torch.int64, 255, 3), (torch.int64, -100, 3), (torch.uint8, -100, 3), (torch.uint8, 1, 4), (torch.int64, 1, 4)],
)
def test_every_dtype_and_ignore_index_counts_as_brute_force(dtype, ignore, k):
    """int64 masks, an ignore_index uint8 cannot hold, and an ignore_index that is one of the class ids; each
    scan a batch of one."""
    rng = np.random.default_rng(7)
    for item in scans(rng, k, 255, torch.int64):
        truth, pred = (torch.where(item[key] == 255, ignore, item[key]) for key in ("truth", "pred"))
        truth, pred = (truth.clamp(min=0) if dtype == torch.uint8 else truth).to(dtype), pred.to(dtype)
        found = batch_counts(pred[None], truth[None], k, ignore, 2)
        expected = brute_counts(truth.numpy().astype(np.int64), pred.numpy().astype(np.int64), k, ignore, 2)
        for key, value in expected.items():
            assert found[key][0].tolist() == value.tolist(), key


def test_the_offsets_are_the_disc_without_its_centre():
    for radius in range(5):
        offsets = disc_offsets(radius)
        assert len(offsets) == disc(radius).sum() - 1
        assert all(0 < dy * dy + dx * dx <= radius * radius for dy, dx in offsets)


def test_a_neighbour_counts_only_where_it_is_valid():
    """A true pixel whose prediction is no class, or a prediction over an ignored pixel, is no neighbour."""
    for truth, pred in (([[0, 1]], [[1, 9]]), ([[0, 255]], [[1, 1]])):
        found = batch_counts(
            torch.tensor([pred], dtype=torch.uint8), torch.tensor([truth], dtype=torch.uint8), 2, 255, 1
        )
        assert found["tolerance"][0, 1].tolist() == [0, 1, 0, 0]
        expected = brute_counts(np.array(truth), np.array(pred), 2, 255, 1)
        assert found["tolerance"][0].tolist() == expected["tolerance"].tolist()
