"""Paths in what srforge prints are absolute: a job started from another working directory, or a log read later,
still says where its files are."""

import numpy as np
from PIL import Image
from predict_fixtures import random_checkpoint

from srforge.cli import main_evaluate, main_predict


def _labelled(folder) -> None:
    for sub in ("images", "masks"):
        (folder / sub).mkdir(parents=True)
    rng = np.random.default_rng(0)
    for i, (h, w) in enumerate([(9, 13), (12, 20)]):
        Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)).save(folder / "images" / f"s{i}.png")
        Image.fromarray(rng.integers(0, 3, (h, w), dtype=np.uint8)).save(folder / "masks" / f"s{i}.png")


def test_predict_and_evaluate_name_their_reports_by_absolute_paths(tmp_path, monkeypatch, capsys):
    random_checkpoint(tmp_path / "m.pt")
    _labelled(tmp_path / "data")
    monkeypatch.chdir(tmp_path)
    assert main_predict(["--checkpoint", "m.pt", "--input", "data/images", "--output", "out", "--workers", "0"]) == 0
    assert f"report: {tmp_path / 'out' / 'report.json'}" in capsys.readouterr().out
    assert main_evaluate(["--checkpoint", "m.pt", "--input", "data", "--output", "scores", "--workers", "0"]) == 0
    assert f"report: {tmp_path / 'scores' / 'report.html'}" in capsys.readouterr().out
