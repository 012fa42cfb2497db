"""Training configs: the schema, loading YAML with overrides, and validation.

``srforge.config.trust`` (what a checkpoint may make srforge import) and ``srforge.config.preflight`` (checks
before a run writes anything) are submodules, imported where needed: they load torch, reading a config does not.
"""

from srforge.config.load import (
    SCHEMA,
    ConfigError,
    defaults,
    dump,
    get,
    import_object,
    load_config,
    load_yaml,
    parse_override,
    read_yaml_file,
    resolve,
)

__all__ = [
    "SCHEMA",
    "ConfigError",
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
