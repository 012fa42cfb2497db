"""srforge-train, the command (srforge.cli.train): the script end to end, and stopped by Ctrl-C; every mistake in a
config, a Dataset or its labels refused with exit status 2 and a message naming the key, file or sample, before
anything is written, never a traceback; a run stopped before its first checkpoint requeued by --resume.
"""

import signal
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest
import yaml
from test_field_view import FIELDS
from test_train import ROOT, TRAIN, _overrides, tiny_config
from torch.utils.data import Dataset

from srforge.cli import main_train
from srforge.runtime.checkpoint import load_checkpoint, model_from_checkpoint
from srforge.train import train


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
        "dataset": {"class": "test_cli_train:Strips", "args": {"n": 6}},
        "fields": {"image": "scan", "mask": "labels", "name": "id"},
        "batch_size": 2,
        "val_fraction": 0.34,
    },
    "model": {"base_channels": 4, "depth": 2},
    "train": {"epochs": 1, "lr": 0.01, "warmup_steps": 1},
}


def _snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def _config_file(tmp_path: Path, **sections) -> Path:
    cfg = {key: {**value, **sections.get(key, {})} for key, value in CONFIG.items()}
    cfg["run"]["dir"] = str(tmp_path / "run")
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


# -- the script -----------------------------------------------------------------------------------------------------
def _quickstart_run_holds(tmp_path: Path, printed: str) -> None:
    """The README's main job, run with _overrides in ``tmp_path``: scans generated, 4 epochs, loss falling, both
    checkpoints loadable with the quickstart's model, the best validation IoU said on stdout (``printed``)."""
    run = tmp_path / "run"
    assert (tmp_path / "scans" / "images").is_dir()  # generated when missing
    assert "epochs: 4" in (run / "config.yaml").read_text()
    rows = (run / "metrics.csv").read_text().splitlines()
    header, values = rows[0].split(","), [dict(zip(rows[0].split(","), r.split(","))) for r in rows[1:]]
    assert len(values) == 4 and "val_mean_iou" in header
    assert float(values[-1]["train_loss"]) < float(values[0]["train_loss"])
    for name in ("last.pt", "best.pt"):
        ckpt = load_checkpoint(run / name)
        model = model_from_checkpoint(ckpt)
        assert model.size_divisor == 8 and ckpt["class_names"] == ["background", "curve"]
        assert ckpt["config"]["train"]["epochs"] == 4
    assert "best validation mean IoU" in printed


def test_the_quickstart_trains_through_the_command_in_process(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    quickstart = str(ROOT / "configs" / "quickstart.yaml")
    assert main_train(["--config", quickstart, *_overrides(tmp_path), "run.device=cpu"]) == 0  # no CUDA in a worker
    _quickstart_run_holds(tmp_path, capsys.readouterr().out)


@pytest.mark.slow
def test_train_script_end_to_end(tmp_path):
    done = subprocess.run(
        [*TRAIN, "--config", str(ROOT / "configs" / "quickstart.yaml"), *_overrides(tmp_path)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    _quickstart_run_holds(tmp_path, done.stdout)


@pytest.mark.slow
def test_config_errors_from_the_command_line(tmp_path):
    def run(*args):
        return subprocess.run([*TRAIN, *args], capture_output=True, text=True, timeout=120, cwd=ROOT)

    unknown = run("--config", "configs/quickstart.yaml", "train.epoch=3")
    assert unknown.returncode == 2 and "Did you mean 'train.epochs'" in unknown.stderr
    wrong = run("--config", "configs/quickstart.yaml", "train.epochs=many")
    assert wrong.returncode == 2 and "train.epochs: expected int, found str 'many'" in wrong.stderr
    missing = run("--config", str(tmp_path / "missing.yaml"))
    assert missing.returncode == 2 and f"Config file not found: {tmp_path / 'missing.yaml'}" in missing.stderr


@pytest.mark.slow
def test_ctrl_c_writes_last_pt_and_the_run_resumes(tmp_path):
    args = [*TRAIN, "--config", str(ROOT / "configs" / "quickstart.yaml"), *_overrides(tmp_path, epochs=50)]
    # A shell that starts jobs in the background makes them ignore SIGINT, and Python then installs no
    # KeyboardInterrupt handler: give the child the default disposition, as a terminal would.
    proc = subprocess.Popen(
        args,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=tmp_path,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    metrics = tmp_path / "run" / "metrics.jsonl"
    deadline = time.time() + 240
    while not metrics.exists() and time.time() < deadline and proc.poll() is None:
        time.sleep(0.2)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err[-2000:]
    assert "interrupted; wrote" in out
    ckpt = load_checkpoint(tmp_path / "run" / "last.pt")
    assert ckpt["epoch"] >= 1
    resumed = subprocess.run(
        [*TRAIN, "--resume", str(tmp_path / "run"), "train.stop_after=1"],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert load_checkpoint(tmp_path / "run" / "last.pt")["epoch"] == ckpt["epoch"] + 1


# -- a config's mistakes: exit status 2, the key or file named, nothing written -------------------------------------
@pytest.mark.parametrize(
    "override, expected",
    [
        ("data.dataset.class=no_such_module:Scans", "data.dataset.class: cannot import module 'no_such_module'"),
        (
            "data.dataset.class=test_cli_train:Nope",
            "data.dataset.class: module 'test_cli_train' has no attribute 'Nope'",
        ),
        ("data.dataset.args.colour=red", "data.dataset.args: test_cli_train:Strips cannot be built with {'n': 6, 'col"),
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


def test_training_refuses_a_depth_deeper_than_the_scans_before_building_a_model(tmp_path, capsys, monkeypatch):
    monkeypatch.syspath_prepend(str(tmp_path))
    (tmp_path / "careless_data.py").write_text("from test_field_view import Careless  # noqa: F401\n")
    config = {
        "run": {"dir": str(tmp_path / "run"), "device": "cpu"},
        "data": {"dataset": {"class": "careless_data:Careless", "args": {}}, "fields": FIELDS},
        "model": {"base_channels": 4, "depth": 10},
        "train": {"epochs": 1},
    }
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(config))
    assert main_train(["--config", str(tmp_path / "config.yaml")]) == 2
    err = capsys.readouterr().err
    assert "srforge-train: error: model.depth:" in err and "use depth" in err and "Traceback" not in err
    assert not (tmp_path / "run" / "last.pt").exists()


# -- a Dataset's and its labels' mistakes: exit status 2, the sample named ------------------------------------------
@pytest.mark.parametrize("workers", [0, pytest.param(1, marks=pytest.mark.slow)])
def test_mask_values_beyond_num_classes_are_a_message_naming_the_sample(tmp_path, capfd, workers):
    """train(cfg) raises a ValueError naming the sample; srforge-train turns it into exit status 2 and one line,
    also when a DataLoader worker read the sample."""
    cfg = tiny_config(tmp_path / "api", epochs=1)
    cfg["model"]["num_classes"] = 1
    cfg["model"]["class_names"] = None
    with pytest.raises(
        ValueError, match=r"TinyStrips\[\d+\] \('strip_\d+'\): mask values \[1\] are not classes of model.num_classes=1"
    ):
        train(cfg)
    capfd.readouterr()
    config = _config_file(tmp_path, data={"num_workers": workers})
    assert main_train(["--config", str(config), "model.num_classes=1"]) == 2
    err = capfd.readouterr().err
    assert "Strips[" in err and "('strip_" in err and "model.num_classes=1" in err
    assert "Traceback" not in err and "DataLoader worker" not in err


@pytest.mark.slow
@pytest.mark.parametrize("mistake", ["tuple", "raises", "long", "float"])
def test_train_ends_with_status_2_and_the_sample_named(mistake, tmp_path, capsys, monkeypatch):
    monkeypatch.syspath_prepend(str(tmp_path))
    (tmp_path / "careless_data.py").write_text("from test_field_view import Careless  # noqa: F401\n")
    config = {
        "run": {"dir": str(tmp_path / "run"), "device": "cpu"},
        "data": {"dataset": {"class": "careless_data:Careless", "args": {"mistake": mistake}}, "fields": FIELDS},
        "model": {"base_channels": 4, "depth": 2},
        "train": {"epochs": 1},
    }
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(config))
    assert main_train(["--config", str(tmp_path / "config.yaml")]) == 2
    err = capsys.readouterr().err
    assert "srforge-train: error: Careless[" in err and "Traceback" not in err


# -- --resume -------------------------------------------------------------------------------------------------------
def test_a_run_stopped_before_its_first_checkpoint_is_requeued_by_resume(tmp_path, capsys):
    run = tmp_path / "run"
    config_file = tmp_path / "cfg.yaml"
    config_file.write_text(yaml.safe_dump(tiny_config(run, epochs=1)))
    run.mkdir()
    (run / "config.yaml").write_text(config_file.read_text())  # what a run stopped during its first epoch leaves
    assert main_train(["--resume", str(run)]) == 0
    assert f"{run.resolve()} holds no checkpoint yet" in capsys.readouterr().out
    assert load_checkpoint(run / "last.pt")["epoch"] == 1
    (run / "last.pt").unlink()  # best.pt written, then the disk was full at last.pt
    assert main_train(["--resume", str(run)]) == 2
    err = capsys.readouterr().err
    assert f"{(run / 'best.pt').resolve()} does: continue from it with --resume {run / 'best.pt'}" in err
