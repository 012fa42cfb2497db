"""Adapter for segmentation_models_pytorch (smp): any architecture with any encoder, on srforge's model contract.

srforge's model contract (srforge.models.contract): attributes ``size_divisor``, ``in_channels``, ``num_classes``;
``forward(image [B, C, H, W] uint8 | float in [0, 1], sizes [B, 2] int64 | None) -> logits [B, K, H, W]``; the input
normalisation inside the model, so that a checkpoint alone configures prediction. smp models take a normalised
float tensor and return logits; :class:`SmpModel` adds the rest.

What every adapter shares (normalisation buffers, the padded input, failing at once without weights) lives in
:mod:`srforge.models.library_adapter`.

smp is imported lazily (:func:`import_smp`), so srforge runs without it: ``pip install -e ".[smp]"`` adds it.
"""

from __future__ import annotations

import difflib
import json
import os
from collections.abc import Sequence

import torch
from torch import nn

from srforge.extras import MissingExtraError
from srforge.models.library_adapter import (
    IMAGENET_MEAN,
    IMAGENET_STD,
    WeightsUnavailableError,
    adapter_input,
    channel_stats,
    register_stats,
    require_download,
)

# Decoders that downsample the encoder's deepest feature map further: PAN's feature pyramid attention halves it
# three times more (three 2x2 max-pools), so its input must be a multiple of 8 * the encoder's output stride.
DECODER_EXTRA_STRIDE = {"pan": 8}


def import_smp():
    """segmentation_models_pytorch, or an ImportError that names the extra that installs it."""
    try:
        import segmentation_models_pytorch
    except ImportError as exc:
        raise MissingExtraError(
            "SmpModel needs segmentation-models-pytorch (with timm and safetensors), which did not import "
            f'({exc}): pip install -e ".[smp]" (or pip install "segmentation-models-pytorch>=0.6" timm safetensors)'
        ) from exc
    return segmentation_models_pytorch


def hf_cached(repo_id: str, filenames: Sequence[str], revision: str | None = None) -> str | None:
    """Path of the first of ``filenames`` of Hugging Face repo ``repo_id`` in the local hub cache, or None."""
    from huggingface_hub import try_to_load_from_cache

    for name in filenames:
        found = try_to_load_from_cache(repo_id, name, revision=revision)
        if isinstance(found, str):
            return found
    return None


def hf_endpoint() -> str:
    """The Hugging Face hub's address (HF_ENDPOINT); unreachable by definition under HF_HUB_OFFLINE=1."""
    from huggingface_hub import constants

    return "offline://HF_HUB_OFFLINE" if constants.HF_HUB_OFFLINE else constants.ENDPOINT


# -- smp -----------------------------------------------------------------------------------------------------------


def timm_pretrained_cfg(name: str):
    """timm's pretrained config for ``name`` ("resnet18" or "resnet18.a1_in1k"), read locally; None if unknown."""
    import timm

    try:
        return timm.models.get_pretrained_cfg(name)
    except (RuntimeError, KeyError, ValueError):
        return None


def smp_weights_source(smp, encoder: str, weights: str) -> tuple[str, bool] | None:
    """(where encoder ``encoder``'s pretrained ``weights`` download from, whether they are already cached), or None
    when smp will refuse the name itself (an unknown encoder or weights tag: its own error lists the choices)."""
    if encoder.startswith("tu-"):
        cfg = timm_pretrained_cfg(encoder[3:])
        if cfg is None:
            return None
        if cfg.hf_hub_id:
            files = [cfg.hf_hub_filename] if cfg.hf_hub_filename else ["model.safetensors", "pytorch_model.bin"]
            return f"{hf_endpoint()}/{cfg.hf_hub_id}", hf_cached(cfg.hf_hub_id, files) is not None
        url = cfg.url or ""
        cached = os.path.exists(os.path.join(torch.hub.get_dir(), "checkpoints", os.path.basename(url)))
        return url, cached
    settings = smp.encoders.encoders.get(encoder, {}).get("pretrained_settings", {}).get(weights)
    if settings is None:
        return None
    cached = hf_cached(settings["repo_id"], ["model.safetensors"], settings["revision"]) is not None
    cached = cached and hf_cached(settings["repo_id"], ["config.json"], settings["revision"]) is not None
    return f"{hf_endpoint()}/{settings['repo_id']}", cached


def encoder_stats(smp, encoder: str, weights: str | None) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """(mean, std) RGB in [0, 1] units that ``encoder``'s pretrained weights expect; ImageNet's when unknown.

    tu- encoders: timm's pretrained config, read locally (the same for any ``weights``). smp's own encoders: the
    config.json its pretrained weights came with, read from the hub cache, where building with ``weights`` has just
    put it; with ``weights`` None, ImageNet's, so that a config builds the same model on every machine whatever
    its cache holds. An ``input_range`` of [0, 255] is folded into the values (x * 255 - m) / s = (x - m/255) /
    (s/255); an ``input_space`` of BGR is not handled (no smp-hub encoder we know of uses it).
    """
    if encoder.startswith("tu-"):
        cfg = timm_pretrained_cfg(encoder[3:])
        if cfg is not None and cfg.mean and cfg.std:
            return tuple(cfg.mean), tuple(cfg.std)
        return IMAGENET_MEAN, IMAGENET_STD
    settings = smp.encoders.encoders.get(encoder, {}).get("pretrained_settings", {}).get(weights)
    path = settings and hf_cached(settings["repo_id"], ["config.json"], settings["revision"])
    if not path:
        return IMAGENET_MEAN, IMAGENET_STD
    with open(path) as f:
        config = json.load(f)
    scale = 255.0 if max(config.get("input_range", [0, 1])) > 1 else 1.0
    return tuple(m / scale for m in config["mean"]), tuple(s / scale for s in config["std"])


def check_smp_names(smp, arch: str, encoder: str) -> None:
    """A ValueError naming the closest valid choices for an architecture or encoder smp does not have (smp itself
    raises a KeyError or a RuntimeError deep in its code); ``tu-`` encoders are looked up in timm."""
    archs = {name.lower(): cls.__name__ for name, cls in smp.MODEL_ARCHITECTURES_MAPPING.items()}
    if str(arch).lower() not in archs:
        close = difflib.get_close_matches(str(arch).lower(), list(archs), n=3, cutoff=0.5)
        hint = f"closest: {', '.join(archs[c] for c in close)}" if close else f"one of {', '.join(archs.values())}"
        raise ValueError(f"SmpModel: arch {arch!r} is not an smp architecture ({hint}; any case).")
    if str(encoder).startswith("tu-"):
        import timm

        if not timm.is_model(encoder[3:]):
            close = difflib.get_close_matches(encoder[3:], timm.list_models(), n=3, cutoff=0.6)
            hint = f"closest: {', '.join('tu-' + c for c in close)}" if close else "see timm.list_models()"
            raise ValueError(f"SmpModel: encoder {encoder!r}: timm has no model {encoder[3:]!r} ({hint}).")
        return
    names = smp.encoders.get_encoder_names()
    if encoder not in names:
        close = difflib.get_close_matches(str(encoder), names, n=3, cutoff=0.5)
        hint = f"closest: {', '.join(close)}" if close else "see smp.encoders.get_encoder_names()"
        raise ValueError(f"SmpModel: encoder {encoder!r} is not an smp encoder ({hint}; timm's models as 'tu-NAME').")


def build_smp(smp, arch: str, encoder: str, encoder_weights: str | None, **kwargs) -> nn.Module:
    """``smp.create_model`` with a clear error instead of a download traceback when weights cannot be had, and
    for an architecture or encoder smp does not have (:func:`check_smp_names`)."""
    check_smp_names(smp, arch, encoder)
    if encoder_weights is not None:
        source = smp_weights_source(smp, encoder, encoder_weights)
        todo = (
            "download the file elsewhere and give it as model.weights with model.weights_into=encoder, or use "
            "encoder_weights=null (random initialisation)"
        )
        if source is not None:
            require_download(f"{encoder} ({encoder_weights})", *source, todo)
    try:
        return smp.create_model(arch, encoder_name=encoder, encoder_weights=encoder_weights, **kwargs)
    except OSError as exc:  # URLError, huggingface_hub's and httpx's errors, a truncated file: all OSErrors
        raise WeightsUnavailableError(
            f"pretrained weights for {encoder} ({encoder_weights}) could not be loaded: {exc}; download the file "
            "elsewhere and give it as model.weights with model.weights_into=encoder, or use encoder_weights=null"
        ) from exc


class SmpModel(nn.Module):
    """Any segmentation_models_pytorch architecture with any encoder, on srforge's model contract.

    ``SmpModel(in_channels=3, num_classes=2, arch="Unet", encoder="resnet18", encoder_weights=None, **arch_kwargs)``
    builds ``smp.create_model(arch, encoder_name=encoder, ...)``; ``arch`` is any smp architecture (Unet,
    UnetPlusPlus, FPN, PSPNet, DeepLabV3, DeepLabV3Plus, Linknet, MAnet, PAN, UPerNet, Segformer, DPT; any case),
    ``encoder`` any smp encoder, timm's through ``tu-`` names ("tu-resnet18", "tu-mobilenetv3_small_100").
    ``arch_kwargs`` go to the architecture (``encoder_depth``, ``decoder_channels``, ...); ``activation`` and
    ``aux_params`` are refused, because srforge needs the logits alone.

    ``encoder_weights`` ("imagenet", ...; any non-null value for tu- encoders, which pick their weights by tag,
    "tu-resnet18.a1_in1k") passes through to smp/timm. When the weights are not cached and their server cannot
    be reached, construction fails at once with a WeightsUnavailableError saying what to do, never with a
    download's retries and traceback.

    ``size_divisor``: the encoder's output stride (smp's ``encoder.output_stride``: 2 ** encoder_depth at most 32,
    less for dilated encoders, e.g. 8 for DeepLabV3), times 8 for PAN (see DECODER_EXTRA_STRIDE). At a multiple of
    it every stride-2 stage halves the map exactly, so each feature cell covers the same input pixels however
    much padding follows, and every decoder's upsampling lands back on the input grid. H and W that are not
    multiples are a ValueError naming it. ``size_divisor=`` may raise it to a multiple of that.

    Normalisation: uint8 -> x / 255, float taken as [0, 1], then (x - mean) / std with the ``mean`` and ``std``
    buffers (state_dict) from the encoder's pretrained settings (:func:`encoder_stats`; ``mean=``/``std=`` set them
    explicitly); then, with ``sizes``, padded positions are set to 0 (:func:`adapter_input`).

    forward(image [B, C, Hp, Wp] uint8 | float, sizes [B, 2] int64 | None) -> logits [B, K, Hp, Wp] float32.
    smp models use BatchNorm, whose statistics mix the samples of a batch in training and count the padding:
    srforge.models.norms.apply_norm swaps it for GroupNorm, frozen or padding-aware (masked) norms.
    """

    def __init__(
        self,
        in_channels: int = 3,
        num_classes: int = 2,
        arch: str = "Unet",
        encoder: str = "resnet18",
        encoder_weights: str | None = None,
        *,
        size_divisor: int | None = None,
        mean: Sequence[float] | None = None,
        std: Sequence[float] | None = None,
        **arch_kwargs,
    ):
        super().__init__()
        refused = sorted({"activation", "aux_params", "classes", "encoder_name"} & set(arch_kwargs))
        if refused:
            raise ValueError(
                f"SmpModel builds the smp model itself and needs its logits alone; remove {refused} from its "
                f"arguments (num_classes and encoder set classes and encoder_name)"
            )
        smp = import_smp()
        self.in_channels, self.num_classes = in_channels, num_classes
        self.padding_aware = True  # the forward zeroes the padding (sizes): an ONNX export takes sizes too
        self.arch, self.encoder_name, self.encoder_weights = arch, encoder, encoder_weights
        self.net = build_smp(
            smp, arch, encoder, encoder_weights, in_channels=in_channels, classes=num_classes, **arch_kwargs
        )
        least = int(self.net.encoder.output_stride) * DECODER_EXTRA_STRIDE.get(arch.lower(), 1)
        if size_divisor is not None and (size_divisor < least or size_divisor % least):
            raise ValueError(
                f"SmpModel size_divisor must be a multiple of {least} for {arch} on {encoder}, got {size_divisor}"
            )
        self.size_divisor = size_divisor or least
        default_mean, default_std = encoder_stats(smp, encoder, encoder_weights)
        register_stats(
            self, mean or channel_stats(default_mean, in_channels), std or channel_stats(default_std, in_channels)
        )

    @property
    def encoder(self) -> nn.Module:
        """The smp model's encoder (``model.encoder``, where pretrained encoder weights go); its state_dict keys
        are ``net.encoder.*``."""
        return self.net.encoder

    def forward(self, image: torch.Tensor, sizes: torch.Tensor | None = None) -> torch.Tensor:
        logits = self.net(adapter_input(self, image, sizes))
        return logits[0] if isinstance(logits, tuple) else logits
