"""Per-class IoU, Dice and pixel accuracy from a confusion matrix over valid pixels only."""

from __future__ import annotations

import torch


def confusion_matrix(pred: torch.Tensor, target: torch.Tensor, num_classes: int, ignore_index: int = 255) -> torch.Tensor:
    """int64 [K, K] counts, rows = true class, columns = predicted, over pixels whose target is a class.

    pred and target are [B, H, W] (or any equal shapes) of class ids. Padded pixels carry ``ignore_index``,
    so they are left out -- even when ``ignore_index`` is a class id -- and so are target values outside [0, K).
    """
    valid = (target != ignore_index) & (target >= 0) & (target < num_classes)
    index = target[valid] * num_classes + pred[valid].clamp(0, num_classes - 1)
    return torch.bincount(index, minlength=num_classes * num_classes).view(num_classes, num_classes)


def scores(confusion: torch.Tensor) -> dict[str, object]:
    """IoU, Dice and accuracy per class, their means over classes present, and pixel accuracy.

    A class that appears neither in the targets nor in the predictions has no defined IoU: it is NaN
    and left out of the means.
    """
    c = confusion.double()
    tp = c.diag()
    fp = c.sum(0) - tp
    fn = c.sum(1) - tp
    iou = tp / (tp + fp + fn)
    dice = 2 * tp / (2 * tp + fp + fn)
    acc = tp / (tp + fn)
    total = c.sum()
    return {
        "iou": iou.tolist(),
        "dice": dice.tolist(),
        "accuracy": acc.tolist(),
        "mean_iou": float(iou.nanmean()) if total else float("nan"),
        "mean_dice": float(dice.nanmean()) if total else float("nan"),
        "pixel_accuracy": float(tp.sum() / total) if total else float("nan"),
    }
