"""Per-scan augmentation from a config dict, run by torchvision.transforms.v2 on image and mask together.

    build_augmentation({"hflip": 0.5, "affine": {"degrees": 2, "translate": 0.02, "scale": [0.95, 1.05]},
                        "color_jitter": {"brightness": 0.2}, "noise": 0.02,
                        "crop": {"max_height": 1024, "max_width": 4096}}, ignore_index=255)

Order: crop (only scans over the limit, to their own size clipped to the limit, so shapes stay
natural), flips, affine, colour jitter, noise. Geometric steps move image and mask alike; the mask
is resampled nearest and filled with ignore_index where the affine leaves no data, the image with 0.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torchvision import tv_tensors
from torchvision.transforms import v2

from srforge.constants import IGNORE_INDEX
from srforge.data.transforms import DataTransform

# Valid keys: top level, then each section's own.
KEYS = {
    "hflip": None,
    "vflip": None,
    "noise": None,
    "affine": ("degrees", "translate", "scale", "shear"),
    "color_jitter": ("brightness", "contrast", "saturation", "hue"),
    "crop": ("max_height", "max_width"),
}


def _check_keys(config: Mapping, valid, where: str) -> None:
    unknown = [k for k in config if k not in valid]
    if unknown:
        raise ValueError(f"unknown key(s) {unknown} in {where}; valid keys: {sorted(valid)}")


class Augmentation(DataTransform):
    """Random per-sample augmentation of ``image`` uint8 [C, H, W] and ``mask`` int64 [H, W] (see module docstring)."""

    def __init__(self, steps: list, crop: tuple[int, int] | None = None):
        super().__init__()
        self.pipeline = v2.Compose(steps or [v2.Identity()])
        self.crop = crop

    def transform_unbatched(self, image: torch.Tensor, mask: torch.Tensor):
        image, mask = tv_tensors.Image(image), tv_tensors.Mask(mask)
        if self.crop is not None:
            limit_h, limit_w = self.crop
            h, w = image.shape[-2:]
            if h > limit_h or w > limit_w:
                image, mask = v2.RandomCrop((min(h, limit_h), min(w, limit_w)))(image, mask)
        image, mask = self.pipeline(image, mask)
        return image.as_subclass(torch.Tensor), mask.as_subclass(torch.Tensor)

    def __repr__(self) -> str:
        return f"Augmentation(crop={self.crop}, {self.pipeline})"


def build_augmentation(config: Mapping | None, ignore_index: int = IGNORE_INDEX) -> Augmentation:
    """An Augmentation (Entry -> new Entry) from a config dict (``data.augment``); unknown keys are a ValueError.

    ``ignore_index`` fills the mask where an affine leaves no data (the trainer passes ``data.ignore_index``).
    """
    config = dict(config or {})
    _check_keys(config, KEYS, "the augmentation config")
    for section, valid in KEYS.items():
        if valid is not None and section in config:
            if not isinstance(config[section], Mapping):
                raise ValueError(
                    f"augmentation {section!r} must be a mapping with keys {list(valid)}, got {config[section]!r}"
                )
            _check_keys(config[section], valid, f"augmentation {section!r}")
    steps: list = []
    if config.get("hflip"):
        steps.append(v2.RandomHorizontalFlip(p=float(config["hflip"])))
    if config.get("vflip"):
        steps.append(v2.RandomVerticalFlip(p=float(config["vflip"])))
    if "affine" in config:
        affine = dict(config["affine"])
        if isinstance(affine.get("translate"), (int, float)):
            affine["translate"] = (affine["translate"], affine["translate"])
        steps.append(
            v2.RandomAffine(
                degrees=affine.pop("degrees", 0),
                **affine,
                interpolation=v2.InterpolationMode.BILINEAR,
                fill={tv_tensors.Image: 0, tv_tensors.Mask: ignore_index},
            )
        )
    if "color_jitter" in config:
        steps.append(v2.ColorJitter(**config["color_jitter"]))
    if config.get("noise"):
        # GaussianNoise works on float images; ToDtype with a plain dtype leaves masks alone.
        steps += [
            v2.ToDtype(torch.float32, scale=True),
            v2.GaussianNoise(sigma=float(config["noise"])),
            v2.ToDtype(torch.uint8, scale=True),
        ]
    crop = None
    if "crop" in config:
        crop = (int(config["crop"].get("max_height", 2**31)), int(config["crop"].get("max_width", 2**31)))
    return Augmentation(steps, crop)
