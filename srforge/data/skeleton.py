"""The skeleton tube of a mask: what the thin-structure loss (``train.skeleton_weight``) asks the prediction to cover.

For each class c other than 0 (background) the pixels of class c are thinned to a skeleton (Zhang and Suen's
thinning with Lü and Wang's correction, 8-connected; specks of at most 2 x 2 px thin away and have no tube, which
the cross-entropy still counts), the skeleton is widened by ``TUBE_RADIUS`` steps of the 4-neighbourhood (a diamond:
pixels within L1 distance 2), and the result is cut back to the pixels of class c: ``tube[y, x] = c`` there, 0
elsewhere. A 1-px curve is its own tube; a band 3 px wide is covered whole; a thick blob keeps only a band around its
medial line, so that recall on the tube weighs a long thin curve as much as a short fat one (Skeleton Recall,
Kirchhoff et al., ECCV 2024). Pixels of ``ignore_index`` belong to no class and so to no tube.

The tube is made once per scan, from the mask as decoded (before rescaling, cropping and augmentation, which move it
with the mask); with ``data.cache`` it is kept there, keyed by the mask's bytes
(:class:`srforge.data.field_view.FieldView`).
"""

from __future__ import annotations

import numpy as np
import torch

TUBE_RADIUS = 2
TUBE_VERSION = 2  # raise it when thin() or widen() change what they make: the cache keys tubes by it


def _neighbours(padded: np.ndarray) -> list[np.ndarray]:
    """The 8 neighbours P2..P9 of every inner pixel of ``padded`` (a bool [H + 2, W + 2]), clockwise from north."""
    h, w = padded.shape[0] - 2, padded.shape[1] - 2
    offsets = [(-1, 0), (-1, 1), (0, 1), (1, 1), (1, 0), (1, -1), (0, -1), (-1, -1)]
    return [padded[1 + dy : 1 + dy + h, 1 + dx : 1 + dx + w] for dy, dx in offsets]


def thin(binary: np.ndarray) -> np.ndarray:
    """Zhang-Suen thinning of ``binary`` (bool [H, W]) to a thin, 8-connected skeleton: bool [H, W].

    Each pass removes, in two sub-passes, the border pixels with 3 to 6 neighbours (Lü and Wang's correction of
    Zhang-Suen's 2 to 6, which erases 2-px diagonal lines: a curve drawn 2 px wide at 45 degrees stays whole),
    exactly one 0 -> 1 transition around them, and (sub-pass 1) P2*P4*P6 = P4*P6*P8 = 0, (sub-pass 2) P2*P4*P8 =
    P2*P6*P8 = 0; until nothing changes. Only the bounding box of the foreground is worked on.
    """
    out = np.zeros(binary.shape, dtype=bool)
    rows, cols = np.nonzero(binary)
    if rows.size == 0:
        return out
    top, bottom, left, right = rows.min(), rows.max() + 1, cols.min(), cols.max() + 1
    padded = np.pad(binary[top:bottom, left:right].astype(bool), 1)
    inner = padded[1:-1, 1:-1]  # a view: removing a pixel there removes it from padded
    changed = True
    while changed:
        changed = False
        for first in (True, False):
            p = _neighbours(padded)
            count = sum(q.astype(np.uint8) for q in p)
            transitions = sum((~p[i] & p[(i + 1) % 8]).astype(np.uint8) for i in range(8))
            p2, p4, p6, p8 = p[0], p[2], p[4], p[6]
            if first:
                keep_shape = ~(p2 & p4 & p6) & ~(p4 & p6 & p8)
            else:
                keep_shape = ~(p2 & p4 & p8) & ~(p2 & p6 & p8)
            remove = inner & (count >= 3) & (count <= 6) & (transitions == 1) & keep_shape
            if remove.any():
                inner[remove] = False
                changed = True
    out[top:bottom, left:right] = inner
    return out


def widen(binary: np.ndarray, steps: int = TUBE_RADIUS) -> np.ndarray:
    """``binary`` (bool [H, W]) grown ``steps`` times by the 4-neighbourhood: every pixel within L1 distance
    ``steps`` of a true pixel (a diamond), inside the image."""
    out = binary.copy()
    for _ in range(steps):
        grown = out.copy()
        grown[1:, :] |= out[:-1, :]
        grown[:-1, :] |= out[1:, :]
        grown[:, 1:] |= out[:, :-1]
        grown[:, :-1] |= out[:, 1:]
        out = grown
    return out


def skeleton_tube(mask: torch.Tensor, ignore_index: int) -> torch.Tensor:
    """The skeleton tube (module docstring) of ``mask`` [H, W] class ids: uint8 [H, W] (int64 with ids over 255),
    0 where no tube, else the class id."""
    ids = mask.numpy() if isinstance(mask, torch.Tensor) else np.asarray(mask)
    classes = [int(c) for c in np.unique(ids) if c != 0 and c != ignore_index]
    dtype = np.uint8 if not classes or max(classes) <= 255 else np.int64
    tube = np.zeros(ids.shape, dtype=dtype)
    for c in classes:
        where = ids == c
        tube[widen(thin(where)) & where] = c
    return torch.from_numpy(tube)
