"""Data: Entry and its collation, padding collate, transforms, loaders."""

from .entry import Entry
from .loader import DataLoaderFactory, GeneralCollation
from .transforms import DataTransform

__all__ = ["Entry", "DataTransform", "DataLoaderFactory", "GeneralCollation"]
