"""SegmentationFolder, header sizes and their cache, and every bad input named clearly."""

import json

import numpy as np
import pytest
import torch
from helpers import labels, rgb, write
from PIL import Image

import srforge.data.datasets as datasets
import srforge.data.sizes as sizes
from srforge.cli import main_check_data
from srforge.data.datasets import SegmentationFolder, check_folder
from srforge.data.entry import Entry
from srforge.data.images import DataError
from srforge.data.sizes import measure_sizes


def test_items_keep_natural_shape_and_exact_pixels(folder):
    ds = SegmentationFolder(folder)
    assert len(ds) == 3 and ds.names == ["scan_0", "scan_1", "scan_2"]
    for i, (h, w) in enumerate([(12, 20), (16, 9), (7, 30)]):
        entry = ds[i]
        assert isinstance(entry, Entry) and entry.name == f"scan_{i}"
        assert entry.image.dtype == torch.uint8 and entry.image.shape == (3, h, w)
        assert entry.mask.dtype == torch.uint8 and entry.mask.shape == (h, w)  # 8-bit mask files
        assert torch.equal(entry.image, torch.from_numpy(rgb(h, w, i)).permute(2, 0, 1))
        assert torch.equal(entry.mask, torch.from_numpy(labels(h, w, seed=i)).long())


@pytest.mark.parametrize("suffix", [".png", ".bmp", ".tif", ".tiff"])
def test_lossless_formats_read_exactly(make_pair, suffix):
    image = rgb(9, 11)
    ds = SegmentationFolder(make_pair("a", image, labels(9, 11), image_suffix=suffix))
    assert torch.equal(ds[0].image, torch.from_numpy(image).permute(2, 0, 1))


def test_jpeg_image_pairs_with_png_mask_in_subfolder(make_pair):
    smooth = np.tile(np.linspace(0, 255, 16, dtype=np.uint8)[None, :, None], (8, 1, 3))
    ds = SegmentationFolder(make_pair("well/a", smooth, labels(8, 16), image_suffix=".jpg"))
    assert ds.names == ["well/a"]
    assert (ds[0].image.int() - torch.from_numpy(smooth).permute(2, 0, 1).int()).abs().float().mean() < 8


def test_modes_are_converted(make_pair, tmp_path):
    gray = np.arange(60, dtype=np.uint8).reshape(6, 10) * 4
    rgba = np.dstack([rgb(6, 10), np.full((6, 10), 7, np.uint8)])
    palette_idx = (np.arange(60).reshape(6, 10) % 3).astype(np.uint8)
    make_pair("gray", gray, labels(6, 10))
    make_pair("rgba", rgba, labels(6, 10))
    write(tmp_path / "images" / "pal.png", palette_idx, "P", palette=[10, 20, 30, 40, 50, 60, 70, 80, 90] + [0] * 759)
    write(tmp_path / "masks" / "pal.png", labels(6, 10))
    ds = SegmentationFolder(tmp_path)
    by_name = {ds.names[i]: ds[i].image for i in range(len(ds))}
    assert torch.equal(by_name["gray"], torch.from_numpy(gray)[None].expand(3, -1, -1))
    assert torch.equal(by_name["rgba"], torch.from_numpy(rgba[..., :3]).permute(2, 0, 1))
    assert by_name["pal"][:, 0, 1].tolist() == [40, 50, 60]  # index 1 -> second palette colour
    assert SegmentationFolder(tmp_path, image_mode="L")[0].image.shape == (1, 6, 10)


@pytest.mark.parametrize("suffix", [".png", ".tif"])
def test_16bit_images_scale_to_8bit(make_pair, suffix):
    raw = (np.arange(40, dtype=np.uint16).reshape(5, 8) * 257 * 6).astype(np.uint16)
    raw[0, 0] = 65535
    ds = SegmentationFolder(make_pair("deep", raw, labels(5, 8), image_suffix=suffix))
    image = ds[0].image
    assert image.dtype == torch.uint8 and image.shape == (3, 5, 8)
    expected = torch.from_numpy((raw.astype(np.int64) // 257).astype(np.uint8))
    expected[0, 0] = 255
    assert torch.equal(image[0], expected)


def test_palette_mask_gives_indices_and_ignore_index_stays(make_pair, tmp_path):
    idx = labels(6, 7)
    idx[0, :] = 255
    make_pair("a", rgb(6, 7), None)
    write(tmp_path / "masks" / "a.png", idx, "P", palette=[200, 0, 0] * 256)  # every index the same colour
    mask = SegmentationFolder(tmp_path, num_classes=3)[0].mask
    assert torch.equal(mask, torch.from_numpy(idx).long())


def test_missing_partners_are_all_listed(make_pair, tmp_path):
    for name in ["a", "b", "c"]:
        make_pair(name, rgb(4, 4), labels(4, 4))
    (tmp_path / "masks" / "a.png").unlink()
    (tmp_path / "masks" / "b.png").unlink()
    write(tmp_path / "masks" / "orphan.png", labels(4, 4))
    with pytest.raises(DataError) as info:
        SegmentationFolder(tmp_path)
    message = str(info.value)
    for part in ["images/a.png", "images/b.png", "masks/orphan.png", "3 unpaired"]:
        assert part in message


def test_size_mismatch_names_both_sizes(make_pair):
    ds = SegmentationFolder(make_pair("a", rgb(5, 6), labels(5, 7)))
    with pytest.raises(DataError, match=r"masks/a.png.*\(5, 7\).*\(5, 6\)"):
        ds[0]


def test_mask_values_out_of_range_are_listed(make_pair):
    mask = labels(5, 6)
    mask[0, 0], mask[0, 1], mask[0, 2] = 7, 9, 255
    ds = SegmentationFolder(make_pair("a", rgb(5, 6), mask), num_classes=3)
    with pytest.raises(DataError, match=r"masks/a.png.*\[7, 9\]"):
        ds[0]
    assert SegmentationFolder(ds.root, num_classes=10)[0].mask[0, 2] == 255


@pytest.mark.parametrize("damage", ["empty", "garbage", "truncated"])
def test_damaged_file_names_the_path(make_pair, tmp_path, damage):
    root = make_pair("a", rgb(20, 20), labels(20, 20))
    path = tmp_path / "images" / "a.png"
    data = path.read_bytes()
    path.write_bytes({"empty": b"", "garbage": b"not an image at all", "truncated": data[: len(data) // 2]}[damage])
    with pytest.raises(DataError, match=str(path)):
        SegmentationFolder(root)[0]
    count, problems = check_folder(root)
    assert count == 1 and len(problems) == 1 and str(path) in problems[0]


def test_decompression_bomb_says_how_to_raise_the_limit(make_pair, monkeypatch):
    root = make_pair("big", rgb(20, 20), labels(20, 20))
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 150)  # 400 px: over 2x the limit
    with pytest.raises(DataError, match="MAX_IMAGE_PIXELS") as info:
        SegmentationFolder(root)[0]
    assert "images/big.png" in str(info.value)
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 300)  # between 1x and 2x: PIL only warns, we refuse
    with pytest.raises(DataError, match="MAX_IMAGE_PIXELS"):
        SegmentationFolder(root).sizes()


def test_empty_folder_names_folder_and_layout(tmp_path):
    (tmp_path / "images").mkdir()
    (tmp_path / "masks").mkdir()
    with pytest.raises(DataError, match="expected layout") as info:
        SegmentationFolder(tmp_path)
    assert str(tmp_path / "images") in str(info.value)
    with pytest.raises(DataError, match="expected layout"):
        SegmentationFolder(tmp_path / "nowhere")


def test_sizes_from_headers_then_cache(folder, monkeypatch):
    calls = []
    real_read_size = sizes.read_size
    monkeypatch.setattr(sizes, "read_size", lambda p: calls.append(p) or real_read_size(p))
    monkeypatch.setattr(Image.Image, "load", lambda self: pytest.fail("sizes() decoded pixels"))
    expected = [(12, 20), (16, 9), (7, 30)]
    assert SegmentationFolder(folder).sizes() == expected and len(calls) == 3
    index = json.loads((folder / datasets.SIZES_FILE).read_text())["entries"]
    assert index["images/scan_1.png"][:2] == [16, 9]
    calls.clear()
    assert SegmentationFolder(folder).sizes() == expected and calls == []  # all from the cache
    monkeypatch.undo()
    write(folder / "images" / "scan_1.png", rgb(17, 5))  # replaced with a new size
    write(folder / "masks" / "scan_1.png", labels(17, 5))
    calls.clear()
    monkeypatch.setattr(sizes, "read_size", lambda p: calls.append(p) or real_read_size(p))
    assert SegmentationFolder(folder).sizes() == [(12, 20), (17, 5), (7, 30)]
    assert [p.name for p in calls] == ["scan_1.png"]


def test_sizes_without_writable_root(folder, monkeypatch):
    def refuse(*args):
        raise PermissionError("read-only file system")

    monkeypatch.setattr(sizes.os, "replace", refuse)
    assert SegmentationFolder(folder).sizes() == [(12, 20), (16, 9), (7, 30)]
    assert not (folder / datasets.SIZES_FILE).exists()
    assert list(folder.glob(".srforge_sizes*")) == []  # no temporary left behind


def test_measure_sizes_ignores_damaged_cache(folder):
    cache = folder / "index.json"
    cache.write_text("{not json")
    paths = sorted((folder / "images").glob("*.png"))
    assert measure_sizes(paths, cache) == [(12, 20), (16, 9), (7, 30)]
    assert json.loads(cache.read_text())["version"] == sizes.CACHE_VERSION


def test_check_data_reports_everything_at_once(make_pair, tmp_path, capsys):
    make_pair("good", rgb(5, 5), labels(5, 5))
    assert main_check_data([str(tmp_path), "--num-classes", "3"]) == 0
    make_pair("mismatch", rgb(5, 5), labels(6, 5))
    bad_values = labels(5, 5)
    bad_values[1, 1] = 5
    make_pair("values", rgb(5, 5), bad_values)
    make_pair("lonely", rgb(5, 5), None)
    (tmp_path / "images" / "corrupt.png").write_bytes(b"\x89PNG broken")
    write(tmp_path / "masks" / "corrupt.png", labels(5, 5))
    assert main_check_data([str(tmp_path), "--num-classes", "3"]) == 1
    err = capsys.readouterr().err
    for part in ["lonely.png: no mask", "masks/mismatch.png", "[5]", "images/corrupt.png"]:
        assert part in err
    assert len(err.strip().splitlines()) == 4


def test_transform_is_applied(folder):
    ds = SegmentationFolder(folder, transform=lambda e: Entry(**e, flag=True))
    assert ds[0].flag is True and "flag" not in ds.load(0)


def test_check_data_reports_a_name_clash_and_every_other_problem(make_pair, tmp_path, capsys):
    make_pair("dup", rgb(5, 5), labels(5, 5))
    write(tmp_path / "images" / "dup.jpg", rgb(5, 5))  # the same scan name as dup.png
    make_pair("mismatch", rgb(5, 5), labels(6, 5))
    bad_values = labels(5, 5)
    bad_values[1, 1] = 5
    make_pair("values", rgb(5, 5), bad_values)
    make_pair("lonely", rgb(5, 5), None)
    write(tmp_path / "masks" / "orphan.png", labels(5, 5))
    assert main_check_data([str(tmp_path), "--num-classes", "3"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    expected = ["same name 'dup'", "masks/mismatch.png", "[5]", "lonely.png: no mask", "orphan.png: no image"]
    assert all(any(part in line for line in err) for part in expected), err
    assert len(err) == len(expected)


def test_check_data_refuses_a_class_count_below_one(folder, capsys):
    with pytest.raises(SystemExit) as exit_:
        main_check_data([str(folder), "--num-classes", "0"])
    assert exit_.value.code == 2 and "--num-classes must be >= 1, found 0" in capsys.readouterr().err


def _folder(root, masks: dict, image_suffix=".png", mask_suffix=".png"):
    from PIL import Image

    for name, mask in masks.items():
        (root / "images").mkdir(parents=True, exist_ok=True)
        (root / "masks").mkdir(parents=True, exist_ok=True)
        Image.fromarray(np.full((*mask.shape, 3), 128, np.uint8)).save(root / "images" / f"{name}{image_suffix}")
        Image.fromarray(mask).save(root / "masks" / f"{name}{mask_suffix}")
    return root


def test_check_data_reports_masks_saved_as_0_and_255(tmp_path):
    from srforge.data.datasets import check_folder

    mask = np.zeros((8, 16), np.uint8)
    mask[4, 2:14] = 255
    count, problems = check_folder(_folder(tmp_path / "a", {"s0": mask, "s1": mask}), num_classes=2)
    assert count == 2 and len(problems) == 1 and "every mask holds only 0 and 255" in problems[0]
    mixed = {"s0": mask, "s1": np.where(mask == 255, 1, 0).astype(np.uint8)}  # one mask with a real class: fine
    assert check_folder(_folder(tmp_path / "b", mixed), num_classes=2) == (2, [])


def test_jpeg_masks_and_multi_page_tiffs_are_reported(tmp_path):
    from PIL import Image

    from srforge.data.datasets import check_folder
    from srforge.data.images import DataWarning, read_image

    mask = np.zeros((8, 16), np.uint8)
    mask[4, 2:14] = 1
    count, problems = check_folder(_folder(tmp_path / "j", {"s0": mask}, mask_suffix=".jpg"), num_classes=2)
    assert any("a JPEG mask is lossy" in p and "s0.jpg" in p for p in problems), problems
    pages = [Image.fromarray(np.full((8, 16, 3), v, np.uint8)) for v in (10, 200)]
    pages[0].save(tmp_path / "two.tif", save_all=True, append_images=pages[1:])
    with pytest.warns(DataWarning, match=r"two.tif: has 2 pages; srforge reads the first one only"):
        assert int(read_image(tmp_path / "two.tif")[0, 0, 0]) == 10
