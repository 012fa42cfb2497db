"""Scores of predicted masks against true masks, batched on the device: counts first, figures from counts.

Per scan and class, two sets of counts, each computed for a whole padded batch at once (no Python loop over
pixels or scans, nothing read back to the host until the batch is done):

- the confusion matrix [K, K] (rows: true class, columns: predicted) over the scan's valid pixels: a true
  value of ``ignore_index`` (padding, and pixels the mask leaves unlabelled) counts nowhere;
- tolerance counts [K, 4]: predicted pixels of class c within ``tolerance`` px (Euclidean) of a true pixel of
  c, predicted pixels of c, true pixels of c within ``tolerance`` px of a predicted pixel of c, true pixels of
  c. "Within T px" is the disc of radius T (every offset with dy^2 + dx^2 <= T^2), which is exactly
  thresholding the Euclidean distance transform of the other mask at T. Only the pixels whose answer is not
  known beforehand are looked at: a pixel predicted its true class is within 0 px of both, and the class totals
  are the confusion matrix's row and column sums; so the search runs on the valid pixels where prediction and
  truth differ (a few percent for a useful model), each compared with the other mask at every offset of the
  disc: one gather per offset over those pixels, not a dilation of K planes over every pixel. A neighbour
  outside the scan's slot is out, so an offset never wraps to another row or reaches another scan.

Figures (:func:`figures`) come from counts, so one function scores a scan, a width third or the whole set
(micro: counts pooled); a figure whose denominator is 0 is NaN (undefined) and left out of every mean.
"""

from __future__ import annotations

import math

import torch

BACKGROUND = 0  # the class the "without_bg" means leave out
PER_CLASS = ("iou", "dice", "precision", "recall", "tol_precision", "tol_recall", "tol_f1")
MEANS = ("iou", "dice", "precision", "recall", "tol_f1")  # averaged over classes, with and without background


def disc(radius: int, device=None) -> torch.Tensor:
    """float32 [2r+1, 2r+1]: 1 at every offset (dy, dx) with dy^2 + dx^2 <= r^2, else 0."""
    offsets = torch.arange(-radius, radius + 1, device=device)
    return ((offsets[:, None] ** 2 + offsets[None, :] ** 2) <= radius**2).float()


def disc_offsets(radius: int) -> list[tuple[int, int]]:
    """The offsets (dy, dx) of :func:`disc` other than (0, 0), row by row."""
    return [(dy - radius, dx - radius) for dy, dx in disc(radius).nonzero().tolist() if (dy, dx) != (radius, radius)]


def levels(ids: torch.Tensor, k: int, ignore_index: int | None) -> tuple[torch.Tensor, int, int | None]:
    """(ids as levels, the number of levels, the level of ``ignore_index`` or None): class ids 0..K-1 are their
    own level, every other value a level >= K. uint8 ids are their own levels (256) where that holds (K <= 255
    and ``ignore_index`` no class); any other dtype: ``ignore_index`` is level K, anything else K + 1."""
    if ids.dtype == torch.uint8 and k <= 255 and not (ignore_index is not None and 0 <= ignore_index < k):
        return ids, 256, ignore_index if ignore_index is not None and 0 <= ignore_index <= 255 else None
    ids = ids.long()
    classes = (ids >= 0) & (ids < k)
    if ignore_index is None:
        return torch.where(classes, ids, k + 1), k + 2, None
    classes &= ids != ignore_index
    return torch.where(classes, ids, torch.where(ids == ignore_index, k, k + 1)), k + 2, k


def _inside(coordinate: torch.Tensor, shifts, extent: int) -> dict[int, torch.Tensor]:
    """{shift: bool, coordinate + shift in [0, extent)} for each shift."""
    return {s: (coordinate < extent - s) if s > 0 else (coordinate >= -s) for s in shifts}


def near_misses(truth: torch.Tensor, guess: torch.Tensor, misses: tuple, k: int, radius: int) -> torch.Tensor:
    """int64 [B, K, 2] of the ``misses`` (b, y, x, true class, predicted class: valid pixels where the levels
    ``truth`` and ``guess`` [B, H, W] differ): [b, c, 0] those predicted c within ``radius`` px of a true pixel
    of c, [b, c, 1] those truly c within ``radius`` px of a pixel predicted c (a neighbour counts where it is
    valid: both its levels are classes). Each offset of the disc is one gather over the misses; a neighbour
    outside the slot [H, W] (another row, another scan) is out."""
    batch, height, width = truth.shape
    b, y, x, true, predicted = misses
    near = torch.zeros(2, batch * k, dtype=torch.int64, device=truth.device)
    offsets = disc_offsets(radius)
    if offsets and b.numel():
        flat = truth.reshape(-1), guess.reshape(-1)
        centre = (b * height + y) * width + x
        rows = _inside(y, {dy for dy, _ in offsets}, height)
        columns = _inside(x, {dx for _, dx in offsets}, width)
        hits = torch.zeros_like(b, dtype=torch.bool), torch.zeros_like(b, dtype=torch.bool)
        for dy, dx in offsets:
            inside = rows[dy] & columns[dx] if dy and dx else rows[dy] if dy else columns[dx]
            at = torch.where(inside, centre + (dy * width + dx), centre)
            truth_at, guess_at = flat[0][at], flat[1][at]
            hits[0].logical_or_(inside & (truth_at == predicted) & (guess_at < k))
            hits[1].logical_or_(inside & (guess_at == true) & (truth_at < k))
        near[0].index_add_(0, b * k + predicted, hits[0].long())
        near[1].index_add_(0, b * k + true, hits[1].long())
    return near.view(2, batch, k).permute(1, 2, 0)


def batch_counts(
    pred: torch.Tensor, target: torch.Tensor, num_classes: int, ignore_index: int, tolerance: int
) -> dict[str, torch.Tensor]:
    """Counts of each scan of a padded batch, on its device.

    pred, target: [B, H, W] class ids (any integer dtype), target padded with ``ignore_index``. Returns
    ``confusion`` int64 [B, K, K], ``tolerance`` int64 [B, K, 4] (see the module docstring) and ``invalid``
    int64 [B, 2]: valid pixels whose true / predicted id is outside [0, K) (a mask that does not fit the
    classes: the caller turns such a scan into an error row).

    Three passes over the pixels: a histogram of the true levels per scan, "true level != predicted level", and
    the positions where it holds; everything else is counted on those positions (a few percent of the pixels).
    """
    k, batch = num_classes, pred.shape[0]
    truth, count, ignored = levels(target, k, ignore_index)
    guess = levels(pred, k, None)[0]
    histogram = torch.stack([torch.bincount(truth[j].reshape(-1), minlength=count) for j in range(batch)])
    b, y, x = (truth != guess).nonzero(as_tuple=True)
    true, predicted = truth[b, y, x].long(), guess[b, y, x].long()
    pairs = (b * (k + 1) + true.clamp(max=k)) * (k + 1) + predicted.clamp(max=k)
    differ = torch.bincount(pairs, minlength=batch * (k + 1) ** 2).view(batch, k + 1, k + 1)
    hit = histogram[:, :k] - differ[:, :k].sum(2)  # a pixel of class c either predicted c or differing
    confusion = differ[:, :k, :k] + torch.diag_embed(hit)
    unlabelled = histogram[:, ignored] if ignored is not None else 0
    invalid = torch.stack([histogram[:, k:].sum(1) - unlabelled, differ[:, :k, k].sum(1)], 1)
    valid = (true < k) & (predicted < k)
    misses = (b[valid], y[valid], x[valid], true[valid], predicted[valid])
    near = near_misses(truth, guess, misses, k, tolerance)
    tol = torch.stack([hit + near[..., 0], confusion.sum(1), hit + near[..., 1], confusion.sum(2)], -1)
    return {"confusion": confusion, "tolerance": tol, "invalid": invalid}


def _ratio(top: torch.Tensor, bottom: torch.Tensor) -> torch.Tensor:
    return top / bottom  # float64: 0 / 0 is NaN, the undefined figure


def per_class(confusion: torch.Tensor, tolerance: torch.Tensor) -> dict[str, torch.Tensor]:
    """float64 [K] of each name in PER_CLASS from one set of counts (confusion [K, K], tolerance [K, 4]).

    Tolerance F1 is 2PR / (P + R) of the tolerance precision P and recall R; where one of them is undefined
    (the class neither predicted, or not present) and the other defined, F1 is 0; both undefined: NaN.
    """
    c, t = confusion.double(), tolerance.double()
    tp = c.diagonal()
    fp, fn = c.sum(0) - tp, c.sum(1) - tp
    p, r = _ratio(t[:, 0], t[:, 1]), _ratio(t[:, 2], t[:, 3])
    f1 = torch.where(p + r > 0, 2 * p * r / (p + r), torch.zeros_like(p))
    f1 = torch.where(p.isnan() | r.isnan(), torch.zeros_like(p), f1)
    f1 = torch.where((t[:, 1] + t[:, 3]) == 0, torch.full_like(p, math.nan), f1)
    return {
        "iou": _ratio(tp, tp + fp + fn),
        "dice": _ratio(2 * tp, 2 * tp + fp + fn),
        "precision": _ratio(tp, tp + fp),
        "recall": _ratio(tp, tp + fn),
        "tol_precision": p,
        "tol_recall": r,
        "tol_f1": f1,
    }


def nanmean(values) -> float:
    """The mean of the values that are not NaN; NaN when none is."""
    kept = [float(v) for v in values if not math.isnan(float(v))]
    return sum(kept) / len(kept) if kept else math.nan


def figures(confusion: torch.Tensor, tolerance: torch.Tensor, class_names) -> dict:
    """Every figure of one set of counts: ``pixel_accuracy``, ``mean_<m>_with_bg`` and ``mean_<m>_without_bg``
    for m in MEANS (NaN classes left out), and ``per_class`` {figure: {class name: value}}; plus the error
    pixel counts ``false_positive_px`` (predicted a foreground class where the truth is another class) and
    ``false_negative_px`` (a true foreground pixel given another class)."""
    scores = per_class(confusion, tolerance)
    c = confusion.double()
    total = float(c.sum())
    out: dict = {"pixel_accuracy": float(c.diagonal().sum()) / total if total else math.nan}
    for name in MEANS:
        values = scores[name].tolist()
        out[f"mean_{name}_with_bg"] = nanmean(values)
        out[f"mean_{name}_without_bg"] = nanmean(v for k, v in enumerate(values) if k != BACKGROUND)
    off = c - torch.diag(c.diagonal())
    out["false_positive_px"] = int(off[:, 1:].sum()) if c.shape[0] > 1 else 0
    out["false_negative_px"] = int(off[1:, :].sum()) if c.shape[0] > 1 else 0
    out["per_class"] = {name: dict(zip(class_names, scores[name].tolist())) for name in PER_CLASS}
    return out


def primary(num_classes: int) -> str:
    """The figure scans are ranked by (worst first, compared): mean IoU without background, or with it for a
    single-class model."""
    return "mean_iou_without_bg" if num_classes > 1 else "mean_iou_with_bg"
