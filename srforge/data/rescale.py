"""Random rescaling of training scans: ``data.augment.scale: [lo, hi]``, a factor drawn per (seed, epoch, sample).

A training scan is resized, image and mask together, by a factor drawn log-uniformly from [lo, hi] (so that 0.5
and 2.0 are equally likely around 1) from (seed, epoch, sample index) alone -- its own stream of
:func:`srforge.data.crop.sample_seed`, so adding rescaling leaves crops and the other augmentation as they were,
and a resumed run, any worker count and any batch order rescale alike. It changes the scan's size: the FieldView
rescales before ``data.crop`` cuts the rescaled scan, and the sampler groups each epoch's batches by the sizes the
scans have in that epoch (:func:`epoch_sizes`), so every batch stays within its pixel budget; both through one
:class:`srforge.data.size_policy.SizePolicy`.

Images are resized bilinearly with antialiasing. Masks keep their classes: nearest neighbour when enlarging; when
shrinking, a pixel takes the foreground class that covers enough of it (:func:`rescale_mask`), so a curve one pixel
wide survives at any factor instead of vanishing between the nearest neighbour's samples (isolated one-pixel dots
can still vanish at factors below about 0.6: see :func:`rescale_mask`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
import torch.nn.functional as F

from srforge.constants import IGNORE_INDEX
from srforge.data.crop import crop_sizes, sample_seed

# A shrunk pixel is foreground where the foreground covers at least COVERAGE x ratio of its area (ratio: output over
# input size, the smaller axis). A 1-px horizontal line covers >= 1/2 of one output pixel's rows, i.e. >= ratio / 2,
# wherever it falls; but a 45-degree staircase near ratio 1 can leave every pixel of an output column with less: an
# output column then holds a pixels' worth of one line pixel and 1 - a of the next row's, and with the row grid at
# its worst the better of the two output pixels gets (1 - a)^2 / (2 - 3a) of the ratio, least at a = 1/3: 4/9.
# With 4/9, every column (for steep curves, row) of a 1-px line keeps a pixel: straight lines of every slope and
# random 8-connected curves at factors 0.1-0.995 never fell below 0.447 of the ratio (tests/test_rescale.py sweeps
# the diagonals). The price: a line split almost evenly (4/9 to 5/9) between two output rows keeps both.
COVERAGE = 4 / 9
# Floating-point slack: a line that covers exactly the threshold must not be lost to rounding in the prefix sums.
_SLACK = 1e-9


def scale_factor(seed: int, epoch: int, index: int, scale_range: Sequence[float]) -> float:
    """The factor sample ``index`` is rescaled by in ``epoch``: log-uniform in [lo, hi], from
    ``sample_seed(seed, epoch, index, "scale")`` alone (exactly ``lo`` when lo == hi)."""
    lo, hi = float(scale_range[0]), float(scale_range[1])
    if not 0 < lo <= hi:
        raise ValueError(f"data.augment.scale: expected 0 < lo <= hi, found [{lo:g}, {hi:g}].")
    if lo == hi:
        return lo
    # The 63-bit seed itself is the uniform draw: no generator to build per sample, so the sampler can draw a whole
    # epoch's factors cheaply, and the FieldView and the sampler get the very same float.
    u = sample_seed(seed, epoch, index, "scale") / 2.0**63  # in [0, 1)
    return min(hi, lo * math.exp(u * math.log(hi / lo)))  # u rounds to 1.0 for the top 2**9 seeds


def scaled_size(size: Sequence[int], factor: float) -> tuple[int, int]:
    """(max(1, round(H * factor)), max(1, round(W * factor))): the size a scan of ``size`` (H, W) is rescaled to."""
    h, w = int(size[0]), int(size[1])
    return max(1, round(h * factor)), max(1, round(w * factor))


def epoch_sizes(
    sizes: Sequence[Sequence[int]],
    indices: Sequence[int],
    seed: int,
    epoch: int,
    scale_range: Sequence[float] | None,
    crop: tuple[int, int] | None,
) -> list[tuple[int, int]]:
    """[(H, W), ...]: the sizes the training scans have in ``epoch``, rescaled (:func:`scaled_size` by
    :func:`scale_factor`), then cropped (:func:`srforge.data.crop.crop_sizes`) -- what the FieldView makes of them.

    ``sizes[i]`` is the true size of the view's sample ``i`` and ``indices[i]`` the dataset index it draws its
    factor with (FieldView reads ``dataset[indices[i]]``); ``scale_range`` None leaves sizes unscaled.
    """
    if len(sizes) != len(indices):
        raise ValueError(f"epoch_sizes: {len(sizes)} sizes but {len(indices)} indices; give one index per size.")
    if scale_range is None:
        return crop_sizes(sizes, crop)
    scaled = [scaled_size(size, scale_factor(seed, epoch, index, scale_range)) for size, index in zip(sizes, indices)]
    return crop_sizes(scaled, crop)


def _nearest(mask: torch.Tensor, size: tuple[int, int]) -> torch.Tensor:
    """``mask`` [..., H, W] sampled at the input pixel whose centre is nearest each output centre: [..., h, w].

    Indexing, not F.interpolate: values and dtype stay exactly as they are (int64 ids, ignore index, float masks).
    """
    (height, width), (h, w) = mask.shape[-2:], size
    rows = ((torch.arange(h, dtype=torch.float64) + 0.5) * (height / h)).long().clamp_(max=height - 1)
    cols = ((torch.arange(w, dtype=torch.float64) + 0.5) * (width / w)).long().clamp_(max=width - 1)
    return mask.index_select(-2, rows.to(mask.device)).index_select(-1, cols.to(mask.device))


def _interval_sums(values: torch.Tensor, dim: int, parts: int) -> torch.Tensor:
    """float64: sums of ``values`` over ``parts`` equal intervals of [0, n) along ``dim`` (n its length); a cell that
    straddles an interval's edge counts in each interval by the share of it that lies there.

    Exact area integration by prefix sums: the integral of a piecewise-constant function up to a fractional
    coordinate x is prefix[floor(x)] + frac(x) * value[floor(x)]. (F.interpolate's "area" mode averages overlapping
    whole-pixel windows instead, which undercounts a 1-px line at some offsets.)
    """
    x = values.movedim(dim, 0)  # [n, ...]
    n = x.shape[0]
    # Counts of a bool mask in int32 (exact, half the bytes of float64); anything else in float64.
    cumulative = x.cumsum(0, dtype=torch.int32 if x.dtype == torch.bool else torch.float64)
    prefix = torch.cat([cumulative.new_zeros((1, *x.shape[1:])), cumulative])  # [n + 1, ...]
    edges = torch.arange(parts + 1, dtype=torch.float64, device=x.device) * n / parts  # the last one exactly n
    cell = edges.floor().long().clamp_(max=n - 1)
    share = (edges - cell).view(-1, *([1] * (x.dim() - 1)))
    at = prefix[cell].double() + share * x[cell].double()  # [parts + 1, ...]
    return (at[1:] - at[:-1]).movedim(0, dim)


def area_coverage(region: torch.Tensor, size: tuple[int, int]) -> torch.Tensor:
    """float64 [h, w]: the share of each output pixel's area that the bool ``region`` [H, W] covers, when the scan
    is resized to ``size`` (h, w) <= (H, W) and each output pixel spans (H / h) x (W / w) input pixels."""
    (height, width), (h, w) = region.shape, size
    sums = _interval_sums(_interval_sums(region, 0, h), 1, w)
    return sums / ((height / h) * (width / w))


def rescale_mask(mask: torch.Tensor, size: tuple[int, int], ignore_index: int = IGNORE_INDEX) -> torch.Tensor:
    """``mask`` [H, W] (class ids; 0 background, ``ignore_index`` unlabelled) resized to ``size`` (h, w), same dtype.

    Enlarging (h >= H and w >= W): nearest neighbour, so no new values appear. Shrinking: each output pixel takes
    the nearest neighbour's value, unless the foreground classes (neither 0 nor ``ignore_index``) together cover at
    least ``COVERAGE * ratio`` (4/9 of the ratio) of its area (:func:`area_coverage`), ``ratio = min(h / H, w / W)``
    (the factor, as rounded into whole pixels): then it takes the foreground class that covers most of it. A line
    one pixel wide covers at least half a pixel of one output pixel's (H / h) rows wherever it falls relative to the
    output grid, that is >= ratio / 2 of its area, in every output column it crosses, and a diagonal one >= 4/9 of
    the ratio (see COVERAGE) -- so a curve is never thinned below one pixel, while the nearest neighbour alone drops
    a 1-px line in most positions at factors below 1/2. Background and ``ignore_index`` pixels come from the nearest
    neighbour: ignore stays ignore, and no class is invented. The guarantee is for lines; an isolated dot of one
    pixel covers at most ratio**2 of an output pixel and is lost where that is below the threshold (below ratio
    4/9, and at some positions from about 0.6 down), as a dot of that size is also lost in the bilinear image.
    """
    height, width = int(mask.shape[-2]), int(mask.shape[-1])
    h, w = size
    nearest = _nearest(mask, (h, w))
    if h >= height and w >= width:
        return nearest
    classes = [c for c in mask.unique().tolist() if c != 0 and c != ignore_index]
    if not classes:
        return nearest
    best = torch.zeros((h, w), dtype=torch.float64, device=mask.device)
    label = torch.zeros_like(nearest)
    total = torch.zeros_like(best)
    for c in classes:  # one class at a time: memory of one [H, W] prefix sum, not of a one-hot [K, H, W]
        cover = area_coverage(mask == c, (h, w))
        total += cover
        more = cover > best
        label[more] = c
        best = torch.where(more, cover, best)
    threshold = COVERAGE * min(h / height, w / width)
    return torch.where(total >= threshold - _SLACK, label, nearest)


def rescale_image(image: torch.Tensor, size: tuple[int, int]) -> torch.Tensor:
    """``image`` [..., H, W] (uint8 0..255 or float) resized to ``size`` (h, w): bilinear, antialiased when
    shrinking (so fine structure is averaged, not aliased), align_corners=False; same dtype (integers rounded)."""
    height, width = image.shape[-2:]
    work = image.reshape(1, -1, height, width)
    if work.dtype != torch.float64:
        work = work.float()  # interpolate's antialiased bilinear wants float; float32 holds uint8 exactly
    out = F.interpolate(work, size=tuple(size), mode="bilinear", align_corners=False, antialias=True)
    if not image.is_floating_point():
        info = torch.iinfo(image.dtype)
        out = out.round_().clamp_(info.min, info.max)
    return out.to(image.dtype).reshape(*image.shape[:-2], *size)


def rescale(sample: dict, factor: float, ignore_index: int = IGNORE_INDEX) -> dict:
    """``sample`` with ``image`` [C, H, W] and ``mask`` [H, W] (and a skeleton ``tube`` [H, W], 0 where none, when
    there is one) resized by ``factor`` to :func:`scaled_size` (:func:`rescale_image`, :func:`rescale_mask`); other
    fields untouched. The same object, changed in place, is
    returned; a factor that leaves the size as it is (1, or one too small to change a pixel) returns it as it was.
    """
    image = torch.as_tensor(sample["image"])
    height, width = int(image.shape[-2]), int(image.shape[-1])
    size = scaled_size((height, width), factor)
    if size == (height, width):
        return sample
    sample["image"] = rescale_image(image, size)
    if sample.get("mask") is not None:
        sample["mask"] = rescale_mask(torch.as_tensor(sample["mask"]), size, ignore_index)
    if sample.get("tube") is not None:
        tube = rescale_mask(torch.as_tensor(sample["tube"]), size, ignore_index)
        # Resampled alone, the tube may pick another class than the mask where two classes meet: none there.
        sample["tube"] = tube.masked_fill(tube != sample["mask"].to(tube.dtype), 0)
    return sample
