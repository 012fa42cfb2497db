"""Test-time augmentation: class probabilities averaged over the scan and its mirror images (predict.py's and
evaluate.py's ``--tta flip``, and self-training's flip teacher, ``train.self_training.tta``).

``flip`` averages the softmax probabilities of four views of every scan: as it is, mirrored left-right,
upside-down, and both (nnU-Net mirrors by default; MMSegmentation's SegTTAModel). Each scan of a padded batch is
mirrored within its own extent (H_i, W_i): its pixels move, its padding stays where it is (bottom and right), so
the padding-aware model sees each view exactly as it would see that view alone, and a prediction stays
independent of its batch company. Mirroring is its own inverse: the same index map takes each view's
probabilities back to the scan's orientation.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from srforge.constants import TTA_MODES

# The views of ``flip``: the mirrored spatial dims of each (-1: left-right, -2: upside-down).
FLIP_VIEWS: tuple[tuple[int, ...], ...] = ((), (-1,), (-2,), (-2, -1))


def tta_mode(tta: str | None) -> str | None:
    """The one reading of ``tta``: None or "none" -> None (no augmentation); "flip" -> "flip"; else a ValueError."""
    if tta is None or tta == "none":
        return None
    if tta in TTA_MODES:
        return tta
    raise ValueError(f"tta must be one of {', '.join(TTA_MODES)} (or None), got {tta!r}")


def mirror_index(padded: int, lengths: torch.Tensor) -> torch.Tensor:
    """int64 [B, padded]: position x of sample b reads from ``lengths[b] - 1 - x`` inside its extent, from x in
    its padding (which stays put)."""
    x = torch.arange(padded, device=lengths.device)
    lengths = lengths.to(x.device)[:, None]
    return torch.where(x < lengths, lengths - 1 - x, x)


def mirror_within(tensor: torch.Tensor, sizes: torch.Tensor, dims: tuple[int, ...]) -> torch.Tensor:
    """``tensor`` [B, C, Hp, Wp] with each sample b mirrored along ``dims`` (-1 W, -2 H) within its own extent
    ``sizes[b]`` = (H_b, W_b): its pixels stay inside the extent and padding stays padding (a padded column keeps
    its place; a padded row is mirrored along W with the rest of its row, among padded pixels only)."""
    batch, channels, height, width = tensor.shape
    for dim in dims:
        if dim == -1:
            index = mirror_index(width, sizes[:, 1])[:, None, None, :].expand(batch, channels, height, width)
            tensor = tensor.gather(3, index)
        else:
            index = mirror_index(height, sizes[:, 0])[:, None, :, None].expand(batch, channels, height, width)
            tensor = tensor.gather(2, index)
    return tensor


def flip_probabilities(
    forward: Callable[[torch.Tensor], torch.Tensor], image: torch.Tensor, sizes: torch.Tensor
) -> torch.Tensor:
    """float32 [B, K, Hp, Wp]: the mean over FLIP_VIEWS of softmax(forward(view)), each mirrored back.

    ``forward`` maps a padded batch [B, C, Hp, Wp] to logits [B, K, Hp, Wp] (the model with the batch's sizes);
    ``sizes`` [B, 2] on the device of ``image``. The views run one after another: memory is one forward pass
    plus the running sum.
    """
    total = None
    for dims in FLIP_VIEWS:
        probs = forward(mirror_within(image, sizes, dims)).float().softmax(1)
        probs = mirror_within(probs, sizes, dims)
        total = probs if total is None else total.add_(probs)
    return total.div_(len(FLIP_VIEWS))
