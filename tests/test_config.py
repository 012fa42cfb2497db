"""Config: defaults, overrides as YAML scalars, and errors that name the key path."""

import re
import time
import tracemalloc
from pathlib import Path

import pytest
import yaml

from srforge.config import (
    ConfigError,
    defaults,
    import_object,
    load_config,
    load_yaml,
    parse_override,
    resolve,
)
from srforge.config.schema import ModelSection
from srforge.constants import MAX_DEPTH

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


def test_an_override_inside_a_mapping_or_null_key_keeps_the_mappings_other_entries():
    user = {"train": {"ema": 0.9, "self_training": {"weight": 2.0, "confidence": 0.8}}, "data": {"unlabelled": "/u"}}
    cfg = resolve(user, ["train.self_training.tta=flip", "train.self_training.augment.noise=0.1"])
    assert cfg["train"]["self_training"] == {"weight": 2.0, "confidence": 0.8, "tta": "flip", "augment": {"noise": 0.1}}
    user["train"]["self_training"]["augment"] = None  # null inside: a mapping of that one entry
    cfg = resolve(user, ["train.self_training.augment.noise=0.1", "train.early_stop.patience=4"])
    assert cfg["train"]["self_training"]["augment"] == {"noise": 0.1}
    assert cfg["train"]["early_stop"] == {"patience": 4}
    with pytest.raises(ConfigError, match="Override 'train.self_training.wieght=1': .*unknown key 'wieght'"):
        resolve(user, ["train.self_training.wieght=1"])


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
    assert import_object("srforge.config.load:resolve", "k") is resolve
    with pytest.raises(ConfigError, match="data.dataset.class: cannot import module 'no_such_pkg.mod'"):
        import_object("no_such_pkg.mod:X", "data.dataset.class")
    with pytest.raises(ConfigError, match="has no attribute 'Nope'"):
        import_object("srforge.config.load:Nope", "data.dataset.class")


def _alias_bomb(levels: int = 9, width: int = 9) -> str:
    """``levels`` anchors, each a list of ``width`` aliases of the one before: width**levels names."""
    lines = [f"a0: &a0 [{', '.join(['lol'] * width)}]"]
    lines += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * width)}]" for i in range(1, levels)]
    return "\n".join(lines) + "\n"


def test_an_alias_bomb_is_refused_quickly_and_without_memory(tmp_path):
    path = tmp_path / "bomb.yaml"
    text = "data:\n  dataset:\n    args:\n" + "".join(f"      {line}\n" for line in _alias_bomb().splitlines())
    path.write_text(text + "model:\n  class_names: *a8\n")
    tracemalloc.start()
    started = time.perf_counter()
    try:
        with pytest.raises(ConfigError, match=rf"{path}: its aliases \(\*name\) expand it to more than 1,000,000"):
            load_config(path)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert time.perf_counter() - started < 2 and peak < 2 << 20
    with pytest.raises(ConfigError, match=r"Override 'data.dataset.args.x=.*': the value: its aliases"):
        resolve({}, ["data.dataset.args.x=[" + _alias_bomb().replace("\n", ", ").rstrip(", ") + "]"])


def test_aliases_within_bounds_self_reference_and_deep_nesting():
    assert load_yaml(_alias_bomb(levels=3), "f")["a2"] == [[["lol"] * 9] * 9] * 9  # 729 names: fine
    with pytest.raises(ConfigError, match="f: its aliases .* or an alias refers to itself"):
        load_yaml("a: &x [1, *x]\n", "f")
    with pytest.raises(ConfigError, match="f is not valid YAML: nested too deeply"):
        load_yaml("[" * 20_000, "f")
    assert load_yaml("", "f") is None


def test_class_names_must_be_short_strings():
    with pytest.raises(ConfigError, match="model.class_names: expected at most 1024 class names, found 1025"):
        resolve({"model": {"num_classes": 1025, "class_names": [f"c{i}" for i in range(1025)]}})
    assert (
        len(
            resolve({"model": {"num_classes": 1024, "class_names": [f"c{i}" for i in range(1024)]}})["model"][
                "class_names"
            ]
        )
        == 1024
    )
    with pytest.raises(ConfigError, match="class name 0 must have 1 to 64 characters, found 0"):
        resolve({"model": {"class_names": ["", "b"]}})
    with pytest.raises(ConfigError, match="class name 1 must be a string, found int"):
        resolve({"model": {"class_names": ["a", 7]}})


def test_non_finite_numbers_anywhere_name_their_key():
    for text, key in [
        ("train.lr=.inf", "train.lr"),
        ("train.min_lr_ratio=.nan", "train.min_lr_ratio"),
        ("data.augment={noise: -.inf}", "data.augment.noise"),
        ("data.dataset.args.sizes=[1, .nan]", r"data.dataset.args.sizes\[1\]"),
    ]:
        with pytest.raises(ConfigError, match=rf"{key}: expected a finite number, found"):
            resolve({}, [text])
    assert resolve({}, ["train.lr=1e-2"])["train"]["lr"] == 0.01


def test_empty_and_non_utf8_files(tmp_path):
    (tmp_path / "empty.yaml").write_text("")
    with pytest.raises(ConfigError, match=r"empty.yaml is empty: expected a mapping with the sections"):
        load_config(tmp_path / "empty.yaml")
    (tmp_path / "list.yaml").write_text("- 1\n")
    with pytest.raises(ConfigError, match=r"list.yaml: config: expected a mapping"):
        load_config(tmp_path / "list.yaml")
    (tmp_path / "bom.yaml").write_bytes("\ufefftrain: {epochs: 2}\n".encode())
    assert load_config(tmp_path / "bom.yaml")["train"]["epochs"] == 2
    (tmp_path / "utf16.yaml").write_bytes("train: {epochs: 2}\n".encode("utf-16"))
    with pytest.raises(ConfigError, match=r"utf16.yaml is not UTF-8 text \(line 1, byte 0"):
        load_config(tmp_path / "utf16.yaml")


def test_a_typo_inside_data_augment_names_the_closest_key():
    with pytest.raises(
        ConfigError, match=r"Unknown config key 'data.augment.vfilp'. Did you mean 'data.augment.vflip'"
    ):
        resolve({"data": {"augment": {"vfilp": 0.5}}})
    with pytest.raises(ConfigError, match=r"'data.augment.affine.degres'. Did you mean 'data.augment.affine.degrees'"):
        resolve({"data": {"augment": {"affine": {"degres": 8}}}})
    assert resolve({"data": {"augment": {"vflip": 0.5, "affine": {"degrees": 8}}}})["data"]["augment"]["vflip"] == 0.5
    with pytest.raises(ConfigError, match=r"data\.augment\.crop is no longer an option: use data\.crop"):
        resolve({"data": {"augment": {"crop": {"max_height": 8}}}})


def test_log_every_and_dist_timeout_are_checked():
    cfg = resolve({"train": {"log_every": 5, "dist_timeout_s": 60}})
    assert cfg["train"]["log_every"] == 5 and cfg["train"]["dist_timeout_s"] == 60
    with pytest.raises(ConfigError, match=r"train.log_every: expected an integer >= 1, found 0"):
        resolve({"train": {"log_every": 0}})
    with pytest.raises(ConfigError, match=r"train.dist_timeout_s: expected a positive number of seconds, found 0"):
        resolve({"train": {"dist_timeout_s": 0}})


def test_synthetic_scale_is_a_number_or_a_range():
    assert resolve({}).data.synthetic.scale == 0.0625
    assert resolve({}, ["data.synthetic.scale=[0.03, 0.0625]"]).data.synthetic.scale == [0.03, 0.0625]
    assert resolve({"data": {"synthetic": {"scale": [0.05, 0.05]}}}).data.synthetic.scale == [0.05, 0.05]
    expected = r"data.synthetic.scale: expected a positive number or \[lo, hi\] of them with lo <= hi"
    for bad in (0, -1, [0.03], [0.03, 0.05, 0.1], [0, 0.05], ["a", 0.05], [True, 1]):
        with pytest.raises(ConfigError, match=rf"{expected} \(e.g. \[0.03, 0.0625\]\), found {re.escape(repr(bad))}\."):
            resolve({"data": {"synthetic": {"scale": bad}}})
    with pytest.raises(
        ConfigError, match=r"data.synthetic.scale: expected \[lo, hi\] with lo <= hi, found \[0.1, 0.05\]"
    ):
        resolve({}, ["data.synthetic.scale=[0.1, 0.05]"])
    with pytest.raises(ConfigError, match=r"data.synthetic.scale: expected float or int or list, found str 'big'"):
        resolve({}, ["data.synthetic.scale=big"])
    with pytest.raises(ConfigError, match=r"YAML reads 3e-2 as text: write it with a dot \(3.0e-2\)"):
        resolve({}, ["data.synthetic.scale=[3e-2, 5e-2]"])
    with pytest.raises(ConfigError, match=r"data.synthetic.scale\[1\]: expected a finite number, found inf"):
        resolve({"data": {"synthetic": {"scale": [0.03, float("inf")]}}})


def test_duplicate_class_names_are_refused():
    with pytest.raises(ConfigError, match=r"model.class_names: class name 1 'bg' repeats class name 0"):
        resolve({"model": {"num_classes": 2, "class_names": ["bg", "bg"]}})


def test_duplicate_keys_in_a_config_file_are_an_error_naming_both_lines(tmp_path):
    path = tmp_path / "twice.yaml"
    path.write_text("train:\n  epochs: 1\ndata:\n  batch_size: 2\ntrain:\n  epochs: 50\n")
    from srforge.config import load_config

    with pytest.raises(ConfigError, match=r"the key 'train' is given twice in one mapping \(lines 1 and 5\)"):
        load_config(str(path), [])
    path.write_text("data:\n  dataset:\n    args: {root: d1, root: dtiny}\n")
    with pytest.raises(ConfigError, match=r"the key 'root' is given twice in one mapping \(lines 3 and 3\)"):
        load_config(str(path), [])
    with pytest.raises(ConfigError, match="is a folder, not a config file"):
        load_config(str(tmp_path), [])


def test_an_override_of_one_of_a_pair_replaces_the_other_and_says_so(capsys):
    from srforge.config import load_config

    cfg = load_config("configs/quickstart.yaml", ["data.batch_size=8"])
    assert (cfg.data.batch_size, cfg.data.max_pixels) == (8, None)
    assert "data.batch_size given on the command line: data.max_pixels (30000) set to null" in capsys.readouterr().out
    cfg = load_config("configs/quickstart.yaml", ["model.class=test_model_create:TinyNet"])
    assert cfg.model.depth == 5 and cfg.model.class_ == "test_model_create:TinyNet"
    assert "the UNet keys base_channels, depth reset" in capsys.readouterr().out


def test_config_accepts_auto_numbers_and_null_for_max_pixels_and_crops():
    assert resolve({"data": {"batch_size": None, "max_pixels": "auto"}})["data"]["max_pixels"] == "auto"
    with pytest.raises(ConfigError, match=r"data.max_pixels: expected an int >= 1, auto or null, found 'max'"):
        resolve({"data": {"batch_size": None, "max_pixels": "max"}})
    with pytest.raises(ConfigError, match=r"data.max_pixels: expected an integer >= 1 \(or auto\), found 0"):
        resolve({"data": {"batch_size": None, "max_pixels": 0}})
    assert resolve({"data": {"crop": [512, 4096]}})["data"]["crop"] == [512, 4096]
    with pytest.raises(ConfigError, match=r"data.crop: expected an int >= 1 or \[H, W\] of them"):
        resolve({"data": {"crop": [512]}})
    with pytest.raises(ConfigError, match=r"train.accumulate: expected an integer >= 1, found 0"):
        resolve({"train": {"accumulate": 0}})
    welllog = resolve(yaml.safe_load((ROOT / "configs" / "welllog.yaml").read_text()))
    assert welllog["data"]["max_pixels"] == "auto"


def test_model_depth_has_a_static_bound_that_names_it():
    assert resolve({"model": {"depth": MAX_DEPTH}}).model.depth == MAX_DEPTH
    with pytest.raises(ConfigError, match=r"model.depth: expected an integer <= 16 \(.*65,536 px.*\), found 40"):
        resolve({"model": {"depth": 40}})
    with pytest.raises(ConfigError, match=r"model.depth: expected an integer >= 1, found 0"):
        resolve({"model": {"depth": 0}})
    assert ModelSection.depth.maximum == MAX_DEPTH


def test_an_ignore_index_that_is_a_class_id_is_refused_naming_both_keys():
    for index, classes in [(1, 2), (0, 2), (4, 5)]:
        expected = rf"data.ignore_index and model.num_classes: .*found data.ignore_index {index}, so class {index}"
        with pytest.raises(ConfigError, match=expected):
            resolve({"data": {"ignore_index": index}, "model": {"num_classes": classes}})
    for index, classes in [(2, 2), (-1, 2), (255, 2), (255, 300)]:
        assert resolve({"data": {"ignore_index": index}, "model": {"num_classes": classes}}).data.ignore_index == index


# -- an error names the override that set the bad value, not the file -----------------------------------------------
@pytest.fixture
def config_file(tmp_path):
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump({"train": {"epochs": 2}, "data": {"dataset": {"args": {"root": "scans"}}}}))
    return path


@pytest.mark.parametrize(
    "override, message",
    [
        ("train.lr=abc", r"train.lr: expected float or int, found str 'abc'"),
        ("train.lr=-1", r"train.lr: expected a positive number, found -1"),
        ("model.depth=40", r"model.depth: expected an integer <= 16"),
        ("data.ignore_index=1", r"data.ignore_index and model.num_classes"),
        ("data.batch_size=null", r"data.batch_size and data.max_pixels: set exactly one"),
        ("data={batch_size: 0}", r"data.batch_size: expected an integer >= 1"),
        ("data.augment.noise=-.inf", r"data.augment.noise: expected a finite number"),
        ("data.dataset.args.root.x=1", r"data.dataset.args.root: expected a mapping for data.dataset.args.root.x"),
        ("trian.lr=1", r"Unknown config key 'trian'. Did you mean 'train'"),
    ],
)
def test_an_override_error_names_the_override_not_the_file(config_file, override, message):
    with pytest.raises(ConfigError) as caught:
        load_config(config_file, ["run.seed=3", override])
    text = str(caught.value)
    assert text.startswith(f"Override '{override}': ") and str(config_file) not in text
    assert caught.value.override == override
    assert re.search(message, text), text


def test_a_bad_value_from_the_file_still_names_the_file(tmp_path):
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump({"train": {"lr": -1}, "data": {"ignore_index": 0}}))
    with pytest.raises(ConfigError, match=rf"^{path}: train.lr: expected a positive number") as caught:
        load_config(path, ["train.epochs=3", "model.depth=4"])
    assert caught.value.override is None
    with pytest.raises(ConfigError, match=rf"^{path}: data.ignore_index and model.num_classes"):
        load_config(path, ["train.lr=0.01"])
    assert load_config(path, ["train.lr=0.01", "data.ignore_index=255"]).data.ignore_index == 255
    path.write_text("train: {lr: abc}\n")
    with pytest.raises(ConfigError, match=rf"^{path}: train.lr: expected float or int"):
        load_config(path, ["train.epochs=3"])


def test_the_last_override_of_a_key_is_blamed():
    with pytest.raises(ConfigError, match=r"^Override 'train=\{lr: -2\}': train.lr: expected a positive number"):
        resolve({}, ["train.lr=-1", "train={lr: -2}", "run.seed=1"])
    assert resolve({"train": {"lr": -1}}, ["train.lr=0.5"]).train.lr == 0.5  # an override may mend the file
