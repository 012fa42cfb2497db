"""Config: defaults, overrides as YAML scalars, and errors that name the key path."""

from pathlib import Path

import pytest

from srforge.config import (
    ConfigError,
    defaults,
    import_object,
    load_config,
    parse_override,
    resolve,
)

ROOT = Path(__file__).resolve().parents[1]


def test_shipped_configs_resolve():
    for name in ("quickstart", "welllog", "custom_dataset"):
        cfg = load_config(ROOT / "configs" / f"{name}.yaml")
        for path in ("run", "data", "model", "train"):
            assert path in cfg
    quick = load_config(ROOT / "configs" / "quickstart.yaml")
    assert quick["data"]["synthetic"]["root"] == "data/quickstart" and quick["model"]["num_classes"] == 2


def test_keys_users_rely_on_exist():
    cfg = defaults()
    for path in (
        "run.dir",
        "run.seed",
        "data.dataset.class",
        "data.dataset.args",
        "data.batch_size",
        "data.max_pixels",
        "data.num_workers",
        "model.num_classes",
        "model.base_channels",
        "model.depth",
        "train.epochs",
        "train.lr",
        "train.precision",
    ):
        node = cfg
        for part in path.split("."):
            node = node[part]


def test_overrides_are_yaml_scalars_and_reach_free_form_args():
    assert parse_override("train.lr=0.01") == ("train.lr", 0.01)
    assert resolve({}, ["train.lr=1e-2"])["train"]["lr"] == 0.01  # YAML 1.1 reads 1e-2 as a string
    assert resolve({"train": {"lr": "3e-4"}})["train"]["lr"] == 3e-4
    assert parse_override("model.class_names=[a, b]") == ("model.class_names", ["a", "b"])
    assert parse_override("data.max_pixels=null") == ("data.max_pixels", None)
    cfg = resolve(
        {},
        [
            "train.epochs=3",
            "train.channels_last=true",
            "data.dataset.args.root=/x",
            "data.batch_size=null",
            "data.max_pixels=1000",
        ],
    )
    assert cfg["train"]["epochs"] == 3 and cfg["train"]["channels_last"] is True
    assert cfg["data"]["dataset"]["args"] == {"root": "/x"}
    assert cfg["data"]["max_pixels"] == 1000


def test_unknown_key_names_the_closest_valid_key():
    with pytest.raises(ConfigError, match=r"Unknown config key 'train.lr_'.*Did you mean 'train.lr'"):
        resolve({"train": {"lr_": 0.1}})
    with pytest.raises(ConfigError, match=r"'model.base_chanels'.*Did you mean 'model.base_channels'"):
        resolve({}, ["model.base_chanels=8"])
    with pytest.raises(ConfigError, match=r"Unknown config key 'trian'.*Did you mean 'train'"):
        resolve({"trian": {}})


def test_wrong_type_names_the_path_and_the_expected_type():
    with pytest.raises(ConfigError, match=r"train.epochs: expected int, found str 'ten'"):
        resolve({"train": {"epochs": "ten"}})
    with pytest.raises(ConfigError, match=r"train.lr: expected float or int, found str"):
        resolve({}, ["train.lr=fast"])
    with pytest.raises(ConfigError, match=r"model.padding_aware: expected bool, found int"):
        resolve({"model": {"padding_aware": 1}})
    with pytest.raises(ConfigError, match=r"train.epochs: expected int, found bool"):
        resolve({"train": {"epochs": True}})
    with pytest.raises(ConfigError, match=r"train.precision: expected one of \['fp32', 'bf16', 'fp16'\], found 'fp8'"):
        resolve({"train": {"precision": "fp8"}})


def test_value_rules():
    with pytest.raises(ConfigError, match="set exactly one"):
        resolve({"data": {"max_pixels": 1000}})
    with pytest.raises(ConfigError, match=r"model.class_names: expected 2 names"):
        resolve({"model": {"class_names": ["a"]}})
    with pytest.raises(ConfigError, match=r"data.dataset.class: expected 'module.path:ClassName'"):
        resolve({"data": {"dataset": {"class": "nomodule"}}})
    with pytest.raises(ConfigError, match=r"train.epochs: expected an integer >= 1, found 0"):
        resolve({"train": {"epochs": 0}})


def test_missing_config_file_and_bad_yaml(tmp_path):
    with pytest.raises(ConfigError, match=r"Config file not found: .*nope.yaml"):
        load_config(tmp_path / "nope.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("train: [1, 2\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(bad)
    unsafe = tmp_path / "unsafe.yaml"
    unsafe.write_text("train: !!python/object/apply:os.system ['true']\n")
    with pytest.raises(ConfigError):  # safe_load refuses Python tags
        load_config(unsafe)


def test_import_object_errors_name_the_key():
    assert import_object("srforge.config:resolve", "k") is resolve
    with pytest.raises(ConfigError, match="data.dataset.class: cannot import module 'no_such_pkg.mod'"):
        import_object("no_such_pkg.mod:X", "data.dataset.class")
    with pytest.raises(ConfigError, match="has no attribute 'Nope'"):
        import_object("srforge.config:Nope", "data.dataset.class")
