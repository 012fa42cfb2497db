"""Command-line overrides: ``key.path=value``, the value read as a YAML scalar (``train.lr=1e-2``, ``x=null``)."""

from __future__ import annotations

from typing import Any

from srforge.config.errors import ConfigError
from srforge.config.fields import Key, Section
from srforge.config.yaml_io import load_yaml


def parse_override(text: str) -> tuple[str, Any]:
    """``"train.lr=0.01"`` -> ("train.lr", 0.01): the value is read as a YAML scalar."""
    if "=" not in text:
        raise ConfigError(f"Override '{text}' must look like key.path=value, e.g. train.epochs=3.")
    path, raw = text.split("=", 1)
    value = load_yaml(raw, f"Override '{text}': the value") if raw.strip() else None
    return path.strip(), value


def nest(path: str, value: Any) -> dict:
    """``("a.b", 1)`` -> ``{"a": {"b": 1}}``."""
    out: Any = value
    for part in reversed(path.split(".")):
        out = {part: out}
    return out


def set_free_form(cfg: Section, path: str, value: Any) -> bool:
    """Set ``path`` when it reaches inside a free-form mapping (``data.dataset.args.root=...``), creating the
    mappings on the way; False when ``path`` is no such path (the caller merges it as a key of the schema)."""
    parts = path.split(".")
    node: Any = cfg
    for i, part in enumerate(parts):
        field = node.FIELDS.get(part) if isinstance(node, Section) else None
        if field is None:
            return False
        if isinstance(field, Key):
            if not field.free_form or i == len(parts) - 1:
                return False
            target = node[part]
            for depth, inner in enumerate(parts[i + 1 : -1], start=i + 1):
                target = target.setdefault(inner, {})
                if not isinstance(target, dict):
                    where = ".".join(parts[: depth + 1])
                    found = f"{type(target).__name__} {target!r}"
                    raise ConfigError(f"Override '{path}': {where} is {found}, not a mapping.")
            target[parts[-1]] = value
            return True
        node = node[part]
    return False
