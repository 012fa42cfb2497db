"""SegmentationFolder: image/mask pairs from ROOT/images and ROOT/masks, each scan in its natural shape.

Images and masks pair by relative path and stem (``images/a/b.jpg`` with ``masks/a/b.png`` is the scan
``a/b``). Sizes come from file headers, cached beside the data, so size-grouped samplers and splits
cost no decoding. Every bad file is a DataError that names it.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from pathlib import Path

import torch
from tqdm import tqdm

from srforge.constants import IGNORE_INDEX
from srforge.data.cache import DecodedCache, cached_image, cached_mask, open_cache
from srforge.data.entry import Entry
from srforge.data.images import DataError, DataWarning, invalid_mask_values, mask_values
from srforge.data.naming import find_pairs
from srforge.data.sizes import measure_sizes

SIZES_FILE = ".srforge_sizes.json"


def pair_problems(
    image_path: Path,
    image: torch.Tensor,
    mask_path: Path,
    mask: torch.Tensor,
    num_classes: int | None,
    ignore_index: int,
) -> list[str]:
    """What is wrong with a decoded pair: sizes that differ, class values out of range."""
    problems = []
    if tuple(mask.shape) != tuple(image.shape[1:]):
        problems.append(
            f"{mask_path}: mask is {tuple(mask.shape)} (H, W) but its image {image_path} "
            f"is {tuple(image.shape[1:])}; they must match"
        )
    bad = invalid_mask_values(mask, num_classes, ignore_index) if num_classes is not None else []
    if bad:
        problems.append(
            f"{mask_path}: mask values {bad[:20]} are >= num_classes={num_classes} and not "
            f"ignore_index={ignore_index}; fix the mask or num_classes"
        )
    return problems


class SegmentationFolder(torch.utils.data.Dataset):
    """Scans in ROOT/images with masks in ROOT/masks; item i is
    ``Entry(name="a/b", image=uint8 [C, H, W], mask=uint8 [H, W])`` in natural shape (int64 masks from
    16-bit mask files).

    ``image_mode`` is the PIL mode every image is converted to. ``num_classes`` (optional) makes any
    mask value >= num_classes other than ``ignore_index`` an error. ``transform`` (optional) maps the
    Entry, e.g. an augmentation. Missing partners are reported all at once on construction. ``cache`` (optional):
    a decoded-scan cache folder or :class:`srforge.data.cache.DecodedCache` every image and mask is read through;
    left None, ``data.cache`` fills it in (:class:`srforge.data.field_view.FieldView`).
    """

    def __init__(
        self,
        root,
        images: str = "images",
        masks: str = "masks",
        image_mode: str = "RGB",
        num_classes: int | None = None,
        ignore_index: int = IGNORE_INDEX,
        transform: Callable | None = None,
        cache: DecodedCache | str | None = None,
    ):
        self.root = Path(root)
        self.image_mode, self.num_classes, self.ignore_index = image_mode, num_classes, ignore_index
        self.transform = transform
        self.cache = open_cache(cache)
        pairs, problems = find_pairs(self.root, images, masks)
        if problems:
            raise DataError(f"{len(problems)} unpaired or clashing file(s) in {self.root}:\n  " + "\n  ".join(problems))
        self.names = [name for name, _, _ in pairs]
        self.image_paths = [image for _, image, _ in pairs]
        self.mask_paths = [mask for _, _, mask in pairs]

    def __len__(self) -> int:
        return len(self.names)

    def sizes(self) -> list[tuple[int, int]]:
        """True (H, W) of every scan, from headers (cached in ROOT/.srforge_sizes.json)."""
        return measure_sizes(self.image_paths, cache=self.root / SIZES_FILE)

    def load(self, index: int) -> Entry:
        """Decode and validate scan ``index`` (no transform)."""
        image_path, mask_path = self.image_paths[index], self.mask_paths[index]
        image = cached_image(self.cache, image_path, self.image_mode)
        mask = cached_mask(self.cache, mask_path)
        problems = pair_problems(image_path, image, mask_path, mask, self.num_classes, self.ignore_index)
        if problems:
            raise DataError("; ".join(problems))
        return Entry(name=self.names[index], image=image, mask=mask)

    def __getitem__(self, index: int) -> Entry:
        entry = self.load(index)
        return self.transform(entry) if self.transform is not None else entry


def check_folder(
    root,
    images: str = "images",
    masks: str = "masks",
    num_classes: int | None = None,
    ignore_index: int = IGNORE_INDEX,
    image_mode: str = "RGB",
    cache: DecodedCache | None = None,
    progress: bool = False,
) -> tuple[int, list[str]]:
    """Fully decode every pair under root; returns (number of pairs, every problem found). With ``cache`` every
    pair that decodes is also written into it (training's first epoch then reads it at memory speed); ``progress``
    shows a bar."""
    try:
        pairs, problems = find_pairs(root, images, masks)
    except DataError as error:
        return 0, [str(error)]
    seen: set[int] = set()  # every mask value of the folder
    for _, image_path, mask_path in tqdm(pairs, desc="checking", unit="pair", disable=not progress):
        decoded = []
        readers = (
            (lambda p: cached_image(cache, p, image_mode), image_path),
            (lambda p: cached_mask(cache, p), mask_path),
        )
        for read, path in readers:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always", DataWarning)
                try:
                    decoded.append(read(path))
                except DataError as error:
                    problems.append(str(error))
            problems += [str(w.message) for w in caught if issubclass(w.category, DataWarning)]
        if len(decoded) == 2:
            problems += pair_problems(image_path, decoded[0], mask_path, decoded[1], num_classes, ignore_index)
            seen.update(mask_values(decoded[1]))
    if ignore_index in seen and seen <= {0, ignore_index}:
        problems.append(
            f"{root}: every mask holds only 0 and {ignore_index} (the ignore index), so no pixel of any class but 0 "
            f"is learned; if {ignore_index} marks the foreground (masks saved as 0/255), save it as class 1"
        )
    return len(pairs), problems
