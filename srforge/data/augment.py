"""Per-scan augmentation from a config dict, run by torchvision.transforms.v2 on image and mask together.

    build_augmentation({"hflip": 0.5, "affine": {"degrees": 2, "translate": 0.02}, "color_jitter":
                        {"brightness": 0.2}, "noise": 0.02}, ignore_index=255)

Order: flips, affine, colour jitter, noise. Geometric steps move image and mask alike; the mask is resampled
nearest and filled with ignore_index where the affine leaves no data, the image with 0. None of them changes a
scan's size.

A scan's size has one policy (:mod:`srforge.data.size_policy`), which the sampler knows: ``scale: [lo, hi]`` (e.g.
[0.5, 2.0]) rescales each training scan by a factor drawn from that range, and ``data.crop`` cuts it to an aligned
random crop; :func:`build_augmentation` builds nothing for them. The keys that once did the same outside that policy
(``crop``, ``affine.scale``) are config errors naming their replacement (REPLACED).
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
    "affine": ("degrees", "translate", "shear"),
    "color_jitter": ("brightness", "contrast", "saturation", "hue"),
}
# Keys of the recipe that resized scans where the sampler could not see it, and what does that job now.
REPLACED = {
    "crop": "data.crop: [H, W] (random crops aligned to the model's size divisor, which the sampler batches by)",
    "affine.scale": "data.augment.scale: [lo, hi] (rescales each scan by a factor from that range; the sampler "
    "batches by the rescaled sizes)",
}


def check_recipe(recipe: Mapping, where: str = "data.augment") -> None:
    """Raise ValueError for the first key of ``recipe`` that is not in KEYS (naming the closest valid key), or a
    section (affine, color_jitter, crop) that is not a mapping of its own keys, or a ``scale`` that is not [lo, hi]
    (:func:`scale_range`). ``where`` is the recipe's config path, which the messages name. The config's validation
    and :func:`build_augmentation` both call this."""
    for name, value in recipe.items():
        if name in REPLACED:
            if value is not None:  # null: absent (how a run that had it is resumed)
                raise ValueError(_replaced(name, where))
            continue
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
            if f"{name}.{inner}" in REPLACED:
                if value[inner] is not None:
                    raise ValueError(_replaced(f"{name}.{inner}", where))
                continue
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


def _replaced(name: str, where: str) -> str:
    return (
        f"{where}.{name} is no longer an option: use {REPLACED[name]}. One size policy serves every scan. (A run "
        f"configured with it resumes with the override {where}.{name}=null.)"
    )


def _unknown(name: object, valid, where: str) -> str:
    close = difflib.get_close_matches(str(name), list(valid), n=1, cutoff=0.5)
    hint = f" Did you mean '{where}.{close[0]}'?" if close else ""
    return f"Unknown config key '{where}.{name}'.{hint} '{name}' is not one of the valid keys {sorted(valid)}."


class Augmentation(DataTransform):
    """Random per-sample augmentation of ``image`` uint8 [C, H, W] and ``mask`` int64 [H, W] (see module docstring)."""

    def __init__(self, steps: list):
        super().__init__()
        self.pipeline = v2.Compose(steps or [v2.Identity()])

    def transform_unbatched(self, image: torch.Tensor, mask: torch.Tensor):
        image, mask = self.pipeline(tv_tensors.Image(image), tv_tensors.Mask(mask))
        return image.as_subclass(torch.Tensor), mask.as_subclass(torch.Tensor)

    def __repr__(self) -> str:
        return f"Augmentation({self.pipeline})"


def build_augmentation(config: Mapping | None, ignore_index: int = IGNORE_INDEX) -> Augmentation:
    """An Augmentation (Entry -> new Entry) from a config dict (``data.augment``); unknown keys are a ValueError
    (:func:`check_recipe`).

    ``ignore_index`` fills the mask where an affine leaves no data (the trainer passes ``data.ignore_index``).
    ``scale`` is checked but builds no step: the FieldView rescales (see the module docstring).
    """
    config = {k: v for k, v in dict(config or {}).items() if not (k in REPLACED and v is None)}
    check_recipe(config)
    steps: list = []
    if config.get("hflip"):
        steps.append(v2.RandomHorizontalFlip(p=float(config["hflip"])))
    if config.get("vflip"):
        steps.append(v2.RandomVerticalFlip(p=float(config["vflip"])))
    if "affine" in config:
        affine = {k: v for k, v in config["affine"].items() if not (k == "scale" and v is None)}
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
    return Augmentation(steps)
