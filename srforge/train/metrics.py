"""Per-class IoU, Dice and pixel accuracy from a confusion matrix over valid pixels only."""

from __future__ import annotations

import torch

from srforge.constants import IGNORE_INDEX


def confusion_matrix(
    pred: torch.Tensor, target: torch.Tensor, num_classes: int, ignore_index: int = IGNORE_INDEX
) -> torch.Tensor:
    """int64 [K, K] counts, rows = true class, columns = predicted, over pixels whose target is a class.

    pred and target are [B, H, W] (or any equal shapes) of class ids, any integer dtype. Padded pixels carry
    ``ignore_index``, so they are left out -- even when ``ignore_index`` is a class id -- and so are target values
    outside [0, K). Every shape here is fixed by K alone (no boolean-mask indexing, no bincount, whose output
    size depends on the data): pixels left out go to an extra bin K*K that is dropped, so on a GPU nothing is
    read back to the host.
    """
    k = num_classes
    target = target.long()
    valid = (target != ignore_index) & (target >= 0) & (target < k)
    index = torch.where(valid, target * k + pred.long().clamp(0, k - 1), k * k).reshape(-1)
    ones = torch.ones((), dtype=torch.int64, device=index.device).expand(index.numel())
    counts = torch.zeros(k * k + 1, dtype=torch.int64, device=index.device).scatter_add_(0, index, ones)
    return counts[: k * k].view(k, k)


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
