"""Data: Entry and its collation, the padding collate, datasets, samplers, transforms, loaders."""

from srforge.data.collate import AlignedCollate, pad_to_multiple
from srforge.data.datasets import SegmentationFolder, check_folder
from srforge.data.entry import Entry
from srforge.data.field_view import FieldView, mask_dtype
from srforge.data.images import DataError, read_image, read_mask
from srforge.data.loader import DataLoaderFactory, GeneralCollation
from srforge.data.sampling import SizeGroupedBatchSampler, size_stratified_split
from srforge.data.sizes import dataset_sizes, measure_sizes
from srforge.data.transforms import DataTransform
from srforge.geometry import crop_to_sizes, valid_mask

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
    "FieldView",
    "dataset_sizes",
    "mask_dtype",
]
