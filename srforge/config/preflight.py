"""Checks that run before training writes anything: what can be known wrong from the config alone.

A dataset class that does not import, arguments it does not take, a dataset root that does not exist, a device
this machine does not have: each is a ConfigError naming the key, raised before the run folder is touched, so
a mistyped command leaves no half-made run behind.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from srforge.config.errors import ConfigError
from srforge.config.imports import import_object
from srforge.runtime.device import resolve_device


def check_dataset(spec: Mapping[str, Any], key: str, generated_root: str | None = None) -> None:
    """``spec`` ({class, args}) at config key ``key`` imports, takes its args, and its ``root`` arg (when it has
    one) exists, unless it is ``generated_root`` (synthetic scans generated into it before building)."""
    cls = import_object(spec["class"], f"{key}.class")
    args = spec["args"]
    try:
        signature = inspect.signature(cls)
    except (TypeError, ValueError):  # a builtin or extension type: nothing to check before calling it
        signature = None
    if signature is not None:
        try:
            signature.bind(**args)
        except TypeError as exc:
            raise ConfigError(
                f"{key}.args: {spec['class']} cannot be built with {dict(args)} ({exc}); it takes {signature}."
            ) from None
    root = args.get("root")
    if isinstance(root, str) and not Path(root).exists():
        if generated_root is None or Path(root).resolve() != Path(generated_root).resolve():
            raise ConfigError(f"{key}.args.root: {root} does not exist; set it to your dataset folder.")


def check_model_class(spec: str) -> None:
    """``model.class`` imports, and is an nn.Module subclass (nothing else is ever called)."""
    from srforge.models.create import model_class

    try:
        model_class(spec, lambda path: import_object(path, "model.class"))
    except ValueError as exc:
        raise ConfigError(str(exc)) from None


def check_before_training(cfg: Mapping[str, Any]) -> None:
    """Every check above for a resolved training config, ``model.class`` imports as an nn.Module subclass, and
    ``run.device`` names a device this machine has."""
    check_model_class(cfg.model.class_)
    data = cfg.data
    check_dataset(data.dataset, "data.dataset", data.synthetic.root)
    if data.val_dataset.class_ is not None:
        check_dataset(data.val_dataset, "data.val_dataset")
    try:
        resolve_device(cfg.run.device)
    except ValueError as exc:
        raise ConfigError(f"run.device: {exc}") from None
