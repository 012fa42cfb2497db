"""Adapters for other libraries' models (smp, torchvision) and the norm options for padded batches.

Random init, tiny images, no network: every download is either refused by the adapters' own check with the network
blocked, or replaced by a function that fails as a download would.
"""

import copy
import importlib.util
import socket
import sys
import time
import warnings

import pytest
import torch
from helpers import scan_folder
from test_model_create import _config, _yaml
from torch import nn
from torchvision.ops import FrozenBatchNorm2d

from srforge.cli import main_train
from srforge.geometry import round_up
from srforge.models.library_adapter import IMAGENET_MEAN, WeightsUnavailableError
from srforge.models.norms import NORM_OPTIONS, FrozenBatchNorm, MaskedNorm, NormAct, apply_norm
from srforge.models.smp import SmpModel
from srforge.models.tv_segmentation import TorchvisionModel

warnings.filterwarnings("ignore", message=".*deprecated.*")
needs_smp = pytest.mark.skipif(
    importlib.util.find_spec("segmentation_models_pytorch") is None, reason='needs pip install -e ".[smp]"'
)

BATCH_NORMS = nn.modules.batchnorm._BatchNorm


def count(model: nn.Module, kind) -> int:
    return sum(isinstance(m, kind) for m in model.modules())


def smp_unet(seed: int = 0, **kwargs) -> SmpModel:
    torch.manual_seed(seed)
    return SmpModel(in_channels=3, num_classes=2, arch="Unet", encoder="resnet18", **kwargs)


def pad(scans: list[torch.Tensor], divisor: int) -> tuple[torch.Tensor, torch.Tensor]:
    """[C, H, W] scans -> zeros bottom-right to the per-batch maximum of each side rounded up to the divisor, as
    AlignedCollate pads them: ([B, C, Hp, Wp], sizes [B, 2])."""
    height = max(round_up(s.shape[1], divisor) for s in scans)
    width = max(round_up(s.shape[2], divisor) for s in scans)
    out = torch.zeros(len(scans), scans[0].shape[0], height, width, dtype=scans[0].dtype)
    for i, s in enumerate(scans):
        out[i, :, : s.shape[1], : s.shape[2]] = s
    return out, torch.tensor([list(s.shape[1:]) for s in scans])


@torch.no_grad()
def invariance(model: nn.Module, small=(64, 96), big=(128, 256)) -> float:
    """Max |logit difference| on the small scan's true extent, alone vs batched with the big one (eval mode)."""
    model.eval()
    gen = torch.Generator().manual_seed(0)
    a = torch.randint(0, 256, (3, *small), generator=gen, dtype=torch.uint8)
    b = torch.randint(0, 256, (3, *big), generator=gen, dtype=torch.uint8)
    alone = model(*pad([a], model.size_divisor))[0, :, : small[0], : small[1]]
    batched = model(*pad([a, b], model.size_divisor))[0, :, : small[0], : small[1]]
    return float((alone - batched).abs().max())


@pytest.fixture
def offline(monkeypatch, tmp_path):
    """The network blocked (every connection and name lookup fails at once) and empty weight caches."""

    def refuse(*args, **kwargs):
        raise OSError("network blocked by the test")

    monkeypatch.setattr(socket, "getaddrinfo", refuse)
    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "torch"))
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hf"))


# -- SmpModel ----------------------------------------------------------------------------------------------------


@needs_smp
def test_smp_model_meets_the_contract():
    model = smp_unet().eval()
    assert (model.size_divisor, model.in_channels, model.num_classes) == (32, 3, 2)
    image = torch.randint(0, 256, (2, 3, 64, 96), dtype=torch.uint8)
    with torch.no_grad():
        logits = model(image, torch.tensor([[64, 96], [50, 70]]))
        assert logits.shape == (2, 2, 64, 96) and logits.dtype == torch.float32
        # uint8 is normalised inside: x / 255, then the encoder's mean/std (buffers, so the checkpoint holds them)
        assert torch.allclose(model(image), model(image.float() / 255), atol=1e-5)
    assert {"mean", "std"} <= set(model.state_dict())
    assert torch.allclose(model.mean.flatten(), torch.tensor(IMAGENET_MEAN))
    with pytest.raises(ValueError, match="size_divisor=32"):
        model(torch.zeros(1, 3, 64, 80, dtype=torch.uint8))
    with pytest.raises(TypeError, match="uint8 or float"):
        model(torch.zeros(1, 3, 64, 64, dtype=torch.int32))
    assert model.encoder is model.net.encoder  # where model.weights_into=encoder loads


@needs_smp
def test_smp_model_passes_srforges_own_contract_check():
    from srforge.models.create import create_model

    model = create_model("srforge.models.smp:SmpModel", {"in_channels": 3, "num_classes": 2}, norm="masked")
    assert model.size_divisor == 32 and count(model, BATCH_NORMS) == 0 and model.padding_aware


@needs_smp
@pytest.mark.parametrize(
    "arch, kwargs, divisor",
    [
        ("Unet", {"encoder_depth": 3, "decoder_channels": (32, 16, 8)}, 8),  # 2 ** encoder_depth
        ("DeepLabV3Plus", {}, 16),  # a dilated encoder: output stride 16
        ("PAN", {}, 128),  # output stride 16, and its pyramid attention halves 3 times more
    ],
)
def test_smp_size_divisor_follows_the_encoder_and_the_decoder(arch, kwargs, divisor):
    model = SmpModel(arch=arch, **kwargs).eval()
    assert model.size_divisor == divisor
    with torch.no_grad():
        assert model(torch.zeros(1, 3, divisor, 2 * divisor)).shape == (1, 2, divisor, 2 * divisor)


@needs_smp
def test_smp_size_divisor_may_be_raised_to_a_multiple_only():
    assert smp_unet(size_divisor=64).size_divisor == 64
    with pytest.raises(ValueError, match="multiple of 32"):
        smp_unet(size_divisor=48)


@needs_smp
def test_smp_timm_encoder_and_other_channel_counts():
    model = SmpModel(in_channels=1, num_classes=3, encoder="tu-resnet18", encoder_depth=3, decoder_channels=(32, 16, 8))
    assert (model.size_divisor, model.in_channels, model.num_classes) == (8, 1, 3)
    assert model.mean.shape == (1, 1, 1, 1)  # the RGB triple averaged, as smp sums a pretrained first conv
    assert model.mean.item() == pytest.approx(sum(IMAGENET_MEAN) / 3)
    with torch.no_grad():
        assert model(torch.zeros(2, 1, 16, 24, dtype=torch.uint8)).shape == (2, 3, 16, 24)


@needs_smp
def test_smp_refuses_arguments_that_change_the_output():
    with pytest.raises(ValueError, match="activation"):
        SmpModel(activation="sigmoid")


def test_missing_smp_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "segmentation_models_pytorch", None)  # import fails as if not installed
    with pytest.raises(ImportError, match=r'pip install -e "\.\[smp\]"'):
        SmpModel()


# -- pretrained weights, offline ------------------------------------------------------------------------------------


@needs_smp
@pytest.mark.parametrize("encoder, weights", [("resnet18", "imagenet"), ("tu-resnet18", "imagenet")])
def test_offline_pretrained_weights_fail_at_once_saying_what_to_do(offline, encoder, weights):
    start = time.perf_counter()
    with pytest.raises(WeightsUnavailableError) as caught:
        SmpModel(encoder=encoder, encoder_weights=weights)
    assert time.perf_counter() - start < 5  # huggingface_hub alone retries for ~23 s before it gives up
    text = str(caught.value)
    assert f"pretrained weights for {encoder} ({weights}) cannot be downloaded here" in text
    assert "model.weights_into=encoder" in text and "encoder_weights=null" in text


@needs_smp
def test_a_download_that_fails_during_the_build_is_one_clear_error(monkeypatch):
    import segmentation_models_pytorch.encoders as smp_encoders
    from huggingface_hub.errors import LocalEntryNotFoundError

    import srforge.models.library_adapter as adapter

    def fail(*args, **kwargs):
        raise LocalEntryNotFoundError("An error happened while trying to locate the file on the Hub")

    monkeypatch.setattr(adapter, "reachable", lambda url, timeout=3.0: True)
    monkeypatch.setattr(smp_encoders, "hf_hub_download", fail)
    with pytest.raises(WeightsUnavailableError, match="encoder_weights=null"):
        SmpModel(encoder="resnet18", encoder_weights="imagenet")


def test_offline_torchvision_backbone_weights_fail_at_once(offline):
    start = time.perf_counter()
    with pytest.raises(WeightsUnavailableError, match="weights_backbone=null"):
        TorchvisionModel(name="lraspp_mobilenet_v3_large", weights_backbone="DEFAULT")
    assert time.perf_counter() - start < 5


# -- TorchvisionModel ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name, divisor",
    [
        ("fcn_resnet50", 8),
        ("deeplabv3_resnet50", 8),
        ("deeplabv3_mobilenet_v3_large", 16),
        ("lraspp_mobilenet_v3_large", 16),
    ],
)
def test_torchvision_models_meet_the_contract(name, divisor):
    torch.manual_seed(0)
    model = TorchvisionModel(in_channels=1, num_classes=3, name=name).eval()
    assert (model.size_divisor, model.in_channels, model.num_classes) == (divisor, 1, 3)
    image = torch.randint(0, 256, (2, 1, 2 * divisor, 3 * divisor), dtype=torch.uint8)
    with torch.no_grad():
        logits = model(image, torch.tensor([[2 * divisor, 3 * divisor], [divisor, divisor]]))
        assert logits.shape == (2, 3, 2 * divisor, 3 * divisor)
        assert torch.allclose(model(image), model(image.float() / 255), atol=1e-4)
    with pytest.raises(ValueError, match=f"size_divisor={divisor}"):
        model(torch.zeros(1, 1, divisor + 1, divisor, dtype=torch.uint8))


def test_torchvision_refuses_unknown_names():
    with pytest.raises(ValueError, match="deeplabv3_resnet50"):
        TorchvisionModel(name="maskrcnn_resnet50_fpn")


# -- apply_norm --------------------------------------------------------------------------------------------------


@needs_smp
@pytest.mark.parametrize(
    "option, kind", [("group", nn.GroupNorm), ("frozen", FrozenBatchNorm2d), ("masked", MaskedNorm)]
)
def test_apply_norm_converts_every_batchnorm(option, kind):
    model = smp_unet()
    assert count(model, BATCH_NORMS) == 30
    bn = model.net.encoder.layer1[0].bn1
    with torch.no_grad():  # distinct values, to see them copied
        bn.weight.uniform_(0.5, 2), bn.bias.uniform_(-1, 1), bn.running_mean.uniform_(-1, 1)
        bn.running_var.uniform_(0.5, 2)
    expected = {name: t.clone() for name, t in bn.state_dict().items()}
    same = apply_norm(model, option)
    assert same is model and (model.size_divisor, model.in_channels, model.num_classes) == (32, 3, 2)
    assert count(model, BATCH_NORMS) == 0 and count(model, kind) == 30
    converted = model.net.encoder.layer1[0].bn1
    assert isinstance(converted, kind)
    for name in ("weight", "bias") + (("running_mean", "running_var") if option == "frozen" else ()):
        assert torch.equal(getattr(converted, name), expected[name]), name
    with torch.no_grad():
        assert model(torch.zeros(1, 3, 64, 64), torch.tensor([[40, 50]])).shape == (1, 2, 64, 64)


@needs_smp
def test_apply_norm_keep_and_unknown_options():
    model = smp_unet()
    assert apply_norm(model, "keep") is model and count(model, BATCH_NORMS) == 30
    with pytest.raises(ValueError, match="keep"):
        apply_norm(model, "batch")
    assert set(NORM_OPTIONS) == {"keep", "group", "frozen", "masked"}


def test_frozen_handles_batchnorm1d_and_matches_eval_batchnorm():
    model = nn.Sequential(nn.Linear(4, 6), nn.BatchNorm1d(6), nn.Conv2d(1, 5, 1), nn.BatchNorm2d(5))
    with torch.no_grad():
        for bn in (model[1], model[3]):
            bn.running_mean.uniform_(-1, 1), bn.running_var.uniform_(0.5, 2), bn.weight.uniform_(0.5, 2)
    x, y = torch.randn(3, 6), torch.randn(2, 5, 4, 4)
    want = model[1].eval()(x), model[3].eval()(y)
    apply_norm(model, "frozen")
    assert isinstance(model[1], FrozenBatchNorm) and isinstance(model[3], FrozenBatchNorm2d)
    assert torch.allclose(model[1](x), want[0], atol=1e-6) and torch.allclose(model[3](y), want[1], atol=1e-6)


@pytest.mark.slow
@needs_smp
def test_masked_norm_is_batch_invariant_where_the_others_are_not():
    """The bound: float32 rounding only. The padded and the unpadded forward run the same arithmetic on the scan's
    pixels, but the convolutions' algorithms sum in other orders for other tensor sizes; ~1e-7 relative per layer
    over ~25 layers, on logits of magnitude ~3.5, gives a few 1e-6 (measured 4.6e-6 to 6.1e-6). 1e-4 leaves a
    margin of ~20x, and lies 4 orders below what the other options leak (0.8 to 6)."""
    errors = {option: invariance(apply_norm(smp_unet(), option)) for option in NORM_OPTIONS}
    partial = invariance(apply_norm(smp_unet(), "masked"), small=(50, 90))  # 50 x 90: partial blocks at every stride
    errors["masked"] = max(errors["masked"], partial)
    assert errors["masked"] < 1e-4, errors
    assert min(errors["keep"], errors["group"], errors["frozen"]) > 1e-2, errors


@needs_smp
def test_masked_without_sizes_is_plain_group_norm_and_trains():
    group, masked = apply_norm(smp_unet(), "group"), apply_norm(smp_unet(), "masked")
    image = torch.randint(0, 256, (2, 3, 64, 64), dtype=torch.uint8)
    with torch.no_grad():
        assert torch.equal(group(image), masked(image))
    masked.train()
    logits = masked(image, torch.tensor([[64, 64], [33, 47]]))
    logits.logsumexp(1).mean().backward()
    grads = [p.grad for p in masked.parameters()]
    assert all(g is not None and torch.isfinite(g).all() for g in grads)
    assert masked.norm_context.sizes is None  # cleared after the forward


@needs_smp
def test_masked_survives_a_deep_copy():
    model = apply_norm(smp_unet(), "masked")
    twin = copy.deepcopy(model)
    assert twin.norm_context is not model.norm_context
    assert all(m.context is twin.norm_context for m in twin.modules() if isinstance(m, MaskedNorm))
    assert invariance(twin) < 1e-4


@needs_smp
def test_fused_norm_activation_layers_keep_their_activation():
    """timm's BatchNormAct2d holds its activation inside: converting it must not drop the activation."""
    torch.manual_seed(0)
    model = SmpModel(encoder="tu-mobilenetv3_small_100", encoder_depth=3, decoder_channels=(32, 16, 8)).eval()
    fused = sum(type(m).__name__ == "BatchNormAct2d" for m in model.modules())
    image = torch.randint(0, 256, (1, 3, 32, 48), dtype=torch.uint8)
    with torch.no_grad():
        want = model(image)
        apply_norm(model, "frozen")
        assert torch.allclose(model(image), want, atol=1e-5)  # eval BatchNorm == frozen BatchNorm, activation kept
    assert fused > 0 and count(model, BATCH_NORMS) == 0 and count(model, NormAct) == fused


def test_masked_torchvision_model_leaks_only_at_the_far_edge():
    """DeepLabV3 on MobileNetV3: ASPP's image pooling and the squeeze-excitation pools become masked means; only
    the final bilinear upsampling still sees the padding, in the last s/2 pixels of the bottom and right edges."""
    torch.manual_seed(0)
    model = apply_norm(TorchvisionModel(name="deeplabv3_mobilenet_v3_large"), "masked").eval()
    s, (h, w) = model.size_divisor, (64, 96)
    gen = torch.Generator().manual_seed(0)
    a = torch.randint(0, 256, (3, h, w), generator=gen, dtype=torch.uint8)
    b = torch.randint(0, 256, (3, 128, 256), generator=gen, dtype=torch.uint8)
    with torch.no_grad():
        alone = model(*pad([a], s))[0, :, :h, :w]
        batched = model(*pad([a, b], s))[0, :, :h, :w]
    inside = (alone - batched)[:, : h - s // 2, : w - s // 2].abs().max()
    assert inside < 1e-4, inside


class TinyBatchNormModel(nn.Module):
    """conv -> BatchNorm -> ReLU -> stride-2 max-pool -> conv head, upsampled: the layers apply_norm touches."""

    size_divisor, in_channels, num_classes = 2, 3, 2

    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1, bias=False), nn.BatchNorm2d(8), nn.ReLU())
        self.pool, self.head = nn.MaxPool2d(3, 2, 1), nn.Conv2d(8, 2, 3, padding=1)

    def forward(self, image: torch.Tensor, sizes: torch.Tensor | None = None) -> torch.Tensor:
        logits = self.head(self.pool(self.body(image.float() / 255)))
        return nn.functional.interpolate(logits, scale_factor=2.0, mode="nearest")


@pytest.mark.slow
def test_masked_model_exports_to_onnx(tmp_path):
    pytest.importorskip("onnxscript")
    pytest.importorskip("onnxruntime")
    from srforge.export.onnx import check_onnx, export_onnx

    torch.manual_seed(0)
    model = apply_norm(TinyBatchNormModel(), "masked").eval()
    assert model.padding_aware  # its forward takes sizes: the graph takes them too
    path = export_onnx(model, tmp_path / "tiny.onnx")
    assert check_onnx(model, path) < 1e-4


@needs_smp
@pytest.mark.parametrize(
    "args, named",
    [
        ({"arch": "UNetXX"}, "arch 'UNetXX' is not an smp architecture (closest: Unet"),
        ({"encoder": "resnet999"}, "encoder 'resnet999' is not an smp encoder (closest: resnet"),
        ({"encoder": "tu-notamodel"}, "encoder 'tu-notamodel': timm has no model 'notamodel'"),
    ],
)
def test_unknown_smp_names_are_exit_2_naming_the_closest(tmp_path, capsys, args, named):
    root = scan_folder(tmp_path / "data", n=4)
    cfg = _config(tmp_path / "run", root, **{"class": "srforge.models.smp:SmpModel", "args": args})
    assert main_train(["--config", _yaml(tmp_path, cfg)]) == 2
    err = capsys.readouterr().err
    assert named in err and "Traceback" not in err


@needs_smp
def test_pretrained_encoder_weights_offline_are_exit_2_saying_what_to_do(tmp_path, capsys, monkeypatch):
    from srforge.models import library_adapter as adapter

    monkeypatch.setattr(adapter, "reachable", lambda url, timeout=3.0: False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    root = scan_folder(tmp_path / "data", n=4)
    args = {"encoder": "resnet18", "encoder_weights": "imagenet", "encoder_depth": 3, "decoder_channels": [8, 8, 8]}
    cfg = _config(tmp_path / "run", root, **{"class": "srforge.models.smp:SmpModel", "args": args})
    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "torch-home"))
    assert main_train(["--config", _yaml(tmp_path, cfg)]) == 2
    err = capsys.readouterr().err
    assert "resnet18 (imagenet)" in err and "model.weights" in err and "Traceback" not in err
