"""ONNX export: dynamic batch / H / W, the padding-aware sizes input, the onnxruntime check, the README snippet.

The tests that export need the optional extra (onnx, onnxscript, onnxruntime) and are skipped without it;
the tests of the missing-extra error run everywhere.
"""

import contextlib
import io
import re
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from srforge import UNet
from srforge.cli import main_export
from srforge.export.onnx import EXTRA, OnnxCheckError, check_onnx, check_scans, export_onnx
from srforge.runtime.checkpoint import save_checkpoint

README = Path(__file__).resolve().parents[1] / "README.md"
SKIP = f"ONNX export needs the optional extra: {EXTRA} (onnx, onnxscript, onnxruntime)"


def _tiny(padding_aware=True, seed=0, depth=3):
    torch.manual_seed(seed)
    return UNet(num_classes=3, base_channels=4, depth=depth, padding_aware=padding_aware).eval()


def _checkpoint(model, path, names=("bg", "solid", "dashed")):
    args = {"num_classes": 3, "base_channels": 4, "depth": model.depth, "padding_aware": model.padding_aware}
    payload = {"model": model.state_dict(), "model_args": args, "size_divisor": model.size_divisor}
    return save_checkpoint({**payload, "class_names": list(names)}, path)


def _run(argv):
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
    code, out, err = _run(["--checkpoint", str(tmp / "best.pt"), "--output", str(tmp / "model.onnx")])
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
def test_the_readme_snippet_predicts_a_scan_with_onnxruntime_alone(exported, tmp_path, monkeypatch):
    model, path, _ = exported
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), re.S)
    snippet = next(b for b in blocks if "onnxruntime as ort" in b)
    scan = check_scans(3, model.size_divisor, seed=5)[0]  # [3, H, W], H and W not multiples of the divisor
    Image.fromarray(scan.permute(1, 2, 0).numpy()).save(tmp_path / "scan.png")
    shutil.copy(path, tmp_path / "model.onnx")
    monkeypatch.chdir(tmp_path)
    namespace = {}
    exec(compile(snippet, "README.md", "exec"), namespace)
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
    code, _, err = _run(["--checkpoint", str(tmp_path / "best.pt"), "--output", str(tmp_path / "m.onnx")])
    assert code == 2 and EXTRA in err and missing in err
    assert not (tmp_path / "m.onnx").exists()


@pytest.mark.slow
def test_without_onnxruntime_the_export_is_written_and_the_check_skipped_with_a_note(exported, tmp_path, monkeypatch):
    _, path, _ = exported
    monkeypatch.setattr("srforge.export.onnx.export_onnx", lambda model, out, **kw: Path(shutil.copy(path, out)))
    monkeypatch.setitem(sys.modules, "onnxruntime", None)
    _checkpoint(_tiny(), tmp_path / "best.pt")
    code, out, _ = _run(["--checkpoint", str(tmp_path / "best.pt"), "--output", str(tmp_path / "m.onnx")])
    assert code == 0 and "not checked" in out and EXTRA in out and (tmp_path / "m.onnx").is_file()
    code, out, _ = _run(["--checkpoint", str(tmp_path / "best.pt"), "--output", str(tmp_path / "n.onnx"), "--no-check"])
    assert code == 0 and "wrote" in out and "checked" not in out and (tmp_path / "n.onnx").is_file()
    with pytest.raises(ImportError, match="onnxruntime"):
        check_onnx(_tiny(), path)


def test_a_missing_checkpoint_is_exit_status_2(tmp_path):
    code, _, err = _run(["--checkpoint", str(tmp_path / "nope.pt"), "--output", str(tmp_path / "m.onnx")])
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
    code, _, err = _run(["--checkpoint", str(tmp_path / "best.pt"), "--output", str(tmp_path / "model.onnx")])
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
