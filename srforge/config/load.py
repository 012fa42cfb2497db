"""Training configs: YAML -> defaults merged -> command-line overrides -> validated -> a typed ``Config``.

Every key, with its type, default and rules, is declared once in ``srforge.config.schema``. Validation happens
before anything heavy starts and every error names the key path: an unknown key also names the closest valid
key, a wrong type names the expected type. An error whose value came from a command-line override names that
override (``Override 'train.lr=abc': ...``); one from the file names the file.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from srforge.config.errors import ConfigError
from srforge.config.overrides import blame_override, nest, parse_override, set_free_form, touches
from srforge.config.schema import SCHEMA, Config
from srforge.config.yaml_io import read_yaml_file


def defaults() -> Config:
    """The default config: every key's default."""
    return Config()


def get(cfg: Mapping, path: str) -> Any:
    """The value at a dotted path: ``get(cfg, "train.lr")``."""
    node: Any = cfg
    for part in path.split("."):
        node = node[part]
    return node


def resolve(user: Mapping | None = None, overrides: list[str] = ()) -> Config:
    """Defaults <- user config <- overrides, validated. Raises ConfigError naming the key path, and the override
    when one set the value at fault (the last override touching the keys of a rule that fails, see ``touches``)."""
    cfg = Config(user or {})
    paths = []
    for text in overrides:
        try:
            path, value = parse_override(text)
            if not set_free_form(cfg, path, value):
                cfg.merge(nest(path, value))
        except ConfigError as exc:
            raise blame_override(text, exc) from None
        paths.append((path, text))
        replace_the_partner(cfg, path)
    try:
        cfg.check()
    except ConfigError as exc:
        culprits = [text for path, text in paths if touches(path, exc.keys)]
        if not culprits:
            raise
        raise blame_override(culprits[-1], exc) from None
    return cfg


# An override of one key of these pairs replaces the other, which the file may have set: they cannot both be given.
PARTNERS = {"data.batch_size": "data.max_pixels", "data.max_pixels": "data.batch_size"}


def replace_the_partner(cfg: Config, path: str) -> None:
    """After the override of ``path``: set to a value, data.batch_size nulls data.max_pixels and the other way round;
    a model.class other than srforge's UNet resets the UNet keys (which only the UNet takes) to their defaults.
    Each change is one line on the console, so that the intent of the command line is plain."""
    from srforge.config.schema import ModelSection
    from srforge.constants import UNET_CLASSES, UNET_KEYS

    if path in PARTNERS and get(cfg, path) is not None:
        partner = PARTNERS[path]
        section, key = partner.split(".")
        if cfg[section][key] is not None:
            print(f"srforge: {path} given on the command line: {partner} ({cfg[section][key]}) set to null")
            cfg[section][key] = None
    if path in ("model.class", "model") and cfg.model.class_ not in UNET_CLASSES:
        changed = [k for k in UNET_KEYS if cfg.model[k] != ModelSection.__dict__[k].default]
        for k in changed:
            cfg.model[k] = ModelSection.__dict__[k].default
        if changed:
            reset = ", ".join(changed)
            print(f"srforge: model.class={cfg.model.class_} given: the UNet keys {reset} reset (the UNet's only)")


def load_config(path: str | os.PathLike, overrides: list[str] = ()) -> Config:
    """Read a YAML config file (``read_yaml_file``), merge defaults and overrides, and validate."""
    user = read_yaml_file(path)
    if user is None:
        raise ConfigError(
            f"{path} is empty: expected a mapping with the sections {list(SCHEMA)}, e.g. a copy of "
            "configs/quickstart.yaml."
        )
    try:
        return resolve(user, overrides)
    except ConfigError as exc:
        if exc.override is not None:  # a command-line value, not the file's
            raise
        raise ConfigError(f"{path}: {exc}", exc.keys) from None
