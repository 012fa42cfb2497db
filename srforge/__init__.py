"""srforge: train one segmentation model on images of every size, without resizing a pixel."""

from srforge.data import *  # noqa: F403  -- the data layer's public names (Entry, AlignedCollate, ...), listed in data.__all__
from srforge.data import __all__ as _data_names
from srforge.data.archive import ScanArchive
from srforge.engine.checkpoint import load_checkpoint
from srforge.engine.predictor import Predictor
from srforge.models import UNet

__all__ = [*_data_names, "ScanArchive", "UNet", "Predictor", "load_checkpoint"]
__version__ = "0.1.0"
