"""Any segmentation Dataset, seen through srforge's field names: the one-line custom Dataset.

A user's Dataset may return an Entry or a dict, keep its image under ``scan`` and its mask under
``labels``, and know nothing of sizes. :class:`FieldView` renames the fields to srforge's ``image``,
``mask`` and ``name``, turns numpy arrays into tensors, applies per-sample augmentation with a random
state that depends only on (seed, epoch, index) -- so a resumed run augments exactly as an unbroken one,
in the main process or in any worker -- and :func:`dataset_sizes` finds every sample's (H, W).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Mapping
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import Dataset
from tqdm import tqdm

from srforge.atomic import atomic_write_text
from srforge.data.entry import Entry
from srforge.defaults import IGNORE_INDEX

CANONICAL = ("image", "mask", "name")


class FieldView(Dataset):
    """``dataset[indices[i]]`` as ``Entry(name=str, image=[C, H, W], mask=[H, W], ...)``.

    Args:
        dataset: returns Entry or dict samples.
        fields: canonical name -> the dataset's name, e.g. ``{"image": "scan", "mask": "labels"}``.
        indices: the subset to expose (default: all).
        augment: a per-sample Entry -> Entry callable, or None.
        seed: with the epoch (``set_epoch``) and the sample index, fixes the augmentation's randomness.
        num_classes: when given, a mask value outside [0, num_classes) other than ``ignore_index`` is a
            ValueError naming the sample, instead of an index error deep inside the loss.
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
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = int(epoch)

    def __len__(self) -> int:
        return len(self.indices)

    def __getitem__(self, i: int) -> Entry:
        index = self.indices[i]
        sample = self.dataset[index]
        if not isinstance(sample, Mapping):
            raise TypeError(
                f"{type(self.dataset).__name__}[{index}] returned a {type(sample).__name__}; "
                "srforge needs an Entry or dict with image and mask fields (see data.fields)."
            )
        entry = Entry()
        renamed = {v: k for k, v in self.fields.items()}
        for key, value in sample.items():
            entry[renamed.get(key, key)] = (
                torch.from_numpy(np.ascontiguousarray(value)) if isinstance(value, np.ndarray) else value
            )
        for key in ("image", "mask"):
            if key not in entry:
                raise KeyError(
                    f"{type(self.dataset).__name__}[{index}] has no field '{self.fields[key]}' for the {key}; "
                    f"it has {sorted(map(str, sample.keys()))}. Set data.fields.{key} to the right name."
                )
        if "name" not in entry:
            entry["name"] = f"{index:06d}"
        entry["name"] = str(entry["name"])
        if self.num_classes is not None:
            self._check_mask(torch.as_tensor(entry["mask"]), index, entry["name"])
        if self.augment is not None:
            # Seeded per (seed, epoch, index): independent of worker count, batch order and resumption.
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(
                    int.from_bytes(
                        hashlib.blake2b(f"{self.seed}/{self.epoch}/{index}".encode(), digest_size=8).digest(), "little"
                    )
                    >> 1
                )
                entry = self.augment(entry)
        return entry

    def _check_mask(self, mask: torch.Tensor, index: int, name: str) -> None:
        labelled = mask[mask != self.ignore_index]
        if labelled.numel() and (labelled.min() < 0 or labelled.max() >= self.num_classes):
            bad = sorted({int(v) for v in labelled.unique() if not 0 <= v < self.num_classes})
            raise ValueError(
                f"{type(self.dataset).__name__}[{index}] ('{name}'): mask values {bad[:10]} are not classes of "
                f"model.num_classes={self.num_classes} (0..{self.num_classes - 1}) nor the ignore index "
                f"{self.ignore_index}. Fix the mask or set model.num_classes / data.ignore_index."
            )

    def sizes_of(self, all_sizes: list[tuple[int, int]]) -> list[tuple[int, int]]:
        return [tuple(all_sizes[i]) for i in self.indices]


def dataset_sizes(
    dataset: Dataset, fields: Mapping[str, str] | None = None, cache: Path | None = None, key: str = ""
) -> list[tuple[int, int]]:
    """(H, W) of every sample: ``dataset.sizes()`` when it has one, else measured once and cached.

    Measuring reads every sample (a progress bar shows it); the result is kept in ``cache`` under ``key``
    (e.g. the dataset's class and arguments) and reused while the key and the length still match.
    """
    if callable(getattr(dataset, "sizes", None)):
        return [tuple(map(int, s)) for s in dataset.sizes()]
    if cache is not None and cache.is_file():
        try:
            stored = json.loads(cache.read_text())
        except (OSError, ValueError):
            stored = {}  # a damaged cache is measured again, never trusted
        if stored.get("key") == key and len(stored.get("sizes", [])) == len(dataset):
            return [tuple(s) for s in stored["sizes"]]
    view = FieldView(dataset, fields)
    sizes = []
    for i in tqdm(range(len(view)), desc="measuring sizes (once)", unit="scan", leave=False):
        image = view[i]["image"]
        sizes.append((int(image.shape[-2]), int(image.shape[-1])))
    if cache is not None:
        atomic_write_text(cache, json.dumps({"key": key, "sizes": sizes}))
    return sizes
