"""Scores of predicted masks against true masks, batched on the device: counts first, figures from counts.

Per scan and class, two sets of counts, each computed for a whole padded batch at once (no Python loop over
pixels or scans, nothing read back to the host until the batch is done):

- the confusion matrix [K, K] (rows: true class, columns: predicted) over the scan's valid pixels: a true
  value of ``ignore_index`` (padding, and pixels the mask leaves unlabelled) counts nowhere;
- tolerance counts [K, 4]: predicted pixels of class c within ``tolerance`` px (Euclidean) of a true pixel of
  c, predicted pixels of c, true pixels of c within ``tolerance`` px of a predicted pixel of c, true pixels of
  c. "Within T px" is a dilation by the disc of radius T (every offset with dy^2 + dx^2 <= T^2), which is
  exactly thresholding the Euclidean distance transform of the other mask at T; it runs as one grouped
  convolution per batch. Each scan sits in its own slot, so a dilation never reaches another scan.

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


def dilate(masks: torch.Tensor, radius: int) -> torch.Tensor:
    """bool [B, K, H, W]: pixels within ``radius`` px (Euclidean) of a True pixel of the same [b, k] plane."""
    if radius == 0:
        return masks
    k = masks.shape[1]
    weight = disc(radius, masks.device)[None, None].expand(k, 1, -1, -1)
    reached = torch.nn.functional.conv2d(masks.float(), weight, padding=radius, groups=k)
    return reached > 0.5


def batch_counts(
    pred: torch.Tensor, target: torch.Tensor, num_classes: int, ignore_index: int, tolerance: int
) -> dict[str, torch.Tensor]:
    """Counts of each scan of a padded batch, on its device.

    pred, target: [B, H, W] class ids (any integer dtype), target padded with ``ignore_index``. Returns
    ``confusion`` int64 [B, K, K], ``tolerance`` int64 [B, K, 4] (see the module docstring) and ``invalid``
    int64 [B, 2]: valid pixels whose true / predicted id is outside [0, K) (a mask that does not fit the
    classes: the caller turns such a scan into an error row).
    """
    k, batch = num_classes, pred.shape[0]
    target, pred = target.long(), pred.long()
    labelled = target != ignore_index
    valid = labelled & (target >= 0) & (target < k)
    fits = (pred >= 0) & (pred < k)
    invalid = torch.stack([(labelled & ~valid).sum((1, 2)), (valid & ~fits).sum((1, 2))], 1)
    valid &= fits
    bins = k * k + 1  # the last bin takes every pixel left out, and is dropped
    index = torch.where(valid, target * k + pred, k * k) + torch.arange(batch, device=pred.device)[:, None, None] * bins
    counts = torch.zeros(batch * bins, dtype=torch.int64, device=pred.device)
    counts.scatter_add_(
        0, index.reshape(-1), torch.ones((), dtype=torch.int64, device=pred.device).expand(index.numel())
    )
    confusion = counts.view(batch, bins)[:, : k * k].view(batch, k, k)
    classes = torch.arange(k, device=pred.device)[None, :, None, None]
    truth = (target[:, None] == classes) & valid[:, None]  # [B, K, H, W]
    guess = (pred[:, None] == classes) & valid[:, None]
    near_truth, near_guess = dilate(truth, tolerance), dilate(guess, tolerance)
    tol = torch.stack(
        [(guess & near_truth).sum((2, 3)), guess.sum((2, 3)), (truth & near_guess).sum((2, 3)), truth.sum((2, 3))], -1
    )
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
