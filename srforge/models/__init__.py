"""Segmentation models: UNet, its padding-aware GroupNorm, and logits to class ids."""

from srforge.geometry import level_mask
from srforge.models.class_map import class_map
from srforge.models.norm import GroupNorm2d, group_count, masked_group_norm
from srforge.models.unet import UNet

__all__ = ["GroupNorm2d", "UNet", "class_map", "group_count", "level_mask", "masked_group_norm"]
