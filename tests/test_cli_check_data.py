"""srforge-check-data, the command (srforge.cli.check_data): depth and divisor bounds, a --plot the scans do not
allow or a read-only file system refused in one line, the divisor taken from the configured model.
"""

import contextlib
import os
import subprocess
from pathlib import Path

import pytest
from helpers import labels, rgb, scan_folder
from test_model_create import _config_file

import srforge.data.layout_plot as layout_plot
from srforge.cli import main_check_data


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


def test_check_data_plot_onto_a_read_only_file_system_is_one_line_and_exit_1(make_pair, tmp_path, capsys):
    root = _tiny_folder(make_pair, tmp_path / "data")
    with read_only_tmpfs(tmp_path / "ro") as ro:
        for out in (ro / "layout.png", ro / "pictures" / "layout.png"):
            assert main_check_data([str(root), "--plot", str(out), "--depth", "3"]) == 1
            err = capsys.readouterr().err
            assert err == f"check_data: cannot write {out}: Read-only file system; choose a --plot path you can write\n"
            assert not out.exists()


def test_check_data_takes_the_divisor_from_the_configured_model(tmp_path, monkeypatch):
    from srforge.data import layout_plot

    root = scan_folder(tmp_path / "data", n=4)
    seen = []
    real = layout_plot.batch_layout
    monkeypatch.setattr(layout_plot, "batch_layout", lambda *a, **k: seen.append(k) or real(*a, **k))
    config = _config_file(tmp_path / "cfg", tmp_path / "run", root)
    out = tmp_path / "layout.png"
    assert main_check_data([str(root), "--config", str(config), "--plot", str(out)]) == 0
    assert seen[-1]["divisor"] == 4 and seen[-1]["batch_size"] == 3 and out.is_file()
    assert main_check_data([str(root), "--config", str(config), "--plot", str(out), "--divisor", "8"]) == 0
    assert seen[-1]["divisor"] == 8


def test_check_data_reports_every_problem_of_an_export_at_once_and_plots_its_masks(tmp_path, capsys):
    import json

    from annotation_exports import CLASSES, write_coco, write_labelme

    classes = ",".join(CLASSES)
    root = write_labelme(tmp_path / "lm")
    assert (
        main_check_data([str(root), "--format", "labelme", "--classes", classes, "--plot", str(tmp_path / "p.png")])
        == 0
    )
    assert (tmp_path / "p.png").is_file() and "2 annotated scans checked, 0 problem(s)" in capsys.readouterr().out
    coco = write_coco(tmp_path / "coco")
    doc = json.loads(coco.read_text())
    doc["images"].append({"id": 3, "file_name": "a.png", "height": 12, "width": 16})
    doc["images"].append({"id": 4, "file_name": "gone.png", "height": 5, "width": 5})
    doc["images"][1]["width"] = 15
    doc["categories"].append({"id": 9, "name": "weird"})
    more = [
        [1, 1, [[0, 0, 4, 4, 8, 8]]],
        [7, 1, [[0, 0, 4, 0, 4, 4]]],
        [1, 9, [[0, 0, 4, 0, 4, 4]]],
        [1, 1, [[0, 0, 99, 0, 4, 4]]],
    ]
    doc["annotations"] += [
        {"id": 20 + i, "image_id": im, "category_id": c, "segmentation": s} for i, (im, c, s) in enumerate(more)
    ]
    coco.write_text(json.dumps(doc))
    assert main_check_data([str(coco), "--format", "coco", "--classes", classes]) == 1
    err = capsys.readouterr().err
    for expected in [
        "image 'a.png' is listed twice (ids 1 and 3)",
        "image 'gone.png' (id 4): no file at",
        "annotation 5 (id 21) points at image id 7, which the file does not list",
        "annotation 6 (id 22, 'weird'): label 'weird' is no class",
        "annotation 4 (id 20, 'region'): degenerate polygon: 3 point(s), area 0",
        "annotation 7 (id 23, 'region'): point (99, 0) is outside the 16 x 12 (W x H) image",
        "states image 'b' is 10 x 15 (H x W) but",
    ]:
        assert expected in err, expected
    with pytest.raises(SystemExit) as stop:  # no classes: a usage error
        main_check_data([str(coco), "--format", "coco"])
    assert stop.value.code == 2 and "give --classes" in capsys.readouterr().err
