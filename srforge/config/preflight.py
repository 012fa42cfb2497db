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
from srforge.constants import UNET_CLASS
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


TEACHER = "train.self_training.teacher"


def teacher_checkpoint(path: str, model_class: str, run_dir: str | None) -> tuple[dict, str]:
    """(checkpoint, sha256 of its file) of train.self_training.teacher ``path``: an srforge checkpoint outside the
    run's folder ``run_dir`` (which the run rewrites, or --overwrite removes), whose model class is srforge's own or
    ``model_class``, this run's (the config imports that one anyway; a checkpoint's word does not count), the file
    read once, so that the sha256 is of the very bytes loaded. ConfigError naming the key and the file otherwise."""
    import hashlib

    from srforge.models.create import is_srforge_path
    from srforge.runtime.checkpoint import load_checkpoint

    if run_dir is not None and Path(path).resolve().is_relative_to(Path(run_dir).resolve()):
        raise ConfigError(
            f"{TEACHER}: {path} lies in this run's own folder run.dir ({run_dir}), whose checkpoints the run rewrites; "
            "copy it elsewhere (a teacher must stay as it was), or set teacher: null for the EMA teacher."
        )

    try:
        raw = Path(path).read_bytes() if Path(path).is_file() else None  # else load_checkpoint says what it is
        ckpt = load_checkpoint(path, raw=raw)
    except FileNotFoundError as error:
        fix = "" if Path(path).is_dir() else "; give an srforge checkpoint (e.g. an earlier run's best.pt)"
        raise ConfigError(f"{TEACHER}: {error}{fix}, or teacher: null for the EMA teacher.") from None
    except (OSError, ValueError) as error:
        raise ConfigError(f"{TEACHER}: {error}") from None
    if raw is None:  # not a file when looked at, one a moment later: its bytes were not the ones loaded
        raise ConfigError(f"{TEACHER}: {path} changed while it was read; start again once it is written.")
    found = ckpt.get("model_class", UNET_CLASS)
    if not is_srforge_path(found) and found != model_class:
        raise ConfigError(
            f"{TEACHER}: {path}: its model class is {found}, neither srforge's own nor this run's model.class "
            f"({model_class}); srforge imports a class a checkpoint names only when you name it (importing runs its "
            "code): give a teacher of srforge's classes or of this run's model.class."
        )
    return ckpt, hashlib.sha256(raw).hexdigest()


def check_before_training(cfg: Mapping[str, Any]) -> None:
    """Every check above for a resolved training config, ``model.class`` imports as an nn.Module subclass,
    train.self_training's teacher is a checkpoint it may use (:func:`teacher_checkpoint`), and ``run.device`` names a
    device this machine has."""
    check_model_class(cfg.model.class_)
    spec = cfg.train.self_training
    if spec is not None and spec.get("teacher") is not None:
        teacher_checkpoint(spec["teacher"], cfg.model.class_, cfg.run.dir)
    data = cfg.data
    check_dataset(data.dataset, "data.dataset", data.synthetic.root)
    if data.val_dataset.class_ is not None:
        check_dataset(data.val_dataset, "data.val_dataset")
    try:
        resolve_device(cfg.run.device)
    except ValueError as exc:
        raise ConfigError(f"run.device: {exc}") from None
