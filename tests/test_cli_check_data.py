"""Hostile and careless input, round three: depth bounds, an ignore index that is a class id, errors that name the
override that set the bad value, and a --plot onto a read-only file system."""

import contextlib
import errno
import os
import re
import subprocess
from pathlib import Path

import pytest
import torch
import yaml
from helpers import labels, rgb

import srforge.data.layout_plot as layout_plot
from srforge.atomic import atomic_write
from srforge.cli import main_check_data
from srforge.config import ConfigError, load_config, resolve
from srforge.config.schema import ModelSection
from srforge.constants import MAX_DEPTH
from srforge.geometry import depth_problem, largest_sensible_depth
from srforge.models import UNet

# The quickstart's scans: heights 30-40 px, widths 200-800 px (data.synthetic.scale 0.0625), depth 5.
QUICKSTART_SIZES = [(30 + i % 11, 200 + 60 * i) for i in range(11)]


@contextlib.contextmanager
def read_only_tmpfs(path: Path):
    """An empty read-only tmpfs at ``path`` (needs root and mount rights; the test is skipped otherwise)."""
    path.mkdir(parents=True, exist_ok=True)
    if os.geteuid() != 0 or subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=1m", "tmpfs", str(path)]).returncode:
        pytest.skip("mounting a tmpfs needs root")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


def _tiny_folder(make_pair, root: Path) -> Path:
    """Three pairs, the tallest 16 px and the widest 30 px: depth 4 (divisor 16) is the deepest sensible."""
    for i, (h, w) in enumerate([(12, 20), (16, 9), (7, 30)]):
        make_pair(f"scan_{i}", rgb(h, w, i), labels(h, w, seed=i), root=root)
    return root


# -- 1. model.depth: a static bound, a bound from the data, and the UNet's own --------------------------------
def test_model_depth_has_a_static_bound_that_names_it():
    assert resolve({"model": {"depth": MAX_DEPTH}}).model.depth == MAX_DEPTH
    with pytest.raises(ConfigError, match=r"model.depth: expected an integer <= 16 \(.*65,536 px.*\), found 40"):
        resolve({"model": {"depth": 40}})
    with pytest.raises(ConfigError, match=r"model.depth: expected an integer >= 1, found 0"):
        resolve({"model": {"depth": 0}})
    assert ModelSection.depth.maximum == MAX_DEPTH


def test_unet_refuses_a_depth_beyond_the_bound_before_allocating():
    for depth in (0, MAX_DEPTH + 1, 30):
        with pytest.raises(ValueError, match=rf"UNet depth must be 1 to {MAX_DEPTH} .*got {depth}"):
            UNet(depth=depth)
    assert UNet(base_channels=1, max_channels=1, depth=MAX_DEPTH).size_divisor == 2**MAX_DEPTH


def test_the_quickstart_depth_is_sensible_and_a_deeper_one_is_named():
    assert largest_sensible_depth(QUICKSTART_SIZES) == 6  # 2**5 = 32 < 40: the 6th stage still halves 2 rows
    assert depth_problem(QUICKSTART_SIZES, 5) is None and depth_problem(QUICKSTART_SIZES, 6) is None
    problem = depth_problem(QUICKSTART_SIZES, 12)
    assert "depth 12 (size divisor 2**12)" in problem and "largest scan height is 40 px" in problem
    assert "use depth 6 or less (size divisor 64)" in problem


def test_the_depth_rule_looks_at_the_narrower_side_and_takes_tensors():
    problem = depth_problem(torch.tensor([[500, 20], [300, 12]]), 6)
    assert "largest scan width is 20 px" in problem and "single column" in problem
    assert "use depth 5 or less (size divisor 32)" in problem
    assert "too small for any depth" in depth_problem([(1, 50)], 1)
    assert depth_problem([], 12) is None
    assert largest_sensible_depth([(10**6, 10**6)]) == MAX_DEPTH


def test_check_data_refuses_depth_and_divisor_out_of_bounds(folder, capsys):
    for option, value, expected in [
        ("--depth", "40", "--depth must be 1 to 16"),
        ("--depth", "0", "--depth must be 1 to 16"),
        ("--divisor", "0", "--divisor must be 1 to 65,536"),
        ("--divisor", "70000", "--divisor must be 1 to 65,536"),
    ]:
        with pytest.raises(SystemExit) as exit_:
            main_check_data([str(folder), option, value])
        assert exit_.value.code == 2
        assert f"{expected} (" in capsys.readouterr().err


def test_check_data_plot_refuses_a_depth_the_scans_do_not_allow(make_pair, tmp_path, capsys, monkeypatch):
    root = _tiny_folder(make_pair, tmp_path / "data")
    out = tmp_path / "layout.png"

    def no_layout(*args, **kwargs):
        raise AssertionError("batch_layout reached with a depth the scans do not allow")

    with monkeypatch.context() as patch:
        patch.setattr(layout_plot, "batch_layout", no_layout)
        assert main_check_data([str(root), "--plot", str(out), "--depth", "12"]) == 1
        err = capsys.readouterr().err
        assert f"check_data: cannot draw {out}: --depth: depth 12 (size divisor 2**12) is too deep" in err
        assert "use depth 4 or less (size divisor 16)" in err and not out.exists()
        assert main_check_data([str(root), "--plot", str(out)]) == 1  # the default 5: 2**4 = 16, not below 16
    assert main_check_data([str(root), "--plot", str(out), "--depth", "4"]) == 0 and out.is_file()
    assert main_check_data([str(root), "--plot", str(out), "--divisor", "64"]) == 0  # a divisor is taken as given


def test_a_picture_too_large_to_draw_is_refused_before_allocating(tmp_path):
    layout = layout_plot.batch_layout([(12, 20), (16, 9), (7, 30)], batch_size=1, divisor=2**16, val_fraction=None)
    with pytest.raises(ValueError, match=r"at 1:1 would be 66,000 x 196,754 px, more than 64,000,000 pixels"):
        layout_plot.draw_batch_layout(layout, 3, scale=1)


# -- 2. the ignore index is no class id ---------------------------------------------------------------------------
def test_an_ignore_index_that_is_a_class_id_is_refused_naming_both_keys():
    for index, classes in [(1, 2), (0, 2), (4, 5)]:
        expected = rf"data.ignore_index and model.num_classes: .*found data.ignore_index {index}, so class {index}"
        with pytest.raises(ConfigError, match=expected):
            resolve({"data": {"ignore_index": index}, "model": {"num_classes": classes}})
    for index, classes in [(2, 2), (-1, 2), (255, 2), (255, 300)]:
        assert resolve({"data": {"ignore_index": index}, "model": {"num_classes": classes}}).data.ignore_index == index


# -- 3. an error names the override that set the bad value, not the file -------------------------------------------
@pytest.fixture
def config_file(tmp_path):
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump({"train": {"epochs": 2}, "data": {"dataset": {"args": {"root": "scans"}}}}))
    return path


@pytest.mark.parametrize(
    "override, message",
    [
        ("train.lr=abc", r"train.lr: expected float or int, found str 'abc'"),
        ("train.lr=-1", r"train.lr: expected a positive number, found -1"),
        ("model.depth=40", r"model.depth: expected an integer <= 16"),
        ("data.ignore_index=1", r"data.ignore_index and model.num_classes"),
        ("data.batch_size=null", r"data.batch_size and data.max_pixels: set exactly one"),
        ("data={batch_size: 0}", r"data.batch_size: expected an integer >= 1"),
        ("data.augment.noise=-.inf", r"data.augment.noise: expected a finite number"),
        ("data.dataset.args.root.x=1", r"data.dataset.args.root: expected a mapping for data.dataset.args.root.x"),
        ("trian.lr=1", r"Unknown config key 'trian'. Did you mean 'train'"),
    ],
)
def test_an_override_error_names_the_override_not_the_file(config_file, override, message):
    with pytest.raises(ConfigError) as caught:
        load_config(config_file, ["run.seed=3", override])
    text = str(caught.value)
    assert text.startswith(f"Override '{override}': ") and str(config_file) not in text
    assert caught.value.override == override
    assert re.search(message, text), text


def test_a_bad_value_from_the_file_still_names_the_file(tmp_path):
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump({"train": {"lr": -1}, "data": {"ignore_index": 0}}))
    with pytest.raises(ConfigError, match=rf"^{path}: train.lr: expected a positive number") as caught:
        load_config(path, ["train.epochs=3", "model.depth=4"])
    assert caught.value.override is None
    with pytest.raises(ConfigError, match=rf"^{path}: data.ignore_index and model.num_classes"):
        load_config(path, ["train.lr=0.01"])
    assert load_config(path, ["train.lr=0.01", "data.ignore_index=255"]).data.ignore_index == 255
    path.write_text("train: {lr: abc}\n")
    with pytest.raises(ConfigError, match=rf"^{path}: train.lr: expected float or int"):
        load_config(path, ["train.epochs=3"])


def test_the_last_override_of_a_key_is_blamed():
    with pytest.raises(ConfigError, match=r"^Override 'train=\{lr: -2\}': train.lr: expected a positive number"):
        resolve({}, ["train.lr=-1", "train={lr: -2}", "run.seed=1"])
    assert resolve({"train": {"lr": -1}}, ["train.lr=0.5"]).train.lr == 0.5  # an override may mend the file


# -- 4. --plot onto a read-only file system --------------------------------------------------------------------------
def test_a_failed_cleanup_never_hides_the_error_that_stopped_the_write(tmp_path, monkeypatch):
    def unlink(self, missing_ok=False):
        raise OSError(errno.EROFS, "Read-only file system", str(self))

    def write(f):
        raise RuntimeError("the real error")

    monkeypatch.setattr(Path, "unlink", unlink)
    with pytest.raises(RuntimeError, match="the real error") as caught:
        atomic_write(tmp_path / "x.bin", write)
    assert not isinstance(caught.value.__context__, OSError)


def test_check_data_plot_onto_a_read_only_file_system_is_one_line_and_exit_1(make_pair, tmp_path, capsys):
    root = _tiny_folder(make_pair, tmp_path / "data")
    with read_only_tmpfs(tmp_path / "ro") as ro:
        for out in (ro / "layout.png", ro / "pictures" / "layout.png"):
            assert main_check_data([str(root), "--plot", str(out), "--depth", "3"]) == 1
            err = capsys.readouterr().err
            assert err == f"check_data: cannot write {out}: Read-only file system; choose a --plot path you can write\n"
            assert not out.exists()
