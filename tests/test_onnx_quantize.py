"""srforge-export --quantize int8 --calibrate SCANS: a static int8 model calibrated on a user's scans
(srforge.export.quantize), predicted through predict.py; bad calibration input is exit 2 with nothing written."""

import json

import numpy as np
import pytest
import torch
from PIL import Image
from predict_fixtures import png, write_folder
from test_export import run_export

from srforge import UNet
from srforge.cli import main_export, main_predict
from srforge.data.archive import ScanArchive
from srforge.export.onnx import EXTRA
from srforge.export.quantize import CalibrationError, calibration_archive, calibration_feeds, spread, window
from srforge.runtime.checkpoint import save_checkpoint

SKIP = f"int8 export needs the optional extra: {EXTRA} (onnx, onnxscript, onnxruntime)"
NAMES = ["bg", "thin", "thick"]


def _needs_extra():
    for name in ("onnx", "onnxscript", "onnxruntime"):
        pytest.importorskip(name, reason=SKIP)


def _checkpoint(path):
    torch.manual_seed(0)
    args = {"num_classes": 3, "base_channels": 8, "depth": 3}
    model = UNet(**args).eval()
    payload = {"model": model.state_dict(), "model_args": args, "size_divisor": model.size_divisor}
    return save_checkpoint({**payload, "class_names": NAMES}, path)


def _log(i: int, h: int, w: int) -> np.ndarray:
    """A scan-like picture uint8 [H, W, 3]: white paper, dark curves of varying width, a grid, a little noise."""
    rng = np.random.default_rng(i)
    image = np.full((h, w, 3), 245, np.float64)
    y, x = np.mgrid[:h, :w]
    image[(x % 16 == 0) | (y % 16 == 0)] = 200
    for k in range(3):
        centre = w / 2 + w / 4 * np.sin(y / (6 + 3 * k) + rng.uniform(0, 6))
        image[np.abs(x - centre) < 1 + k] = (40 * k, 20, 160 - 50 * k)
    image += rng.normal(0, 6, image.shape)
    return np.clip(image, 0, 255).astype(np.uint8)


@pytest.fixture(scope="module")
def quantized(tmp_path_factory):
    """(checkpoint, int8 model, scans folder, srforge-export's stdout): a tiny UNet exported as int8, calibrated on
    four of the folder's six scans of odd sizes."""
    _needs_extra()
    tmp = tmp_path_factory.mktemp("int8")
    ckpt = _checkpoint(tmp / "best.pt")
    sizes = [(45, 61), (40, 40), (33, 70), (57, 29), (48, 64), (37, 52)]
    scans = write_folder(tmp / "scans", {f"log_{i}.png": png(_log(i, h, w)) for i, (h, w) in enumerate(sizes)})
    argv = ["--checkpoint", str(ckpt), "--output", str(tmp / "model.int8.onnx"), "--quantize", "int8"]
    code, out, err = run_export([*argv, "--calibrate", str(scans), "--calibrate-count", "4"])
    assert code == 0, err
    return ckpt, tmp / "model.int8.onnx", scans, out


@pytest.mark.slow
def test_the_int8_model_is_quantised_and_keeps_srforges_metadata(quantized):
    import onnx

    _, path, scans, out = quantized
    model = onnx.load(str(path))
    ops = [node.op_type for node in model.graph.node]
    assert ops.count("QuantizeLinear") >= 10 and ops.count("DequantizeLinear") >= 10
    int8_weights = [t for t in model.graph.initializer if t.data_type == onnx.TensorProto.INT8 and len(t.dims) == 4]
    assert len(int8_weights) >= 10  # the convolutions' kernels are stored as int8
    head = next(node for node in model.graph.node if "logits" in node.output)
    assert head.op_type == "Conv"  # the logits come from a float convolution, not dequantised from 8 bits
    meta = {p.key: p.value for p in model.metadata_props}
    assert meta["size_divisor"] == "8" and meta["class_names"] == "bg,thin,thick"
    assert meta["padding_aware"] == "true" and meta["in_channels"] == "3"
    assert meta["quantization"].startswith("int8 static") and "on 4 scans of" in meta["quantization"]
    assert f"calibrated on 4 scans of {scans}" in out
    agreed = float(out.split("int8 vs float32 masks: ")[1].split("%")[0])
    assert 90.0 <= agreed <= 100.0
    assert sorted(p.name for p in path.parent.iterdir()) == ["best.pt", "model.int8.onnx", "scans"]  # no temporary


@pytest.mark.slow
def test_the_int8_model_predicts_through_predict_py_to_masks_that_mostly_agree(quantized, tmp_path):
    ckpt, path, scans, _ = quantized
    common = ["--input", str(scans), "--no-progress", "--workers", "0"]
    assert main_predict(["--checkpoint", str(ckpt), "--output", str(tmp_path / "pt"), *common]) == 0
    assert main_predict(["--checkpoint", str(path), "--output", str(tmp_path / "int8"), *common]) == 0
    report = json.loads((tmp_path / "int8" / "report.json").read_text())
    assert report["summary"]["runtime"].startswith("onnxruntime CPUExecutionProvider")
    same = total = 0
    for name in sorted(p.name for p in scans.iterdir()):
        want = np.asarray(Image.open(tmp_path / "pt" / "masks" / name))
        got = np.asarray(Image.open(tmp_path / "int8" / "masks" / name))
        assert got.shape == want.shape and int(got.max()) < len(NAMES)
        same, total = same + int((got == want).sum()), total + want.size
    assert same / total >= 0.9, same / total  # int8 is not float32: most pixels, not all


def test_calibration_scans_are_spread_decoded_and_padded_as_predict_pads_them(tmp_path):
    scans = write_folder(tmp_path / "s", {f"s{i}.png": png(_log(i, 20 + i, 30 - i)) for i in range(5)})
    assert spread(5, 3) == [0, 2, 4] and spread(5, 9) == [0, 1, 2, 3, 4] and spread(5, 1) == [0]
    with ScanArchive(scans) as archive:
        feeds = list(calibration_feeds(archive, "RGB", 8, 2))
    assert len(feeds) == 2
    for feed, i in zip(feeds, (0, 4)):
        h, w = 20 + i, 30 - i
        assert feed["sizes"].tolist() == [[h, w]] and feed["sizes"].dtype == np.int64
        assert feed["image"].dtype == np.uint8 and feed["image"].shape == (1, 3, -(-h // 8) * 8, -(-w // 8) * 8)
        assert np.array_equal(feed["image"][0, :, :h, :w].transpose(1, 2, 0), _log(i, h, w))
        assert not feed["image"][0, :, h:].any() and not feed["image"][0, :, :, w:].any()  # zero padding


def test_a_scan_over_the_pixel_limit_is_calibrated_on_its_centred_window():
    image = torch.arange(10 * 100).reshape(1, 10, 100)
    cut = window(image, pixels=300)
    assert cut.shape == (1, 10, 30) and cut[0, 0, 0] == 35  # the long side cut, centred
    assert window(image.transpose(1, 2), pixels=300).shape == (1, 30, 10)
    square = window(torch.zeros(1, 50, 40), pixels=100)
    assert square.shape == (1, 10, 10)
    assert window(image, pixels=1000) is image


@pytest.mark.parametrize("case", ["missing", "empty", "no scans"])
def test_bad_calibration_input_is_exit_2_naming_it_and_nothing_is_written(tmp_path, case):
    for name in ("onnx", "onnxscript", "onnxruntime"):  # the CLI checks the extra before the calibration scans
        pytest.importorskip(name, reason=SKIP)
    ckpt = _checkpoint(tmp_path / "best.pt")
    folder = tmp_path / "calib"
    if case != "missing":
        folder.mkdir()
    if case == "no scans":
        (folder / "notes.txt").write_text("not a scan")
    out = tmp_path / "out" / "model.int8.onnx"
    out.parent.mkdir()
    argv = ["--checkpoint", str(ckpt), "--output", str(out), "--quantize", "int8", "--calibrate", str(folder)]
    code, stdout, err = run_export(argv)
    assert code == 2 and f"--calibrate {folder}:" in err and "Traceback" not in err
    assert ("not found" if case == "missing" else "no scans found") in err
    assert (case == "no scans") == ("notes.txt" in err)  # what was passed over is named
    assert list(out.parent.iterdir()) == [] and stdout == ""  # nothing exported, nothing written
    with pytest.raises(CalibrationError, match="--calibrate"):
        calibration_archive(folder)


def test_quantize_and_calibrate_go_together_and_count_is_positive(tmp_path, capsys):
    ckpt = str(_checkpoint(tmp_path / "best.pt"))
    out = str(tmp_path / "m.onnx")
    for extra, said in (
        (["--quantize", "int8"], "go together"),
        (["--calibrate", str(tmp_path)], "go together"),
        (["--quantize", "int8", "--calibrate", str(tmp_path), "--calibrate-count", "0"], "at least 1"),
    ):
        with pytest.raises(SystemExit) as info:
            main_export(["--checkpoint", ckpt, "--output", out, *extra])
        assert info.value.code == 2 and said in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["best.pt"]
