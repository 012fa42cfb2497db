"""srforge-train against hostile and careless input: checkpoints that ask to run code, copied runs, bad configs.

Every refusal is exit status 2 with a message naming the key, file or sample, and nothing written before it.
"""

import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from PIL import Image
from torch.utils.data import Dataset

from srforge.cli import main_train
from srforge.config import resolve
from srforge.config.trust import untrusted_imports
from srforge.runtime.checkpoint import load_checkpoint
from srforge.train import train

ROOT = Path(__file__).resolve().parents[1]
TRAIN = [sys.executable, str(ROOT / "scripts" / "train.py")]


class Strips(Dataset):
    """Six tiny scans with a dark line (class 1) on a light background (class 0)."""

    def __init__(self, n=6):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        h, w = 8 + i % 3, 16 + 4 * i
        labels = np.zeros((h, w), np.int64)
        labels[h // 2, 1 : w - 1] = 1
        scan = np.repeat(np.where(labels == 1, 30, 220)[None], 3, 0).astype(np.uint8)
        return {"id": f"strip_{i}", "scan": scan, "labels": labels}


CONFIG = {
    "run": {"seed": 1, "device": "cpu"},
    "data": {
        "dataset": {"class": "test_hostile:Strips", "args": {"n": 6}},
        "fields": {"image": "scan", "mask": "labels", "name": "id"},
        "batch_size": 2,
        "val_fraction": 0.34,
    },
    "model": {"base_channels": 4, "depth": 2},
    "train": {"epochs": 1, "lr": 0.01, "warmup_steps": 1},
}


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A run folder after one epoch: config.yaml, last.pt, best.pt, metrics."""
    run = tmp_path_factory.mktemp("hostile") / "run"
    train(resolve({**CONFIG, "run": {**CONFIG["run"], "dir": str(run)}}))
    return run


def _snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def _config_file(tmp_path: Path, **sections) -> Path:
    cfg = {key: {**value, **sections.get(key, {})} for key, value in CONFIG.items()}
    cfg["run"]["dir"] = str(tmp_path / "run")
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


# -- failure 1: a checkpoint names code to import ----------------------------------------------------------
def test_a_resumed_checkpoint_cannot_make_srforge_import_code(trained, tmp_path):
    c = torch.load(trained / "best.pt", weights_only=True)
    pwned = tmp_path / "PWNED"
    c["config"]["data"]["dataset"] = {"class": "subprocess:run", "args": {"args": ["touch", str(pwned)]}}
    evil = tmp_path / "evil.pt"
    torch.save(c, evil)
    before = _snapshot(tmp_path)
    done = subprocess.run([*TRAIN, "--resume", str(evil)], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert done.returncode == 2, done.stderr[-2000:]
    assert not pwned.exists()
    assert "import data.dataset.class=subprocess:run" in done.stderr
    assert "allow it on the command line: data.dataset.class=subprocess:run" in done.stderr
    assert "Traceback" not in done.stderr and _snapshot(tmp_path) == before  # nothing written


def test_every_import_path_of_a_checkpoint_is_checked(trained, tmp_path, capsys):
    c = torch.load(trained / "last.pt", weights_only=True)
    c["config"]["data"]["val_dataset"] = {"class": "os:system", "args": {"command": f"touch {tmp_path / 'P'}"}}
    torch.save(c, tmp_path / "evil.pt")
    assert main_train(["--resume", str(tmp_path / "evil.pt")]) == 2
    assert "data.val_dataset.class=os:system" in capsys.readouterr().err and not (tmp_path / "P").exists()
    # The run folder's own config.yaml names the dataset class: a legitimate resume needs nothing more.
    assert untrusted_imports(c["config"], [yaml.safe_load((trained / "config.yaml").read_text())]) == [
        ("data.val_dataset.class", "os:system")
    ]


def test_what_counts_as_named_by_the_user():
    cfg = resolve({"data": {"dataset": {"class": "mine:Scans"}, "val_dataset": {"class": "srforge.config.load:dump"}}})
    assert untrusted_imports(cfg, []) == [
        ("data.dataset.class", "mine:Scans"),
        ("data.val_dataset.class", "srforge.config.load:dump"),
    ]
    # the same path at the same key, from a file or a command-line override (dotted keys), is allowed
    assert untrusted_imports(cfg, [{"data.dataset.class": "mine:Scans"}]) == [
        ("data.val_dataset.class", "srforge.config.load:dump")
    ]
    assert untrusted_imports(cfg, [{"data": {"val_dataset": {"class": "mine:Scans"}}}])[0][0] == "data.dataset.class"
    # srforge's own Dataset classes are allowed; srforge functions that are not Datasets are not
    default = resolve({})
    assert default["data"]["dataset"]["class"].startswith("srforge.") and untrusted_imports(default, []) == []


# -- failure 4: a copied run is resumed in place -------------------------------------------------------
def test_resuming_a_copied_run_writes_into_the_copy(trained, tmp_path, capsys):
    copy = tmp_path / "copy"
    shutil.copytree(trained, copy)
    original = _snapshot(trained)
    assert main_train(["--resume", str(copy), "train.epochs=2"]) == 0
    assert f"resuming {copy} at epoch 2" in capsys.readouterr().out
    assert _snapshot(trained) == original
    assert load_checkpoint(copy / "last.pt")["epoch"] == 2
    assert f"dir: {copy}" in (copy / "config.yaml").read_text()
    # a checkpoint file: its own folder; run.dir on the command line: there
    moved = tmp_path / "moved"
    shutil.copytree(trained, moved)
    assert main_train(["--resume", str(moved / "last.pt"), "train.epochs=2"]) == 0
    assert load_checkpoint(moved / "last.pt")["epoch"] == 2
    elsewhere = tmp_path / "elsewhere"
    assert main_train(["--resume", str(copy), "train.epochs=3", f"run.dir={elsewhere}"]) == 0
    assert load_checkpoint(elsewhere / "last.pt")["epoch"] == 3 and load_checkpoint(copy / "last.pt")["epoch"] == 2
    assert _snapshot(trained) == original


# -- rough edges: a message, exit 2, nothing written -----------------------------------------------------
@pytest.mark.parametrize(
    "override, expected",
    [
        ("data.dataset.class=no_such_module:Scans", "data.dataset.class: cannot import module 'no_such_module'"),
        ("data.dataset.class=test_hostile:Nope", "data.dataset.class: module 'test_hostile' has no attribute 'Nope'"),
        ("data.dataset.args.colour=red", "data.dataset.args: test_hostile:Strips cannot be built with {'n': 6, 'col"),
        ("run.device=cuda:7", "run.device: no device 'cuda:7'"),
        ("run.device=gpu", "run.device: 'gpu' is not a device"),
        ("train.lr=.inf", "train.lr: expected a finite number, found inf"),
        ("train.grad_clip=.nan", "train.grad_clip: expected a finite number, found nan"),
        ("data.dataset.args.n=.inf", "data.dataset.args.n: expected a finite number, found inf"),
        ("data.augment={hflp: 0.5}", "Unknown config key 'data.augment.hflp'. Did you mean 'data.augment.hflip'?"),
        ("data.augment={affine: {degres: 3}}", "Did you mean 'data.augment.affine.degrees'?"),
        ("model.class_names=[a, '" + "b" * 65 + "']", "model.class_names: class name 1 must have 1 to 64 characters"),
        ("model.class_names=[a, [b]]", "model.class_names: class name 1 must be a string, found list"),
    ],
)
def test_config_mistakes_are_refused_before_anything_is_written(tmp_path, capsys, override, expected):
    config = _config_file(tmp_path)
    assert main_train(["--config", str(config), override]) == 2
    err = capsys.readouterr().err
    assert expected in err and "Traceback" not in err
    assert not (tmp_path / "run").exists()


def test_a_missing_dataset_root_is_named(tmp_path, capsys):
    missing = tmp_path / "no_scans"
    config = _config_file(
        tmp_path,
        data={"dataset": {"class": "srforge.data.datasets:SegmentationFolder", "args": {"root": str(missing)}}},
    )
    assert main_train(["--config", str(config)]) == 2
    assert f"data.dataset.args.root: {missing} does not exist" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("workers", [0, 1])
def test_mask_values_beyond_num_classes_are_a_message_naming_the_sample(tmp_path, capfd, workers):
    config = _config_file(tmp_path, data={"num_workers": workers})
    assert main_train(["--config", str(config), "model.num_classes=1"]) == 2
    err = capfd.readouterr().err
    assert "Strips[" in err and "('strip_" in err and "model.num_classes=1" in err
    assert "Traceback" not in err and "DataLoader worker" not in err


def test_empty_and_non_utf8_config_files_are_named(tmp_path, capsys):
    empty = tmp_path / "empty.yaml"
    empty.write_text("# nothing here\n")
    assert main_train(["--config", str(empty)]) == 2
    assert f"{empty} is empty" in capsys.readouterr().err
    latin = tmp_path / "latin.yaml"
    latin.write_bytes("model:\n  class_names: [caf\xe9, b]\n".encode("latin-1"))
    assert main_train(["--config", str(latin)]) == 2
    assert f"{latin} is not UTF-8 text (line 2, byte 26" in capsys.readouterr().err


def test_an_aliased_class_names_bomb_is_refused_from_a_config_file(tmp_path, capsys):
    lines = ['a0: &a0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    lines += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]" for i in range(1, 9)]
    bomb = tmp_path / "bomb.yaml"
    # the anchors sit where the schema allows any keys: inside the free-form dataset args
    text = "data:\n  dataset:\n    args:\n" + "".join(f"      {line}\n" for line in lines)
    bomb.write_text(text + "model:\n  class_names: *a8\n")
    assert len(bomb.read_bytes()) < 1000
    assert main_train(["--config", str(bomb)]) == 2
    err = capsys.readouterr().err
    assert f"{bomb}: its aliases (*name) expand it to more than" in err


def test_a_checkpoint_with_aliased_class_names_is_refused_by_predict_and_resume(trained, tmp_path, capsys):
    from srforge.cli import main_predict

    names = ["lol"] * 9
    for _ in range(8):
        names = [names] * 9  # 9**9 names from 81 shared lists, as a pickle stores them
    c = torch.load(trained / "best.pt", weights_only=True)
    c["class_names"] = names
    c["config"]["model"]["class_names"] = names
    torch.save(c, tmp_path / "names.pt")
    (tmp_path / "scans").mkdir()
    Image.fromarray(np.full((8, 8, 3), 200, np.uint8)).save(tmp_path / "scans" / "a.png")
    out = tmp_path / "out"
    args = ["--checkpoint", str(tmp_path / "names.pt"), "--input", str(tmp_path / "scans"), "--output", str(out)]
    assert main_predict(args) == 2
    assert "names.pt: class_names: class name 0 must be a string, found list" in capsys.readouterr().err
    assert not out.exists()
    assert main_train(["--resume", str(tmp_path / "names.pt")]) == 2
    assert "class name 0 must be a string" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["names.pt", "scans"]


def test_resolve_device_names_the_devices_there_are(monkeypatch):
    from srforge.runtime.device import resolve_device

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 1)
    assert resolve_device("cuda:1") == torch.device("cuda", 1)
    # Always indexed (torch.cuda.set_device refuses a bare "cuda"): the current device.
    assert resolve_device("cuda") == torch.device("cuda", 1) and resolve_device("auto") == torch.device("cuda", 1)
    with pytest.raises(ValueError, match=r"no device 'cuda:7': this machine has cuda:0 to cuda:1; use one of those"):
        resolve_device("cuda:7")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ValueError, match=r"no device 'cuda': this machine has no CUDA device; use cpu"):
        resolve_device("cuda")
    assert resolve_device("cpu") == torch.device("cpu")
