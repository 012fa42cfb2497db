"""Training configs: the schema (``Config``, one class per section), loading YAML with overrides, validation.

    cfg = load_config("configs/quickstart.yaml", ["train.lr=0.01"])
    cfg.train.lr == cfg["train"]["lr"]     # attribute or item access; sections are dicts
    cfg.to_dict()                          # plain nested dicts, for checkpoints and YAML

``srforge.config.trust`` (what a checkpoint may make srforge import) and ``srforge.config.preflight`` (checks
before a run writes anything) are submodules, imported where needed: they load torch, reading a config does not.
"""

from srforge.config.errors import ConfigError
from srforge.config.fields import Key, Section
from srforge.config.imports import import_object
from srforge.config.load import defaults, get, load_config, resolve
from srforge.config.overrides import parse_override
from srforge.config.schema import SCHEMA, Config
from srforge.config.yaml_io import dump, load_yaml, read_yaml_file

__all__ = [
    "SCHEMA",
    "Config",
    "ConfigError",
    "Key",
    "Section",
    "defaults",
    "dump",
    "get",
    "import_object",
    "load_config",
    "load_yaml",
    "parse_override",
    "read_yaml_file",
    "resolve",
]
