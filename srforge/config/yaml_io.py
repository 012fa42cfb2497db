"""YAML in and out: a config file read safely (no Python tags, no alias bombs, UTF-8 only), a config written."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from srforge.config.errors import ConfigError
from srforge.config.fields import Section
from srforge.limits import MAX_ALIAS_EXPANSION, expanded_size


def _yaml_parts(node: yaml.Node):
    if isinstance(node, yaml.MappingNode):
        for key, value in node.value:
            yield key
            yield value
    elif isinstance(node, yaml.SequenceNode):
        yield from node.value


def _yaml_weight(node: yaml.Node) -> int:
    return 1 + (len(node.value) if isinstance(node, yaml.ScalarNode) else 0)


def duplicate_key(root: yaml.Node) -> str | None:
    """'key 'train' twice in one mapping (lines 3 and 9)' for the first mapping of the composed document that
    holds a key twice, else None. YAML's loaders keep the last silently, so a second ``train:`` block would replace
    the first."""
    seen, todo = set(), [root]
    while todo:
        node = todo.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        if isinstance(node, yaml.MappingNode):
            lines: dict[Any, int] = {}
            for key, _ in node.value:
                if isinstance(key, yaml.ScalarNode):
                    if key.value in lines:
                        first, again = lines[key.value], key.start_mark.line + 1
                        return f"the key {key.value!r} is given twice in one mapping (lines {first} and {again})"
                    lines[key.value] = key.start_mark.line + 1
        todo.extend(_yaml_parts(node))
    return None


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
        twice = duplicate_key(node)
        if twice:
            raise ConfigError(f"{source}: {twice}; the second would silently replace the first. Keep one.")
        return loader.construct_document(node)
    except yaml.YAMLError as exc:
        raise ConfigError(f"{source} is not valid YAML: {exc}") from None
    except RecursionError:
        raise ConfigError(f"{source} is not valid YAML: nested too deeply.") from None
    finally:
        loader.dispose()


def read_yaml_file(path: str | os.PathLike) -> Any:
    """The YAML document in ``path`` (None when it holds none), read as UTF-8 with :func:`load_yaml`."""
    path = Path(path)
    if path.is_dir():
        raise ConfigError(f"{path.resolve()} is a folder, not a config file; give a YAML file (configs/*.yaml).")
    if not path.is_file():
        raise ConfigError(f"Config file not found: {path.resolve()}")
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


def dump(cfg: Mapping) -> str:
    """``cfg`` (a Config, or the plain dict a checkpoint holds) as YAML, keys in the schema's order."""
    return yaml.safe_dump(cfg.to_dict() if isinstance(cfg, Section) else dict(cfg), sort_keys=False)
