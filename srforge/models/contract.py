"""The contract every model srforge trains, predicts with and exports meets, written in one place.

    attributes     size_divisor   int > 0   H and W of every input are multiples of it (AlignedCollate pads to it)
                   in_channels    int > 0   C, the image's channels
                   num_classes    int > 0   K, the logits' channels (one per class)
                   padding_aware  bool, optional (False when absent): the logits depend on ``sizes``; the ONNX
                                  export then takes ``sizes`` as a second input
    forward        (image [B, C, H, W] uint8 0..255 or float 0..1, as AlignedCollate gives it,
                    sizes [B, 2] int64 true (H, W) of each scan | None) -> logits [B, K, H, W], at the input's size
    normalisation  uint8 -> float and the mean/std step happen inside the model (or its adapter), their values in
                   buffers, so that the checkpoint alone (class path, arguments, state_dict) configures prediction

Every caller -- the training step, validation, the Predictor and its tiles, the CUDA memory probe, the ONNX
export -- calls ``model(image, sizes)``. A model whose forward does not take ``sizes`` (its second positional
parameter is not named ``sizes``: ``forward(self, x)`` of torchvision, timm or segmentation_models_pytorch) is
wrapped by :func:`with_sizes` in :class:`ImageOnly`, which takes ``sizes`` and calls the model with the image
alone. The name decides, not the count: a second parameter with another name means something else
(``forward(x, return_features=False)``), and passing the sizes tensor there would be wrong.

:func:`check_model` holds a built model to the contract before anything trains on it or predicts with it: a
missing attribute, one that is not a positive int, a forward that fails on a small zero image, or logits of
another shape are each a ValueError that names the class.
"""

from __future__ import annotations

import inspect
from typing import Any

import torch
from torch import nn

ATTRIBUTES = ("size_divisor", "in_channels", "num_classes")
# The probe forward runs on a zero image of 2d x 3d pixels (unequal sides catch a transposed output); beyond this
# many pixels it is skipped (a UNet of depth 16 would need 2**33), and the first batch is the check instead.
PROBE_MAX_PIXELS = 2**17
# What the attribute error suggests setting, per attribute.
_EXAMPLES = {"size_divisor": "32 (2 ** the number of stride-2 stages)", "in_channels": "3", "num_classes": "2"}


def unit_image(image: torch.Tensor, dtype: torch.dtype, owner: str) -> torch.Tensor:
    """[B, C, H, W] uint8 (0..255) or float (0..1), the image this contract has models take -> ``dtype`` in
    [0, 1]; a TypeError naming ``owner`` (the model's class name) for any other dtype."""
    if image.dtype == torch.uint8:
        return image.to(dtype) / 255.0
    if image.is_floating_point():
        return image.to(dtype)
    raise TypeError(
        f"{owner} expects a uint8 (0..255) or float (0..1) image, got {image.dtype}; convert it to uint8 or float first"
    )


class ImageOnly(nn.Module):
    """A model whose forward takes the image alone, made to take ``sizes`` too (and ignore them).

    forward(image [B, C, H, W], sizes [B, 2] | None) -> ``model(image)``. Every other attribute (size_divisor,
    in_channels, num_classes, encoder, ...) is the wrapped model's; ``padding_aware`` is False, since the logits
    cannot depend on sizes the model never sees. The state_dict keys are the model's under ``model.``.
    """

    padding_aware = False

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def __getattr__(self, name: str) -> Any:
        try:
            return super().__getattr__(name)
        except AttributeError:
            if name == "model":
                raise
            return getattr(self.model, name)

    def forward(self, image: torch.Tensor, sizes: torch.Tensor | None = None) -> torch.Tensor:
        return self.model(image)


def takes_sizes(model: nn.Module) -> bool:
    """Whether ``model.forward``'s second positional parameter is named ``sizes`` (see the module's doc)."""
    try:
        parameters = list(inspect.signature(model.forward).parameters.values())
    except (TypeError, ValueError):  # no signature to read (a builtin): call it with the image alone
        return False
    positional = [p for p in parameters if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    return len(positional) >= 2 and positional[1].name == "sizes"


def with_sizes(model: nn.Module) -> nn.Module:
    """``model`` itself when its forward takes ``sizes``, else ``ImageOnly(model)``."""
    return model if takes_sizes(model) else ImageOnly(model)


def class_name(model: Any) -> str:
    """The name errors give a model: its class's, the wrapped model's for an ImageOnly."""
    inner = model.model if isinstance(model, ImageOnly) else model
    cls = inner if isinstance(inner, type) else type(inner)
    return f"{cls.__module__}.{cls.__qualname__}"


def check_attributes(model: nn.Module, where: str) -> None:
    """A ValueError naming ``where`` and the class unless size_divisor, in_channels and num_classes are positive
    ints (bool is not one)."""
    for name in ATTRIBUTES:
        value = getattr(model, name, None)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            continue
        found = "has no such attribute" if value is None else f"has {name}={value!r}"
        raise ValueError(
            f"{where}: {class_name(model)} {found}; srforge needs size_divisor, in_channels and num_classes as "
            f"positive ints on every model (srforge.models.contract). Set it in __init__, e.g. self.{name} = "
            f"{_EXAMPLES[name]}, or wrap the model in an adapter that does."
        )


def check_model(model: nn.Module, where: str) -> None:
    """Hold ``model`` (built, on the CPU) to the contract: the attributes (:func:`check_attributes`), then one
    forward of a zero uint8 image [1, C, 2d, 3d] (d = size_divisor) with its sizes, whose output must be logits
    [1, K, 2d, 3d]. ValueError naming ``where`` and the class otherwise.

    The probe has no side effect a run could see: eval mode (no running statistics move, no dropout draws from
    the random state) under ``torch.no_grad``, every submodule's own mode restored after; zeros, not random
    pixels. It is skipped where 2d x 3d exceeds PROBE_MAX_PIXELS.
    """
    check_attributes(model, where)
    d, channels, classes = model.size_divisor, model.in_channels, model.num_classes
    height, width = 2 * d, 3 * d
    if height * width > PROBE_MAX_PIXELS:
        return
    image = torch.zeros(1, channels, height, width, dtype=torch.uint8)
    sizes = torch.tensor([[height, width]], dtype=torch.int64)
    modes = {module: module.training for module in model.modules()}  # each restored as it was, after
    model.eval()
    try:
        with torch.no_grad():
            logits = model(image, sizes)
    except Exception as exc:  # any failure of the user's forward: the message says what it was given
        raise ValueError(
            f"{where}: {class_name(model)}'s forward failed on a zero image uint8 [1, {channels}, {height}, {width}] "
            f"with sizes [[{height}, {width}]] ({type(exc).__name__}: {exc}); srforge calls every model with "
            "uint8 or float images whose H and W are multiples of its size_divisor (srforge.models.contract)."
        ) from exc
    finally:
        for module, training in modes.items():
            module.training = training
    want = (1, classes, height, width)
    if not isinstance(logits, torch.Tensor) or tuple(logits.shape) != want:
        found = f"{type(logits).__name__}" if not isinstance(logits, torch.Tensor) else f"shape {list(logits.shape)}"
        raise ValueError(
            f"{where}: {class_name(model)} returned {found} for an image [1, {channels}, {height}, {width}]; "
            f"expected logits {list(want)}: [B, num_classes, H, W] at the input's size (upsample inside the model, "
            "and return the tensor itself, not a dict or tuple: an adapter can pick it)."
        )
