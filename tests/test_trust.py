"""What a checkpoint may make srforge import (srforge.config.trust): nothing that the user's own config does not
name too; srforge's own Dataset classes always. ``trained`` (tests/conftest.py) is a real run to tamper with.
"""

import subprocess

import pytest
import torch
import yaml
from test_cli_train import _snapshot
from test_train import TRAIN

from srforge.cli import main_train
from srforge.config import resolve
from srforge.config.trust import untrusted_imports


@pytest.mark.slow
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
