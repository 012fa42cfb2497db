"""Careless custom Datasets and labels, round three: every mistake is exit status 2 with a message naming the
sample, never a traceback, and nothing silently wrong (a float mask truncated, two classes with one name)."""

import numpy as np
import pytest
import torch
import yaml
from torch.utils.data import Dataset

from srforge.cli import main_train
from srforge.config import ConfigError, resolve
from srforge.data.field_view import FieldView
from srforge.data.images import DataError


class Careless(Dataset):
    """Four tiny scans; ``mistake`` picks what goes wrong."""

    def __init__(self, mistake="none", n=4):
        self.mistake, self.n = mistake, n

    def __len__(self):
        return self.n + (2 if self.mistake == "long" else 0)

    def __getitem__(self, i):
        if i >= self.n:
            raise IndexError(f"index {i} out of range")
        if self.mistake == "raises" and i == 2:
            raise RuntimeError("scan 2 is on a disk that went away")
        labels = np.zeros((8, 16), np.float32 if self.mistake.startswith("float") else np.int64)
        labels[4, 1:15] = {"float": 0.6, "float_whole": 1.0}.get(self.mistake, 1)
        scan = np.repeat(np.where(labels > 0, 30, 220)[None], 3, 0).astype(np.uint8)
        if self.mistake == "tuple":
            return scan, labels
        return {"id": f"careless_{i}", "scan": scan, "labels": labels}


FIELDS = {"image": "scan", "mask": "labels", "name": "id"}


def view(mistake):
    return FieldView(Careless(mistake), FIELDS, num_classes=2)


def test_a_float_mask_with_fractions_is_refused_naming_the_sample():
    with pytest.raises(DataError, match=r"Careless\[0\] \('careless_0'\): mask values \[0\.6\d*\] are not whole"):
        view("float")[0]
    mask = view("float_whole")[0].mask  # whole numbers stored as floats are class ids
    assert mask.dtype == torch.uint8 and int(mask.max()) == 1


@pytest.mark.parametrize(
    "mistake, message",
    [
        ("tuple", r"Careless\[0\] returned a tuple"),
        ("raises", r"Careless\[2\] raised RuntimeError: scan 2 is on a disk that went away"),
        ("long", r"Careless\[4\] raised IndexError: index 4 out of range \(its __len__ is 6\)"),
    ],
)
def test_dataset_mistakes_are_data_errors_naming_the_sample(mistake, message):
    samples = view(mistake)
    with pytest.raises(DataError, match=message):
        for i in range(len(samples)):
            samples[i]


def test_a_field_name_that_is_not_there_names_the_setting():
    samples = FieldView(Careless(), {**FIELDS, "mask": "label"}, num_classes=2)
    with pytest.raises(DataError, match=r"has no field 'label' for the mask.*Set data.fields.mask"):
        samples[0]


@pytest.mark.parametrize("mistake", ["tuple", "raises", "long", "float"])
def test_train_ends_with_status_2_and_the_sample_named(mistake, tmp_path, capsys, monkeypatch):
    monkeypatch.syspath_prepend(str(tmp_path))
    (tmp_path / "careless_data.py").write_text(
        "from test_hostile_data import Careless  # noqa: F401\n"
    )
    config = {
        "run": {"dir": str(tmp_path / "run"), "device": "cpu"},
        "data": {"dataset": {"class": "careless_data:Careless", "args": {"mistake": mistake}}, "fields": FIELDS},
        "model": {"base_channels": 4, "depth": 2},
        "train": {"epochs": 1},
    }
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(config))
    assert main_train(["--config", str(tmp_path / "config.yaml")]) == 2
    err = capsys.readouterr().err
    assert "srforge-train: error: Careless[" in err and "Traceback" not in err


def test_duplicate_class_names_are_refused():
    with pytest.raises(ConfigError, match=r"model.class_names: class name 1 'bg' repeats class name 0"):
        resolve({"model": {"num_classes": 2, "class_names": ["bg", "bg"]}})


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


def test_a_float_image_above_1_is_refused_naming_the_sample():
    class FloatScans(Careless):
        def __getitem__(self, i):
            sample = super().__getitem__(i)
            return {**sample, "scan": sample["scan"].astype(np.float32) / self.divide}

    scans = FloatScans()
    scans.divide = 1.0
    with pytest.raises(DataError, match=r"FloatScans\[0\] \('careless_0'\): a float image must hold values in"):
        FieldView(scans, FIELDS, num_classes=2)[0]
    scans.divide = 255.0
    assert FieldView(scans, FIELDS, num_classes=2)[0].image.dtype == torch.float32


@pytest.mark.parametrize("kind", ["zip", "tar.gz", "tar"])
def test_a_truncated_archive_is_called_damaged_not_unknown(kind, tmp_path):
    import io
    import tarfile
    import zipfile

    from srforge.data.archive import archive_kind

    path = tmp_path / f"scans.{kind}"
    payload = np.random.default_rng(0).integers(0, 256, 4096, dtype=np.uint8).tobytes()
    if kind == "zip":
        with zipfile.ZipFile(path, "w") as zf:
            zf.writestr("a.png", payload)
    else:
        with tarfile.open(path, "w:gz" if kind == "tar.gz" else "w") as tf:
            info = tarfile.TarInfo("a.png")
            info.size = len(payload)
            tf.addfile(info, io.BytesIO(payload))
    data = path.read_bytes()
    path.write_bytes(data[: 300 if kind != "tar.gz" else 20])
    with pytest.raises(ValueError, match=r"starts as a .*(zip|tar).* truncated or damaged"):
        archive_kind(path)


def test_a_checkpoint_folder_is_named_as_a_folder(tmp_path):
    from srforge.runtime.checkpoint import load_checkpoint

    (tmp_path / "last.pt").write_bytes(b"x")
    with pytest.raises(FileNotFoundError, match=r"is a folder, not a checkpoint file; it holds last.pt"):
        load_checkpoint(tmp_path)


def test_training_refuses_a_depth_deeper_than_the_scans_before_building_a_model(tmp_path, capsys, monkeypatch):
    monkeypatch.syspath_prepend(str(tmp_path))
    (tmp_path / "careless_data.py").write_text("from test_hostile_data import Careless  # noqa: F401\n")
    config = {
        "run": {"dir": str(tmp_path / "run"), "device": "cpu"},
        "data": {"dataset": {"class": "careless_data:Careless", "args": {}}, "fields": FIELDS},
        "model": {"base_channels": 4, "depth": 10},
        "train": {"epochs": 1},
    }
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(config))
    assert main_train(["--config", str(tmp_path / "config.yaml")]) == 2
    err = capsys.readouterr().err
    assert "srforge-train: error: model.depth:" in err and "use depth" in err and "Traceback" not in err
    assert not (tmp_path / "run" / "last.pt").exists()


def test_a_model_class_that_is_not_a_module_is_refused_before_the_run_folder_exists(tmp_path, capsys):
    config = {"run": {"dir": str(tmp_path / "run"), "device": "cpu"}, "model": {"class": "os:getcwd"}}
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(config))
    assert main_train(["--config", str(tmp_path / "config.yaml")]) == 2
    assert "model.class: os:getcwd is builtin_function_or_method, not a torch.nn.Module" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()
