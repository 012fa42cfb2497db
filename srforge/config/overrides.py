"""Command-line overrides: ``key.path=value``, the value read as a YAML scalar (``train.lr=1e-2``, ``x=null``)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from srforge.config.errors import ConfigError
from srforge.config.fields import Key, Section
from srforge.config.yaml_io import load_yaml


def parse_override(text: str) -> tuple[str, Any]:
    """``"train.lr=0.01"`` -> ("train.lr", 0.01): the value is read as a YAML scalar."""
    if "=" not in text:
        raise ConfigError(f"Override '{text}' must look like key.path=value, e.g. train.epochs=3.", override=text)
    path, raw = text.split("=", 1)
    try:
        value = load_yaml(raw, f"Override '{text}': the value") if raw.strip() else None
    except ConfigError as exc:
        exc.override = text  # the message names the override already
        raise
    return path.strip(), value


def blame_override(text: str, exc: ConfigError) -> ConfigError:
    """``exc`` as the error of the override ``text``: ``Override 'train.lr=abc': train.lr: expected ...``."""
    if exc.override is not None:
        return exc
    return ConfigError(f"Override '{text}': {exc}", exc.keys, override=text)


def touches(path: str, keys: Iterable[str]) -> bool:
    """Whether an override of ``path`` set one of ``keys`` (dotted paths), a value inside one, or a section
    holding one: ``data`` touches ``data.batch_size``, ``data.augment.noise`` touches ``data.augment``."""
    return any(
        key == path or key.startswith((f"{path}.", f"{path}[")) or path.startswith((f"{key}.", f"{key}["))
        for key in keys
    )


def nest(path: str, value: Any) -> dict:
    """``("a.b", 1)`` -> ``{"a": {"b": 1}}``."""
    out: Any = value
    for part in reversed(path.split(".")):
        out = {part: out}
    return out


def set_free_form(cfg: Section, path: str, value: Any) -> bool:
    """Set ``path`` when it reaches inside a key whose value is a mapping (``data.dataset.args.root=...``,
    ``train.self_training.tta=flip``), creating the mappings on the way (null ones too: a mapping of that one
    entry), so that a mapping's other entries stay; False when ``path`` is no such path (the caller merges it as a
    key of the schema)."""
    parts = path.split(".")
    node: Any = cfg
    for i, part in enumerate(parts):
        field = node.FIELDS.get(part) if isinstance(node, Section) else None
        if field is None:
            return False
        if isinstance(field, Key):
            if not field.free_form or i == len(parts) - 1:
                return False
            if node[part] is None:
                node[part] = {}
            target = node[part]
            for depth, inner in enumerate(parts[i + 1 : -1], start=i + 1):
                if target.get(inner) is None:
                    target[inner] = {}
                target = target[inner]
                if not isinstance(target, dict):
                    where = ".".join(parts[: depth + 1])
                    found = f"{type(target).__name__} {target!r}"
                    raise ConfigError(
                        f"{where}: expected a mapping for {path} to reach inside, found {found}; set {where} "
                        "itself, or name another key."
                    )
            target[parts[-1]] = value
            return True
        node = node[part]
    return False
