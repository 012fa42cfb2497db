"""srforge.data.annotations: a labelme, a COCO and a CVAT export of one small set give the masks computed by hand
(holes, RLE, an EXIF-turned photo), train to the weights of the equivalent mask folder, read masks from data.cache
keyed by content; malformed files (truncated JSON, an XML entity bomb, absurd coordinates, 10^6 points, unknown
labels) are one clear error naming the file, and make_masks writes nothing then; labelme's own examples (slow,
fetched with pip) train and evaluate."""

import json
import re
import subprocess
import sys
import tarfile
from pathlib import Path

import numpy as np
import pytest
import torch
from annotation_exports import (
    CLASSES,
    expected_masks,
    write_coco,
    write_cvat,
    write_labelme,
    write_mask_folder,
)
from helpers import write

from srforge.cli.make_masks import main_make_masks
from srforge.config import ConfigError, resolve
from srforge.data.annotations import CocoExport, CvatExport, LabelmeExport
from srforge.data.cache import DecodedCache
from srforge.data.images import DataError
from srforge.train import Trainer

MAKERS = {"labelme": write_labelme, "coco": write_coco, "cvat": write_cvat}
CLASSES_OF = {"labelme": "LabelmeExport", "coco": "CocoExport", "cvat": "CvatExport"}


def export(fmt: str, tmp: Path) -> dict:
    """The dataset spec of the small set written in ``fmt`` under ``tmp``."""
    path = MAKERS[fmt](tmp / fmt)
    key = "root" if fmt == "labelme" else "annotations"
    return {"class": f"srforge.data.annotations:{CLASSES_OF[fmt]}", "args": {key: str(path), "classes": CLASSES}}


@pytest.mark.parametrize("fmt", list(MAKERS))
def test_each_export_gives_the_masks_computed_by_hand_at_the_displayed_size(tmp_path, fmt):
    spec = export(fmt, tmp_path)
    dataset = {"labelme": LabelmeExport, "coco": CocoExport, "cvat": CvatExport}[fmt](**spec["args"])
    assert dataset.sizes() == [(12, 16), (14, 10)]  # b is stored 10 x 14, turned by its EXIF orientation
    for i, name in enumerate(["a", "b"]):
        entry = dataset[i]
        assert entry.name == name and entry.mask.dtype == torch.uint8
        assert np.array_equal(entry.mask.numpy(), expected_masks()[name]), name
        assert tuple(entry.image.shape) == (3, *expected_masks()[name].shape)


def _weights(tmp: Path, dataset: dict, cache: Path | None = None) -> dict:
    cfg = resolve(
        {
            "run": {"dir": str(tmp), "seed": 0},
            "data": {"dataset": dataset, "batch_size": 2, "val_fraction": 0.5, "cache": str(cache) if cache else None},
            "model": {"base_channels": 4, "depth": 2, "num_classes": 3, "class_names": CLASSES},
            "train": {"epochs": 2, "lr": 0.01},
        }
    )
    tmp.mkdir(parents=True)
    trainer = Trainer.from_config(cfg)
    trainer.train()
    return trainer.model.state_dict()


@pytest.mark.slow
def test_training_on_each_export_gives_the_weights_of_the_mask_folder(tmp_path):
    folder = write_mask_folder(tmp_path / "folder")
    reference = _weights(
        tmp_path / "run-folder", {"class": "srforge.data:SegmentationFolder", "args": {"root": str(folder)}}
    )
    for fmt in MAKERS:
        cache = tmp_path / f"cache-{fmt}"
        found = _weights(tmp_path / f"run-{fmt}", export(fmt, tmp_path), cache)
        assert all(torch.equal(value, found[name]) for name, value in reference.items()), fmt
        assert len(list(cache.rglob("*.npy"))) == 4  # two images, two masks: epoch 2 read them from the cache


def test_classes_default_to_the_models_class_names_or_the_error_says_to_give_them(tmp_path):
    from srforge.train.from_config import build_data

    spec = export("labelme", tmp_path)
    del spec["args"]["classes"]
    cfg = resolve({"data": {"dataset": spec, "batch_size": 2, "val_fraction": 0.5},
                   "model": {"num_classes": 3, "class_names": CLASSES}})  # fmt: skip
    data = build_data(cfg.data, num_classes=3, seed=0, run_dir=tmp_path, class_names=CLASSES)
    for entry in (data.train[0], data.val[0]):  # mapped by model.class_names: the masks drawn by hand
        assert np.array_equal(entry["mask"].numpy(), expected_masks()[entry["name"]]), entry["name"]
    with pytest.raises(ConfigError, match=r"data\.dataset\.args\.classes: .*LabelmeExport maps its labels"):
        build_data(cfg.data, num_classes=3, seed=0, run_dir=tmp_path, class_names=None)


def test_a_cached_mask_is_keyed_by_the_annotations_content(tmp_path):
    root = write_labelme(tmp_path / "lm")
    cache = DecodedCache(tmp_path / "cache")
    first = LabelmeExport(root, CLASSES, cache=cache)[0].mask
    doc = json.loads((root / "a.json").read_text())
    doc["shapes"] = doc["shapes"][:1]  # the region alone: no hole, no curve
    (root / "a.json").write_text(json.dumps(doc))
    second = LabelmeExport(root, CLASSES, cache=cache)[0].mask
    assert (first == 2).any() and not (second == 2).any() and second[4, 4] == 1
    wider = LabelmeExport(root, CLASSES, cache=cache, line_width=3)  # other rules: another entry, not a stale one
    assert torch.equal(wider[0].mask, second)


def test_rules_ignore_labels_map_unknown_ones_and_widen_lines_per_label(tmp_path):
    root = write_labelme(tmp_path / "lm")
    with pytest.raises(DataError) as error:
        LabelmeExport(root, ["background", "region"])
    assert "a.json: shape 2 (linestrip 'curve'): label 'curve' is no class" in str(error.value)
    ignored = LabelmeExport(root, ["background", "region"], unknown="ignore")[0].mask
    assert np.array_equal(ignored.numpy() == 255, expected_masks()["a"] == 2)
    masked = LabelmeExport(root, CLASSES, ignore=["region"])[0].mask
    assert (masked.numpy() == 255).sum() == (expected_masks()["a"] == 1).sum()
    wide = LabelmeExport(root, CLASSES, line_width={"curve": 3})[0].mask.numpy()
    assert (wide[9:12, 0:12] == 2).all() and (wide[9, 12:14] == 2).all()  # 3 px: rows 9..11, columns 11..13


BOMB = """<?xml version="1.0"?>
<!DOCTYPE lolz [<!ENTITY lol "lol"><!ENTITY lol2 "&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;">
<!ENTITY lol3 "&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;">]>
<annotations><image name="a.png" width="16" height="12"><tag label="&lol3;"/></image></annotations>"""


def _malformed(tmp: Path, case: str) -> tuple[str, Path, str]:
    """(format, the export, what its error says) of a damaged copy of the small set."""
    if case == "entity bomb":
        path = write_cvat(tmp / "cvat")
        path.write_text(BOMB)
        return "cvat", path, "declares a document type"
    if case == "truncated xml":
        path = write_cvat(tmp / "cvat")
        path.write_text(path.read_text()[:300])
        return "cvat", path, "not well-formed XML"
    root = write_labelme(tmp / "lm")
    doc = json.loads((root / "a.json").read_text())
    if case == "truncated json":
        (root / "a.json").write_text(json.dumps(doc)[:100])
        return "labelme", root, "a.json: cannot read as labelme JSON"
    if case == "absurd coordinates":
        doc["shapes"][0]["points"][1] = [1e300, 2]
        message = "a.json: shape 0 (polygon 'region'): coordinate 1e+300 is not a pixel position"
    elif case == "nan":
        doc["shapes"][0]["points"][1] = [float("nan"), 2]
        message = "a.json: shape 0 (polygon 'region'): coordinate nan is not a pixel position"
    else:
        doc["shapes"][2]["points"] = [[i % 16, 10.5] for i in range(10**6)]
        message = "a.json: shape 2 (linestrip 'curve'): 1,000,000 points, expected at most 100,000"
    (root / "a.json").write_text(json.dumps(doc))
    return "labelme", root, message


@pytest.mark.parametrize(
    "case",
    [
        "truncated json",
        "truncated xml",
        "entity bomb",
        "absurd coordinates",
        "nan",
        pytest.param("million", marks=pytest.mark.slow),
    ],
)
def test_a_malformed_export_is_one_clear_error_naming_the_file_and_nothing_is_written(tmp_path, case, capsys):
    fmt, path, message = _malformed(tmp_path, case)
    dataset = LabelmeExport if fmt == "labelme" else CvatExport
    with pytest.raises(DataError, match=re.escape(message)):
        dataset(path, CLASSES)
    out = tmp_path / "out"
    assert main_make_masks([str(path), str(out), "--format", fmt, "--classes", ",".join(CLASSES)]) == 2
    assert message in capsys.readouterr().err and not out.exists()


def test_make_masks_writes_the_folder_srforge_trains_on(tmp_path, capsys):
    from srforge.data import SegmentationFolder

    for fmt in MAKERS:
        out = tmp_path / f"out-{fmt}"
        source = MAKERS[fmt](tmp_path / fmt)
        assert main_make_masks([str(source), str(out), "--format", fmt, "--classes", ",".join(CLASSES)]) == 0
        folder = SegmentationFolder(out)
        assert [np.array_equal(folder[i].mask.numpy(), expected_masks()[folder[i].name]) for i in range(2)] == [1, 1]
        before = (out / "masks" / "a.png").read_bytes()
        assert main_make_masks([str(source), str(out), "--format", fmt, "--classes", "background,region,curve"]) == 2
        assert "would be overwritten" in capsys.readouterr().err and (out / "masks" / "a.png").read_bytes() == before


def _labelme_sdist(tmp: Path) -> Path:
    """labelme's source distribution, unpacked under ``tmp`` (pytest skips, saying why, when pip cannot fetch it)."""
    got = subprocess.run(
        [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:", "labelme", "-d", str(tmp)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    archives = sorted(tmp.glob("labelme-*.tar.gz"))
    if got.returncode or not archives:
        pytest.skip(
            f"cannot fetch labelme's sdist (offline?): {got.stderr.strip().splitlines()[-1:] or got.returncode}"
        )
    with tarfile.open(archives[0]) as tar:
        tar.extractall(tmp / "src", filter="data")
    return tmp / "src"


@pytest.mark.slow
def test_labelmes_own_examples_train_and_evaluate(tmp_path):
    src = _labelme_sdist(tmp_path)
    folders = sorted({p.parent for p in src.rglob("*.json") if '"shapes"' in p.read_text(errors="replace")})
    if not folders:
        pytest.skip(f"labelme's sdist holds no example JSON with shapes ({sorted(p.name for p in src.iterdir())})")
    folder = max(folders, key=lambda f: len(list(f.glob("*.json"))))
    labels = sorted({s["label"] for p in folder.glob("*.json") for s in json.loads(p.read_text())["shapes"]})
    classes = ["_background_", *[label for label in labels if label != "_background_"]]
    dataset = LabelmeExport(folder, classes)
    assert len(dataset) >= 1 and all(int(dataset[i].mask.max()) > 0 for i in range(len(dataset)))
    cfg = resolve(
        {
            "run": {"dir": str(tmp_path / "run"), "seed": 0},
            "data": {
                "dataset": {
                    "class": "srforge.data.annotations:LabelmeExport",
                    "args": {"root": str(folder), "classes": classes},
                },
                "batch_size": 1,
                "val_fraction": 0.0 if len(dataset) < 2 else 0.5,
            },
            "model": {"base_channels": 4, "depth": 2, "num_classes": len(classes), "class_names": classes},
            "train": {"epochs": 1},
        }
    )
    (tmp_path / "run").mkdir()
    Trainer.from_config(cfg).train()
    from srforge.cli import main_evaluate

    args = ["--checkpoint", tmp_path / "run" / "last.pt", "--labels", folder, "--format", "labelme"]
    status = main_evaluate([*map(str, args), "--output", str(tmp_path / "eval"), "--no-progress", "--workers", "0"])
    assert (
        status == 0 and json.loads((tmp_path / "eval" / "metrics.json").read_text())["models"][0]["results"]["scored"]
    )


def _coco_with(tmp: Path, edit) -> Path:
    """The small set as COCO, its document changed by ``edit(document)``."""
    path = write_coco(tmp / "coco")
    document = json.loads(path.read_text())
    edit(document)
    path.write_text(json.dumps(document))
    return path


def _cvat_with(tmp: Path, old: str, new: str) -> Path:
    """The small set as CVAT, with ``old`` in its XML replaced by ``new``."""
    path = write_cvat(tmp / "cvat")
    text = path.read_text()
    assert old in text
    path.write_text(text.replace(old, new))
    return path


@pytest.mark.parametrize("name", ["../../a.png", "ABSOLUTE", "x//a.png"])
def test_an_image_name_outside_the_images_folder_is_refused_and_make_masks_writes_nothing(tmp_path, name, capsys):
    name = str(tmp_path / "a.png") if name == "ABSOLUTE" else name
    reason = {"../../a.png": "'..' component", "x//a.png": "empty path component"}.get(name, "absolute path")

    def rename(document):
        document["images"][0]["file_name"] = name

    coco = _coco_with(tmp_path, rename)
    cvat = _cvat_with(tmp_path, 'name="a.png"', f'name="{name}"')
    write(tmp_path / "a.png", np.zeros((12, 16, 3), np.uint8))  # what ../../a.png and the absolute name point at
    before = sorted(p for p in tmp_path.rglob("*"))
    for fmt, path, entry in (("coco", coco, "image entry id 1"), ("cvat", cvat, "<image> id '0'")):
        message = f"{path}: {entry}: " + (f"file_name {name!r}" if fmt == "coco" else f"name {name!r}")
        with pytest.raises(
            DataError, match=re.escape(f"{message} is no relative path under the images folder ({reason})")
        ):
            (CocoExport if fmt == "coco" else CvatExport)(path, CLASSES)
        out = tmp_path / "deep" / "out"
        assert main_make_masks([str(path), str(out), "--format", fmt, "--classes", ",".join(CLASSES)]) == 2
        assert message in capsys.readouterr().err
    assert sorted(p for p in tmp_path.rglob("*")) == before  # nothing written anywhere


def test_make_masks_refuses_a_target_that_resolves_outside_out(tmp_path):
    from types import SimpleNamespace

    from srforge.cli.make_masks import _targets
    from srforge.data.annotations import Scan

    out = tmp_path / "out"
    escaping = SimpleNamespace(scans=[Scan("../../evil", "export.json", None, b"", None, [])])
    with pytest.raises(DataError, match=r"export.json: scan '../../evil' would be written to .*outside"):
        _targets(escaping, out)
    (tmp_path / "elsewhere").mkdir()
    out.mkdir()
    (out / "masks").symlink_to(tmp_path / "elsewhere")  # a link already in OUT leads out of it
    with pytest.raises(DataError, match=r"scan 'a' would be written to .*masks/a.png.*outside"):
        _targets(SimpleNamespace(scans=[Scan("a", "export.json", None, b"", None, [])]), out)
    inside = _targets(SimpleNamespace(scans=[Scan("sub/a", "export.json", None, b"", None, [])]), tmp_path / "o2")
    assert inside == [(tmp_path / "o2" / "images" / "sub/a.png", tmp_path / "o2" / "masks" / "sub/a.png")]


BIG_RLE = {"size": [50000, 50000], "counts": [0, 2500000000]}


@pytest.mark.parametrize(
    "segmentation, found",
    [
        ({"size": [12, 16], "counts": [0, 2**70]}, f"run length {2**70} is not an integer in [0, 12 x 16 = 192]"),
        ({"size": [12, 16], "counts": [5, -5, 192]}, "run length -5 is not an integer in [0, 12 x 16 = 192]"),
        ({"size": [12, 16], "counts": "0" + "o" * 20}, "count 1 runs past 13 characters"),
        ({"size": [12, 16], "counts": "1\u00e9"}, "character '\u00e9' at position 1 is not in COCO's RLE alphabet"),
    ],
)
def test_a_coco_rle_out_of_bounds_is_a_problem_naming_the_file_and_annotation(tmp_path, segmentation, found):
    def damage(document):
        document["annotations"][1]["segmentation"] = segmentation

    path = _coco_with(tmp_path, damage)
    with pytest.raises(DataError, match=re.escape(f"{path}: annotation 1 (id 2, 'curve'): ") + ".*" + re.escape(found)):
        CocoExport(path, CLASSES)


def test_a_coco_rle_without_a_stated_size_is_held_to_pils_pixel_limit(tmp_path):
    def damage(document):
        del document["images"][0]["height"]
        document["annotations"][1]["segmentation"] = BIG_RLE

    path = _coco_with(tmp_path, damage)
    message = "annotation 1 (id 2, 'curve'): run-length size 50000 x 50000 (H x W) is no image srforge reads"
    with pytest.raises(DataError, match=re.escape(message)):
        CocoExport(path, CLASSES)


@pytest.mark.parametrize(
    "attributes, found",
    [
        ('rle="0,99999999999999999999999"', "run length 99999999999999999999999 is not an integer in [0, 3 x 5 = 15]"),
        ('rle="0,15" left="inf"', "a mask needs finite numbers left, top, width, height, found {'left': 'inf'"),
        ('rle="0,2500000000" width="50000" height="50000"', "its 50000 x 50000 (W x H) mask box is larger than"),
    ],
)
def test_a_cvat_mask_out_of_bounds_is_a_problem_naming_the_file_and_shape(tmp_path, attributes, found):
    path = write_cvat(tmp_path / "cvat")
    text = path.read_text()
    start = text.index("<mask ")
    end = text.index("/>", start)
    mask = '<mask label="region" occluded="0" rle="0,15" left="8" top="6" width="5" height="3" z_order="0"'
    for attribute in attributes.split('" '):
        key, value = attribute.rstrip('"').split('="')
        mask = re.sub(rf' {key}="[^"]*"', f' {key}="{value}"', mask)
    path.write_text(text[:start] + mask + text[end:])
    message = f"{path}: image 'b.png': shape 1 (<mask> 'region'): {found}"
    with pytest.raises(DataError, match=re.escape(message)):
        CvatExport(path, CLASSES)


@pytest.mark.parametrize("rotation", ["nan", "inf", "abc"])
def test_a_cvat_box_rotation_must_be_a_finite_number_and_check_data_collects_it(tmp_path, rotation):
    from srforge.data.annotations.check import check_export

    path = _cvat_with(tmp_path, 'ybr="6"', f'ybr="6" rotation="{rotation}"')
    message = f"{path}: image 'b.png': shape 0 (<box> 'region'): expected a finite number in 'rotation', found "
    with pytest.raises(DataError, match=re.escape(f"{message}{rotation!r}")):
        CvatExport(path, CLASSES)
    dataset, problems = check_export("cvat", path, {"classes": CLASSES})
    assert problems == [f"{message}{rotation!r}"]


def test_a_turned_cvat_box_is_checked_where_it_is_drawn(tmp_path):
    # The box (0, 0)-(2**20, 2**20) is within the coordinate bound; turned 45 degrees about its centre its corners
    # reach 2**19 * (1 + sqrt 2) ~ 1.27e6, past it.
    path = _cvat_with(
        tmp_path, 'xtl="1" ytl="2" xbr="5" ybr="6"', f'xtl="0" ytl="0" xbr="{2**20}" ybr="{2**20}" rotation="45"'
    )
    message = f"{path}: image 'b.png': shape 0 (<box> 'region') turned 45 degrees: coordinate "
    with pytest.raises(DataError, match=re.escape(message)):
        CvatExport(path, CLASSES)


def test_a_coordinate_out_of_bounds_is_reported_by_its_value():
    from srforge.data.annotations.shapes import check_points

    with pytest.raises(ValueError, match=re.escape("here: coordinate 5e+06 is not a pixel position")):
        check_points([[1, 5e6]], "here")
    with pytest.raises(ValueError, match=re.escape("here: coordinate -3e+06 is not a pixel position")):
        check_points([[0, 1], [2, 3], [-3e6, 7]], "here")


def test_check_data_collects_a_shape_that_passed_its_reader_but_cannot_be_drawn(tmp_path):
    from srforge.data.annotations.check import scan_problems
    from srforge.data.annotations.cvat import read_cvat
    from srforge.data.annotations.dataset import AnnotatedScans, export_rules

    scans, problems = read_cvat(write_cvat(tmp_path / "cvat"))
    assert problems == []
    scans[0].shapes[0].parts = [np.full((4, 2), np.nan)]  # a reader's gap: drawing it fails on NaN
    dataset = AnnotatedScans(scans, export_rules({"classes": CLASSES}, "cvat"))
    found = scan_problems(dataset, 0, None)
    assert len(found) == 1 and found[0].startswith(f"{scans[0].file}: scan 'a': its mask cannot be drawn (ValueError: ")
    assert scan_problems(dataset, 1, None) == []
