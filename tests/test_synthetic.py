"""Synthetic well-log scans: deterministic, in range, masks exact and aligned, readable as a folder."""

import numpy as np
import pytest

from srforge.cli import main_make_synthetic
from srforge.data.datasets import SegmentationFolder, check_folder
from srforge.data.synthetic import make_welllog_scans, welllog_scan

SMALL = 1 / 16


def _bytes(root):
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*.png"))}


def test_same_seed_same_bytes_other_seed_differs(tmp_path):
    a = _bytes(make_welllog_scans(tmp_path / "a", 3, scale=SMALL, seed=5)[0].parents[1])
    b = _bytes(make_welllog_scans(tmp_path / "b", 3, scale=SMALL, seed=5, workers=2)[0].parents[1])
    c = _bytes(make_welllog_scans(tmp_path / "c", 3, scale=SMALL, seed=6)[0].parents[1])
    assert len(a) == 6 and a == b
    assert all(a[k] != c[k] for k in a)


def test_scan_i_does_not_depend_on_n(tmp_path):
    make_welllog_scans(tmp_path / "one", 1, scale=SMALL)
    make_welllog_scans(tmp_path / "three", 3, scale=SMALL)
    for sub in ("images", "masks"):
        assert (tmp_path / "one" / sub / "scan_00000.png").read_bytes() == (
            tmp_path / "three" / sub / "scan_00000.png"
        ).read_bytes()
    assert not list((tmp_path / "three").rglob("*.tmp"))


@pytest.mark.parametrize("scale", [SMALL, 1 / 8])
def test_sizes_scale(scale):
    for i in range(12):
        image, mask = welllog_scan(i, scale=scale)
        h, w = mask.shape
        assert image.shape == (h, w, 3) and image.dtype == np.uint8
        assert round(480 * scale) <= h <= round(640 * scale) and round(3200 * scale) <= w <= round(12800 * scale)


def test_full_scale_size_range():
    image, mask = welllog_scan(0, scale=1.0)
    assert 480 <= mask.shape[0] <= 640 and 3200 <= mask.shape[1] <= 12800


def test_mask_classes():
    binary = set()
    multi = set()
    for i in range(8):
        binary |= set(np.unique(welllog_scan(i, scale=SMALL)[1]).tolist())
        multi |= set(np.unique(welllog_scan(i, scale=SMALL, classes="multiclass")[1]).tolist())
    assert binary == {0, 1} and multi == {0, 1, 2, 3}
    # The same geometry either way: multiclass only splits the curve class by style.
    a, b = welllog_scan(3, scale=SMALL)[1], welllog_scan(3, scale=SMALL, classes="multiclass")[1]
    assert np.array_equal(a > 0, b > 0)
    with pytest.raises(ValueError, match="classes"):
        welllog_scan(0, classes="rainbow")


@pytest.mark.parametrize("scale", [SMALL, 1 / 4])
def test_mask_marks_the_ink(scale):
    for i in range(4):
        image, mask = welllog_scan(i, scale=scale)
        gray = image.astype(float).mean(axis=2)
        curve, paper = gray[mask > 0], gray[mask == 0]
        assert 0.002 < curve.size / gray.size < 0.3
        assert curve.mean() < paper.mean() - 60, (i, curve.mean(), paper.mean())
        # Almost every curve pixel is dark; the background is mostly light.
        assert (curve < 150).mean() > 0.8 and (paper > 150).mean() > 0.75  # borders and grid are dark too


def test_folder_reads_back_and_checks_clean(tmp_path, capsys):
    assert main_make_synthetic([str(tmp_path), "-n", "4", "--scale", str(SMALL), "--classes", "multiclass"]) == 0
    assert "4 scans" in capsys.readouterr().out
    ds = SegmentationFolder(tmp_path, num_classes=4)
    assert len(ds) == 4 and ds.names[0] == "scan_00000"
    assert ds.sizes() == [tuple(ds[i].mask.shape) for i in range(4)]
    assert np.array_equal(ds[2].mask.numpy(), welllog_scan(2, scale=SMALL, classes="multiclass")[1])
    assert check_folder(tmp_path, num_classes=4) == (4, [])


def test_bytes_do_not_depend_on_the_number_of_workers(tmp_path):
    one = _bytes(make_welllog_scans(tmp_path / "one", 5, scale=SMALL, seed=2, workers=1)[0].parents[1])
    three = _bytes(make_welllog_scans(tmp_path / "three", 5, scale=SMALL, seed=2, workers=3)[0].parents[1])
    default = _bytes(make_welllog_scans(tmp_path / "default", 5, scale=SMALL, seed=2)[0].parents[1])  # CPU count
    assert len(one) == 10 and one == three == default


def test_only_missing_completes_a_set_cut_short(tmp_path):
    from srforge.data.synthetic import missing_scans

    full = _bytes(make_welllog_scans(tmp_path / "full", 4, scale=SMALL, workers=1)[0].parents[1])
    cut = tmp_path / "cut"
    make_welllog_scans(cut, 4, scale=SMALL, workers=1)
    (cut / "masks" / "scan_00001.png").unlink()  # as a kill between the mask and the image of scan 1 would not
    (cut / "images" / "scan_00003.png").unlink()  # leave it (mask first), but any pair lacking a file is redone
    kept = (cut / "images" / "scan_00000.png").stat().st_mtime_ns
    assert missing_scans(cut, 4) == [1, 3] and missing_scans(cut, 5) == [1, 3, 4]
    make_welllog_scans(cut, 4, scale=SMALL, workers=2, only_missing=True)
    assert missing_scans(cut, 4) == [] and _bytes(cut) == full
    assert (cut / "images" / "scan_00000.png").stat().st_mtime_ns == kept  # present scans are not rewritten
