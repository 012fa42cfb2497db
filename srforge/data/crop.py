"""Random training crops of scans too large for any budget: ``data.crop: [H, W]`` (or one number for both).

A crop is a maximum size, rounded down to the model's size divisor, so that a cropped side needs no alignment
padding. A training scan larger than it in either dimension is cut to ``(min(H, crop_H), min(W, crop_W))`` at a
random position inside the scan, drawn from (seed, epoch, sample) alone -- like augmentation, so a resumed run, any
worker count and any batch order crop alike -- and a scan that fits stays whole. The crop is taken before
collation, so it lies within the scan and never reaches into padding. The sampler groups training scans by their
cropped sizes (:func:`crop_sizes`), so batches stay within their pixel budget; validation and prediction see
whole scans.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

import numpy as np
import torch


def sample_seed(seed: int, epoch: int, index: int, stream: str = "") -> int:
    """A 63-bit seed that depends only on (``seed``, ``epoch``, sample ``index``) and the ``stream`` of randomness
    ("" for augmentation, "crop" for crops: each draws its own, so adding crops leaves augmentation as it was)."""
    key = f"{seed}/{epoch}/{index}" + (f"/{stream}" if stream else "")
    return int.from_bytes(hashlib.blake2b(key.encode(), digest_size=8).digest(), "little") >> 1


def crop_shape(crop: int | Sequence[int], divisor: int) -> tuple[int, int]:
    """``data.crop`` (an int, or [H, W]) as (H, W) rounded down to multiples of ``divisor``.

    A side that rounds down to 0 is a ValueError naming data.crop, the divisor and the smallest crop that works.
    """
    pair = (crop, crop) if isinstance(crop, int) else tuple(crop)
    if len(pair) != 2 or not all(isinstance(n, int) and not isinstance(n, bool) and n >= 1 for n in pair):
        raise ValueError(f"data.crop: expected an int >= 1 or [H, W] of them, found {crop!r}.")
    aligned = (pair[0] // divisor * divisor, pair[1] // divisor * divisor)
    if min(aligned) < divisor:
        raise ValueError(
            f"data.crop: {list(pair)} rounds down to {list(aligned)} at the model's size divisor {divisor}: a crop "
            f"keeps whole multiples of it. Give at least {divisor} on each side, e.g. "
            f"data.crop=[{max(pair[0], divisor)}, {max(pair[1], divisor)}]."
        )
    return aligned


def crop_sizes(sizes: Sequence[Sequence[int]], crop: tuple[int, int] | None) -> list[tuple[int, int]]:
    """[(min(H, crop_H), min(W, crop_W)), ...]: the sizes the sampler groups training scans by ([(H, W), ...]
    unchanged without a crop)."""
    if crop is None:
        return [(int(h), int(w)) for h, w in sizes]
    return [(min(int(h), crop[0]), min(int(w), crop[1])) for h, w in sizes]


def crop_window(size: tuple[int, int], crop: tuple[int, int], seed: int) -> tuple[int, int, int, int]:
    """(top, left, height, width) of the crop of a scan of ``size`` (H, W): the scan's own extent where it fits
    the crop, else a position drawn from ``seed`` uniformly among all that keep the crop inside the scan."""
    (h, w), (ch, cw) = size, crop
    height, width = min(h, ch), min(w, cw)
    rng = np.random.default_rng(seed)
    top = int(rng.integers(0, h - height + 1))
    left = int(rng.integers(0, w - width + 1))
    return top, left, height, width


def random_crop(sample: dict, crop: tuple[int, int], seed: int) -> dict:
    """``sample`` with ``image`` [C, H, W] and ``mask`` [H, W] (and ``tube`` [H, W], when there is one) cut to one
    crop window (:func:`crop_window`); the same object back when the scan fits the crop. Views, no copy: collation
    copies once into the batch."""
    image = sample["image"]
    height, width = int(image.shape[-2]), int(image.shape[-1])
    if height <= crop[0] and width <= crop[1]:
        return sample
    top, left, h, w = crop_window((height, width), crop, seed)
    sample["image"] = image[..., top : top + h, left : left + w]
    for key in ("mask", "tube"):
        field = sample.get(key)
        if isinstance(field, torch.Tensor) or hasattr(field, "shape"):
            sample[key] = field[..., top : top + h, left : left + w]
    return sample
