"""SizePolicy: the one rule for the size a training scan has in an epoch, asked by the view and the sampler alike.

    true (H, W) -> rescaled by a factor drawn from data.augment.scale [lo, hi]   (srforge.data.rescale)
                -> cut to a random crop of at most data.crop [H, W]            (srforge.data.crop; multiples of
                                                                                the model's size divisor)

Both draws depend only on (seed, epoch, dataset index), so the FieldView, which applies the policy to a scan's
pixels (:meth:`SizePolicy.apply`), and the size-grouped sampler, which groups each epoch's batches by the sizes the
policy gives (:meth:`SizePolicy.epoch_sizes`), agree in every worker and after a resume. Validation scans keep
their true size (no policy).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from srforge.constants import IGNORE_INDEX
from srforge.data.crop import crop_sizes, random_crop, sample_seed
from srforge.data.rescale import epoch_sizes, rescale, scale_factor, scaled_size


@dataclass
class SizePolicy:
    """``scale``: (lo, hi) of the rescaling factor (None: none); ``crop``: (H, W) the largest training scan (None:
    whole scans); ``seed``: the run's seed, from which every draw is made."""

    seed: int = 0
    scale: tuple[float, float] | None = None
    crop: tuple[int, int] | None = None

    @property
    def varies(self) -> bool:
        """Whether a scan's size changes from epoch to epoch (it is rescaled), so the sampler must ask each epoch."""
        return self.scale is not None

    def apply(self, entry, epoch: int, index: int, ignore_index: int = IGNORE_INDEX):
        """``entry`` (image [C, H, W], mask [H, W]) at its training size in ``epoch``: rescaled, then cropped. The
        rescaling comes first, so that a crop of data.crop pixels covers more or less of the scan."""
        if self.scale is not None:
            entry = rescale(entry, scale_factor(self.seed, epoch, index, self.scale), ignore_index)
        if self.crop is not None:
            entry = random_crop(entry, self.crop, sample_seed(self.seed, epoch, index, "crop"))
        return entry

    def epoch_sizes(self, true: Sequence[Sequence[int]], indices: Sequence[int], epoch: int) -> list[tuple[int, int]]:
        """[(H, W), ...] the scans of true sizes ``true`` (dataset indices ``indices``) have in ``epoch``."""
        return epoch_sizes(true, indices, self.seed, epoch, self.scale, self.crop)

    def largest(self, true: Sequence[Sequence[int]]) -> list[tuple[int, int]]:
        """[(H, W), ...] the largest each scan can be in any epoch (rescaled by the upper bound, then cropped):
        what memory planning allows for. Rounding and the crop are monotonic, so no epoch's scan outgrows it."""
        scaled = true if self.scale is None else [scaled_size(size, self.scale[1]) for size in true]
        return crop_sizes(scaled, self.crop)
