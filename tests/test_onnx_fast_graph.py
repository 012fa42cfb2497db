"""srforge.export.fast_graph: the padding-aware GroupNorm in fewer passes for ONNX Runtime gives masked_group_norm's
values, a decoder block without its concatenation gives UpBlock's, and export_copy swaps both into a copy of the
model only."""

import pytest
import torch
from torch import nn

from srforge import UNet
from srforge.export.fast_graph import (
    RectangleGroupNorm,
    SplitUpBlock,
    clears_far_below_zero,
    export_copy,
    rectangle_group_norm,
)
from srforge.geometry import level_mask
from srforge.models.group_norm import GroupNorm2d, masked_group_norm
from srforge.models.norms import MaskedNorm, NormContext

SIZES = torch.tensor([[24, 40], [13, 7], [1, 1], [24, 1]])


@pytest.mark.parametrize("offset, scale", [(0.0, 1.0), (5.0, 3.0), (-40.0, 0.5)])
@pytest.mark.parametrize("affine", [True, False])
def test_rectangle_group_norm_gives_masked_group_norms_values(offset, scale, affine):
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(4, 12, 24, 40, generator=generator) * scale + offset
    mask = level_mask(SIZES, 24, 40)
    weight, bias = (torch.randn(12, generator=generator) for _ in range(2)) if affine else (None, None)
    got = rectangle_group_norm(x, mask, 3, weight, bias, 1e-5)
    want = masked_group_norm(x, mask, 3, weight, bias, 1e-5)
    affine64 = [None if t is None else t.double() for t in (weight, bias)]
    truth = masked_group_norm(x.double(), mask.double(), 3, *affine64)
    assert (got - want).abs().max() <= 1e-5 * max(1.0, abs(offset) / scale)
    assert (got.double() - truth).abs().max() <= 2 * (want.double() - truth).abs().max() + 1e-6
    assert not got[mask.expand_as(got) == 0].any()  # zero on the padding


def test_a_scan_without_valid_pixels_gives_zeros():
    x = torch.randn(2, 4, 8, 8)
    mask = level_mask(torch.tensor([[8, 8], [3, 5]]), 8, 8)
    mask[1] = 0
    out = rectangle_group_norm(x, mask, 2, torch.ones(4), torch.ones(4), 1e-5)
    assert torch.isfinite(out).all() and not out[1].any()


def test_export_copy_swaps_a_unets_norms_and_up_blocks_in_a_copy_with_the_same_logits():
    torch.manual_seed(0)
    model = UNet(num_classes=3, base_channels=4, depth=2).eval()
    twin, replaced = export_copy(model)
    norms = [m for m in model.modules() if isinstance(m, GroupNorm2d)]
    assert len(norms) == 2 * (1 + 2 * 2) and replaced == len(norms) + 2  # stem, 2 down, 2 up blocks; 2 convs each
    assert twin is not model and all(isinstance(m, GroupNorm2d) for m in norms)  # the model is untouched
    assert sum(isinstance(m, RectangleGroupNorm) for m in twin.modules()) == len(norms)
    assert all(isinstance(block, SplitUpBlock) for block in twin.up)
    assert not any(isinstance(m, SplitUpBlock) for m in model.modules())
    image = torch.randint(0, 256, (3, 3, 24, 40), dtype=torch.uint8, generator=torch.Generator().manual_seed(1))
    sizes = torch.tensor([[24, 40], [17, 9], [5, 33]])
    with torch.no_grad():
        want, got = model(image, sizes), twin(image, sizes)
        plain_want, plain_got = model(image), twin(image)
    for i, (h, w) in enumerate(sizes.tolist()):
        assert (got[i, :, :h, :w] - want[i, :, :h, :w]).abs().max() <= 1e-4
    assert (plain_got - plain_want).abs().max() <= 1e-5  # without sizes: plain GroupNorm in both


def test_a_masked_norm_keeps_its_context_and_other_models_are_exported_as_they_are():
    context = NormContext()
    norm = MaskedNorm(2, 8, context).eval()
    with torch.no_grad():
        norm.weight.normal_(), norm.bias.normal_()
    holder = nn.Sequential(norm)
    twin, replaced = export_copy(holder)
    assert replaced == 1 and isinstance(twin[0], RectangleGroupNorm) and isinstance(holder[0], MaskedNorm)
    x = torch.randn(2, 8, 16, 16) + 3
    for ctx in (context, twin[0].context):
        ctx.start(torch.zeros(2, 3, 32, 32), torch.tensor([[32, 20], [9, 32]]))  # masks at half resolution
    assert (twin[0](x) - norm(x)).abs().max() <= 1e-5
    plain = nn.Sequential(nn.Conv2d(3, 8, 3), GroupNorm2d(8))  # no UNet: its mask could be any shape
    assert export_copy(plain) == (plain, 0)


@pytest.mark.parametrize("offset, scale", [(0.0, 1.0), (40.0, 0.5)])
def test_below_zero_leaves_the_valid_values_and_a_relu_clears_the_padding(offset, scale):
    generator = torch.Generator().manual_seed(2)
    x = torch.randn(4, 12, 24, 40, generator=generator) * scale + offset
    mask = level_mask(SIZES, 24, 40)
    weight = torch.randn(12, generator=generator)  # both signs: the push follows each weight's sign
    bias = torch.randn(12, generator=generator) + 2.0  # mostly positive: a bias left on the padding would show
    plain = rectangle_group_norm(x, mask, 3, weight, bias, 1e-5)
    pushed = rectangle_group_norm(x, mask, 3, weight, bias, 1e-5, below_zero=True)
    valid = mask.expand_as(x) == 1
    assert torch.equal(pushed[valid], plain[valid])  # the same arithmetic on valid pixels, bit for bit
    rows = mask[:, :, :, :1].expand_as(x) == 0
    assert not pushed[rows].any()  # padded rows: 0 from the per-row affine
    assert (pushed[~valid & ~rows] < -1e6).all()  # padded columns: far below zero
    assert torch.equal(torch.relu(pushed), torch.relu(plain))


def test_below_zero_needs_a_clearing_activation_and_non_zero_weights():
    assert clears_far_below_zero(torch.nn.ReLU()) and clears_far_below_zero(torch.nn.ReLU6())
    # SiLU and GELU are 0 far below zero in PyTorch, but ONNX Runtime computes them its own way: not trusted
    for other in (torch.nn.LeakyReLU(), torch.nn.Tanh(), torch.nn.SiLU(), torch.nn.GELU()):
        assert not clears_far_below_zero(other)
    norm = GroupNorm2d(8)
    assert RectangleGroupNorm(norm, below_zero=True).below_zero
    with torch.no_grad():
        norm.bias[2] = 1e7 * norm.weight[2]  # a shift the push may not dominate
    assert not RectangleGroupNorm(norm, below_zero=True).below_zero
    with torch.no_grad():
        norm.bias[2] = 0.0
        norm.weight[3] = 0.0  # that channel's output is its bias everywhere: only the mask can clear the padding
    assert not RectangleGroupNorm(norm, below_zero=True).below_zero


@pytest.mark.parametrize("activation, pushed", [(torch.nn.ReLU, True), (torch.nn.LeakyReLU, False)])
def test_export_copy_pushes_the_padding_only_before_an_activation_that_clears_it(activation, pushed):
    torch.manual_seed(0)
    model = UNet(num_classes=3, base_channels=4, depth=2, activation=activation).eval()
    twin, _ = export_copy(model)
    norms = [m for m in twin.modules() if isinstance(m, RectangleGroupNorm)]
    assert norms and all(m.below_zero == pushed for m in norms)
    image = torch.randint(0, 256, (3, 3, 24, 40), dtype=torch.uint8, generator=torch.Generator().manual_seed(1))
    sizes = torch.tensor([[24, 40], [17, 9], [5, 33]])
    with torch.no_grad():
        want, got = model(image, sizes), twin(image, sizes)
    for i, (h, w) in enumerate(sizes.tolist()):
        assert (got[i, :, :h, :w] - want[i, :, :h, :w]).abs().max() <= 1e-4
