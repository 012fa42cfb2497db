"""Training configs: YAML -> defaults merged -> command-line overrides -> validated -> objects.

The schema is plain data: ``SCHEMA`` mirrors the config's nesting, and each leaf is ``(types, default)``.
A leaf whose types are ``(dict,)`` is free-form (a Dataset's own arguments, the augmentation recipe) and
is passed on as it is. Validation happens before anything heavy starts and every error names the key path:
an unknown key also names the closest valid key, a wrong type names the expected type.
"""

from __future__ import annotations

import copy
import difflib
import importlib
import math
import os
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import yaml

from srforge.constants import IGNORE_INDEX, PRECISIONS
from srforge.limits import MAX_ALIAS_EXPANSION, class_names_problem, expanded_size

NoneType = type(None)
NUMBER = (float, int)

SCHEMA: dict[str, Any] = {
    "run": {
        "dir": ((str,), "runs/quickstart"),
        "seed": ((int,), 0),
        "device": ((str,), "auto"),  # auto | cpu | cuda | cuda:N
    },
    "data": {
        "dataset": {
            "class": ((str,), "srforge.data.datasets:SegmentationFolder"),
            "args": ((dict,), {}),
        },
        # A separate validation set; when its class is null, the dataset is split by size (val_fraction).
        "val_dataset": {
            "class": ((str, NoneType), None),
            "args": ((dict,), {}),
        },
        "val_fraction": (NUMBER, 0.2),
        # Where the Dataset keeps each canonical field: {image: scan, mask: labels, name: id}.
        "fields": ((dict,), {}),
        # Synthetic well-log scans generated into `root` when it holds no images yet (the quickstart).
        "synthetic": {
            "root": ((str, NoneType), None),
            "n": ((int,), 48),
            "scale": (NUMBER, 0.0625),
            "classes": ((str,), "binary"),
            "seed": ((int,), 0),
        },
        "batch_size": ((int, NoneType), 4),
        "max_pixels": ((int, NoneType), None),
        "num_workers": ((int,), 0),
        "augment": ((dict,), {}),
        "ignore_index": ((int,), IGNORE_INDEX),
    },
    "model": {
        "in_channels": ((int,), 3),
        "num_classes": ((int,), 2),
        "base_channels": ((int,), 16),
        "depth": ((int,), 5),
        "max_channels": ((int,), 512),
        "padding_aware": ((bool,), True),
        "class_names": ((list, NoneType), None),
    },
    "train": {
        "epochs": ((int,), 10),
        "stop_after": ((int, NoneType), None),  # end this invocation after N epochs (time-limited jobs)
        "lr": (NUMBER, 1e-3),
        "weight_decay": (NUMBER, 1e-4),
        "warmup_steps": ((int,), 10),
        "min_lr_ratio": (NUMBER, 0.01),
        "grad_clip": ((float, int, NoneType), 1.0),
        "precision": ((str,), "fp32"),  # fp32 | bf16 | fp16
        "channels_last": ((bool,), False),
        "compile": ((bool,), False),
        "dice_weight": (NUMBER, 0.0),
        "val_every": ((int,), 1),
        "skip_nonfinite": ((bool,), False),
        # The progress bar's loss, mean IoU and px/s are read from the device every N steps, in the same transfer
        # as the step's finiteness check (the one read a step makes), so N sets how often the bar is redrawn.
        "log_every": ((int,), 2),
        # Collective timeout under torchrun (init_process_group(timeout=...)): how long a rank waits for the others.
        "dist_timeout_s": (NUMBER, 1800),
    },
}

CHOICES = {
    "train.precision": PRECISIONS,
    "data.synthetic.classes": ("binary", "multiclass"),
}


# Integer keys and their smallest valid value (null, where allowed, is checked by type).
MINIMUMS = {
    "data.num_workers": 0,
    "model.in_channels": 1,
    "model.num_classes": 1,
    "model.base_channels": 1,
    "model.depth": 1,
    "train.epochs": 1,
    "train.val_every": 1,
    "data.batch_size": 1,
    "data.max_pixels": 1,
    "train.stop_after": 1,
    "train.log_every": 1,
}


class ConfigError(ValueError):
    """A config that cannot run; the message names the key path."""


def _is_leaf(node: Any) -> bool:
    return isinstance(node, tuple)


def defaults(schema: Mapping = SCHEMA) -> dict[str, Any]:
    """The default config: every leaf's default, nested like the schema."""
    return {k: copy.deepcopy(v[1]) if _is_leaf(v) else defaults(v) for k, v in schema.items()}


def _type_names(types: tuple) -> str:
    names = {float: "float", int: "int", str: "str", bool: "bool", list: "list", dict: "mapping", NoneType: "null"}
    return " or ".join(names[t] for t in types)


def _check_type(value: Any, types: tuple, path: str) -> None:
    # bool is an int in Python, but `epochs: true` is a mistake, not 1.
    ok = isinstance(value, types) and not (isinstance(value, bool) and bool not in types)
    if not ok:
        raise ConfigError(f"{path}: expected {_type_names(types)}, found {type(value).__name__} {value!r}.")


def _yaml11_float(value: Any, types: tuple) -> Any:
    """``1e-3`` as a float: YAML 1.1 (PyYAML) reads exponents without a dot as strings."""
    if isinstance(value, str) and float in types:
        try:
            return float(value)
        except ValueError:
            return value
    return value


def _unknown(key: str, node: Mapping, path: str) -> ConfigError:
    close = difflib.get_close_matches(key, list(node), n=1, cutoff=0.5)
    hint = f" Did you mean '{path + '.' if path else ''}{close[0]}'?" if close else ""
    return ConfigError(
        f"Unknown config key '{path + '.' if path else ''}{key}'.{hint} Valid keys here: {sorted(node)}."
    )


def _merge(base: dict, update: Mapping, schema: Mapping, path: str = "") -> dict:
    """``base`` with ``update`` merged in, checking keys and types against ``schema``."""
    if not isinstance(update, Mapping):
        raise ConfigError(f"{path or 'config'}: expected a mapping, found {type(update).__name__} {update!r}.")
    out = dict(base)
    for key, value in update.items():
        where = f"{path}.{key}" if path else str(key)
        if key not in schema:
            raise _unknown(str(key), schema, path)
        node = schema[key]
        if _is_leaf(node):
            value = _yaml11_float(value, node[0])
            _check_type(value, node[0], where)
            out[key] = copy.deepcopy(value)
        else:
            out[key] = _merge(base[key], value if value is not None else {}, node, where)
    return out


def _check_values(cfg: dict) -> None:
    for path, allowed in CHOICES.items():
        value = get(cfg, path)
        if value not in allowed:
            raise ConfigError(f"{path}: expected one of {list(allowed)}, found {value!r}.")
    data, model, train = cfg["data"], cfg["model"], cfg["train"]
    if (data["batch_size"] is None) == (data["max_pixels"] is None):
        raise ConfigError("data.batch_size and data.max_pixels: set exactly one (the other to null).")
    for path, least in MINIMUMS.items():
        value = get(cfg, path)
        if value is not None and value < least:
            raise ConfigError(f"{path}: expected an integer >= {least}, found {value}.")
    if not 0 < data["val_fraction"] < 1:
        raise ConfigError(f"data.val_fraction: expected a number between 0 and 1, found {data['val_fraction']}.")
    if not train["dist_timeout_s"] > 0:
        raise ConfigError(
            f"train.dist_timeout_s: expected a positive number of seconds, found {train['dist_timeout_s']}."
        )
    if not train["lr"] > 0:
        raise ConfigError(f"train.lr: expected a positive number, found {train['lr']}.")
    names = model["class_names"]
    problem = None if names is None else class_names_problem(names)
    if problem:
        raise ConfigError(f"model.class_names: {problem}.")
    if names is not None and len(names) != model["num_classes"]:
        raise ConfigError(
            f"model.class_names: expected {model['num_classes']} names (model.num_classes), found {len(names)}."
        )
    for section in ("dataset", "val_dataset"):
        spec = data[section]["class"]
        if spec is not None and ":" not in spec:
            raise ConfigError(f"data.{section}.class: expected 'module.path:ClassName', found {spec!r}.")
    _check_augment(data["augment"])
    for path, value in _leaves(cfg):
        if isinstance(value, float) and not math.isfinite(value):
            raise ConfigError(f"{path}: expected a finite number, found {value}.")


def _leaves(node: Any, path: str = "") -> Iterable[tuple[str, Any]]:
    """(dotted path, value) for every leaf of a nested config, free-form parts included."""
    if isinstance(node, Mapping):
        for key, value in node.items():
            yield from _leaves(value, f"{path}.{key}" if path else str(key))
    elif isinstance(node, (list, tuple)):
        for i, value in enumerate(node):
            yield from _leaves(value, f"{path}[{i}]")
    else:
        yield path, node


def _check_augment(recipe: Mapping) -> None:
    """Unknown keys of ``data.augment`` and its sections, with the closest valid key, before training starts."""
    from srforge.data.augment import KEYS  # imported here: it loads torchvision, which reading a config does not need

    for key, value in recipe.items():
        if key not in KEYS:
            raise _unknown(str(key), KEYS, "data.augment")
        if KEYS[key] is not None and isinstance(value, Mapping):
            for inner in value:
                if inner not in KEYS[key]:
                    raise _unknown(str(inner), dict.fromkeys(KEYS[key]), f"data.augment.{key}")


def get(cfg: Mapping, path: str) -> Any:
    node: Any = cfg
    for part in path.split("."):
        node = node[part]
    return node


def _yaml_parts(node: yaml.Node):
    if isinstance(node, yaml.MappingNode):
        for key, value in node.value:
            yield key
            yield value
    elif isinstance(node, yaml.SequenceNode):
        yield from node.value


def _yaml_weight(node: yaml.Node) -> int:
    return 1 + (len(node.value) if isinstance(node, yaml.ScalarNode) else 0)


def load_yaml(text: str, source: str) -> Any:
    """``yaml.safe_load(text)``, refusing a document whose aliases expand it far beyond its own size.

    The expanded size counts one unit per node and one per character of a scalar, every alias at each use;
    it may exceed the text's length by at most ``MAX_ALIAS_EXPANSION`` (a document without aliases always
    passes). The check walks the composed node graph once, before anything is constructed. ``source`` names
    the file (or override) in errors.
    """
    loader = yaml.SafeLoader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        if expanded_size(node, _yaml_parts, _yaml_weight, len(text) + MAX_ALIAS_EXPANSION) is None:
            raise ConfigError(
                f"{source}: its aliases (*name) expand it to more than {MAX_ALIAS_EXPANSION:,} nodes and characters "
                "beyond its own size, or an alias refers to itself; write the values out instead."
            )
        return loader.construct_document(node)
    except yaml.YAMLError as exc:
        raise ConfigError(f"{source} is not valid YAML: {exc}") from None
    except RecursionError:
        raise ConfigError(f"{source} is not valid YAML: nested too deeply.") from None
    finally:
        loader.dispose()


def parse_override(text: str) -> tuple[str, Any]:
    """``"train.lr=0.01"`` -> ("train.lr", 0.01): the value is read as a YAML scalar."""
    if "=" not in text:
        raise ConfigError(f"Override '{text}' must look like key.path=value, e.g. train.epochs=3.")
    path, raw = text.split("=", 1)
    value = load_yaml(raw, f"Override '{text}': the value") if raw.strip() else None
    return path.strip(), value


def _nest(path: str, value: Any) -> dict:
    out: Any = value
    for part in reversed(path.split(".")):
        out = {part: out}
    return out


def _set_free_form(cfg: dict, path: str, value: Any) -> bool:
    """Set ``path`` when it reaches inside a free-form dict leaf (``data.dataset.args.root=...``)."""
    parts = path.split(".")
    schema: Any = SCHEMA
    node: Any = cfg
    for i, part in enumerate(parts):
        if not isinstance(schema, Mapping) or part not in schema:
            return False
        if _is_leaf(schema[part]):
            if schema[part][0] != (dict,) or i == len(parts) - 1:
                return False
            target = node[part]
            for inner in parts[i + 1 : -1]:
                target = target.setdefault(inner, {})
            target[parts[-1]] = value
            return True
        schema, node = schema[part], node[part]
    return False


def resolve(user: Mapping | None = None, overrides: list[str] = ()) -> dict[str, Any]:
    """Defaults <- user config <- overrides, validated. Raises ConfigError naming the key path."""
    cfg = _merge(defaults(), user or {}, SCHEMA)
    for text in overrides:
        path, value = parse_override(text)
        if not _set_free_form(cfg, path, value):
            cfg = _merge(cfg, _nest(path, value), SCHEMA)
    _check_values(cfg)
    return cfg


def read_yaml_file(path: str | os.PathLike) -> Any:
    """The YAML document in ``path`` (None when it holds none), read as UTF-8 with :func:`load_yaml`."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"Config file not found: {path}")
    try:
        text = path.read_bytes().decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = exc.object.count(b"\n", 0, exc.start) + 1
        raise ConfigError(
            f"{path} is not UTF-8 text (line {line}, byte {exc.start}: {exc.object[exc.start : exc.start + 4]!r}); "
            "save it as UTF-8."
        ) from None
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read it ({exc.strerror}).") from None
    return load_yaml(text, str(path))


def load_config(path: str | os.PathLike, overrides: list[str] = ()) -> dict[str, Any]:
    """Read a YAML config file (:func:`read_yaml_file`), merge defaults and overrides, and validate."""
    user = read_yaml_file(path)
    if user is None:
        raise ConfigError(
            f"{path} is empty: expected a mapping with the sections {list(SCHEMA)}, e.g. a copy of "
            "configs/quickstart.yaml."
        )
    try:
        return resolve(user, overrides)
    except ConfigError as exc:
        raise ConfigError(f"{path}: {exc}") from None


def import_object(spec: str, key: str) -> Any:
    """``"package.module:Name"`` -> the object; ``key`` names the config entry in errors."""
    module_name, _, attr = spec.partition(":")
    # Users' own packages live beside their configs, in the working directory.
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigError(f"{key}: cannot import module '{module_name}' ({exc}).") from None
    try:
        return getattr(module, attr)
    except AttributeError:
        raise ConfigError(f"{key}: module '{module_name}' has no attribute '{attr}'.") from None


def dump(cfg: Mapping) -> str:
    return yaml.safe_dump(dict(cfg), sort_keys=False)
