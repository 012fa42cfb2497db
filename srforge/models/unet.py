"""UNet for segmentation of images of every size, with a padding-aware mode for padded batches."""

from collections.abc import Callable, Sequence

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from srforge.constants import MAX_DEPTH
from srforge.geometry import level_mask, round_up
from srforge.models.contract import unit_image
from srforge.models.group_norm import GroupNorm2d
from srforge.models.ink import ink_image


def _check_input(image: torch.Tensor, in_channels: int, divisor: int) -> None:
    """Raise ValueError unless image is [B, in_channels, H, W] with H and W multiples of divisor."""
    if image.ndim != 4 or image.shape[1] != in_channels:
        raise ValueError(f"UNet expects image [B, {in_channels}, H, W], got shape {tuple(image.shape)}")
    for name, n in zip("HW", image.shape[2:]):
        if n % divisor:
            padded = round_up(n, divisor)
            raise ValueError(
                f"UNet input {name}={n} is not a multiple of size_divisor={divisor}; pad {name} to {padded} "
                f"(srforge.AlignedCollate does this) and pass the true sizes"
            )


def sizes_readable(sizes: torch.Tensor) -> bool:
    """Whether the forward may look at the values of ``sizes``: only when they sit in host memory (reading a
    CUDA tensor's values makes the host wait for every queued kernel, once per step) and outside torch.compile
    (where reading them would break the graph)."""
    return sizes.device.type == "cpu" and not torch.compiler.is_compiling()


def check_sizes(sizes: torch.Tensor, image: torch.Tensor, read_values: bool) -> None:
    """Raise ValueError unless sizes is [B, 2] integer and, if ``read_values``, 1 <= size <= padded size.

    The shape and dtype checks read no values and always run. The range check reads them, so it runs only where
    that is free (``sizes_readable``). Sizes already on the device are not range-checked: AlignedCollate records the
    true shapes of the tensors it pads, so they are in range by construction, and a check there would cost a sync.
    """
    batch, _, height, width = image.shape
    if sizes.shape != (batch, 2) or sizes.is_floating_point():
        raise ValueError(
            f"UNet sizes must be an integer [B={batch}, 2] tensor of true (H, W), got "
            f"{sizes.dtype} {tuple(sizes.shape)}"
        )
    if not read_values:
        return
    limit = torch.tensor([height, width], device=sizes.device)
    if bool(((sizes < 1) | (sizes > limit)).any()):
        raise ValueError(
            f"UNet sizes must lie in [1, ({height}, {width})] for image {tuple(image.shape)}, got {sizes.tolist()}"
        )


class ConvNormAct(nn.Module):
    """3x3 conv (no bias: the norm has one) -> GroupNorm2d -> activation; padded positions end up 0.

    forward(x [B, C_in, H, W], mask [B, 1, H', W'] | None) -> [B, C_out, H', W'] (H' = H / stride). The masked
    norm returns 0 on padding; an activation with f(0) != 0 gets a second multiplication by the mask. Zeros there
    are exactly what the next conv's own zero padding holds at an image border.
    """

    def __init__(self, in_channels: int, out_channels: int, activation: type[nn.Module], stride: int = 1):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, 3, stride=stride, padding=1, bias=False)
        self.norm = GroupNorm2d(out_channels)
        self.act = activation()
        self.act_keeps_zero = float(self.act(torch.zeros(1))) == 0.0

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        x = self.act(self.norm(self.conv(x), mask))
        return x if mask is None or self.act_keeps_zero else x * mask.to(x.dtype)


class DoubleConv(nn.Module):
    """Two ConvNormAct; the first may have stride 2 (the encoder's downsampling).

    forward(x [B, C_in, H, W], mask | None) -> [B, C_out, H / stride, W / stride].
    """

    def __init__(self, in_channels: int, out_channels: int, activation: type[nn.Module], stride: int = 1):
        super().__init__()
        self.first = ConvNormAct(in_channels, out_channels, activation, stride)
        self.second = ConvNormAct(out_channels, out_channels, activation)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        return self.second(self.first(x, mask), mask)


class UpBlock(nn.Module):
    """Transposed conv (kernel = stride = 2), concat with the skip, DoubleConv.

    forward(x [B, C_in, h, w], skip [B, C_out, 2h, 2w], mask [B, 1, 2h, 2w] | None) -> [B, C_out, 2h, 2w].
    Kernel = stride means every output pixel comes from exactly one input pixel, so no padded value leaks into a
    valid one (bilinear upsampling would blend the two at a scan's edge).
    """

    def __init__(self, in_channels: int, out_channels: int, activation: type[nn.Module]):
        super().__init__()
        self.up = nn.ConvTranspose2d(in_channels, out_channels, 2, stride=2)
        self.conv = DoubleConv(2 * out_channels, out_channels, activation)

    def forward(self, x: torch.Tensor, skip: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        x = self.up(x)
        if mask is not None:  # the bias and odd-size overhang would otherwise sit in the padding
            x = x.mul_(mask.to(x.dtype))  # in place: the conv's output is not needed for its backward
        return self.conv(torch.cat((x, skip.to(x.dtype)), dim=1), mask)


def normalize_image(image: torch.Tensor, mean: torch.Tensor, std: torch.Tensor, owner: str) -> torch.Tensor:
    """[B, C, H, W] uint8 (0..255) or float (0..1) -> float (x - mean) / std in ``mean``'s dtype; ``owner`` (the
    model's class name) is named when the image is neither."""
    return (unit_image(image, mean.dtype, owner) - mean) / std


class UNet(nn.Module):
    """UNet: ``depth`` stride-2 encoder stages, as many transposed-conv decoder stages, skip connections.

    Channels at level l are ``min(base_channels * 2**l, max_channels)``; every block is two 3x3 conv + GroupNorm
    (``group_count`` groups, never BatchNorm) + activation; a 1x1 conv head gives the logits.
    ``size_divisor = 2 ** depth``: H and W of the input must be multiples of it (ValueError otherwise); ``depth``
    is 1 to MAX_DEPTH (srforge.geometry), and :func:`srforge.geometry.depth_problem` says how deep given scans allow.

    Input normalisation lives in the model, so loaders ship uint8 and prediction needs no preprocessing:
    uint8 images become x / 255, float images are taken as already in [0, 1]; then (x - mean) / std with the
    ``mean`` and ``std`` buffers ([1, C, 1, 1], saved in the state_dict; ImageNet values for 3 channels,
    0.5 / 0.25 otherwise). ``ink=True`` first maps each scan to its darkness against its own paper, in its darkest
    channel (srforge.models.ink, over the valid pixels only): for scans of ink on paper whose paper tint and ink
    colours vary, where it carries a model trained on one kind of scan over to others (docs/performance.md).

    forward(image [B, C, Hp, Wp] uint8 | float, sizes [B, 2] int64 true (H, W) | None) -> logits [B, K, Hp, Wp].

    Padding-aware mode (``sizes`` given and ``padding_aware=True``): every GroupNorm takes its statistics over each
    scan's valid pixels only (at stride s, the top-left ceil(H / s) x ceil(W / s) block), and padded positions are
    set to zero after the input normalisation, each activation and each upsampling. A 3x3 conv at a scan's edge
    then reads the same zeros it reads at the border of an unpadded tensor; the stride-2 conv downsampling and the
    kernel-2 transposed conv read no other neighbours, and the 1x1 head none. So a scan's logits on its true extent
    are the same (up to float rounding) alone, padded to its own multiple of ``size_divisor``, or batched with
    scans several times its size. Logits on padded positions are not meaningful. Without ``sizes`` the model runs
    plain GroupNorm over the whole padded tensor (faster, but batch-dependent, see srforge.models.group_norm).
    The masks ([B, 1, h, w] per level) are built once per forward and shared by all blocks of a level.

    ``dropout`` (0: none) zeroes that share of the head's input features in training mode, each element alone,
    the rest scaled up to match (``nn.Dropout``, as segmentation heads place it before their classifier): the model
    noise Noisy Student gives its student. Its masks are drawn from a generator the Trainer seeds by run seed, step,
    rank and batch (srforge.train.rng.update_randomness), so a resumed run draws the same ones.

    Apart from ``dropout``, train and eval mode are the same computation (GroupNorm keeps no running statistics).
    Works with channels_last inputs, ``torch.autocast`` (norm statistics stay float32) and ``torch.compile``: the
    forward is one graph (``fullgraph=True`` works). ``torch.compile(model, dynamic=True)`` compiles once and serves
    every later size without recompiling; with the default ``dynamic=None`` the first compile is static and the
    first new size recompiles once with dynamic shapes, after which sizes reuse that graph. Prefer ``dynamic=True``
    when sizes vary from batch to batch (the README's performance section has the compile times).
    """

    def __init__(  # noqa: PLR0913 (checkpointing, ink, dropout keyword-only, as test_structure allows a public class)
        self,
        in_channels: int = 3,
        num_classes: int = 2,
        base_channels: int = 32,
        depth: int = 5,
        max_channels: int = 512,
        activation: type[nn.Module] = nn.ReLU,
        mean: Sequence[float] | None = None,
        std: Sequence[float] | None = None,
        padding_aware: bool = True,
        *,
        checkpointing: bool = False,
        ink: bool = False,
        dropout: float = 0.0,
    ):
        super().__init__()
        if isinstance(dropout, bool) or not isinstance(dropout, int | float) or not 0 <= dropout < 1:
            raise ValueError(
                f"UNet dropout is the share of the head's input features dropped in training, 0 <= dropout < 1 "
                f"(0: none; segmentation heads use about 0.1), got {dropout!r}"
            )
        if not 1 <= depth <= MAX_DEPTH:  # before any layer is allocated
            raise ValueError(
                f"UNet depth must be 1 to {MAX_DEPTH} (size divisor 2**depth, at most {2**MAX_DEPTH:,} px, beyond "
                f"any scan; each stage deeper doubles every scan's padding), got {depth}; the quickstart uses 3"
            )
        self.in_channels, self.num_classes, self.depth = in_channels, num_classes, depth
        self.size_divisor = 2**depth
        self.padding_aware = padding_aware
        self.checkpointing = checkpointing
        self.ink = bool(ink)
        imagenet = in_channels == 3
        mean = mean if mean is not None else ((0.485, 0.456, 0.406) if imagenet else (0.5,) * in_channels)
        std = std if std is not None else ((0.229, 0.224, 0.225) if imagenet else (0.25,) * in_channels)
        if len(mean) != in_channels or len(std) != in_channels:
            raise ValueError(
                f"UNet mean and std need {in_channels} values each (in_channels), got {len(mean)} and {len(std)}"
            )
        self.register_buffer("mean", torch.tensor(mean, dtype=torch.float32).view(1, -1, 1, 1))
        self.register_buffer("std", torch.tensor(std, dtype=torch.float32).view(1, -1, 1, 1))

        widths = [min(base_channels * 2**level, max_channels) for level in range(depth + 1)]
        self.stem = DoubleConv(in_channels, widths[0], activation)
        self.down = nn.ModuleList(DoubleConv(widths[i], widths[i + 1], activation, stride=2) for i in range(depth))
        self.up = nn.ModuleList(UpBlock(widths[i + 1], widths[i], activation) for i in reversed(range(depth)))
        self.head = nn.Conv2d(widths[0], num_classes, 1)
        self.dropout = nn.Dropout(float(dropout)) if dropout else None  # None: a model without it runs as before

    def normalize(self, image: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        """[B, C, H, W] uint8 (0..255) or float (0..1) -> float (x - mean) / std in the buffers' dtype; with
        ``ink``, x is the scan's ink image (srforge.models.ink) over ``mask``'s valid pixels ([B, 1, H, W] | None)."""
        if self.ink:
            image = ink_image(image, mask)
        return normalize_image(image, self.mean, self.std, "UNet")

    def forward(self, image: torch.Tensor, sizes: torch.Tensor | None = None) -> torch.Tensor:
        _check_input(image, self.in_channels, self.size_divisor)
        masks: list[torch.Tensor | None] = [None] * (self.depth + 1)
        if sizes is not None and self.padding_aware:
            check_sizes(sizes, image, read_values=sizes_readable(sizes))
            # non_blocking: a plain copy from host memory to CUDA waits for the queued kernels first
            sizes = sizes.to(image.device, non_blocking=True)
            height, width = image.shape[2:]
            masks = [level_mask(sizes, height >> level, width >> level, 2**level) for level in range(self.depth + 1)]

        run = self.run_block
        skips = [run(self.first_level, image, masks[0])]
        for level, block in enumerate(self.down, start=1):
            skips.append(run(block, skips[-1], masks[level]))
        x = skips.pop()
        for level, block in zip(reversed(range(self.depth)), self.up):
            x = run(block, x, skips[level], masks[level])
        return self.head(x if self.dropout is None else self.dropout(x))

    def first_level(self, image: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        """image [B, C, H, W] -> the stem's output [B, base_channels, H, W]: normalised, padding zeroed, stem. One
        block, so that under checkpointing the level keeps the (uint8) image, not its float normalisation."""
        x = self.normalize(image, mask)
        if mask is not None:
            x = x.mul_(mask.to(x.dtype))
        return self.stem(x, mask)

    def run_block(self, block: Callable[..., torch.Tensor], *inputs: torch.Tensor | None) -> torch.Tensor:
        """``block(*inputs)``, checkpointed when ``self.checkpointing`` and gradients are being recorded (in
        evaluation and under no_grad there is nothing to keep for backward, so the block simply runs)."""
        if self.checkpointing and torch.is_grad_enabled():
            return checkpoint(block, *inputs, use_reentrant=False)
        return block(*inputs)
