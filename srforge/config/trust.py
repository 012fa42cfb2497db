"""What a checkpoint may make srforge import: nothing that the user's own config does not name too.

A checkpoint embeds the training config, and ``--resume`` without ``--config`` rebuilds the run from it. Every
``class`` key of a config is an import path that srforge imports and calls (``data.dataset.class``,
``data.val_dataset.class``), so a checkpoint received from someone else could name ``subprocess:run``. Loading
the weights is safe (``weights_only=True``); importing what the checkpoint names is not. An import path from a
checkpoint is therefore allowed only when the user's own config names the same path at the same key -- a
``--config`` file, the run folder's ``config.yaml`` (a text file the user can read), or a command-line
override -- or when it is one of srforge's own classes (a Dataset, which only reads the files it is given, or an
nn.Module, which only builds layers), found by importing srforge's own modules alone.

``model.class`` is one of those keys, so a resumed run's model is covered by :func:`check_checkpoint_imports`.
Prediction and export rebuild the model from the checkpoint alone (its ``model_class``), with no config of the
user's to compare with; :func:`check_checkpoint_model` allows the class when it is srforge's own or when the user
allows it by name (``--allow-model module:Class``). A config.yaml beside the checkpoint does not count (a
downloaded run folder brings one), and the working directory is searched for the class's module only when the user
named the class. The module of any other class is never imported.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Iterable, Mapping
from typing import Any

from srforge.config.errors import ConfigError
from srforge.constants import UNET_CLASS
from srforge.models.create import is_srforge_path


def import_paths(tree: Any, prefix: str = "") -> Iterable[tuple[str, Any]]:
    """(dotted key, value) of every ``class`` key in a nested config, free-form parts included. A key may be
    dotted itself, as a command-line override's is (``{"data.dataset.class": "x"}``)."""
    if isinstance(tree, (list, tuple)):  # train.hooks: a list of {class, args}
        for i, value in enumerate(tree):
            yield from import_paths(value, f"{prefix}[{i}]")
        return
    if not isinstance(tree, Mapping):
        return
    for key, value in tree.items():
        path = f"{prefix}.{key}" if prefix else str(key)
        if path == "class" or path.endswith(".class"):
            yield path, value
        yield from import_paths(value, path)


def is_srforge_class(spec: Any) -> bool:
    """Whether ``spec`` ("module:Name") names a torch Dataset or nn.Module class defined in srforge itself. Only
    a module of srforge is ever imported to find out."""
    if not is_srforge_path(spec) or ":" not in spec:
        return False
    module_name, _, attr = spec.partition(":")
    from torch import nn
    from torch.utils.data import Dataset

    try:
        obj = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError, ValueError):
        return False
    return isinstance(obj, type) and issubclass(obj, (Dataset, nn.Module)) and obj.__module__.startswith("srforge.")


def untrusted_imports(cfg: Mapping, trusted: Iterable[Mapping]) -> list[tuple[str, Any]]:
    """The (key, import path) pairs of ``cfg`` that no ``trusted`` config names at the same key and that
    are not srforge's own classes; null entries (no class) need no trust."""
    allowed = {(path, repr(value)) for source in trusted for path, value in import_paths(source)}
    return [
        (path, value)
        for path, value in import_paths(cfg)
        if value is not None and (path, repr(value)) not in allowed and not is_srforge_class(value)
    ]


def check_checkpoint_imports(cfg: Mapping, checkpoint: str, trusted: Iterable[tuple[str, Mapping]]) -> None:
    """Raise ConfigError when ``cfg`` (resolved from the config embedded in ``checkpoint``) names an import
    path that none of ``trusted`` ((where, config) pairs the user wrote) names. The message says which path
    the checkpoint asks for and how to allow it."""
    trusted = list(trusted)
    refused = untrusted_imports(cfg, [config for _, config in trusted])
    if not refused:
        return
    asks = ", ".join(f"{path}={value}" for path, value in refused)
    where = ", ".join(name for name, _ in trusted) or "none given"
    raise ConfigError(
        f"{checkpoint}: its embedded config asks srforge to import {asks}, which your own config does not name "
        f"(looked in: {where}). srforge imports nothing a checkpoint names unless you name it too. "
        f"If you trust it, allow it on the command line: {' '.join(f'{p}={v}' for p, v in refused)} "
        "(or pass --config with a file that names it)."
    )


def check_checkpoint_model(ckpt: Mapping, checkpoint: str | os.PathLike, allow: Iterable[str] = ()) -> str:
    """The model class path of ``ckpt`` (read from ``checkpoint``), once it may be imported: srforge's own, or
    named by the user in ``allow`` (--allow-model). A checkpoint without ``model_class`` holds srforge's UNet.
    Otherwise a ConfigError saying which class the checkpoint asks for and how to allow it; the class's module is
    not imported. A config.yaml beside the checkpoint does not count: it arrives with a downloaded run folder as
    the checkpoint does, so it is not the user's word."""
    path = ckpt.get("model_class", UNET_CLASS)
    if not isinstance(path, str) or ":" not in path:
        raise ConfigError(
            f"{checkpoint}: model_class must be an import path 'module:Class', found {path!r}; this is not a "
            "checkpoint srforge wrote."
        )
    if path in allow or is_srforge_class(path):
        return path
    raise ConfigError(
        f"{checkpoint}: its model is {path} (model_class), and srforge imports a class a checkpoint names only when "
        f"you name it: it is not one of srforge's own classes and --allow-model does not name it (a config.yaml "
        f"beside the checkpoint does not count: it came with the checkpoint). Importing a module runs its code: if "
        f"you trust {path}, pass --allow-model {path} (from Python: allow_model=[{path!r}])."
    )
