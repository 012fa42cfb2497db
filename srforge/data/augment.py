"""Per-scan augmentation from a config dict, run by torchvision.transforms.v2 on image and mask together.

    build_augmentation({"hflip": 0.5, "affine": {"degrees": 2, "translate": 0.02, "scale": [0.95, 1.05]},
                        "color_jitter": {"brightness": 0.2}, "noise": 0.02,
                        "crop": {"max_height": 1024, "max_width": 4096}}, ignore_index=255)

Order: crop (only scans over the limit, to their own size clipped to the limit, so shapes stay
natural), flips, affine, colour jitter, noise. Geometric steps move image and mask alike; the mask
is resampled nearest and filled with ignore_index where the affine leaves no data, the image with 0.

``scale: [lo, hi]`` (e.g. [0.5, 2.0]) rescales each training scan by a factor drawn from that range: the scan's size
changes, so the sampler must know it, and the FieldView does it (:mod:`srforge.data.rescale`), before ``data.crop``
and before these steps; :func:`build_augmentation` builds nothing for it. ``affine.scale`` is another thing: a
RandomAffine zoom inside a scan whose size stays as it was.
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Mapping

import torch
from torchvision import tv_tensors
from torchvision.transforms import v2

from srforge.constants import IGNORE_INDEX
from srforge.data.transforms import DataTransform

# Valid keys: top level, then each section's own.
KEYS = {
    "scale": None,
    "hflip": None,
    "vflip": None,
    "noise": None,
    "affine": ("degrees", "translate", "scale", "shear"),
    "color_jitter": ("brightness", "contrast", "saturation", "hue"),
    "crop": ("max_height", "max_width"),
}


def check_recipe(recipe: Mapping, where: str = "data.augment") -> None:
    """Raise ValueError for the first key of ``recipe`` that is not in KEYS (naming the closest valid key), or a
    section (affine, color_jitter, crop) that is not a mapping of its own keys, or a ``scale`` that is not [lo, hi]
    (:func:`scale_range`). ``where`` is the recipe's config path, which the messages name. The config's validation
    and :func:`build_augmentation` both call this."""
    for name, value in recipe.items():
        if name not in KEYS:
            raise ValueError(_unknown(name, KEYS, where))
        if name == "scale":
            scale_range(value, f"{where}.scale")
            continue
        valid = KEYS[name]
        if valid is None:
            continue
        if not isinstance(value, Mapping):
            raise ValueError(
                f"{where}.{name}: expected a mapping with keys {list(valid)}, found {type(value).__name__} {value!r}."
            )
        for inner in value:
            if inner not in valid:
                raise ValueError(_unknown(inner, valid, f"{where}.{name}"))


def scale_range(value, where: str = "data.augment.scale") -> tuple[float, float]:
    """``data.augment.scale`` as (lo, hi): two positive, finite numbers with lo <= hi, else a ValueError naming
    ``where`` with what was expected and what was found."""
    numbers = (
        isinstance(value, (list, tuple))
        and len(value) == 2
        and all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in value)
    )
    if not numbers or not 0 < value[0] <= value[1]:
        raise ValueError(
            f"{where}: expected [lo, hi], two positive numbers with lo <= hi (e.g. [0.5, 2.0]: scans from half to "
            f"twice their size), found {value!r}."
        )
    return float(value[0]), float(value[1])


def _unknown(name: object, valid, where: str) -> str:
    close = difflib.get_close_matches(str(name), list(valid), n=1, cutoff=0.5)
    hint = f" Did you mean '{where}.{close[0]}'?" if close else ""
    return f"Unknown config key '{where}.{name}'.{hint} '{name}' is not one of the valid keys {sorted(valid)}."


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
    """An Augmentation (Entry -> new Entry) from a config dict (``data.augment``); unknown keys are a ValueError
    (:func:`check_recipe`).

    ``ignore_index`` fills the mask where an affine leaves no data (the trainer passes ``data.ignore_index``).
    ``scale`` is checked but builds no step: the FieldView rescales (see the module docstring).
    """
    config = dict(config or {})
    check_recipe(config)
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
