"""Weights files into a model or its encoder (srforge.models.weights, model.weights): round trips, other shapes and
kinds of files, a fresh run loading them; files that would load wrong without a word refused with exit status 2.
"""

import sys

import pytest
import torch
from helpers import scan_folder
from test_model_create import TinyNet, _config, _yaml

from srforge.cli import main_train
from srforge.config import resolve
from srforge.models import UNet
from srforge.models.create import create_model
from srforge.models.weights import WeightsFile, load_weights
from srforge.train.from_config import build_model


def test_a_weights_file_round_trips_into_the_model_or_its_encoder(tmp_path):
    torch.manual_seed(1)
    source = TinyNet()
    torch.save(source.state_dict(), tmp_path / "all.pt")
    lines = []
    model = create_model(
        "t:TinyNet", {}, weights=WeightsFile(str(tmp_path / "all.pt")), resolve=lambda p: TinyNet, report=lines.append
    )
    assert all(torch.equal(model.state_dict()[k], v) for k, v in source.state_dict().items())
    assert lines == [f"loaded {tmp_path / 'all.pt'} into model: 8 tensors, 0 missing, 0 unexpected"]
    # a backbone's file, with a classifier the encoder does not have
    torch.save({**source.encoder.state_dict(), "fc.weight": torch.zeros(10, 8)}, tmp_path / "backbone.pth")
    target = TinyNet()
    with pytest.raises(ValueError, match=r"does not fit the encoder .*1 unexpected: \['fc.weight'\].*weights_strict"):
        load_weights(target, WeightsFile(str(tmp_path / "backbone.pth"), into="encoder"))
    line = load_weights(target, WeightsFile(str(tmp_path / "backbone.pth"), into="encoder", strict=False))
    assert line == f"loaded {tmp_path / 'backbone.pth'} into encoder: 6 tensors, 0 missing, 1 unexpected: ['fc.weight']"
    assert all(torch.equal(target.encoder.state_dict()[k], v) for k, v in source.encoder.state_dict().items())
    assert not torch.equal(target.head.weight, source.head.weight)
    # a file without the head, into the whole model: the head is missing
    torch.save({k: v for k, v in source.state_dict().items() if k.startswith("encoder.")}, tmp_path / "no_head.pt")
    with pytest.raises(ValueError, match=r"2 missing: \['head.weight', 'head.bias'\], 0 unexpected\. Load only"):
        load_weights(TinyNet(), WeightsFile(str(tmp_path / "no_head.pt")))


def test_weights_of_another_shape_and_other_kinds_of_files(tmp_path):
    torch.manual_seed(2)
    three = TinyNet(num_classes=3)
    torch.save({"state_dict": three.state_dict(), "epoch": 7}, tmp_path / "lightning.pt")  # found under state_dict
    with pytest.raises(ValueError, match=r"2 of another shape: \['head.weight: \[8, 3, 4, 4\] in the file, \[8, 2"):
        load_weights(TinyNet(), WeightsFile(str(tmp_path / "lightning.pt")))
    two = TinyNet()
    line = load_weights(two, WeightsFile(str(tmp_path / "lightning.pt"), strict=False))
    assert "6 tensors, 0 missing, 0 unexpected, 2 of another shape" in line
    assert torch.equal(two.encoder[0].weight, three.encoder[0].weight)
    from safetensors.torch import save_file

    save_file(three.state_dict(), str(tmp_path / "w.safetensors"))
    again = TinyNet(num_classes=3)
    load_weights(again, WeightsFile(str(tmp_path / "w.safetensors")))
    assert torch.equal(again.head.weight, three.head.weight)
    with pytest.raises(ValueError, match=r"model.weights_into: encoder, but srforge.models.unet.UNet has no attr"):
        load_weights(UNet(base_channels=4, depth=2), WeightsFile(str(tmp_path / "w.safetensors"), into="encoder"))
    with pytest.raises(ValueError, match=r"nope.pt does not exist"):
        load_weights(two, WeightsFile(str(tmp_path / "nope.pt")))
    with pytest.raises(ValueError, match=r"expected a .pt, .pth, .safetensors state-dict file, found '.bin'"):
        load_weights(two, WeightsFile(str(tmp_path / "w.bin")))


def test_a_missing_safetensors_package_is_named(tmp_path, monkeypatch):
    from safetensors.torch import save_file

    save_file(TinyNet().state_dict(), str(tmp_path / "w.safetensors"))
    monkeypatch.setitem(sys.modules, "safetensors.torch", None)
    with pytest.raises(ImportError, match="needs the safetensors package.*pip install safetensors"):
        load_weights(TinyNet(), WeightsFile(str(tmp_path / "w.safetensors")))


def test_training_loads_model_weights_at_a_fresh_start(tmp_path, capsys):
    torch.manual_seed(3)
    source = TinyNet(width=6)
    torch.save({**source.encoder.state_dict(), "fc.bias": torch.zeros(3)}, tmp_path / "enc.pt")
    cfg = resolve(
        _config(
            tmp_path / "run", tmp_path, weights=str(tmp_path / "enc.pt"), weights_into="encoder", weights_strict=False
        )
    )
    model, _ = build_model(cfg.model, torch.device("cpu"), channels_last=False)
    assert capsys.readouterr().out == (
        f"srforge: loaded {tmp_path / 'enc.pt'} into encoder: 6 tensors, 0 missing, 1 unexpected: ['fc.bias']\n"
    )
    assert torch.equal(model.encoder[0].weight, source.encoder[0].weight)
    untouched, _ = build_model(cfg.model, torch.device("cpu"), channels_last=False, load_weights=False)
    assert capsys.readouterr().out == "" and not torch.equal(untouched.encoder[0].weight, source.encoder[0].weight)


@pytest.mark.parametrize("content", [b"", b"\x00" * 7, "torch"], ids=["empty", "truncated", "a torch file"])
def test_a_bad_safetensors_file_is_exit_2_naming_it(tmp_path, capsys, content):
    root = scan_folder(tmp_path / "data", n=4)
    weights = tmp_path / "w.safetensors"
    if content == "torch":
        torch.save(TinyNet().state_dict(), weights)
    else:
        weights.write_bytes(content)
    cfg = _config(tmp_path / "run", root, weights=str(weights))
    assert main_train(["--config", _yaml(tmp_path, cfg)]) == 2
    err = capsys.readouterr().err
    assert f"model.weights: {weights} is not a readable .safetensors file" in err and "Traceback" not in err


@pytest.mark.parametrize(
    "state, named",
    [
        ({f"backbone.{k}": v for k, v in TinyNet(width=6).state_dict().items()}, "none of its tensors fits the model"),
        ({k: v.long() for k, v in TinyNet(width=6).state_dict().items()}, "is torch.int64 in the file and torch."),
        ({k: v * float("nan") for k, v in TinyNet(width=6).state_dict().items()}, "holds NaN or infinite values"),
    ],
    ids=["prefixed names", "int64", "NaN"],
)
def test_weights_that_would_load_wrong_without_a_word_are_refused(tmp_path, capsys, state, named):
    root = scan_folder(tmp_path / "data", n=4)
    weights = tmp_path / "w.pt"
    torch.save(state, weights)
    cfg = _config(tmp_path / "run", root, weights=str(weights), weights_strict=False)
    assert main_train(["--config", _yaml(tmp_path, cfg)]) == 2
    err = capsys.readouterr().err
    assert named in err and "Traceback" not in err
    (tmp_path / "dir.pt").mkdir()
    cfg = _config(tmp_path / "run", root, weights=str(tmp_path / "dir.pt"))
    assert main_train(["--config", _yaml(tmp_path, cfg)]) == 2
    assert "dir.pt is a folder, not a state-dict file" in capsys.readouterr().err
