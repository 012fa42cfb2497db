"""What every adapter of another library's model shares (srforge.models.smp, srforge.models.tv_segmentation).

srforge's model contract (srforge.models.contract): attributes ``size_divisor``, ``in_channels``, ``num_classes``;
``forward(image [B, C, H, W] uint8 | float in [0, 1], sizes [B, 2] int64 | None) -> logits [B, K, H, W]``; the input
normalisation inside the model, so that a checkpoint alone configures prediction. An adapter keeps the pretrained
normalisation as buffers (:func:`register_stats`, :func:`channel_stats`), hands the wrapped model a checked,
normalised input with the padding zeroed (:func:`adapter_input`), and fails at once, saying what to do, when
pretrained weights cannot be downloaded (:func:`require_download`).
"""

from __future__ import annotations

import socket
import urllib.request
from collections.abc import Sequence
from urllib.parse import urlsplit

import torch
from torch import nn

from srforge.geometry import level_mask, round_up
from srforge.models.unet import check_sizes, normalize_image, sizes_readable

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


class WeightsUnavailableError(FileNotFoundError):
    """Pretrained weights named in the config are neither in the local cache nor downloadable from here."""


def channel_stats(values: Sequence[float], in_channels: int) -> tuple[float, ...]:
    """Per-channel mean (or std) for ``in_channels`` from a pretrained RGB triple, matching how smp adapts a
    pretrained first conv: one channel sums the RGB filters (grey = R = G = B), so it gets the triple's average;
    more channels cycle R, G, B, ..., so they get the values cycled the same way."""
    values = tuple(float(v) for v in values)
    if len(values) == in_channels:
        return values
    if in_channels == 1:
        return (sum(values) / len(values),)
    return tuple(values[i % len(values)] for i in range(in_channels))


def register_stats(module: nn.Module, mean: Sequence[float], std: Sequence[float]) -> None:
    """Give ``module`` the ``mean`` and ``std`` buffers [1, C, 1, 1] float32 (saved in the state_dict, so the
    checkpoint holds the normalisation), C = ``module.in_channels``."""
    channels = module.in_channels
    if len(mean) != channels or len(std) != channels:
        raise ValueError(
            f"{type(module).__name__} mean and std need {channels} values each (in_channels), got "
            f"{len(mean)} and {len(std)}"
        )
    module.register_buffer("mean", torch.tensor(mean, dtype=torch.float32).view(1, -1, 1, 1))
    module.register_buffer("std", torch.tensor(std, dtype=torch.float32).view(1, -1, 1, 1))


def check_image(image: torch.Tensor, in_channels: int, divisor: int, owner: str) -> None:
    """Raise ValueError unless image is [B, in_channels, H, W] with H and W multiples of ``divisor``."""
    if image.ndim != 4 or image.shape[1] != in_channels:
        raise ValueError(f"{owner} expects image [B, {in_channels}, H, W], got shape {tuple(image.shape)}")
    for name, n in zip("HW", image.shape[2:]):
        if n % divisor:
            raise ValueError(
                f"{owner} input {name}={n} is not a multiple of size_divisor={divisor}; pad {name} to "
                f"{round_up(n, divisor)} (srforge.AlignedCollate does this) and pass the true sizes"
            )


def adapter_input(model: nn.Module, image: torch.Tensor, sizes: torch.Tensor | None) -> torch.Tensor:
    """What an adapter hands the wrapped library model: [B, C, Hp, Wp] uint8 (0..255) or float (0..1) ->
    float32 (x - model.mean) / model.std, with padded positions (outside each scan's ``sizes``) set to 0.

    Zero padding after the normalisation is what the first convolution's own zero padding holds at an image
    border, so a scan's first layer sees the same numbers alone or padded next to a larger scan (with the
    uint8 zero normalised instead, the padding would be -mean / std, a dark frame the network would learn).
    """
    check_image(image, model.in_channels, model.size_divisor, type(model).__name__)
    x = normalize_image(image, model.mean, model.std, type(model).__name__)
    if sizes is not None:
        check_sizes(sizes, image, read_values=sizes_readable(sizes))
        sizes = sizes.to(image.device, non_blocking=True)
        x = x.mul_(level_mask(sizes, *image.shape[2:]).to(x.dtype))
    return x


def reachable(url: str, timeout: float = 3.0) -> bool:
    """Whether a TCP connection to ``url``'s host (or to the HTTPS/HTTP proxy the environment names for it)
    opens within ``timeout`` seconds. A download library would retry for tens of seconds (huggingface_hub: 5
    retries, 23 s) or wait forever (urllib without a timeout) before failing; this answers in at most
    ``timeout``."""
    parts = urlsplit(url)
    proxies = urllib.request.getproxies()
    if parts.scheme in proxies and not urllib.request.proxy_bypass(parts.hostname or ""):
        parts = urlsplit(proxies[parts.scheme])
    port = parts.port or (443 if parts.scheme == "https" else 80)
    try:
        socket.create_connection((parts.hostname, port), timeout=timeout).close()
    except OSError:
        return False
    return True


def require_download(what: str, url: str, cached: bool, todo: str) -> None:
    """Raise WeightsUnavailableError at once when pretrained weights ``what`` are not ``cached`` and ``url`` (where
    they would come from) cannot be reached; ``todo`` says what to do instead. Nothing to do when cached."""
    if cached or reachable(url):
        return
    raise WeightsUnavailableError(
        f"pretrained weights for {what} cannot be downloaded here: {url} is not reachable and the file is not in "
        f"the local cache; {todo}"
    )
