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
import os
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset
from tqdm import tqdm

from .entry import Entry

CANONICAL = ("image", "mask", "name")


class FieldView(Dataset):
    """``dataset[indices[i]]`` as ``Entry(name=str, image=[C, H, W], mask=[H, W], ...)``.

    Args:
        dataset: returns Entry or dict samples.
        fields: canonical name -> the dataset's name, e.g. ``{"image": "scan", "mask": "labels"}``.
        indices: the subset to expose (default: all).
        augment: a per-sample Entry -> Entry callable, or None.
        seed: with the epoch (``set_epoch``) and the sample index, fixes the augmentation's randomness.
    """

    def __init__(
        self,
        dataset: Dataset,
        fields: Mapping[str, str] | None = None,
        indices: list[int] | None = None,
        augment: Callable[[Entry], Entry] | None = None,
        seed: int = 0,
    ) -> None:
        unknown = sorted(set(fields or {}) - set(CANONICAL))
        if unknown:
            raise ValueError(f"data.fields: unknown canonical field(s) {unknown}; valid: {list(CANONICAL)}.")
        self.dataset = dataset
        self.fields = {k: (fields or {}).get(k, k) for k in CANONICAL}
        self.indices = list(range(len(dataset))) if indices is None else list(indices)
        self.augment = augment
        self.seed = seed
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
            entry[renamed.get(key, key)] = torch.from_numpy(np.ascontiguousarray(value)) if isinstance(value, np.ndarray) else value
        for key in ("image", "mask"):
            if key not in entry:
                raise KeyError(
                    f"{type(self.dataset).__name__}[{index}] has no field '{self.fields[key]}' for the {key}; "
                    f"it has {sorted(map(str, sample.keys()))}. Set data.fields.{key} to the right name."
                )
        if "name" not in entry:
            entry["name"] = f"{index:06d}"
        entry["name"] = str(entry["name"])
        if self.augment is not None:
            # Seeded per (seed, epoch, index): independent of worker count, batch order and resumption.
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(int.from_bytes(hashlib.blake2b(f"{self.seed}/{self.epoch}/{index}".encode(), digest_size=8).digest(), "little") >> 1)
                entry = self.augment(entry)
        return entry

    def sizes_of(self, all_sizes: list[tuple[int, int]]) -> list[tuple[int, int]]:
        return [tuple(all_sizes[i]) for i in self.indices]


def _write_json_atomic(path: Path, data: Any) -> None:
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    with os.fdopen(fd, "w") as f:
        json.dump(data, f)
    os.replace(tmp, path)


def dataset_sizes(dataset: Dataset, fields: Mapping[str, str] | None = None, cache: Path | None = None, key: str = "") -> list[tuple[int, int]]:
    """(H, W) of every sample: ``dataset.sizes()`` when it has one, else measured once and cached.

    Measuring reads every sample (a progress bar shows it); the result is kept in ``cache`` under ``key``
    (e.g. the dataset's class and arguments) and reused while the key and the length still match.
    """
    if callable(getattr(dataset, "sizes", None)):
        return [tuple(map(int, s)) for s in dataset.sizes()]
    if cache is not None and cache.is_file():
        stored = json.loads(cache.read_text())
        if stored.get("key") == key and len(stored.get("sizes", [])) == len(dataset):
            return [tuple(s) for s in stored["sizes"]]
    view = FieldView(dataset, fields)
    sizes = []
    for i in tqdm(range(len(view)), desc="measuring sizes (once)", unit="scan", leave=False):
        image = view[i]["image"]
        sizes.append((int(image.shape[-2]), int(image.shape[-1])))
    if cache is not None:
        cache.parent.mkdir(parents=True, exist_ok=True)
        _write_json_atomic(cache, {"key": key, "sizes": sizes})
    return sizes
