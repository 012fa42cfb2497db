"""The shipped adapters end to end, each from one YAML file: an smp Unet (masked norms) and a torchvision LR-ASPP
(GroupNorm) train a few steps, resume exactly, predict through predict.py from the checkpoint alone (no config
naming the class: srforge's own adapters are always trusted), export to ONNX and match onnxruntime; a missing
optional package is exit status 2 with the extra named, not a traceback.

Random init, images of tens of pixels, nothing downloaded.
"""

import importlib.util
import json
import sys
import warnings
from pathlib import Path

import pytest
import torch
import yaml
from helpers import odd_scans, scan_folder
from PIL import Image
from test_train import ROOT, torchrun_two

from srforge.cli import main_export, main_predict, main_train
from srforge.runtime.checkpoint import load_checkpoint

warnings.filterwarnings("ignore", message=".*deprecated.*")
HAS_SMP = importlib.util.find_spec("segmentation_models_pytorch") is not None

# name -> (model section, size divisor); the smp encoder is cut to 2 stages (its stem and layer1) so that tens of
# pixels suffice and its ONNX export, which grows with every masked norm, takes about half the time of 3 stages
MODELS = {
    "smp_unet": (
        {
            "class": "srforge.models.smp:SmpModel",
            "args": {"arch": "Unet", "encoder": "resnet18", "encoder_depth": 2, "decoder_channels": [16, 8]},
            "norm": "masked",
        },
        4,
    ),
    "tv_lraspp": (
        {
            "class": "srforge.models.tv_segmentation:TorchvisionModel",
            "args": {"name": "lraspp_mobilenet_v3_large"},
            "norm": "group",
        },
        16,
    ),
}


def _config_file(folder: Path, run_dir: Path, root: Path, model: dict) -> Path:
    config = {
        "run": {"dir": str(run_dir), "seed": 3, "device": "cpu"},
        "data": {
            "dataset": {"class": "srforge.data.datasets:SegmentationFolder", "args": {"root": str(root)}},
            "batch_size": 3,
        },
        "model": {**model, "num_classes": 2},
        "train": {"epochs": 2, "lr": 0.003, "warmup_steps": 1},
    }
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


@pytest.fixture(scope="module", params=sorted(MODELS))
def runs(request, tmp_path_factory):
    """(name, folder): a run of 2 epochs straight (folder/straight) on 6 scans (folder/data)."""
    name = request.param
    if name.startswith("smp") and not HAS_SMP:
        pytest.skip('needs pip install -e ".[smp]"')
    tmp = tmp_path_factory.mktemp(name)
    root = scan_folder(tmp / "data", n=6)
    assert main_train(["--config", str(_config_file(tmp / "cfg_a", tmp / "straight", root, MODELS[name][0]))]) == 0
    return name, tmp


@pytest.fixture(scope="module")
def resumed(runs):
    """``runs``, and beside its straight run one of the same config stopped after 1 epoch and resumed from its
    folder (folder/stopped): a fixture of its own, so that the fast loop, which leaves out the resume test, does not
    pay for it."""
    name, tmp = runs
    stopped = _config_file(tmp / "cfg_b", tmp / "stopped", tmp / "data", MODELS[name][0])
    assert main_train(["--config", str(stopped), "train.stop_after=1"]) == 0
    assert main_train(["--resume", str(tmp / "stopped"), "train.stop_after=null"]) == 0
    return name, tmp


@pytest.mark.slow
def test_an_adapter_trains_from_yaml_and_resumes_to_the_same_bits(resumed):
    name, tmp = resumed
    a, b = load_checkpoint(tmp / "straight" / "last.pt"), load_checkpoint(tmp / "stopped" / "last.pt")
    assert a["model_class"] == MODELS[name][0]["class"] and a["model_norm"] == MODELS[name][0]["norm"]
    assert a["size_divisor"] == MODELS[name][1] and a["epoch"] == b["epoch"] == 2 and a["step"] == b["step"]
    for key in a["model"]:
        assert torch.equal(a["model"][key], b["model"][key]), key


def test_an_adapter_predicts_from_a_lone_checkpoint_at_every_scan_size(runs, tmp_path):
    _, tmp = runs
    lone = tmp_path / "elsewhere" / "best.pt"  # no run folder, no config: srforge's adapters need no trust
    lone.parent.mkdir()
    lone.write_bytes((tmp / "straight" / "best.pt").read_bytes())
    sizes = odd_scans(tmp_path / "scans")
    out = tmp_path / "out"
    args = ["--checkpoint", str(lone), "--input", str(tmp_path / "scans"), "--output", str(out)]
    assert main_predict([*args, "--no-progress", "--workers", "0"]) == 0
    for scan, (h, w) in sizes.items():
        with Image.open(out / "masks" / f"{scan}.png") as mask:
            assert mask.size == (w, h)


@pytest.mark.slow
def test_an_adapter_exports_to_onnx_and_matches_onnxruntime(runs, tmp_path, capsys):
    for module in ("onnx", "onnxscript", "onnxruntime"):
        pytest.importorskip(module, reason='ONNX export needs the optional extra: pip install -e ".[export]"')
    name, tmp = runs
    out = tmp_path / f"{name}.onnx"
    assert main_export(["--checkpoint", str(tmp / "straight" / "best.pt"), "--output", str(out)]) == 0
    printed = capsys.readouterr().out
    assert f"H and W multiples of {MODELS[name][1]}" in printed
    assert "onnxruntime vs PyTorch" in printed and out.is_file()


@pytest.mark.slow
def test_an_adapter_with_masked_norms_trains_under_torchrun(tmp_path):
    if not HAS_SMP:
        pytest.skip('needs pip install -e ".[smp]"')
    root = scan_folder(tmp_path / "data", n=6)
    config = _config_file(tmp_path / "cfg", tmp_path / "ddp", root, MODELS["smp_unet"][0])
    script = ROOT / "scripts" / "train.py"
    done = torchrun_two(script, "--config", str(config), "data.batch_size=1", cwd=tmp_path, fresh=(tmp_path / "ddp",))
    assert done.returncode == 0, done.stderr[-3000:]
    rows = [json.loads(line) for line in (tmp_path / "ddp" / "metrics.jsonl").read_text().splitlines()]
    # only rank 0 writes, one row per epoch; both ranks take the same number of steps
    assert [r["epoch"] for r in rows] == [1, 2] and rows[1]["step"] == 2 * rows[0]["step"] > 0
    assert all(r["val_mean_iou"] is not None for r in rows)
    ckpt = load_checkpoint(tmp_path / "ddp" / "last.pt")
    assert ckpt["model_norm"] == "masked" and not any(k.startswith("module.") for k in ckpt["model"])


def test_a_missing_optional_package_is_exit_2_naming_the_extra(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "segmentation_models_pytorch", None)  # import fails as if not installed
    root = scan_folder(tmp_path / "data", n=4)
    config = _config_file(tmp_path / "cfg", tmp_path / "run", root, MODELS["smp_unet"][0])
    assert main_train(["--config", str(config)]) == 2
    err = capsys.readouterr().err
    assert "SmpModel needs segmentation-models-pytorch" in err and 'pip install -e ".[smp]"' in err
    assert "Traceback" not in err
