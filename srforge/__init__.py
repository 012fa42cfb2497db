"""srforge: train one segmentation model on images of every size, without resizing a pixel."""

from .data import *  # noqa: F403  -- the data layer's public names (Entry, AlignedCollate, ...), listed in data.__all__
from .data import __all__ as _data_names
from .data.archive import ScanArchive
from .engine.checkpoint import load_checkpoint
from .engine.predictor import Predictor
from .models import UNet

__all__ = [*_data_names, "ScanArchive", "UNet", "Predictor", "load_checkpoint"]
__version__ = "0.1.0"
