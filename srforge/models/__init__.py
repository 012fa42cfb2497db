"""Segmentation models: UNet and its GroupNorm helpers."""

from srforge.geometry import level_mask
from srforge.models.norm import GroupNorm2d, group_count, masked_group_norm
from srforge.models.unet import UNet

__all__ = ["GroupNorm2d", "UNet", "group_count", "level_mask", "masked_group_norm"]
