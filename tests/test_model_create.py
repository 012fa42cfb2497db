"""Any nn.Module by one line of YAML (srforge.models.create): train, resume exactly, predict and export from the
checkpoint alone; the trust rule for model classes a checkpoint names; what is refused before it is built or
called; srforge's UNet unchanged.

The models are defined here, so their import paths are ``test_model_create:Name`` (pytest puts the tests folder on
sys.path); the contract and weights tests (test_model_contract.py, test_model_weights.py) use them too. Images are
tens of pixels, weights random, nothing is downloaded.
"""

import shutil
import sys
from pathlib import Path

import pytest
import torch
import yaml
from helpers import odd_scans, rgb, scan_folder
from PIL import Image
from torch import nn

from srforge.cli import main_export, main_predict, main_train
from srforge.config import ConfigError, resolve
from srforge.models import UNet
from srforge.models.create import create_model
from srforge.predict.predictor import Predictor
from srforge.runtime.checkpoint import load_checkpoint, model_from_checkpoint, save_checkpoint
from srforge.train.from_config import build_model
from srforge.train.prepare import resume_checkpoint

CALLED: list[str] = []  # what NotAModule and friends were called with: must stay empty


class TinyNet(nn.Module):
    """A user's model on srforge's contract: the three attributes, forward(image, sizes=None), its own uint8 ->
    float step. Two stride-2 convs: size divisor 4."""

    def __init__(self, in_channels=3, num_classes=2, width=8):
        super().__init__()
        self.in_channels, self.num_classes, self.size_divisor = in_channels, num_classes, 4
        self.encoder = nn.Sequential(
            nn.Conv2d(in_channels, width, 3, padding=1),
            nn.ReLU(),
            nn.Conv2d(width, width, 3, stride=2, padding=1),
            nn.ReLU(),
            nn.Conv2d(width, width, 3, stride=2, padding=1),
            nn.ReLU(),
        )
        self.head = nn.ConvTranspose2d(width, num_classes, 4, stride=4)

    def forward(self, image, sizes=None):
        x = image.float() / 255 if image.dtype == torch.uint8 else image.float()
        return self.head(self.encoder(x))


class PlainNet(TinyNet):
    """torchvision's, timm's and smp's way: forward takes the image alone."""

    def forward(self, x):
        return super().forward(x)


class NotAModule:
    """A class that is no nn.Module: srforge must refuse it before calling it."""

    def __init__(self, **kwargs):
        CALLED.append(f"NotAModule{kwargs}")


def _config(run_dir: Path, root: Path, **model) -> dict:
    """A TinyNet run on the scans under ``root`` (srforge's own SegmentationFolder)."""
    return {
        "run": {"dir": str(run_dir), "seed": 5, "device": "cpu"},
        "data": {
            "dataset": {"class": "srforge.data.datasets:SegmentationFolder", "args": {"root": str(root)}},
            "batch_size": 3,
        },
        "model": {"class": "test_model_create:TinyNet", "args": {"width": 6}, "class_names": ["paper", "ink"], **model},
        "train": {"epochs": 3, "lr": 0.01, "warmup_steps": 2},
    }


def _config_file(folder: Path, run_dir: Path, root: Path, **model) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "config.yaml"
    path.write_text(yaml.safe_dump(_config(run_dir, root, **model)))
    return path


def _yaml(tmp_path, cfg) -> str:
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return str(path)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """A TinyNet run of 3 epochs straight, and one stopped after 1 epoch and resumed (--resume, its own config)."""
    tmp = tmp_path_factory.mktemp("any_model")
    root = scan_folder(tmp / "data")
    assert main_train(["--config", str(_config_file(tmp / "cfg_a", tmp / "straight", root))]) == 0
    stopped = _config_file(tmp / "cfg_b", tmp / "stopped", root)
    assert main_train(["--config", str(stopped), "train.stop_after=1"]) == 0
    assert load_checkpoint(tmp / "stopped" / "last.pt")["epoch"] == 1
    assert main_train(["--resume", str(tmp / "stopped"), "train.stop_after=null"]) == 0
    return tmp


# -- training, resume, prediction, export ---------------------------------------------------------------------------
def test_a_model_from_yaml_trains_and_its_checkpoint_records_how_to_rebuild_it(runs):
    ckpt = load_checkpoint(runs / "straight" / "last.pt")
    assert ckpt["model_class"] == "test_model_create:TinyNet" and ckpt["model_norm"] == "keep"
    assert ckpt["model_args"] == {"in_channels": 3, "num_classes": 2, "width": 6}
    assert ckpt["size_divisor"] == 4 and ckpt["epoch"] == 3
    assert "class: test_model_create:TinyNet" in (runs / "straight" / "config.yaml").read_text()
    model = model_from_checkpoint(ckpt, allowed=["test_model_create:TinyNet"])
    assert isinstance(model, TinyNet) and not model.training
    assert all(torch.equal(model.state_dict()[k], v) for k, v in ckpt["model"].items())


def test_a_resumed_run_of_any_model_ends_with_the_same_bits(runs):
    a = load_checkpoint(runs / "straight" / "last.pt")
    b = load_checkpoint(runs / "stopped" / "last.pt")
    assert a["epoch"] == b["epoch"] == 3 and a["step"] == b["step"]
    for key in a["model"]:
        assert torch.equal(a["model"][key], b["model"][key]), key


def test_predict_rebuilds_the_model_from_the_checkpoint_once_its_class_is_named(runs, tmp_path):
    sizes = odd_scans(tmp_path / "scans")
    out = tmp_path / "out"
    args = ["--checkpoint", str(runs / "straight" / "best.pt"), "--input", str(tmp_path / "scans")]
    allow = ["--allow-model", "test_model_create:TinyNet"]
    assert main_predict([*args, "--output", str(out), "--no-progress", "--workers", "0", *allow]) == 0
    for name, (h, w) in sizes.items():
        with Image.open(out / "masks" / f"{name}.png") as mask:
            assert mask.size == (w, h)
    # tiled (a budget below a scan's padded area) and whole give the same class maps
    named = ["test_model_create:TinyNet"]
    whole = Predictor.from_checkpoint(runs / "straight" / "best.pt", device="cpu", allow_model=named)
    tiled = Predictor.from_checkpoint(
        runs / "straight" / "best.pt", device="cpu", max_pixels=24 * 24, overlap=8, allow_model=named
    )
    image = torch.from_numpy(rgb(40, 52, 7)).permute(2, 0, 1).contiguous()
    (a,), (b,) = whole.predict([image]), tiled.predict([image])
    assert a.shape == (40, 52) and float((a == b).float().mean()) > 0.99


@pytest.mark.slow
def test_export_of_any_model_matches_onnxruntime(runs, tmp_path, capsys):
    for name in ("onnx", "onnxscript", "onnxruntime"):
        pytest.importorskip(name, reason='ONNX export needs the optional extra: pip install -e ".[export]"')
    out = tmp_path / "tiny.onnx"
    named = ["--allow-model", "test_model_create:TinyNet"]
    assert main_export(["--checkpoint", str(runs / "straight" / "best.pt"), "--output", str(out), *named]) == 0
    printed = capsys.readouterr().out
    # TinyNet has no padding_aware: the graph takes the image alone
    assert "image uint8 [B, C, H, W] -> logits [B, K, H, W], H and W multiples of 4" in printed
    assert "onnxruntime vs PyTorch" in printed and out.is_file()


def test_a_resumed_run_keeps_its_model_class_norm_and_arguments(runs):
    ckpt = load_checkpoint(runs / "straight" / "last.pt")
    same = resolve(_config(runs / "x", runs / "data"))
    assert resume_checkpoint(runs / "straight", same.model, ckpt) is ckpt
    for model, expected in [
        ({"class": "srforge.models.unet:UNet", "args": {}}, "model.class='srforge.models.unet:UNet'"),
        ({"args": {"width": 7}}, "model.args.width=7 (the checkpoint has 6)"),
        ({"num_classes": 3, "class_names": None}, "model.num_classes=3 (the checkpoint has 2)"),
        ({"args": {}}, "model.args.width=nothing (the checkpoint has 6)"),
    ]:
        cfg = _config(runs / "x", runs / "data")
        cfg["model"].update(model)
        with pytest.raises(ConfigError, match=f"asks for {expected.replace('(', '.').replace(')', '.')}"):
            resume_checkpoint(runs / "straight", resolve(cfg).model, ckpt)


# -- trust ----------------------------------------------------------------------------------------------------------
def test_a_lone_checkpoint_naming_a_class_is_refused_unless_allowed(runs, tmp_path, capsys):
    lone = tmp_path / "lone" / "best.pt"
    lone.parent.mkdir()
    shutil.copy(runs / "straight" / "best.pt", lone)
    sizes = odd_scans(tmp_path / "scans")
    args = ["--checkpoint", str(lone), "--input", str(tmp_path / "scans"), "--no-progress", "--workers", "0"]
    assert main_predict([*args, "--output", str(tmp_path / "refused")]) == 2
    err = capsys.readouterr().err
    assert "its model is test_model_create:TinyNet (model_class)" in err
    assert "pass --allow-model test_model_create:TinyNet" in err and "Traceback" not in err
    assert not (tmp_path / "refused" / "masks").exists()
    assert main_export(["--checkpoint", str(lone), "--output", str(tmp_path / "m.onnx")]) == 2
    assert "--allow-model test_model_create:TinyNet" in capsys.readouterr().err
    allowed = [*args, "--output", str(tmp_path / "allowed"), "--allow-model", "test_model_create:TinyNet"]
    assert main_predict(allowed) == 0
    assert sorted(p.stem for p in (tmp_path / "allowed" / "masks").iterdir()) == sorted(sizes)


def test_the_module_of_an_untrusted_class_is_never_imported(runs, tmp_path, capsys, monkeypatch):
    touched = tmp_path / "IMPORTED"
    (tmp_path / "evil_model.py").write_text(f"open({str(touched)!r}, 'w').close()\nNet = None\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    ckpt = torch.load(runs / "straight" / "best.pt", weights_only=True)
    ckpt["model_class"] = "evil_model:Net"
    folder = tmp_path / "run"
    folder.mkdir()
    torch.save(ckpt, folder / "best.pt")
    # a config.yaml beside it that names the class does not allow it: it came with the checkpoint
    (folder / "config.yaml").write_text(yaml.safe_dump({"model": {"class": "evil_model:Net"}}))
    monkeypatch.chdir(tmp_path)  # the working directory holds evil_model.py too
    odd_scans(tmp_path / "scans")
    args = [
        "--checkpoint",
        str(folder / "best.pt"),
        "--input",
        str(tmp_path / "scans"),
        "--output",
        str(tmp_path / "o"),
    ]
    assert main_predict([*args, "--no-progress", "--workers", "0"]) == 2
    err = capsys.readouterr().err
    assert "its model is evil_model:Net" in err and "a config.yaml beside the checkpoint does not count" in err
    with pytest.raises(ConfigError, match="allow_model=\\['evil_model:Net'\\]"):
        Predictor.from_checkpoint(folder / "best.pt", device="cpu")
    with pytest.raises(ValueError, match="evil_model:Net is not srforge's own"):
        model_from_checkpoint(ckpt)
    assert not touched.exists() and "evil_model" not in sys.modules


def test_resume_checks_the_model_class_of_the_embedded_config(runs, tmp_path, capsys, monkeypatch):
    touched = tmp_path / "IMPORTED"
    (tmp_path / "evil_model.py").write_text(f"open({str(touched)!r}, 'w').close()\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    ckpt = torch.load(runs / "straight" / "last.pt", weights_only=True)
    ckpt["config"]["model"]["class"] = ckpt["model_class"] = "evil_model:Net"
    torch.save(ckpt, tmp_path / "evil.pt")  # no config.yaml beside it
    assert main_train(["--resume", str(tmp_path / "evil.pt")]) == 2
    err = capsys.readouterr().err
    assert "asks srforge to import model.class=evil_model:Net, which your own config does not name" in err
    assert "allow it on the command line: model.class=evil_model:Net (or pass --config" in err
    assert not touched.exists() and "evil_model" not in sys.modules


# -- what is refused before it is called ----------------------------------------------------------------------------
def test_a_class_that_is_no_module_is_refused_before_it_is_called(tmp_path, capsys):
    root = scan_folder(tmp_path / "data", n=4)
    config = _config_file(tmp_path, tmp_path / "run", root, **{"class": "test_model_create:NotAModule"})
    assert main_train(["--config", str(config)]) == 2
    err = capsys.readouterr().err
    assert "model.class: test_model_create:NotAModule is the class test_model_create.NotAModule, not a torch.nn" in err
    with pytest.raises(ValueError, match="model.class: os:system is builtin_function_or_method, not a torch.nn.Module"):
        create_model("os:system", {"command": "echo called"})
    assert CALLED == []
    # a function, not a class, from a config file: refused before the run folder exists
    other = tmp_path / "function"
    other.mkdir()
    config = {"run": {"dir": str(other / "run"), "device": "cpu"}, "model": {"class": "os:getcwd"}}
    (other / "config.yaml").write_text(yaml.safe_dump(config))
    assert main_train(["--config", str(other / "config.yaml")]) == 2
    assert "model.class: os:getcwd is builtin_function_or_method, not a torch.nn.Module" in capsys.readouterr().err
    assert not (other / "run").exists()


class RaisesInInit(TinyNet):
    def __init__(self, **kwargs):
        raise KeyError("no such layer")


def test_a_model_whose_init_raises_is_exit_2_naming_it(tmp_path, capsys):
    root = scan_folder(tmp_path / "data", n=4)
    cfg = _config(tmp_path / "run", root, **{"class": "test_model_create:RaisesInInit", "args": {}})
    assert main_train(["--config", _yaml(tmp_path, cfg)]) == 2
    err = capsys.readouterr().err
    assert "test_model_create.RaisesInInit(in_channels=3, num_classes=2) raised KeyError: 'no such layer'" in err
    assert "Traceback" not in err


# -- config ---------------------------------------------------------------------------------------------------------
def test_every_path_of_srforges_unet_names_the_unet():
    from srforge.constants import UNET_CLASSES
    from srforge.models import create as build

    assert {"srforge.models:UNet", "srforge:UNet"} <= set(UNET_CLASSES)
    assert all(build.import_class(path) is UNet for path in UNET_CLASSES)


def test_config_keys_of_the_model_section(tmp_path):
    cfg = resolve({})
    assert cfg.model.class_ == "srforge.models.unet:UNet" and cfg.model.args == {} and cfg.model.norm == "keep"
    assert (cfg.model.weights, cfg.model.weights_into, cfg.model.weights_strict) == (None, "model", True)
    with pytest.raises(ConfigError, match="model.norm: expected one of"):
        resolve({"model": {"norm": "batch"}})
    with pytest.raises(ConfigError, match="model.class: expected 'module.path:ClassName'"):
        resolve({"model": {"class": "TinyNet"}})
    with pytest.raises(ConfigError, match=r"model.depth=3: this key configures srforge's UNet only.*model.args"):
        resolve({"model": {"class": "test_model_create:TinyNet", "depth": 3}})
    cfg = resolve({"model": {"class": "test_model_create:TinyNet", "args": {"num_classes": 3}}})
    with pytest.raises(ConfigError, match=r"model.args.num_classes: .*set model.num_classes=3 instead"):
        build_model(cfg.model, torch.device("cpu"), channels_last=False)


# -- srforge's UNet, unchanged --------------------------------------------------------------------------------------
def test_a_checkpoint_written_before_model_class_still_predicts(tmp_path):
    torch.manual_seed(4)
    unet = UNet(base_channels=4, depth=2)
    args = {"in_channels": 3, "num_classes": 2, "base_channels": 4, "depth": 2, "max_channels": 512}
    payload = {"model": unet.state_dict(), "model_args": {**args, "padding_aware": True}, "size_divisor": 4}
    save_checkpoint({**payload, "class_names": ["a", "b"]}, tmp_path / "old.pt")  # no model_class nor model_norm
    rebuilt = model_from_checkpoint(load_checkpoint(tmp_path / "old.pt"))
    assert type(rebuilt) is UNet and all(torch.equal(rebuilt.state_dict()[k], v) for k, v in unet.state_dict().items())
    odd_scans(tmp_path / "scans")
    args = [
        "--checkpoint",
        str(tmp_path / "old.pt"),
        "--input",
        str(tmp_path / "scans"),
        "--output",
        str(tmp_path / "o"),
    ]
    assert main_predict([*args, "--no-progress", "--workers", "0"]) == 0
    assert len(list((tmp_path / "o" / "masks").iterdir())) == 3


def test_the_default_model_is_srforge_unet_with_its_keys():
    cfg = resolve({"model": {"base_channels": 4, "depth": 2}})
    model, args = build_model(cfg.model, torch.device("cpu"), channels_last=False)
    assert type(model) is UNet and model.size_divisor == 4
    assert args == {
        "in_channels": 3,
        "num_classes": 2,
        "base_channels": 4,
        "depth": 2,
        "max_channels": 512,
        "padding_aware": True,
    }
