"""Any segmentation Dataset, seen through srforge's field names: the one-line custom Dataset.

A user's Dataset may return an Entry or a dict, keep its image under ``scan`` and its mask under
``labels``, and know nothing of sizes. :class:`FieldView` renames the fields to srforge's ``image``,
``mask`` and ``name``, turns numpy arrays into tensors, applies per-sample augmentation with a random
state that depends only on (seed, epoch, index) -- so a resumed run augments exactly as an unbroken one,
in the main process or in any worker -- and gives every mask one dtype. A training view may also rescale scans by a
factor drawn from ``data.augment.scale``, then cut scans larger than ``data.crop`` to a random crop, each drawn the
same way, before augmentation (:mod:`srforge.data.size_policy`).

With a decoded-scan cache (``data.cache``, :mod:`srforge.data.cache`) a Dataset may return file paths for its image
and mask: the view decodes them through the cache. A Dataset with a ``cache`` attribute left None
(:class:`srforge.data.datasets.SegmentationFolder`) is given the view's cache, and reads its own files through it.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable, Mapping

import numpy as np
import torch
from torch.utils.data import Dataset

from srforge.constants import IGNORE_INDEX
from srforge.data.cache import DecodedCache, cached_image, cached_mask
from srforge.data.crop import sample_seed
from srforge.data.entry import Entry
from srforge.data.images import DataError, invalid_mask_values
from srforge.data.size_policy import SizePolicy
from srforge.data.skeleton import TUBE_RADIUS, TUBE_VERSION, skeleton_tube

CANONICAL = ("image", "mask", "name")


def mask_dtype(num_classes: int, ignore_index: int = IGNORE_INDEX) -> torch.dtype:
    """The narrowest dtype that holds every class id and the ignore index: uint8 when they fit in 0..255.

    A mask travels from the dataset through workers, shared memory, pinning and the host-to-device copy in this
    dtype, an eighth of int64's bytes; only on the device does the loss widen it.
    """
    return torch.uint8 if num_classes <= 255 and 0 <= ignore_index <= 255 else torch.int64


class FieldView(Dataset):
    """``dataset[indices[i]]`` as ``Entry(name=str, image=[C, H, W], mask=[H, W], ...)``.

    Args:
        dataset: returns Entry or dict samples.
        fields: canonical name -> the dataset's name, e.g. ``{"image": "scan", "mask": "labels"}``.
        indices: the subset to expose (default: all).
        augment: a per-sample Entry -> Entry callable, or None.
        seed: with the epoch (``set_epoch``) and the sample index, fixes the augmentation's randomness.
        num_classes: when given, a mask value outside [0, num_classes) other than ``ignore_index`` is a
            ValueError naming the sample, instead of an index error deep inside the loss, and every mask is
            given :func:`mask_dtype` (uint8 for up to 255 classes), so batches of masks from mixed files collate.
        cache: the decoded-scan cache (see the module docstring), or None. An image or mask field that is a path
            (str or os.PathLike) is decoded (the image in ``image_mode``, an attribute, RGB by default), through the
            cache when there is one.

    ``sizing`` (:class:`srforge.data.size_policy.SizePolicy`, training only): every scan rescaled by a factor
    drawn from ``scale`` (an attribute for ``sizing.scale``: (lo, hi), ``data.augment.scale``), then cut to a random
    crop of at most ``crop`` (``sizing.crop``: (H, W), ``data.crop``), before augmentation. The sampler asks the
    same object for each epoch's sizes.

    ``tubes`` (an attribute, training with ``train.skeleton_weight``): every sample also carries ``tube`` [H, W],
    the skeleton tube of its mask as decoded (:func:`srforge.data.skeleton.skeleton_tube`), made once per scan
    and kept in the cache when there is one (keyed by the mask's bytes), then rescaled, cropped and augmented with
    the mask.
    """

    def __init__(
        self,
        dataset: Dataset,
        fields: Mapping[str, str] | None = None,
        indices: list[int] | None = None,
        augment: Callable[[Entry], Entry] | None = None,
        seed: int = 0,
        num_classes: int | None = None,
        ignore_index: int = IGNORE_INDEX,
        cache: DecodedCache | None = None,
    ) -> None:
        unknown = sorted(set(fields or {}) - set(CANONICAL))
        if unknown:
            raise ValueError(f"data.fields: unknown canonical field(s) {unknown}; valid: {list(CANONICAL)}.")
        self.dataset = dataset
        self.fields = {k: (fields or {}).get(k, k) for k in CANONICAL}
        self.indices = list(range(len(dataset))) if indices is None else list(indices)
        self.augment = augment
        self.seed = seed
        self.num_classes, self.ignore_index = num_classes, ignore_index
        self.mask_dtype = mask_dtype(num_classes, ignore_index) if num_classes is not None else None
        self.epoch = 0
        self.sizing = SizePolicy(seed)
        self.cache, self.image_mode = cache, "RGB"
        self.tubes = False
        if cache is not None and getattr(dataset, "cache", False) is None:
            dataset.cache = cache  # e.g. SegmentationFolder: reads its files through data.cache

    @property
    def scale(self) -> tuple[float, float] | None:
        return self.sizing.scale

    @scale.setter
    def scale(self, value: tuple[float, float] | None) -> None:
        self.sizing.scale = value

    @property
    def crop(self) -> tuple[int, int] | None:
        return self.sizing.crop

    @crop.setter
    def crop(self, value: tuple[int, int] | None) -> None:
        self.sizing.crop = value

    def set_epoch(self, epoch: int) -> None:
        self.epoch = int(epoch)

    def __len__(self) -> int:
        return len(self.indices)

    def _sample(self, index: int) -> Mapping:
        """``dataset[index]``; whatever it raises, or a sample that is not a mapping, is a DataError naming it."""
        where = f"{type(self.dataset).__name__}[{index}]"
        try:
            sample = self.dataset[index]
        except Exception as error:  # the user's __getitem__: name the sample, keep the cause
            hint = f" (its __len__ is {len(self.dataset)})" if isinstance(error, IndexError) else ""
            raise DataError(f"{where} raised {type(error).__name__}: {error}{hint}") from error
        if not isinstance(sample, Mapping):
            raise DataError(
                f"{where} returned a {type(sample).__name__}; "
                "srforge needs an Entry or dict with image and mask fields (see data.fields)."
            )
        return sample

    def __getitem__(self, i: int) -> Entry:
        index = self.indices[i]
        sample = self._sample(index)
        entry = Entry()
        renamed = {v: k for k, v in self.fields.items()}
        for key, value in sample.items():
            entry[renamed.get(key, key)] = (
                torch.from_numpy(np.ascontiguousarray(value)) if isinstance(value, np.ndarray) else value
            )
        for key in ("image", "mask"):
            if key not in entry:
                raise DataError(
                    f"{type(self.dataset).__name__}[{index}] has no field '{self.fields[key]}' for the {key}; "
                    f"it has {sorted(map(str, sample.keys()))}. Set data.fields.{key} to the right name."
                )
        if isinstance(entry["image"], (str, os.PathLike)):
            entry["image"] = cached_image(self.cache, entry["image"], self.image_mode)
        if isinstance(entry["mask"], (str, os.PathLike)):
            entry["mask"] = cached_mask(self.cache, entry["mask"])
        if "name" not in entry:
            entry["name"] = f"{index:06d}"
        entry["name"] = str(entry["name"])
        self._check_image(entry["image"], index, entry["name"])
        if self.num_classes is not None:
            mask = torch.as_tensor(entry["mask"])
            self._check_mask(mask, index, entry["name"])
            entry["mask"] = mask.to(self.mask_dtype)
        if self.tubes:
            entry["tube"] = self._tube(torch.as_tensor(entry["mask"]))
        entry = self.sizing.apply(entry, self.epoch, index, self.ignore_index)
        if self.augment is not None:
            # Seeded per (seed, epoch, index): independent of worker count, batch order and resumption.
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(sample_seed(self.seed, self.epoch, index))
                entry = self._augmented(entry)
        return entry

    def _tube(self, mask: torch.Tensor) -> torch.Tensor:
        """The skeleton tube of ``mask`` [H, W]: through the cache when there is one, keyed by the mask's bytes
        (whatever Dataset gave it: a file, an annotation, pixels made in memory), the ignore index and the way tubes
        are made (TUBE_VERSION, TUBE_RADIUS), so that a changed rule never serves an old tube."""
        make = lambda: skeleton_tube(mask, self.ignore_index)  # noqa: E731
        if self.cache is None:
            return make()
        array = np.ascontiguousarray(mask.numpy())
        digest = hashlib.sha256(array.tobytes()).hexdigest()
        source = ["tube", TUBE_VERSION, TUBE_RADIUS, self.ignore_index, digest, list(array.shape), str(array.dtype)]
        return self.cache.read(source, [], "tube", make)

    def _augmented(self, entry: Entry) -> Entry:
        """``self.augment(entry)``; a tube rides along as a second channel of the mask, so that every geometric step
        moves it exactly as the mask (where an affine leaves no data the mask gets the ignore index: no tube)."""
        if "tube" not in entry:
            return self.augment(entry)
        mask, tube = entry["mask"], entry.pop("tube")
        entry["mask"] = torch.stack([mask, tube.to(mask.dtype)])
        entry = self.augment(entry)
        mask, tube = entry["mask"][0], entry["mask"][1]
        entry["mask"], entry["tube"] = mask, tube.masked_fill(tube == self.ignore_index, 0)
        return entry

    def _check_image(self, image, index: int, name: str) -> None:
        """Float images hold values in [0, 1] (uint8 ones 0..255): a float image above 1 is a DataError."""
        if isinstance(image, torch.Tensor) and image.is_floating_point() and image.numel():
            top = float(image.max())
            if top > 1.0 + 1e-3:
                raise DataError(
                    f"{type(self.dataset).__name__}[{index}] ('{name}'): a float image must hold values in [0, 1], "
                    f"found a maximum of {top:g}; return uint8 (0..255) or divide by 255."
                )

    def _check_mask(self, mask: torch.Tensor, index: int, name: str) -> None:
        if mask.is_floating_point() and not bool(torch.equal(mask, mask.round())):
            values = mask[mask != mask.round()].unique()[:5].tolist()
            raise DataError(
                f"{type(self.dataset).__name__}[{index}] ('{name}'): mask values {values} are not whole numbers; "
                "a mask holds class ids. Return an integer mask (e.g. mask.round().long() if that is meant)."
            )
        bad = invalid_mask_values(mask, self.num_classes, self.ignore_index)
        if bad:
            raise DataError(
                f"{type(self.dataset).__name__}[{index}] ('{name}'): mask values {bad[:10]} are not classes of "
                f"model.num_classes={self.num_classes} (0..{self.num_classes - 1}) nor the ignore index "
                f"{self.ignore_index}. Fix the mask or set model.num_classes / data.ignore_index."
            )

    def sizes_of(self, all_sizes: list[tuple[int, int]]) -> list[tuple[int, int]]:
        return [tuple(all_sizes[i]) for i in self.indices]
