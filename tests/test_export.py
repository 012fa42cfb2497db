"""ONNX export: dynamic batch / H / W, the padding-aware sizes input, the onnxruntime check, the documented snippet, and
the exported model predicting through srforge.predict.onnx_model.

The tests that export need the optional extra (onnx, onnxscript, onnxruntime) and are skipped without it;
the tests of the missing-extra error run everywhere.
"""

import contextlib
import io
import json
import re
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from predict_fixtures import png, scan, write_folder

from srforge import UNet
from srforge.cli import main_export, main_predict
from srforge.export.onnx import EXTRA, OnnxCheckError, check_onnx, check_scans, export_onnx
from srforge.predict import Predictor
from srforge.runtime.checkpoint import save_checkpoint

LIBRARY_DOC = Path(__file__).resolve().parents[1] / "docs" / "library.md"  # the snippet without srforge
SKIP = f"ONNX export needs the optional extra: {EXTRA} (onnx, onnxscript, onnxruntime)"


def _tiny(padding_aware=True, seed=0, depth=3):
    torch.manual_seed(seed)
    return UNet(num_classes=3, base_channels=4, depth=depth, padding_aware=padding_aware).eval()


def _checkpoint(model, path, names=("bg", "solid", "dashed")):
    args = {"num_classes": 3, "base_channels": 4, "depth": model.depth, "padding_aware": model.padding_aware}
    payload = {"model": model.state_dict(), "model_args": args, "size_divisor": model.size_divisor}
    return save_checkpoint({**payload, "class_names": list(names)}, path)


def run_export(argv):
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main_export(argv)
    return code, out.getvalue(), err.getvalue()


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """(model, path, stdout) of one `srforge-export` run on a tiny padding-aware UNet (depth 3: divisor 8)."""
    for name in ("onnx", "onnxscript", "onnxruntime"):
        pytest.importorskip(name, reason=SKIP)
    tmp = tmp_path_factory.mktemp("export")
    model = _tiny()
    _checkpoint(model, tmp / "best.pt")
    code, out, err = run_export(["--checkpoint", str(tmp / "best.pt"), "--output", str(tmp / "model.onnx")])
    assert code == 0, err
    return model, tmp / "model.onnx", out


@pytest.mark.slow
def test_export_writes_a_dynamic_model_and_prints_the_check(exported):
    import onnxruntime

    model, path, out = exported
    figure = float(re.search(r"max \|logits difference\| (\S+)", out).group(1))
    assert figure <= 1e-4
    session = onnxruntime.InferenceSession(str(path))
    assert [(i.name, i.type) for i in session.get_inputs()] == [("image", "tensor(uint8)"), ("sizes", "tensor(int64)")]
    image_shape = session.get_inputs()[0].shape
    assert isinstance(image_shape[0], str) and image_shape[1] == 3  # a free batch, fixed channels
    assert all(isinstance(s, str) and s.startswith("8*") for s in image_shape[2:])  # multiples of the divisor
    meta = session.get_modelmeta().custom_metadata_map
    assert meta["size_divisor"] == "8" and meta["class_names"] == "bg,solid,dashed" and meta["padding_aware"] == "true"
    assert sorted(p.name for p in path.parent.iterdir()) == ["best.pt", "model.onnx"]  # no temporary left


@pytest.mark.slow
def test_the_exported_model_serves_sizes_and_batches_it_was_not_traced_with(exported):
    import onnxruntime

    model, path, _ = exported
    session = onnxruntime.InferenceSession(str(path))
    image = torch.randint(0, 256, (4, 3, 5 * 8, 11 * 8), dtype=torch.uint8, generator=torch.Generator().manual_seed(1))
    sizes = torch.tensor([[40, 88], [33, 17], [8, 80], [1, 1]])
    got = session.run(["logits"], {"image": image.numpy(), "sizes": sizes.numpy()})[0]
    with torch.no_grad():
        want = model(image, sizes).numpy()
    for i, (h, w) in enumerate(sizes.tolist()):
        assert np.abs(got[i, :, :h, :w] - want[i, :, :h, :w]).max() <= 1e-4


@pytest.mark.slow
def test_the_check_fails_with_a_clear_message_for_a_model_that_was_not_exported(exported):
    _, path, _ = exported
    with pytest.raises(OnnxCheckError, match=r"differ from PyTorch's by up to .* expected at most 0.0001"):
        check_onnx(_tiny(seed=1), path)


@pytest.mark.slow
def test_the_documented_snippet_predicts_a_scan_with_onnxruntime_alone(exported, tmp_path, monkeypatch):
    model, path, _ = exported
    blocks = re.findall(r"```python\n(.*?)```", LIBRARY_DOC.read_text(), re.S)
    snippet = next(b for b in blocks if "onnxruntime as ort" in b)
    scan = check_scans(3, model.size_divisor, seed=5)[0]  # [3, H, W], H and W not multiples of the divisor
    Image.fromarray(scan.permute(1, 2, 0).numpy()).save(tmp_path / "scan.png")
    shutil.copy(path, tmp_path / "model.onnx")
    monkeypatch.chdir(tmp_path)
    namespace = {}
    exec(compile(snippet, "docs/library.md", "exec"), namespace)
    h, w = scan.shape[1:]
    d = model.size_divisor
    padded = torch.zeros(1, 3, -(-h // d) * d, -(-w // d) * d, dtype=torch.uint8)
    padded[0, :, :h, :w] = scan
    with torch.no_grad():
        want = model(padded, torch.tensor([[h, w]]))[0, :, :h, :w]
    mask = namespace["mask"]
    assert mask.shape == (h, w)
    top2 = want.topk(2, dim=0).values
    clear = (top2[0] - top2[1] > 1e-3).numpy()  # pixels where rounding cannot flip the class
    assert clear.mean() > 0.9 and np.array_equal(mask[clear], want.argmax(0).numpy()[clear])


@pytest.mark.slow
def test_a_plain_model_exports_without_the_sizes_input(tmp_path):
    for name in ("onnx", "onnxscript", "onnxruntime"):
        pytest.importorskip(name, reason=SKIP)
    import onnxruntime

    model = _tiny(padding_aware=False, depth=2)
    export_onnx(model, tmp_path / "plain.onnx")
    session = onnxruntime.InferenceSession(str(tmp_path / "plain.onnx"))
    assert [i.name for i in session.get_inputs()] == ["image"]
    assert session.get_modelmeta().custom_metadata_map["class_names"] == "class_0,class_1,class_2"
    assert check_onnx(model, tmp_path / "plain.onnx") <= 1e-4


@pytest.mark.parametrize("missing", ["onnx", "onnxscript"])
def test_a_missing_extra_is_an_error_that_names_it(missing, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, missing, None)  # `import missing` now raises ImportError
    with pytest.raises(ImportError, match=re.escape(EXTRA)) as info:
        export_onnx(_tiny(depth=2), tmp_path / "m.onnx")
    assert missing in str(info.value)
    _checkpoint(_tiny(depth=2), tmp_path / "best.pt")
    code, _, err = run_export(["--checkpoint", str(tmp_path / "best.pt"), "--output", str(tmp_path / "m.onnx")])
    assert code == 2 and EXTRA in err and missing in err
    assert not (tmp_path / "m.onnx").exists()


@pytest.mark.slow
def test_without_onnxruntime_the_export_is_written_and_the_check_skipped_with_a_note(exported, tmp_path, monkeypatch):
    _, path, _ = exported
    monkeypatch.setattr("srforge.export.onnx.export_onnx", lambda model, out, **kw: Path(shutil.copy(path, out)))
    monkeypatch.setitem(sys.modules, "onnxruntime", None)
    _checkpoint(_tiny(), tmp_path / "best.pt")
    code, out, _ = run_export(["--checkpoint", str(tmp_path / "best.pt"), "--output", str(tmp_path / "m.onnx")])
    assert code == 0 and "not checked" in out and EXTRA in out and (tmp_path / "m.onnx").is_file()
    ckpt = str(tmp_path / "best.pt")
    code, out, _ = run_export(["--checkpoint", ckpt, "--output", str(tmp_path / "n.onnx"), "--no-check"])
    assert code == 0 and "wrote" in out and "checked" not in out and (tmp_path / "n.onnx").is_file()
    with pytest.raises(ImportError, match="onnxruntime"):
        check_onnx(_tiny(), path)


def test_a_missing_checkpoint_is_exit_status_2(tmp_path):
    code, _, err = run_export(["--checkpoint", str(tmp_path / "nope.pt"), "--output", str(tmp_path / "m.onnx")])
    assert code == 2 and "not found" in err


def test_an_output_that_cannot_be_written_is_exit_status_2(tmp_path, monkeypatch):
    for name in ("onnx", "onnxscript"):  # the CLI checks the extra before exporting
        pytest.importorskip(name, reason=SKIP)
    from srforge.atomic import atomic_write

    # Stands in for the (slow) trace; the write, and its failure onto a folder, are the real ones.
    monkeypatch.setattr(
        "srforge.export.onnx.export_onnx", lambda model, out, **kw: atomic_write(out, lambda f: f.write(b"onnx"))
    )
    _checkpoint(_tiny(depth=2), tmp_path / "best.pt")
    (tmp_path / "model.onnx").mkdir()
    code, _, err = run_export(["--checkpoint", str(tmp_path / "best.pt"), "--output", str(tmp_path / "model.onnx")])
    assert code == 2 and "cannot write" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["best.pt", "model.onnx"]  # no temporary left


@pytest.mark.slow
def test_run_onnx_names_what_is_wrong_with_the_inputs_before_onnxruntime_does(exported):
    import onnxruntime

    from srforge.export.onnx import run_onnx

    model, path, _ = exported
    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    image = np.zeros((1, 3, 16, 24), np.uint8)
    sizes = np.array([[12, 20]], np.int64)
    assert run_onnx(session, image, sizes).shape == (1, 3, 16, 24)
    with pytest.raises(ValueError, match=r"multiples of the size divisor 8, found 15 x 24; pad each scan .* 16 x 24"):
        run_onnx(session, image[:, :, :15], sizes)
    with pytest.raises(ValueError, match=r"sizes\[0\] = \(17, 20\): a true size must lie within the image"):
        run_onnx(session, image, np.array([[17, 20]], np.int64))
    with pytest.raises(ValueError, match=r"image: expected \[B, 3, H, W\], found \[1, 1, 16, 24\]"):
        run_onnx(session, image[:, :1], sizes)


# -- the exported model predicts (srforge.predict.onnx_model) -----------------------------------------------------
# Odd sizes, one sub-folder, and one scan wide enough to be tiled under --max-pixels 4096.
SCANS = {"a.png": scan(0), "sub/b.png": scan(1, 13, 27), "c.png": scan(2, 7, 9), "wide.png": scan(3, 17, 300)}


@pytest.fixture
def onnx_run(exported, tmp_path):
    """(the exported model's checkpoint, the exported model, a folder of SCANS)."""
    _, path, _ = exported
    return path.parent / "best.pt", path, write_folder(tmp_path / "scans", {n: png(a) for n, a in SCANS.items()})


def _masks(out):
    return {name: np.asarray(Image.open(out / "masks" / name)) for name in SCANS}


@pytest.mark.slow
@pytest.mark.parametrize("tta", ["none", "flip"])
def test_an_exported_model_predicts_a_folder_to_its_checkpoints_masks(tmp_path, onnx_run, tta):
    ckpt, onnx, scans = onnx_run
    common = ["--input", str(scans), "--no-progress", "--max-pixels", "4096", "--tta", tta, "--workers", "0"]
    assert main_predict(["--checkpoint", str(ckpt), "--output", str(tmp_path / "pt"), *common]) == 0
    assert main_predict(["--checkpoint", str(onnx), "--output", str(tmp_path / "ort"), *common]) == 0
    torch_masks, ort_masks = _masks(tmp_path / "pt"), _masks(tmp_path / "ort")
    report = json.loads((tmp_path / "ort" / "report.json").read_text())
    assert report["summary"]["runtime"].startswith("onnxruntime CPUExecutionProvider")
    tiles = {row["name"]: row["tiles"] for row in report["scans"]}
    assert tiles["wide.png"] > 1 and tiles["a.png"] == 1
    probabilities = Predictor.from_checkpoint(ckpt, device="cpu", max_pixels=4096, tta=tta).probabilities(
        [torch.from_numpy(a).permute(2, 0, 1).contiguous() for a in SCANS.values()]
    )
    for (name, a), prob in zip(SCANS.items(), probabilities):
        assert ort_masks[name].shape == a.shape[:2]
        differ = torch_masks[name] != ort_masks[name]
        if differ.any():  # only where the two best classes tie
            top2 = prob.sort(0, descending=True).values[:2]
            assert ((top2[0] - top2[1])[torch.from_numpy(differ)] < 1e-4).all(), name


@pytest.mark.slow
def test_from_onnx_reads_the_divisor_classes_and_channels_from_the_metadata(onnx_run):
    ckpt, onnx, _ = onnx_run
    predictor = Predictor.from_onnx(onnx, threads=1)
    assert (predictor.divisor, predictor.class_names, predictor.model.in_channels) == (8, ["bg", "solid", "dashed"], 3)
    assert predictor.runtime == "onnxruntime CPUExecutionProvider, 1 intra-op threads"
    # The arena kept between runs and no per-shape memory pattern: what keeps an archive's runs from faulting
    # their activations' pages in afresh (srforge.predict.onnx_model._session).
    options = predictor.model.session.get_session_options()
    assert options.enable_cpu_mem_arena and not options.enable_mem_pattern
    assert predictor.fingerprint != Predictor.from_checkpoint(ckpt, device="cpu").fingerprint  # another model file
    image = torch.from_numpy(scan(4)).permute(2, 0, 1).contiguous()
    (mask,) = predictor.predict([image])
    assert mask.shape == image.shape[1:] and int(mask.max()) < 3


@pytest.mark.slow
def test_a_file_that_is_not_srforges_export_is_exit_2_and_nothing_is_written(tmp_path, onnx_run, capsys):
    import onnx as onnx_lib

    _, good, scans = onnx_run
    garbage = tmp_path / "garbage.onnx"
    garbage.write_bytes(b"not a model at all")
    bare = onnx_lib.load(str(good))
    del bare.metadata_props[:]
    onnx_lib.save(bare, str(tmp_path / "bare.onnx"))
    lying = onnx_lib.load(str(good))
    for prop in lying.metadata_props:
        if prop.key == "size_divisor":
            prop.value = "3"  # the graph needs multiples of 8
    onnx_lib.save(lying, str(tmp_path / "lying.onnx"))
    said = {
        "garbage.onnx": "not an ONNX model onnxruntime can load",
        "bare.onnx": "an ONNX model without srforge's metadata (missing size_divisor, class_names",
        "lying.onnx": "its metadata does not describe its graph",
    }
    for name, message in said.items():
        out = tmp_path / f"out-{name}"
        code = main_predict(["--checkpoint", str(tmp_path / name), "--input", str(scans), "--output", str(out)])
        err = capsys.readouterr().err
        assert code == 2 and message in err and name in err and "Traceback" not in err, (name, err)
        assert not out.exists() or not any(out.iterdir())


@pytest.mark.slow
def test_evaluate_scores_an_exported_model_as_its_checkpoint(tmp_path, onnx_run):
    from srforge.cli import main_evaluate

    ckpt, onnx, scans = onnx_run
    for name, array in SCANS.items():  # masks beside the scans: the labelled layout
        (tmp_path / "data" / "images" / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "data" / "images" / name).write_bytes(png(array))
        mask = (array[..., 0] % 3).astype(np.uint8)
        (tmp_path / "data" / "masks" / name).parent.mkdir(parents=True, exist_ok=True)
        Image.fromarray(mask).save(tmp_path / "data" / "masks" / name)
    scores = {}
    for label, model in (("pt", ckpt), ("ort", onnx)):
        out = tmp_path / f"eval-{label}"
        args = ["--checkpoint", str(model), "--input", str(tmp_path / "data"), "--output", str(out)]
        assert main_evaluate([*args, "--no-progress", "--workers", "0"]) == 0
        scores[label] = json.loads((out / "metrics.json").read_text())["models"][0]["results"]["micro"]
    assert scores["ort"]["pixel_accuracy"] == pytest.approx(scores["pt"]["pixel_accuracy"], abs=1e-4)
