"""Checkpoints: atomic writes, weights_only loading, clear errors for files that are not ours."""

import time

import numpy as np
import pytest
import torch
from PIL import Image

from srforge import UNet
from srforge.cli import main_train
from srforge.runtime.checkpoint import (
    load_checkpoint,
    model_from_checkpoint,
    save_checkpoint,
)


def _payload(model):
    return {
        "model": model.state_dict(),
        "model_args": {"base_channels": 4, "depth": 2},
        "size_divisor": 4,
        "class_names": ["a", "b"],
        "epoch": 1,
    }


def test_round_trip_rebuilds_the_model(tmp_path):
    model = UNet(base_channels=4, depth=2)
    save_checkpoint(_payload(model), tmp_path / "last.pt")
    rebuilt = model_from_checkpoint(load_checkpoint(tmp_path / "last.pt"))
    assert not rebuilt.training and rebuilt.size_divisor == 4
    for key, value in model.state_dict().items():
        assert torch.equal(rebuilt.state_dict()[key], value)


def test_a_failed_write_leaves_the_previous_checkpoint_and_no_temporary_file(tmp_path):
    model = UNet(base_channels=4, depth=2)
    path = save_checkpoint(_payload(model), tmp_path / "last.pt")
    before = path.read_bytes()
    with pytest.raises(Exception):
        save_checkpoint({**_payload(model), "epoch": lambda: 2}, path)  # a lambda cannot be pickled
    assert path.read_bytes() == before and load_checkpoint(path)["epoch"] == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["last.pt"]


def test_files_that_are_not_srforge_checkpoints(tmp_path):
    with pytest.raises(FileNotFoundError, match="Checkpoint not found"):
        load_checkpoint(tmp_path / "missing.pt")
    torch.save({"state_dict": {}}, tmp_path / "other.pt")
    with pytest.raises(
        ValueError, match=r"other.pt is not an srforge checkpoint: expected format 'srforge-checkpoint'"
    ):
        load_checkpoint(tmp_path / "other.pt")
    (tmp_path / "text.pt").write_text("hello")
    with pytest.raises(
        ValueError, match=r"text.pt is not an srforge checkpoint: torch.load\(weights_only=True\) failed"
    ):
        load_checkpoint(tmp_path / "text.pt")
    torch.save({"format": "srforge-checkpoint", "version": 1, "model": {}}, tmp_path / "partial.pt")
    with pytest.raises(ValueError, match="incomplete srforge checkpoint: the field 'model_args' is missing"):
        load_checkpoint(tmp_path / "partial.pt")


def _nested(levels: int = 9, width: int = 9):
    """width**levels names built of shared lists: what a pickle (or a YAML alias) holds cheaply."""
    names = ["lol"] * width
    for _ in range(levels - 1):
        names = [names] * width
    return names


@pytest.mark.parametrize(
    "change, expected",
    [
        ({"class_names": _nested()}, "class_names: class name 0 must be a string, found list"),
        ({"class_names": [f"c{i}" for i in range(1025)]}, "class_names: expected at most 1024 class names"),
        ({"class_names": ["a", "b" * 65]}, "class_names: class name 1 must have 1 to 64 characters, found 65"),
        ({"config": {"model": {"class_names": _nested()}}}, "expand to more than 16,000,000"),
        ({"config": {"data": {"dataset": {"args": {"x": _nested(8)}}}}}, "expand to more than 16,000,000"),
    ],
)
def test_class_names_and_shared_parts_are_bounded_on_load(tmp_path, change, expected):
    model = UNet(base_channels=4, depth=2)
    save_checkpoint({**_payload(model), **change}, tmp_path / "odd.pt")
    started = time.perf_counter()
    with pytest.raises(ValueError, match=rf"odd.pt: .*{expected}"):
        load_checkpoint(tmp_path / "odd.pt")
    assert time.perf_counter() - started < 5
    save_checkpoint({**_payload(model), "config": {"x": _nested(3)}}, tmp_path / "fine.pt")
    assert load_checkpoint(tmp_path / "fine.pt")["config"]["x"] == _nested(3)  # 729 shared names: fine


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


def test_a_checkpoint_folder_is_named_as_a_folder(tmp_path):
    from srforge.runtime.checkpoint import load_checkpoint

    (tmp_path / "last.pt").write_bytes(b"x")
    with pytest.raises(FileNotFoundError, match=r"is a folder, not a checkpoint file; it holds last.pt"):
        load_checkpoint(tmp_path)
