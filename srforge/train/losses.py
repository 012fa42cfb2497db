"""Losses on padded batches: padded pixels carry the ignore index, so they never count."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from srforge.constants import IGNORE_INDEX


def dice_loss(
    logits: torch.Tensor, target: torch.Tensor, ignore_index: int = IGNORE_INDEX, eps: float = 1.0
) -> torch.Tensor:
    """1 - mean soft Dice over classes, on pixels whose target is not ``ignore_index``.

    logits [B, K, H, W] (any float dtype; computed in float32), target [B, H, W] int64 -> scalar.
    """
    valid = (target != ignore_index).unsqueeze(1)  # [B, 1, H, W]
    probs = logits.float().softmax(dim=1) * valid
    # The one-hot in float32 with the mask applied once: int64 and a masked copy would cost 16 bytes per pixel
    # and class, gigabytes at a GPU's batch size.
    one_hot = F.one_hot(target.where(valid.squeeze(1), 0), logits.shape[1]).permute(0, 3, 1, 2).to(probs.dtype)
    one_hot.mul_(valid)
    dims = (0, 2, 3)
    inter = (probs * one_hot).sum(dims)
    total = probs.sum(dims) + one_hot.sum(dims)
    return 1 - ((2 * inter + eps) / (total + eps)).mean()


def valid_pixels(target: torch.Tensor, ignore_index: int = IGNORE_INDEX) -> torch.Tensor:
    """int64 scalar on target's device: the pixels of ``target`` [B, H, W] whose class counts (not ``ignore_index``;
    padding carries it). The count a batch's cross-entropy is averaged over, and what weights the parts of one
    optimizer update against each other (gradient accumulation, a batch redone in parts)."""
    return (target != ignore_index).sum()


def skeleton_recalls(logits: torch.Tensor, tube: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(recall float32 [B, K-1], present bool [B, K-1]): for each scan b and class c >= 1, the soft recall
    sum(p_c * [tube == c]) / sum([tube == c]) of ``logits`` [B, K, H, W] over that scan's pixels alone, and whether
    c has a tube in b (recall is 0 where not). ``tube`` [B, H, W]: class ids, 0 where no tube
    (:func:`srforge.data.skeleton.skeleton_tube`, padded with 0, so padding never counts)."""
    probs = logits.float().softmax(dim=1)[:, 1:]  # [B, K-1, H, W]: background has no tube
    classes = torch.arange(1, logits.shape[1], device=tube.device).view(1, -1, 1, 1)
    member = tube.unsqueeze(1) == classes  # [B, K-1, H, W]
    inside = member.sum((2, 3))  # [B, K-1]
    covered = (probs * member).sum((2, 3))
    return covered / inside.clamp_min(1), inside > 0


def skeleton_recall_loss(logits: torch.Tensor, tube: torch.Tensor) -> torch.Tensor:
    """1 - the mean soft recall of the skeleton tubes (Skeleton Recall, Kirchhoff et al., ECCV 2024).

    logits [B, K, H, W]; tube [B, H, W] class ids, 0 where no tube -> scalar: 1 - the mean of
    :func:`skeleton_recalls` over the (scan, class) pairs that have a tube (never pooled across the scans of a
    batch), 0 (with the graph kept) when no scan has a tube.
    """
    recall, present = skeleton_recalls(logits, tube)
    mean_recall = (recall * present).sum() / present.sum().clamp_min(1)
    return torch.where(present.any(), 1 - mean_recall, mean_recall)  # no tube: 0, the graph kept


def segmentation_loss(
    logits: torch.Tensor,
    target: torch.Tensor,
    ignore_index: int = IGNORE_INDEX,
    dice_weight: float = 0.0,
    skeleton_weight: float = 0.0,
    tube: torch.Tensor | None = None,
) -> torch.Tensor:
    """Mean cross-entropy over valid pixels (+ ``dice_weight`` * Dice loss, + ``skeleton_weight`` * the skeleton
    recall loss of ``tube`` [B, H, W] when given). logits [B, K, H, W], target [B, H, W].

    The one loss of training and validation. The mean divides the summed cross-entropy by the number of valid
    pixels, at least 1, on the device: a batch with no valid pixel (an all-ignore crop) gives a zero that keeps
    the graph, not cross-entropy's 0/0 NaN, and no value is read back to the host to decide it.

    One optimizer update over several batches (or one batch in parts) weights each part's loss by its share of the
    update's valid pixels: the cross-entropy then equals exactly that of one batch holding them all; the Dice term,
    a ratio over the whole batch, becomes the valid-pixel-weighted mean of the parts' Dice (srforge.train.update).
    """
    logits = logits.float()  # once for both terms (under autocast the logits are bf16 / fp16)
    valid = valid_pixels(target, ignore_index).clamp_min(1)
    loss = F.cross_entropy(logits, target, ignore_index=ignore_index, reduction="sum") / valid
    if dice_weight:
        loss = loss + dice_weight * dice_loss(logits, target, ignore_index)
    if skeleton_weight and tube is not None:
        loss = loss + skeleton_weight * skeleton_recall_loss(logits, tube)
    return loss
