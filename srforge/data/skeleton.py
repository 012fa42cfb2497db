"""The skeleton tube of a mask: what the thin-structure loss (``train.skeleton_weight``) asks the prediction to cover.

For each class c other than 0 (background) the pixels of class c are thinned to a skeleton (Zhang and Suen's
thinning with Lü and Wang's correction, 8-connected; specks of at most 2 x 2 px thin away and have no tube, which
the cross-entropy still counts), the skeleton is widened by ``TUBE_RADIUS`` steps of the 4-neighbourhood (a diamond:
pixels within L1 distance 2), and the result is cut back to the pixels of class c: ``tube[y, x] = c`` there, 0
elsewhere. A 1-px curve is its own tube; a band 3 px wide is covered but for the corners at its far end; a thick
blob keeps only a band around its medial line, so that recall on the tube weighs a long thin curve as much as a
short fat one (Skeleton Recall, Kirchhoff et al., ECCV 2024). Pixels of ``ignore_index`` belong to no class and
so to no tube.

The tube is made once per scan, from the mask as decoded (before rescaling, cropping and augmentation, which move it
with the mask); with ``data.cache`` it is kept there, keyed by the mask's bytes
(:class:`srforge.data.field_view.FieldView`). Self-training's tubes of pseudo-labels
(``train.self_training.skeleton``) are made each update for a whole padded batch on its device: every function
here takes one mask or a batch of them, each worked on alone.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

TUBE_RADIUS = 2
TUBE_VERSION = 2  # raise it when thin() or widen() change what they make: the cache keys tubes by it


# The 8 neighbours P2..P9 of a pixel, clockwise from north: bit i of a pixel's neighbourhood code is P(i + 2).
NEIGHBOURS = [(-1, 0), (-1, 1), (0, 1), (1, 1), (1, 0), (1, -1), (0, -1), (-1, -1)]


def removable(first: bool) -> torch.Tensor:
    """bool [256]: whether a foreground pixel whose neighbourhood code (NEIGHBOURS) is the index is removed in
    sub-pass 1 (``first``) or 2 of :func:`thin`: 3 to 6 neighbours (Lü and Wang's correction of Zhang-Suen's 2 to
    6, which erases 2-px diagonal lines: a curve drawn 2 px wide at 45 degrees stays whole), exactly one 0 -> 1
    transition around it, and (sub-pass 1) P2*P4*P6 = P4*P6*P8 = 0, (sub-pass 2) P2*P4*P8 = P2*P6*P8 = 0."""
    table = torch.zeros(256, dtype=torch.bool)
    for code in range(256):
        p = [(code >> i) & 1 for i in range(8)]
        transitions = sum(1 - p[i] and p[(i + 1) % 8] for i in range(8))
        p2, p4, p6, p8 = p[0], p[2], p[4], p[6]
        corners = (p2 and p4 and p6) or (p4 and p6 and p8) if first else (p2 and p4 and p8) or (p2 and p6 and p8)
        table[code] = 3 <= sum(p) <= 6 and transitions == 1 and not corners
    return table


REMOVABLE = (removable(True), removable(False))


def thin(binary: torch.Tensor) -> torch.Tensor:
    """Zhang-Suen thinning of ``binary`` (bool [..., H, W]: one mask or a batch of them, each thinned alone, on its
    own device) to a thin, 8-connected skeleton: bool [..., H, W].

    Each pass removes, in two sub-passes, the foreground pixels that sub-pass's rule (:func:`removable`, looked up
    by each pixel's neighbourhood code) allows; until nothing changes in any mask. Only the bounding box of the
    foreground of all masks together is worked on: outside a mask (and outside the box) is background, so the
    padding of a batch changes nothing.
    """
    binary = binary.bool()
    out = torch.zeros_like(binary)
    if binary.numel() == 0:
        return out
    flat = binary.reshape(-1, *binary.shape[-2:]).any(0)
    rows, cols = flat.any(1).nonzero()[:, 0], flat.any(0).nonzero()[:, 0]
    if rows.numel() == 0:
        return out
    top, bottom, left, right = int(rows[0]), int(rows[-1]) + 1, int(cols[0]), int(cols[-1]) + 1
    padded = F.pad(binary[..., top:bottom, left:right].to(torch.uint8), (1, 1, 1, 1))
    inner = padded[..., 1:-1, 1:-1]  # a view: removing a pixel there removes it from padded
    h, w = inner.shape[-2:]
    tables = [table.to(binary.device) for table in REMOVABLE]
    changed = True
    while changed:
        changed = False
        for table in tables:
            code = torch.zeros_like(inner)
            for i, (dy, dx) in enumerate(NEIGHBOURS):
                code |= padded[..., 1 + dy : 1 + dy + h, 1 + dx : 1 + dx + w] << i
            remove = table[code.int()] & inner.bool()
            if remove.any():
                inner.masked_fill_(remove, 0)
                changed = True
    out[..., top:bottom, left:right] = inner.bool()
    return out


def widen(binary: torch.Tensor, steps: int = TUBE_RADIUS) -> torch.Tensor:
    """``binary`` (bool [..., H, W]) grown ``steps`` times by the 4-neighbourhood: every pixel within L1 distance
    ``steps`` of a true pixel (a diamond), inside the image."""
    out = binary.clone()
    for _ in range(steps):
        grown = out.clone()
        grown[..., 1:, :] |= out[..., :-1, :]
        grown[..., :-1, :] |= out[..., 1:, :]
        grown[..., :, 1:] |= out[..., :, :-1]
        grown[..., :, :-1] |= out[..., :, 1:]
        out = grown
    return out


def skeleton_tube(mask: torch.Tensor, ignore_index: int) -> torch.Tensor:
    """The skeleton tube (module docstring) of ``mask`` [..., H, W] class ids (one mask or a batch of them, each
    alone): uint8 [..., H, W] (int64 with ids over 255), 0 where no tube, else the class id; on ``mask``'s
    device."""
    ids = torch.as_tensor(mask)
    classes = [int(c) for c in ids.unique().tolist() if c != 0 and c != ignore_index]
    dtype = torch.uint8 if not classes or max(classes) <= 255 else torch.int64
    tube = torch.zeros(ids.shape, dtype=dtype, device=ids.device)
    for c in classes:
        where = ids == c
        tube.masked_fill_(widen(thin(where)) & where, c)
    return tube
