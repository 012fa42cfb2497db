"""Adapter for torchvision.models.segmentation (FCN, DeepLabV3, LR-ASPP) on srforge's model contract."""

from __future__ import annotations

import inspect
import os
import typing

import torch
from torch import nn

from srforge.models.library_adapter import (
    IMAGENET_MEAN,
    IMAGENET_STD,
    WeightsUnavailableError,
    adapter_input,
    channel_stats,
    register_stats,
    require_download,
)

BUILDERS = (
    "fcn_resnet50",
    "fcn_resnet101",
    "deeplabv3_resnet50",
    "deeplabv3_resnet101",
    "deeplabv3_mobilenet_v3_large",
    "lraspp_mobilenet_v3_large",
)


def weights_url(builder, parameter: str, value) -> str:
    """The download URL of ``value`` ("DEFAULT", "IMAGENET1K_V1", an enum member) for the builder's ``weights`` or
    ``weights_backbone`` parameter, resolved with the enum its signature names; a bad name is torchvision's
    ValueError listing the choices."""
    from torchvision.models import WeightsEnum

    annotation = inspect.signature(builder).parameters[parameter].annotation
    enums = [t for t in typing.get_args(annotation) if isinstance(t, type) and issubclass(t, WeightsEnum)]
    return enums[0].verify(value).url


def require_tv_download(builder, parameter: str, value) -> None:
    """WeightsUnavailableError at once when torchvision would have to download ``value`` and cannot."""
    url = weights_url(builder, parameter, value)
    cached = os.path.exists(os.path.join(torch.hub.get_dir(), "checkpoints", os.path.basename(url)))
    into = " with model.weights_into=encoder (the backbone)" if parameter == "weights_backbone" else ""
    todo = f"download {url} elsewhere and give it as model.weights{into}, or use {parameter}=null"
    require_download(f"{builder.__name__} ({parameter}={value})", url, cached, todo)


def replace_first_conv(net: nn.Module, in_channels: int) -> None:
    """Swap the first Conv2d of ``net`` (3 input channels) for one taking ``in_channels``, as smp does for its
    encoders: one channel gets the sum of the RGB filters (grey = R = G = B), more channels cycle the RGB filters,
    scaled by 3 / in_channels so the activations keep their size; random init weights stay random in kind."""
    first = (n for n, m in net.named_modules() if isinstance(m, nn.Conv2d) and m.in_channels == 3 and m.groups == 1)
    name = next(first)
    conv = net.get_submodule(name)
    new = nn.Conv2d(
        in_channels,
        conv.out_channels,
        conv.kernel_size,
        conv.stride,
        conv.padding,
        conv.dilation,
        bias=conv.bias is not None,
    )
    with torch.no_grad():
        weight = conv.weight
        if in_channels == 1:
            new.weight.copy_(weight.sum(1, keepdim=True))
        else:
            new.weight.copy_(weight[:, [i % 3 for i in range(in_channels)]] * (3 / in_channels))
        if conv.bias is not None:
            new.bias.copy_(conv.bias)
    parent, _, child = name.rpartition(".")
    setattr(net.get_submodule(parent), child, new)


def output_stride(net: nn.Module, in_channels: int, probe: int = 32) -> int:
    """The backbone's largest stride: the probe's side over the smallest side of the backbone's feature maps
    (a [1, in_channels, probe, probe] zero tensor through ``net.backbone`` in eval mode, so no running statistic
    moves). 8 for the dilated ResNets of FCN and DeepLabV3, 16 for the MobileNetV3 ones."""
    was_training = net.training
    net.eval()
    with torch.no_grad():
        features = net.backbone(torch.zeros(1, in_channels, probe, probe))
    net.train(was_training)
    return probe // min(min(f.shape[-2:]) for f in features.values())


class TorchvisionModel(nn.Module):
    """A torchvision.models.segmentation model on srforge's contract: ``TorchvisionModel(in_channels=3,
    num_classes=2, name="deeplabv3_resnet50", weights=None, weights_backbone=None, **builder_kwargs)``.

    ``name``: one of BUILDERS. ``weights`` (the whole model: COCO with VOC labels, 21 classes, so num_classes must
    be 21, torchvision's rule) and ``weights_backbone`` (ImageNet; any num_classes) default to None (random
    init), unlike torchvision's defaults, so nothing downloads unless asked. Weights that are neither cached nor
    downloadable here fail at once with a WeightsUnavailableError saying what to do.

    ``in_channels`` other than 3 replaces the first convolution (:func:`replace_first_conv`). Output: the
    model's ``["out"]`` as logits (no aux head; ``aux_loss`` is refused).

    ``size_divisor`` = the backbone's output stride (:func:`output_stride`: 8 for FCN and DeepLabV3 on ResNet,
    16 on MobileNetV3). torchvision upsamples the stride-s logits bilinearly to any input size, so any size would
    run, but only at a multiple of s is the feature grid aligned with the pixel grid: each feature cell then covers
    the same s x s input pixels and the upsampling's scale factor is exactly s whatever the padding, so a scan's
    logits sample its features at the same positions alone, padded next to a larger scan, or as a tile of a larger
    scan. At other sizes the strided convolutions round, the scale becomes Hp / ceil(Hp / s), and the sampling
    positions shift with the amount of padding. H and W that are not multiples are a ValueError naming it.

    Normalisation: uint8 -> x / 255, float as [0, 1], then (x - mean) / std with ImageNet ``mean``/``std``
    buffers (cycled or averaged for other channel counts, see srforge.models.library_adapter.channel_stats), padded
    positions set to 0 when ``sizes`` is given.

    forward(image [B, C, Hp, Wp] uint8 | float, sizes [B, 2] int64 | None) -> logits [B, K, Hp, Wp].
    BatchNorm, and the global pooling of DeepLabV3's ASPP, LR-ASPP and MobileNetV3's squeeze-excitation, make the
    logits depend on the padding; ``apply_norm(model, "masked")`` (srforge.models.norms) takes all of them over
    the valid pixels only. What is left is the final bilinear upsampling, which at a scan's bottom/right edge
    blends its last feature cell with the padding's zero where alone it clamps: measured on a 64 x 96 scan alone
    vs batched with a 160 x 320 one, logits agree to 3e-6 except in the last s/2 pixels (FCN, DeepLabV3; LR-ASPP,
    upsampling twice: the last s), where they differ by up to 0.25-0.56.
    """

    def __init__(
        self,
        in_channels: int = 3,
        num_classes: int = 2,
        name: str = "deeplabv3_resnet50",
        weights: str | None = None,
        weights_backbone: str | None = None,
        **builder_kwargs,
    ):
        super().__init__()
        from torchvision.models import segmentation

        if name not in BUILDERS:
            raise ValueError(f"TorchvisionModel name must be one of {list(BUILDERS)}, got {name!r}")
        if builder_kwargs.get("aux_loss"):
            raise ValueError("TorchvisionModel returns the main head's logits only; remove aux_loss")
        builder = getattr(segmentation, name)
        for parameter, value in (("weights", weights), ("weights_backbone", weights_backbone)):
            if value is not None:
                require_tv_download(builder, parameter, value)
        self.in_channels, self.num_classes, self.name = in_channels, num_classes, name
        self.padding_aware = True  # the forward zeroes the padding (sizes): an ONNX export takes sizes too
        try:
            self.net = builder(
                weights=weights, weights_backbone=weights_backbone, num_classes=num_classes, **builder_kwargs
            )
        except OSError as exc:  # URLError, a truncated file: the download itself failed
            raise WeightsUnavailableError(
                f"pretrained weights for {name} could not be loaded: {exc}; download the file elsewhere and give "
                "it as model.weights, or use weights=null and weights_backbone=null"
            ) from exc
        if in_channels != 3:
            replace_first_conv(self.net, in_channels)
        self.size_divisor = output_stride(self.net, in_channels)
        register_stats(self, channel_stats(IMAGENET_MEAN, in_channels), channel_stats(IMAGENET_STD, in_channels))

    @property
    def encoder(self) -> nn.Module:
        """The torchvision model's backbone, where model.weights_into=encoder loads ImageNet backbone weights;
        its state_dict keys are ``net.backbone.*``."""
        return self.net.backbone

    def forward(self, image: torch.Tensor, sizes: torch.Tensor | None = None) -> torch.Tensor:
        return self.net(adapter_input(self, image, sizes))["out"]
