"""srforge: train one segmentation model on images of every size, without resizing a pixel.

The public names below are loaded on first use, so that importing one layer (``import srforge.models``,
``import srforge.geometry``) does not pull in the others: models never import the data layer.
"""

import importlib

# Public name -> the module that defines it.
_EXPORTS = {
    "Entry": "srforge.data.entry",
    "AlignedCollate": "srforge.data.collate",
    "pad_to_multiple": "srforge.data.collate",
    "crop_to_sizes": "srforge.geometry",
    "valid_mask": "srforge.geometry",
    "DataTransform": "srforge.data.transforms",
    "DataLoaderFactory": "srforge.data.loader",
    "GeneralCollation": "srforge.data.loader",
    "SegmentationFolder": "srforge.data.datasets",
    "check_folder": "srforge.data.datasets",
    "DataError": "srforge.data.images",
    "read_image": "srforge.data.images",
    "read_mask": "srforge.data.images",
    "measure_sizes": "srforge.data.sizes",
    "dataset_sizes": "srforge.data.sizes",
    "SizeGroupedBatchSampler": "srforge.data.sampling",
    "size_stratified_split": "srforge.data.sampling",
    "Augmentation": "srforge.data.augment",
    "build_augmentation": "srforge.data.augment",
    "make_welllog_scans": "srforge.synthetic",
    "FieldView": "srforge.data.field_view",
    "mask_dtype": "srforge.data.field_view",
    "ScanArchive": "srforge.data.archive",
    "UNet": "srforge.models.unet",
    "Predictor": "srforge.predict.predictor",
    "Trainer": "srforge.train.trainer",
    "TrainSettings": "srforge.train.settings",
    "load_checkpoint": "srforge.runtime.checkpoint",
}

__all__ = list(_EXPORTS)
__version__ = "0.1.0"


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'srforge' has no attribute {name!r}")
    value = getattr(importlib.import_module(_EXPORTS[name]), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_EXPORTS])
