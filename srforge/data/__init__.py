"""Data: Entry and its collation, the padding collate, datasets, samplers, transforms, loaders."""

from .adapter import FieldView, dataset_sizes
from .augment import Augmentation, build_augmentation
from .collate import AlignedCollate, crop_to_sizes, pad_to_multiple, valid_mask
from .datasets import (
    DataError,
    SegmentationFolder,
    check_folder,
    measure_sizes,
    read_image,
    read_mask,
)
from .entry import Entry
from .loader import DataLoaderFactory, GeneralCollation
from .sampling import SizeGroupedBatchSampler, size_stratified_split
from .synthetic import make_welllog_scans
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
    "SegmentationFolder",
    "DataError",
    "check_folder",
    "measure_sizes",
    "read_image",
    "read_mask",
    "SizeGroupedBatchSampler",
    "size_stratified_split",
    "Augmentation",
    "build_augmentation",
    "make_welllog_scans",
    "FieldView",
    "dataset_sizes",
]
