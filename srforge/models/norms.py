"""Swap the normalisation layers of any model for ones that suit padded batches: ``apply_norm(model, option)``.

Why: other libraries' models (smp, torchvision) use BatchNorm. In training its statistics mix the samples of a
batch and count every padded pixel; in eval its running statistics are per-pixel and fine, but it maps the
padding's zeros to ``bias - mean * scale``, which the next convolution reads at a scan's edge. Options:

* ``keep``: the model as it is.
* ``group``: every BatchNorm (1d/2d/3d, SyncBatchNorm) becomes a GroupNorm (``group_count`` groups, affine weights
  copied, running statistics dropped). No batch mixing, the same computation in train and eval; the statistics
  of each sample still count its padding.
* ``frozen``: every BatchNorm becomes a frozen one (torchvision.ops.FrozenBatchNorm2d; running statistics and affine
  copied, nothing trained): the usual choice with a pretrained encoder and small batches.
* ``masked``: padding-aware, as srforge's UNet: every BatchNorm, GroupNorm and InstanceNorm becomes a
  :class:`MaskedNorm`, srforge's masked GroupNorm (``masked_group_norm``: statistics over each scan's valid
  pixels only, 0 on the padding); every global average pool (``AdaptiveAvgPool2d(1)``) averages the valid pixels
  only (:class:`MaskedGlobalPool`); and the layers that could write a scan's values into the padding with no norm
  after them -- 2-D max/average pools, convolutions with a bias -- get their output's padding set to 0
  (:class:`ZeroPadding`). The norms alone are not enough: ResNet's stem max-pool (3x3, stride 2) copies a scan's
  last valid row into the first padded row, and the next convolution reads it (max |logit difference| 0.9 on an
  smp ResNet-18 U-Net with masked norms alone, 5e-6 with the pools masked too).

A masked layer must know the batch's true ``sizes`` and its padded input's (H, W) during the forward, and which
of its feature map's positions they make valid. ``apply_norm`` gives the model one :class:`NormContext` shared by
all its masked layers, and a forward pre-hook (:class:`RecordSizes`) that writes (sizes, Hp, Wp) into it from the
model's ``forward(image, sizes)`` arguments before anything runs, cleared again when the forward ends. Each
layer derives its mask from its own feature map's (h, w): at resolution h / Hp a scan of true height H covers
ceil(H * h / Hp) rows (``level_mask``'s rule at stride Hp / h). Hooks rather than a wrapping module keep the model
itself: its class, its attributes (``size_divisor``, ``in_channels``, ``num_classes``, ``encoder``) and its
state_dict keys stay as they were. With ``sizes`` None every masked layer is a plain GroupNorm.

Why that is exact for a U-Net on a ResNet (smp ``Unet``): every norm and pool leaves zeros on the padding and
ReLU keeps them, so a convolution at a scan's bottom/right edge reads the zeros it reads at a tensor's border
when the scan is alone; nearest-neighbour upsampling copies cells, and at multiples of ``size_divisor`` every
stride halves the map exactly. What ``masked`` cannot fix, because it happens in functions, not modules: a mean
over the whole map (timm's squeeze-excitation ``x.mean((2, 3))``: MobileNetV3, EfficientNet), attention, and
bilinear upsampling, which at a scan's far edge blends its last cell with the padding's zero where alone it
clamps (DeepLabV3/V3+ and torchvision's models: the last stride/2 pixels differ), and with ``align_corners=True``
(smp's FPN) samples positions that depend on the padded size everywhere. Measure a model with
``benchmarks/bench_model.py --model smp_<arch>_<encoder> --norm masked``.
"""

from __future__ import annotations

import itertools

import torch
import torch.nn.functional as F
from torch import nn
from torchvision.ops import FrozenBatchNorm2d

from srforge.geometry import valid_mask
from srforge.models.contract import takes_sizes
from srforge.models.group_norm import GroupNorm2d, group_count, masked_group_norm

NORM_OPTIONS = ("keep", "group", "frozen", "masked")
BATCH_NORMS = (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d, nn.SyncBatchNorm)


class NormContext:
    """The current forward's true ``sizes`` [B, 2] (on the input's device) and padded input size (height, width),
    shared by the masked layers of one model, with their masks cached per feature-map size for that forward."""

    def __init__(self):
        self.sizes: torch.Tensor | None = None
        self.height = self.width = 0
        self.masks: dict[tuple[int, int], torch.Tensor] = {}

    def start(self, image: torch.Tensor, sizes: torch.Tensor | None) -> None:
        """Record a forward's input image [B, C, Hp, Wp] and sizes (None: no masking in this forward)."""
        self.masks = {}
        self.sizes = None if sizes is None else sizes.to(image.device, non_blocking=True)
        self.height, self.width = image.shape[-2:]

    def clear(self) -> None:
        """Forget the batch (and free its masks) once its forward is over."""
        self.sizes, self.masks = None, {}

    def mask(self, x: torch.Tensor) -> torch.Tensor | None:
        """float [B, 1, h, w] valid-position mask for a feature map x [B, C, h, w]; None without sizes."""
        if self.sizes is None or x.ndim != 4 or x.shape[0] != self.sizes.shape[0]:
            return None
        h, w = x.shape[-2:]
        # No cache while traced (torch.export, torch.compile): even looking symbolic sizes up in a dict made the
        # ONNX export trace masked_group_norm through a decomposition ONNX cannot translate (prims.fma).
        traced = torch.compiler.is_compiling() or isinstance(h, torch.SymInt) or isinstance(w, torch.SymInt)
        if not traced and (h, w) in self.masks:
            return self.masks[(h, w)]
        extent = torch.tensor([self.height, self.width], device=self.sizes.device)
        scaled = (self.sizes * torch.tensor([h, w], device=self.sizes.device) + extent - 1) // extent
        mask = valid_mask(scaled, h, w).float()
        if not traced:
            self.masks[(h, w)] = mask
        return mask


class RecordSizes:
    """Forward pre-hook (with kwargs): stores ``forward(image, sizes)``'s arguments in the context. A callable
    object, not a closure, so that ``copy.deepcopy(model)`` gives the copy's hook the copy's context."""

    def __init__(self, context: NormContext):
        self.context = context

    def __call__(self, module: nn.Module, args: tuple, kwargs: dict) -> None:
        image = args[0] if args else kwargs["image"]
        sizes = args[1] if len(args) > 1 else kwargs.get("sizes")
        self.context.start(image, sizes if isinstance(sizes, torch.Tensor) else None)


class ForgetSizes:
    """Forward hook (always called, also when the forward raises): clears the context."""

    def __init__(self, context: NormContext):
        self.context = context

    def __call__(self, module: nn.Module, args: tuple, kwargs: dict, output) -> None:
        self.context.clear()


class MaskedNorm(nn.GroupNorm):
    """GroupNorm over each scan's valid positions only (``masked_group_norm``), zero on the padding.

    forward(x [B, C, h, w]) -> [B, C, h, w]: the mask comes from the shared NormContext at x's resolution; without
    one (no sizes in this forward, or an input that is not 4-D) it is ``F.group_norm``. State_dict keys are
    nn.GroupNorm's (weight, bias).
    """

    def __init__(self, num_groups: int, channels: int, context: NormContext, eps: float = 1e-5, affine: bool = True):
        super().__init__(num_groups, channels, eps=eps, affine=affine)
        self.context = context

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        mask = self.context.mask(x)
        if mask is None:
            return F.group_norm(x, self.num_groups, self.weight, self.bias, self.eps)
        return masked_group_norm(x, mask, self.num_groups, self.weight, self.bias, self.eps)


class ZeroPadding:
    """Forward hook: sets the padded positions of a module's 4-D output to 0 (mask from the shared context).

    For the layers that can write a scan's values into the padding with no norm after them to clean up: a 3x3
    max-pool of stride 2 (ResNet's stem) puts a scan's last valid row into the next output row, which is
    padding, and the next convolution would read it where alone it reads its own zero border; a convolution with
    a bias (no norm follows it, or it would need none) writes the bias there."""

    def __init__(self, context: NormContext):
        self.context = context

    def __call__(self, module: nn.Module, args: tuple, output):
        mask = self.context.mask(output) if isinstance(output, torch.Tensor) else None
        return output if mask is None else output * mask.to(output.dtype)


class MaskedGlobalPool(nn.AdaptiveAvgPool2d):
    """AdaptiveAvgPool2d(1) that averages each scan's valid positions only: [B, C, h, w] -> [B, C, 1, 1]. The
    global pooling of DeepLabV3's ASPP, LR-ASPP and torchvision's squeeze-excitation blocks would otherwise
    average the padding in."""

    def __init__(self, context: NormContext):
        super().__init__(1)
        self.context = context

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        mask = self.context.mask(x)
        if mask is None:
            return super().forward(x)
        mask = mask.to(x.dtype)
        return (x * mask).sum((2, 3), keepdim=True) / mask.sum((2, 3), keepdim=True).clamp_min(1.0)


class FrozenBatchNorm(FrozenBatchNorm2d):
    """FrozenBatchNorm2d for inputs of any rank [B, C, *] (BatchNorm1d's [B, C] and [B, C, L], BatchNorm3d's)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = (1, -1) + (1,) * (x.ndim - 2)
        scale = self.weight * (self.running_var + self.eps).rsqrt()
        shift = self.bias - self.running_mean * scale
        return x * scale.view(shape) + shift.view(shape)


class NormAct(nn.Module):
    """A converted norm followed by the dropout and activation its original held inside itself, as timm's
    BatchNormAct2d and GroupNormAct do (``x -> act(drop(norm(x)))``, their order): forward(x [B, C, ...]) -> same
    shape. State_dict keys gain ``norm.`` (``bn1.norm.weight``)."""

    def __init__(self, norm: nn.Module, drop: nn.Module, act: nn.Module):
        super().__init__()
        self.norm, self.drop, self.act = norm, drop, act

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.act(self.drop(self.norm(x)))


def keep_activation(old: nn.Module, new: nn.Module) -> nn.Module:
    """``new`` itself when the norm ``old`` holds no submodule; NormAct(new, old.drop, old.act) for timm's fused
    norm + activation layers; a ValueError for any other norm with submodules (its forward is unknown here)."""
    children = dict(old.named_children())
    if not children:
        return new
    if set(children) <= {"drop", "act"}:
        return NormAct(new, children.get("drop", nn.Identity()), children.get("act", nn.Identity()))
    raise ValueError(
        f"apply_norm: {type(old).__module__}.{type(old).__qualname__} holds submodules {sorted(children)}, and how "
        "its forward applies them is unknown; use model.norm: keep for this model"
    )


def copy_affine(source: nn.Module, target: nn.Module) -> nn.Module:
    """Copy ``source``'s affine weight and bias into ``target`` (when both have them); returns target."""
    if getattr(source, "weight", None) is not None and getattr(target, "weight", None) is not None:
        with torch.no_grad():
            target.weight.copy_(source.weight)
            target.bias.copy_(source.bias)
    return target


def to_group(module: nn.Module) -> nn.Module | None:
    """BatchNorm -> nn.GroupNorm(group_count(C), C) with its affine weights; None for any other module."""
    if not isinstance(module, BATCH_NORMS):
        return None
    channels = module.num_features
    return copy_affine(module, nn.GroupNorm(group_count(channels), channels, module.eps, module.affine))


def to_frozen(module: nn.Module) -> nn.Module | None:
    """BatchNorm -> FrozenBatchNorm2d (FrozenBatchNorm for other ranks) with its running statistics and affine
    weights (identity where the layer has none); None for any other module."""
    if not isinstance(module, BATCH_NORMS):
        return None
    kind = FrozenBatchNorm2d if isinstance(module, (nn.BatchNorm2d, nn.SyncBatchNorm)) else FrozenBatchNorm
    frozen = copy_affine(module, kind(module.num_features, module.eps))
    if module.running_mean is not None:
        frozen.running_mean.copy_(module.running_mean)
        frozen.running_var.copy_(module.running_var)
    return frozen


def to_masked(module: nn.Module, context: NormContext) -> nn.Module | None:
    """BatchNorm (group_count groups), GroupNorm (its groups) or InstanceNorm (one group per channel) -> MaskedNorm
    with the same affine weights; None for any other module, and for srforge's GroupNorm2d, masked already."""
    if isinstance(module, BATCH_NORMS):
        groups, channels, affine = group_count(module.num_features), module.num_features, module.affine
    elif isinstance(module, nn.GroupNorm) and not isinstance(module, (GroupNorm2d, MaskedNorm)):
        groups, channels, affine = module.num_groups, module.num_channels, module.affine
    elif isinstance(module, (nn.InstanceNorm1d, nn.InstanceNorm2d, nn.InstanceNorm3d)):
        groups, channels, affine = module.num_features, module.num_features, module.affine
    else:
        return None
    return copy_affine(module, MaskedNorm(groups, channels, context, module.eps, affine))


def to_masked_pool(module: nn.Module, context: NormContext) -> nn.Module | None:
    """AdaptiveAvgPool2d to 1 x 1 -> MaskedGlobalPool; None for any other module."""
    global_pool = isinstance(module, nn.AdaptiveAvgPool2d) and module.output_size in (1, (1, 1))
    return MaskedGlobalPool(context) if global_pool and not isinstance(module, MaskedGlobalPool) else None


def spills_into_padding(module: nn.Module) -> bool:
    """Whether ``module``'s output can hold non-zero values on the padding that no norm clears before the next
    layer reads them: 2-D max and average pools, and convolutions with a bias (one without is followed by a norm,
    which is why it has none)."""
    pools = (nn.MaxPool2d, nn.AvgPool2d)
    convs = (nn.Conv2d, nn.ConvTranspose2d)
    return isinstance(module, pools) or (isinstance(module, convs) and module.bias is not None)


def make_padding_aware(model: nn.Module) -> NormContext:
    """The ``masked`` option: norms -> MaskedNorm, global average pools -> MaskedGlobalPool, ZeroPadding hooks on
    the layers that spill into the padding, and the hooks that fill the returned shared context."""
    context = NormContext()
    replace_modules(model, lambda module: to_masked(module, context) or to_masked_pool(module, context))
    for module in model.modules():
        if spills_into_padding(module):
            module.register_forward_hook(ZeroPadding(context))
    model.register_forward_pre_hook(RecordSizes(context), with_kwargs=True)
    model.register_forward_hook(ForgetSizes(context), with_kwargs=True, always_call=True)
    return context


def replace_modules(module: nn.Module, convert) -> int:
    """Replace, depth first, every submodule for which ``convert(child)`` returns a module; their count."""
    count = 0
    for name, child in list(module.named_children()):
        new = convert(child)
        if new is None:
            count += replace_modules(child, convert)
        else:
            new = keep_activation(child, new)
            held = next(itertools.chain(child.parameters(), child.buffers()), None)
            setattr(module, name, new if held is None else new.to(held.device))
            count += 1
    return count


def apply_norm(model: nn.Module, option: str) -> nn.Module:
    """``model`` with its normalisation layers converted as ``option`` says (NORM_OPTIONS; see the module's
    docstring), in place; returns the same module, so its attributes and the names of its parameters stay.

    ``masked`` also sets ``model.norm_context`` (the NormContext), registers the hooks that fill it from
    ``model(image [B, C, Hp, Wp], sizes [B, 2] | None)`` and, when the forward takes ``sizes``, sets
    ``model.padding_aware = True`` (srforge.models.contract); applying it twice converts nothing more.
    """
    if option not in NORM_OPTIONS:
        raise ValueError(f"model.norm must be one of {list(NORM_OPTIONS)}, got {option!r}")
    if option == "group":
        replace_modules(model, to_group)
    elif option == "frozen":
        replace_modules(model, to_frozen)
    elif option == "masked" and not hasattr(model, "norm_context"):
        model.norm_context = make_padding_aware(model)
        if takes_sizes(model):  # its logits now depend on sizes: an ONNX export must take them too
            model.padding_aware = True
    return model
