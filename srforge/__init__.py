"""srforge: train one segmentation model on images of every size, without resizing a pixel."""

from .data import (
    AlignedCollate,
    DataLoaderFactory,
    DataTransform,
    Entry,
    GeneralCollation,
    crop_to_sizes,
    pad_to_multiple,
    valid_mask,
)

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
__version__ = "0.1.0"
