"""Segmentation models: UNet, its padding-aware GroupNorm, logits to class ids, and the contract any model meets.

``contract`` (what srforge needs of a model, and the check), ``build`` (one builder from an import path, its
arguments, the norm option and a weights file) and ``weights`` (state-dict files into a model or its encoder).
"""

from srforge.constants import UNET_CLASS
from srforge.geometry import level_mask
from srforge.models.class_map import class_map
from srforge.models.contract import ImageOnly, check_model, takes_sizes, with_sizes
from srforge.models.create import create_model, import_class, model_class
from srforge.models.group_norm import GroupNorm2d, group_count, masked_group_norm
from srforge.models.unet import UNet
from srforge.models.weights import WeightsFile, load_weights, read_state_dict

__all__ = [
    "UNET_CLASS",
    "GroupNorm2d",
    "ImageOnly",
    "UNet",
    "WeightsFile",
    "check_model",
    "class_map",
    "create_model",
    "group_count",
    "import_class",
    "level_mask",
    "load_weights",
    "masked_group_norm",
    "model_class",
    "read_state_dict",
    "takes_sizes",
    "with_sizes",
]
