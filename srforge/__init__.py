"""srforge: train one segmentation model on images of every size, without resizing a pixel."""

from .data import DataLoaderFactory, DataTransform, Entry, GeneralCollation

__all__ = ["Entry", "DataTransform", "DataLoaderFactory", "GeneralCollation"]
__version__ = "0.1.0"
