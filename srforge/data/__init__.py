"""Data: Entry and its collation, the padding collate, transforms, loaders."""

from .collate import AlignedCollate, crop_to_sizes, pad_to_multiple, valid_mask
from .entry import Entry
from .loader import DataLoaderFactory, GeneralCollation
from .transforms import DataTransform

__all__ = [
    "Entry",
    "AlignedCollate",
    "crop_to_sizes",
    "pad_to_multiple",
    "valid_mask",
    "DataTransform",
    "DataLoaderFactory",
    "GeneralCollation",
]
