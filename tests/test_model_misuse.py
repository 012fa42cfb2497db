"""A user's model and its files used carelessly: a forward that writes into ``sizes``, a model that is wrong only in
training mode, a model whose code changed under a resume, unknown smp names, bad weights files, pretrained weights
offline. Each ends in a clear message and the right exit status, or in correct results; never a traceback."""

import json

import pytest
import torch
import yaml
from helpers import scan_folder
from PIL import Image
from test_any_model import TinyNet, _config

from srforge.cli import main_predict, main_train
from srforge.config import ConfigError, resolve
from srforge.runtime.checkpoint import load_checkpoint
from srforge.train import train

smp = pytest.importorskip("segmentation_models_pytorch", reason='needs pip install -e ".[smp]"')


class SizeWriter(TinyNet):
    """Writes into the ``sizes`` it is given, as a careless forward may: srforge must not crop or count with it."""

    def forward(self, image, sizes=None):
        if sizes is not None:
            sizes.fill_(1)
        return super().forward(image, sizes)


class WrongInTraining(TinyNet):
    """Meets the contract in eval mode, returns half-size logits in training mode."""

    def forward(self, image, sizes=None):
        logits = super().forward(image, sizes)
        return logits[..., ::2, ::2] if self.training else logits


class FiveByFive(TinyNet):
    """TinyNet whose first conv became 5 x 5 (the code changed between a run and its resume)."""

    def __init__(self, in_channels=3, num_classes=2, width=8):
        super().__init__(in_channels, num_classes, width)
        self.encoder[0] = torch.nn.Conv2d(in_channels, width, 5, padding=2)


def _yaml(tmp_path, cfg) -> str:
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return str(path)


def test_a_model_that_writes_into_sizes_changes_neither_the_masks_nor_the_counts(tmp_path):
    root = scan_folder(tmp_path / "data", n=6)
    cfg = _config(tmp_path / "run", root, **{"class": "test_model_misuse:SizeWriter"})
    cfg["train"]["epochs"] = 1
    train(resolve(cfg))
    row = json.loads((tmp_path / "run" / "metrics.jsonl").read_text().splitlines()[0])
    assert row["real_pixels_per_s"] * row["seconds"] > 100  # the scans' real pixels, not 1 px a scan
    out = tmp_path / "masks"
    assert main_predict(["--checkpoint", str(tmp_path / "run" / "best.pt"), "--input", str(root / "images"),
                         "--output", str(out), "--allow-model", "test_model_misuse:SizeWriter"]) == 0  # fmt: skip
    for image in sorted((root / "images").iterdir()):
        with Image.open(image) as scan, Image.open(out / "masks" / f"{image.stem}.png") as mask:
            assert mask.size == scan.size


def test_a_model_wrong_only_in_training_mode_is_named_before_training(tmp_path, capsys):
    root = scan_folder(tmp_path / "data", n=6)
    cfg = _config(tmp_path / "run", root, **{"class": "test_model_misuse:WrongInTraining"})
    assert main_train(["--config", _yaml(tmp_path, cfg)]) == 2
    err = capsys.readouterr().err
    assert "WrongInTraining returned shape [1, 2, 64, 256] in training mode" in err and "Traceback" not in err
    assert not (tmp_path / "run" / "config.yaml").exists()  # refused before anything is written


def test_resuming_after_the_models_code_changed_is_exit_2_and_config_yaml_stays(tmp_path, capsys, monkeypatch):
    root = scan_folder(tmp_path / "data", n=6)
    cfg = _config(tmp_path / "run", root)
    cfg["train"]["epochs"] = 1
    train(resolve(cfg))
    before = (tmp_path / "run" / "config.yaml").read_text()
    import test_any_model

    monkeypatch.setattr(test_any_model, "TinyNet", FiveByFive)
    assert main_train(["--resume", str(tmp_path / "run"), "train.epochs=2"]) == 2
    err = capsys.readouterr().err
    assert "--resume: the checkpoint's weights do not fit the test_model_misuse.FiveByFive built now" in err
    assert "size mismatch for encoder.0.weight" in err and "Traceback" not in err
    assert (tmp_path / "run" / "config.yaml").read_text() == before
    assert load_checkpoint(tmp_path / "run" / "last.pt")["epoch"] == 1


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


def test_the_cpu_allocators_failure_counts_as_out_of_memory():
    from srforge.runtime.device_memory import is_out_of_memory

    text = "[enforce fail at alloc_cpu.cpp:121] data. DefaultCPUAllocator: can't allocate memory: you tried to allocate"
    assert is_out_of_memory(RuntimeError(text + " 8589934592 bytes. Error code 12 (Cannot allocate memory)"))
    assert not is_out_of_memory(RuntimeError("mat1 and mat2 shapes cannot be multiplied"))


def test_out_of_memory_in_the_memory_probe_is_exit_2_with_what_to_do(tmp_path, capsys, monkeypatch):
    from srforge.models import UNet

    real = UNet.forward

    def forward(self, image, sizes=None):
        if torch.is_grad_enabled():
            raise RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried to allocate 9 GB (simulated)")
        return real(self, image, sizes)

    monkeypatch.setattr(UNet, "forward", forward)
    root = scan_folder(tmp_path / "data", n=4)
    cfg = _config(tmp_path / "run", root, **{"class": "srforge.models.unet:UNet", "args": {}})
    cfg["model"].update(base_channels=4, depth=2)
    assert main_train(["--config", _yaml(tmp_path, cfg)]) == 2
    err = capsys.readouterr().err
    assert "the start-of-run memory probe ran out of memory on cpu" in err and "model.checkpointing=true" in err
    assert "Traceback" not in err


def test_a_scan_too_large_even_alone_is_exit_3_with_last_pt(tmp_path, capsys, monkeypatch):
    from srforge.models import UNet
    from srforge.runtime.device_memory import StepMemory
    from srforge.train import pixel_budget as train_memory

    real = UNet.forward

    def forward(self, image, sizes=None):
        if torch.is_grad_enabled():
            raise torch.OutOfMemoryError("CUDA out of memory (simulated)")
        return real(self, image, sizes)

    monkeypatch.setattr(train_memory, "probe_memory", lambda *args, **kw: StepMemory(500.0, 0.0, "cpu", "fp32"))
    monkeypatch.setattr(UNet, "forward", forward)
    root = scan_folder(tmp_path / "data", n=4)
    cfg = _config(tmp_path / "run", root, **{"class": "srforge.models.unet:UNet", "args": {}})
    cfg["model"].update(base_channels=4, depth=2)
    assert main_train(["--config", _yaml(tmp_path, cfg)]) == 3
    err = capsys.readouterr().err
    assert "even as a batch of its own" in err and "continue with --resume" in err and "Traceback" not in err
    assert (tmp_path / "run" / "last.pt").is_file()


def test_duplicate_keys_in_a_config_file_are_an_error_naming_both_lines(tmp_path):
    path = tmp_path / "twice.yaml"
    path.write_text("train:\n  epochs: 1\ndata:\n  batch_size: 2\ntrain:\n  epochs: 50\n")
    from srforge.config import load_config

    with pytest.raises(ConfigError, match=r"the key 'train' is given twice in one mapping \(lines 1 and 5\)"):
        load_config(str(path), [])
    path.write_text("data:\n  dataset:\n    args: {root: d1, root: dtiny}\n")
    with pytest.raises(ConfigError, match=r"the key 'root' is given twice in one mapping \(lines 3 and 3\)"):
        load_config(str(path), [])
    with pytest.raises(ConfigError, match="is a folder, not a config file"):
        load_config(str(tmp_path), [])


class RaisesInInit(TinyNet):
    def __init__(self, **kwargs):
        raise KeyError("no such layer")


def test_a_model_whose_init_raises_is_exit_2_naming_it(tmp_path, capsys):
    root = scan_folder(tmp_path / "data", n=4)
    cfg = _config(tmp_path / "run", root, **{"class": "test_model_misuse:RaisesInInit", "args": {}})
    assert main_train(["--config", _yaml(tmp_path, cfg)]) == 2
    err = capsys.readouterr().err
    assert "test_model_misuse.RaisesInInit(in_channels=3, num_classes=2) raised KeyError: 'no such layer'" in err
    assert "Traceback" not in err


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


def test_an_override_of_one_of_a_pair_replaces_the_other_and_says_so(capsys):
    from srforge.config import load_config

    cfg = load_config("configs/quickstart.yaml", ["data.batch_size=8"])
    assert (cfg.data.batch_size, cfg.data.max_pixels) == (8, None)
    assert "data.batch_size given on the command line: data.max_pixels (30000) set to null" in capsys.readouterr().out
    cfg = load_config("configs/quickstart.yaml", ["model.class=test_any_model:TinyNet"])
    assert cfg.model.depth == 5 and cfg.model.class_ == "test_any_model:TinyNet"
    assert "the UNet keys base_channels, depth reset" in capsys.readouterr().out


def test_deep_padding_and_tiny_rescaling_are_warned_about(tmp_path, capsys):
    from test_train import tiny_config

    cfg = tiny_config(tmp_path / "deep", epochs=1)
    cfg["model"]["depth"] = 4  # divisor 16 on scans of 12-16 x 20-83 px
    cfg["data"]["augment"] = {"scale": [0.1, 0.2]}
    train(resolve(cfg))
    out = capsys.readouterr().out
    assert "warning: the model's size divisor 16 pads the training scans to" in out
    assert "warning: data.augment.scale=[0.1, 0.2] shrinks every training scan to at most 3 px" in out


def test_predicting_a_masks_folder_or_a_dataset_root_is_warned_about(tmp_path, capsys):
    from test_train import tiny_config

    train(tiny_config(tmp_path / "run", epochs=1))
    root = scan_folder(tmp_path / "data", n=3)
    ckpt = str(tmp_path / "run" / "best.pt")
    cases = ((root / "masks", "looks like a folder of masks"), (root, "looks like a labelled dataset's root"))
    for given, said in cases:
        out = tmp_path / f"out_{given.name}"
        assert main_predict(["--checkpoint", ckpt, "--input", str(given), "--output", str(out), "--no-progress"]) == 0
        assert said in capsys.readouterr().err
