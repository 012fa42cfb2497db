"""srforge-evaluate end to end on tiny scans: checkpoint mode scores what predict.py writes (folder and zip alike),
the predictions-folder mode with missing and wrong-size predictions, --compare, bad input with a clear error, and
(slow) two torchrun processes giving the metrics.json of one."""

import csv
import io
import json
import os
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import labels, rgb, run_once_more_after_native_abort, write
from PIL import Image
from predict_fixtures import one_thread, png, random_checkpoint, write_zip  # noqa: F401
from test_cli_predict import _labelled

from srforge.cli import main_evaluate
from srforge.evaluate.metrics import figures
from srforge.predict.predictor import Predictor

ROOT = Path(__file__).resolve().parents[1]
SIZES = [(9, 14), (12, 30), (7, 9), (10, 21), (13, 40), (8, 17)]
pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return random_checkpoint(tmp_path_factory.mktemp("ckpt") / "a.pt")


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    """A labelled folder of six scans (one in sub/), masks with all three classes and some ignored pixels."""
    root = tmp_path_factory.mktemp("data")
    for i, (h, w) in enumerate(SIZES):
        name = f"{'sub/' if i == 2 else ''}s{i}"
        write(root / "images" / f"{name}.png", rgb(h, w, i))
        mask = labels(h, w, 3, i)
        mask[0, 0] = 255
        write(root / "masks" / f"{name}.png", mask)
    return root


def evaluate(*args) -> int:
    return main_evaluate([*map(str, args), "--no-progress", "--workers", "0"])


def metrics(out: Path) -> dict:
    return json.loads((out / "metrics.json").read_text())


def scans(out: Path) -> list[dict]:
    return list(csv.DictReader(io.StringIO((out / "scans.csv").read_text())))


def expected_confusion(ckpt, root: Path) -> np.ndarray:
    """The pooled confusion of what Predictor predicts for every scan of ``root``, counted by numpy."""
    predictor = Predictor.from_checkpoint(ckpt, device="cpu")
    total = np.zeros((3, 3), np.int64)
    for path in sorted((root / "images").rglob("*.png")):
        image = torch.from_numpy(np.asarray(Image.open(path).convert("RGB")).copy()).permute(2, 0, 1)
        (pred,) = predictor.predict([image])
        truth = np.asarray(Image.open(root / "masks" / path.relative_to(root / "images")))
        keep = truth != 255
        np.add.at(total, (truth[keep].astype(int), pred.numpy()[keep]), 1)
    return total


def test_checkpoint_mode_scores_what_predict_writes_and_a_zip_scores_the_same(tmp_path, ckpt, data):
    assert evaluate("--checkpoint", ckpt, "--input", data, "--output", tmp_path / "out") == 0
    found = metrics(tmp_path / "out")
    model = found["models"][0]
    assert model["fingerprint"] == Predictor.from_checkpoint(ckpt, device="cpu").fingerprint
    assert (
        found["data"] == str(data)
        and found["options"]["tolerance"] == 2
        and found["classes"] == ["paper", "ink", "margin"]
    )
    micro = model["results"]["micro"]
    assert np.array_equal(micro["confusion_matrix"], expected_confusion(ckpt, data))
    again = figures(torch.tensor(micro["confusion_matrix"]), torch.zeros(3, 4, dtype=torch.int64), found["classes"])
    assert micro["per_class"]["iou"] == pytest.approx(again["per_class"]["iou"])
    rows = scans(tmp_path / "out")
    assert [r["name"] for r in rows] == ["s0", "s1", "s3", "s4", "s5", "sub/s2"] and {r["status"] for r in rows} == {
        "ok"
    }
    assert [t["scans"] for t in model["results"]["by_width_third"]] == [2, 2, 2]
    assert (tmp_path / "out" / "predictions" / "masks" / "sub" / "s2.png").is_file()
    assert len(list((tmp_path / "out" / "pictures").glob("*.png"))) == 6
    files = {f"{p.relative_to(data).as_posix()}": p.read_bytes() for p in data.rglob("*.png")}
    archive = write_zip(tmp_path / "data.zip", {f"set/{name}": blob for name, blob in files.items()})
    assert evaluate("--checkpoint", ckpt, "--input", archive, "--output", tmp_path / "zip") == 0
    assert metrics(tmp_path / "zip")["models"] == found["models"]


def test_predictions_mode_missing_and_wrong_size_predictions_are_error_rows(tmp_path, data):
    preds = tmp_path / "preds"
    for i, (h, w) in enumerate(SIZES[:3]):
        truth = np.asarray(Image.open(data / "masks" / f"{'sub/' if i == 2 else ''}s{i}.png"))
        guess = np.where(truth == 255, 0, truth).astype(np.uint8)
        if i == 1:
            guess = guess[:, :-1]  # one column short
        write(preds / f"{'sub/' if i == 2 else ''}s{i}.png", guess)
    out = tmp_path / "out"
    assert evaluate("--predictions", preds, "--masks", data, "--classes", "a,b,c", "--output", out) == 1
    rows = {r["name"]: r for r in scans(out)}
    assert len(rows) == 6 and rows["s0"]["status"] == rows["sub/s2"]["status"] == "ok"
    assert float(rows["s0"]["pixel_accuracy"]) == 1.0 and float(rows["s0"]["tol_f1_b"]) == 1.0
    assert "is (12, 29) (H, W) but the true mask" in rows["s1"]["error"] and "(12, 30)" in rows["s1"]["error"]
    assert (
        rows["s3"]["status"] == "failed"
        and f"no prediction for scan 's3': expected {preds / 's3.png'}" in rows["s3"]["error"]
    )
    found = metrics(out)["models"][0]["results"]
    assert (found["scored"], found["failed"]) == (2, 4) and found["micro"]["pixel_accuracy"] == 1.0


def test_compare_scores_a_second_model_side_by_side_sorted_by_the_difference(tmp_path, ckpt, data):
    other = random_checkpoint(tmp_path / "b.pt", seed=3)
    out = tmp_path / "out"
    assert evaluate("--checkpoint", ckpt, "--compare", other, "--input", data, "--output", out, "--worst", "2") == 0
    found = metrics(out)
    a, b = (m["results"]["micro"] for m in found["models"])
    assert found["difference_b_minus_a"]["micro"]["mean_iou_without_bg"] == pytest.approx(
        b["mean_iou_without_bg"] - a["mean_iou_without_bg"]
    )
    diffs = [float(r["difference"]) for r in scans(out)]
    assert diffs == sorted(diffs) and len(diffs) == 6
    assert len(list((out / "pictures").glob("*.png"))) == 4  # the 2 worst, pictured for A and for B


def test_compare_where_b_misses_a_scan_heads_the_report_with_the_scans_both_scored(tmp_path, capsys):
    data, preds = _predicted_folder(tmp_path, ["s0", "s1", "s2"])
    other = tmp_path / "preds-b"
    other.mkdir()
    for name in ("s0", "s1"):
        (other / f"{name}.png").write_bytes((preds / f"{name}.png").read_bytes())
    out = tmp_path / "out"
    args = ["--predictions", preds, "--predictions", other, "--masks", data, "--classes", "x,y,z", "--output", out]
    assert evaluate(*args) == 1  # B has no prediction for s2
    printed = capsys.readouterr().out
    assert "on the 2 scans both scored (besides them A scored 1, B 0): mean_iou_without_bg A " in printed
    assert "B - A +0.0000" in printed
    found = metrics(out)
    both = found["both_scored"]
    assert (both["scans"], both["a_only"], both["b_only"]) == (2, 1, 0)
    assert both["micro_a"] == both["micro_b"]  # the same predictions of the same two scans
    assert both["difference_b_minus_a"]["pixel_accuracy"] == 0.0
    assert found["models"][0]["results"]["scored"] == 3 and found["models"][1]["results"]["scored"] == 2
    page = (out / "report.html").read_text()
    assert "A and B on the 2 scans both scored; A also scored 1 other, B none, left out here" in page


def test_bad_input_is_a_clear_error(tmp_path, ckpt, data, capsys):
    bad = tmp_path / "bad"
    write(bad / "images" / "a.png", rgb(9, 14))
    write(bad / "masks" / "a.png", labels(9, 13, 3))  # one column short
    write(bad / "images" / "b.png", rgb(9, 14))
    write(bad / "masks" / "b.png", np.full((9, 14), 7, np.uint8))  # a class the model lacks
    write(bad / "images" / "c.png", rgb(9, 14))  # no mask
    assert evaluate("--checkpoint", ckpt, "--input", bad, "--output", tmp_path / "out") == 1
    rows = {r["name"]: r for r in scans(tmp_path / "out")}
    assert "the prediction of" not in rows["a"]["error"] and "(9, 14) (H, W) but the true mask" in rows["a"]["error"]
    assert "true mask values [7] are not one of the model's 3 classes" in rows["b"]["error"]
    assert "images/c.png has no mask at masks/c.png" in rows["c"]["error"]
    write(tmp_path / "nomasks" / "images" / "a.png", rgb(9, 14))
    assert evaluate("--checkpoint", ckpt, "--input", tmp_path / "nomasks", "--output", tmp_path / "o2") == 2
    assert "no ground-truth masks" in capsys.readouterr().err
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "notes.txt").write_text("mine")
    assert evaluate("--checkpoint", ckpt, "--input", data, "--output", tmp_path / "busy") == 2
    err = capsys.readouterr().err
    assert "holds files srforge-evaluate did not write (notes.txt)" in err and "Traceback" not in err
    (tmp_path / "theirs").mkdir()
    (tmp_path / "theirs" / "metrics.json").write_text("{}")
    assert evaluate("--checkpoint", ckpt, "--input", data, "--output", tmp_path / "theirs") == 2
    assert "metrics.json is not a report srforge wrote" in capsys.readouterr().err
    assert (tmp_path / "theirs" / "metrics.json").read_text() == "{}"
    assert evaluate("--checkpoint", ckpt, "--input", data, "--output", data / "eval") == 2
    assert "is inside the input folder" in capsys.readouterr().err and not (data / "eval").exists()
    write(tmp_path / "foreign" / "s0.png", labels(9, 14, 3))
    assert evaluate("--predictions", tmp_path / "foreign", "--masks", data, "--output", tmp_path / "o3") == 2
    assert "give --classes" in capsys.readouterr().err


@pytest.mark.slow
def test_two_torchrun_processes_give_the_metrics_of_one(tmp_path, ckpt, data):
    assert evaluate("--checkpoint", ckpt, "--input", data, "--output", tmp_path / "one") == 0
    args = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]
    args += [str(ROOT / "scripts" / "evaluate.py"), "--checkpoint", str(ckpt), "--input", str(data)]
    args += ["--output", str(tmp_path / "two"), "--no-progress", "--device", "cpu", "--workers", "1"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    done = run_once_more_after_native_abort(args, fresh=(tmp_path / "two",), env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.count("srforge-evaluate: report:") == 1  # rank 0 alone prints
    one, two = metrics(tmp_path / "one"), metrics(tmp_path / "two")
    assert two.pop("run")["processes"] == 2 and one.pop("run")["processes"] == 1
    assert one == two
    assert (tmp_path / "one" / "scans.csv").read_text() == (tmp_path / "two" / "scans.csv").read_text()


def test_evaluate_names_its_report_by_an_absolute_path(tmp_path, monkeypatch, capsys):
    random_checkpoint(tmp_path / "m.pt")
    _labelled(tmp_path / "data")
    monkeypatch.chdir(tmp_path)
    assert main_evaluate(["--checkpoint", "m.pt", "--input", "data", "--output", "scores", "--workers", "0"]) == 0
    assert f"report: {tmp_path / 'scores' / 'report.html'}" in capsys.readouterr().out


# -- round five: one odd name never costs the scores ----------------------------------------------------------------
def _predicted_folder(root: Path, names: list[str], shape=(9, 14)) -> tuple[Path, Path]:
    """(a labelled root with images/ and masks/, a predictions folder) for ``names``, predictions one pixel off."""
    data, preds = root / "data", root / "preds"
    for i, name in enumerate(names):
        write(data / "images" / f"{name}.png", rgb(*shape, i))
        truth = labels(*shape, 3, i)
        write(data / "masks" / f"{name}.png", truth)
        guess = truth.copy()
        guess[0, 0] = (guess[0, 0] + 1) % 3
        write(preds / f"{name}.png", guess)
    return data, preds


def test_names_near_the_file_systems_limit_keep_their_scores_and_pictures(tmp_path):
    names = ["a" * 235, "b" * 250, "short"]  # pictures named 001-<name>-A.png: the second one's would not fit
    data, preds = _predicted_folder(tmp_path, names)
    out = tmp_path / "out"
    assert evaluate("--predictions", preds, "--masks", data, "--classes", "x,y,z", "--output", out) == 0
    assert sorted(r["name"] for r in scans(out)) == sorted(names)
    assert metrics(out)["models"][0]["results"]["scored"] == 3
    pictures = sorted(p.name for p in (out / "pictures").iterdir())
    assert len(pictures) == 3 and all(len(os.fsencode(p)) <= 255 for p in pictures)
    assert any("a" * 235 in p for p in pictures) and (out / "report.html").is_file()


def test_a_picture_that_cannot_be_written_is_a_note_and_the_scores_stay(tmp_path, monkeypatch):
    import srforge.evaluate.run as run

    data, preds = _predicted_folder(tmp_path, ["s0", "s1"])
    real = run.atomic_write

    def refuse(path, write, fsync=False):
        if path.parent.name == "pictures" and "s1" in path.name:
            raise OSError(28, "No space left on device")
        return real(path, write, fsync)

    monkeypatch.setattr(run, "atomic_write", refuse)
    out = tmp_path / "out"
    assert evaluate("--predictions", preds, "--masks", data, "--classes", "x,y,z", "--output", out) == 0
    assert len(scans(out)) == 2 and (out / "metrics.json").is_file()
    page = (out / "report.html").read_text()
    assert "the picture could not be written (No space left on device)" in page and "s0" in page


def test_a_file_name_that_is_not_utf8_is_shown_escaped_and_linked_by_its_bytes(tmp_path):
    name = os.fsdecode(b"scan_\xff#1")  # not UTF-8, and a character that ends a URL's path
    data, preds = _predicted_folder(tmp_path, [name])
    out = tmp_path / "out"
    assert evaluate("--predictions", preds, "--masks", data, "--classes", "x,y,z", "--output", out) == 0
    page = (out / "report.html").read_text(encoding="utf-8")
    assert "scan_\\xff#1" in page and 'href="pictures/001-scan_%FF%231-A.png"' in page
    assert (out / "pictures" / f"001-{name}-A.png").is_file()


def test_repeated_class_names_and_an_ignore_index_that_is_a_class_or_no_mask_value_are_refused(tmp_path, capsys):
    data, preds = _predicted_folder(tmp_path, ["s0"])
    base = ["--predictions", preds, "--masks", data, "--output", tmp_path / "out"]
    assert evaluate(*base, "--classes", "a,a") == 2
    assert "class name 1 'a' repeats class name 0" in capsys.readouterr().err
    assert evaluate(*base, "--classes", ",x") == 2
    assert "class name 0 must have 1 to" in capsys.readouterr().err
    for value in ("300", "0"):
        assert evaluate(*base, "--classes", "a,b,c", "--ignore-index", value) == 2
        err = capsys.readouterr().err
        assert f"--ignore-index {value}: expected a mask value from 3 to 255" in err and "Traceback" not in err
    assert not (tmp_path / "out" / "metrics.json").exists()


def _coco_of(data: Path, tmp: Path) -> tuple[Path, Path]:
    """The labelled folder ``data`` as a COCO export (each class an uncompressed RLE) and as a mask folder of the
    same masks (ignored pixels as background: COCO has no ignore); (the JSON, the folder)."""
    from annotation_exports import runs

    images, annotations, folder = [], [], tmp / "folder"
    for i, path in enumerate(sorted((data / "images").rglob("*.png"))):
        name = path.relative_to(data / "images").as_posix()
        mask = np.asarray(Image.open(data / "masks" / name)).copy()
        mask[mask == 255] = 0
        write(folder / "images" / name, np.asarray(Image.open(path)))
        write(folder / "masks" / name, mask)
        images.append({"id": i, "file_name": name, "height": mask.shape[0], "width": mask.shape[1]})
        for c in (1, 2):
            rle = {"counts": runs((mask == c).T.ravel()), "size": list(mask.shape)}
            annotations.append({"id": len(annotations), "image_id": i, "category_id": c, "segmentation": rle})
    categories = [{"id": 1, "name": "ink"}, {"id": 2, "name": "margin"}]
    path = tmp / "instances.json"
    path.write_text(json.dumps({"images": images, "annotations": annotations, "categories": categories}))
    return path, folder


def test_an_annotation_export_scores_as_its_mask_folder_in_both_modes(tmp_path, ckpt, data, capsys):
    coco, folder = _coco_of(data, tmp_path)
    labels = ["--labels", coco, "--format", "coco", "--image-root", folder / "images"]
    assert evaluate("--checkpoint", ckpt, "--input", folder, "--output", tmp_path / "masks") == 0
    assert evaluate("--checkpoint", ckpt, *labels, "--output", tmp_path / "coco") == 0
    expected = metrics(tmp_path / "masks")["models"][0]["results"]["micro"]
    assert metrics(tmp_path / "coco")["models"][0]["results"]["micro"] == expected
    predictions = tmp_path / "masks" / "predictions"
    assert evaluate("--predictions", predictions, *labels, "--output", tmp_path / "pred") == 0
    assert metrics(tmp_path / "pred")["models"][0]["results"]["micro"] == expected
    assert evaluate("--predictions", predictions, "--labels", coco, "--output", tmp_path / "x") == 2
    assert "--labels PATH needs --format" in capsys.readouterr().err
    coco.write_text(coco.read_text()[:-40])
    assert evaluate("--predictions", predictions, *labels, "--output", tmp_path / "bad") == 2
    assert f"{coco}: cannot read as COCO JSON" in capsys.readouterr().err
