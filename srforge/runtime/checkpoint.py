"""Checkpoints: one file that holds everything to resume training or to predict.

A checkpoint is a plain dict that ``torch.load(..., weights_only=True)`` can read (tensors, numbers,
strings, lists, dicts: no pickled classes)::

    format        "srforge-checkpoint"       version   1
    model         the model's state_dict (weights and normalisation buffers: mean/std for srforge's UNet)
    model_class   the model's import path as the config names it ("srforge.models.unet:UNet" by default);
                  absent in checkpoints written before model.class: srforge's UNet
    model_args    every keyword argument the class was built with (in_channels, num_classes, ...)
    model_norm    the norm option applied after building (keep | group | frozen | masked; absent: keep)
    size_divisor  the model's size divisor     class_names  one name per class     ignore_index  int
    image_mode    the PIL mode the training images were decoded in ("RGB" unless the dataset says otherwise)
    config        the resolved training config
    epoch, step   completed epochs and optimizer steps; batches_done: of the next epoch, after a Ctrl-C
    optimizer, scheduler, scaler, sampler, rng, best_metric      (training state, for --resume)
    rng           Python, numpy, torch CPU and (with CUDA) the current device's states (srforge.train.rng)

It is written atomically: to a temporary file in the same folder, flushed and fsync'ed, then renamed over
the old one, so a kill at any moment leaves either the previous checkpoint or the new one, never half.
"""

from __future__ import annotations

import io
import os
from collections.abc import Collection
from pathlib import Path
from typing import Any

import torch

from srforge.atomic import atomic_write
from srforge.constants import NORMS, UNET_CLASS
from srforge.limits import MAX_CHECKPOINT_CONFIG, class_names_problem, expanded_size, object_parts, object_weight
from srforge.models.contract import class_name
from srforge.models.create import Resolver, create_model, import_class, is_srforge_path

FORMAT = "srforge-checkpoint"
VERSION = 1


def save_checkpoint(payload: dict[str, Any], path: str | os.PathLike) -> Path:
    """Write ``payload`` (with the format tag added) to ``path`` atomically."""
    return atomic_write(path, lambda f: torch.save({"format": FORMAT, "version": VERSION, **payload}, f), fsync=True)


def class_names_or_default(names, num_classes: int) -> list[str]:
    """The class names a checkpoint records: the given ones, or ``class_0 .. class_{K-1}``."""
    return list(names) if names else [f"class_{c}" for c in range(num_classes)]


def load_checkpoint(path: str | os.PathLike, map_location: Any = "cpu", *, raw: bytes | None = None) -> dict[str, Any]:
    """Read an srforge checkpoint with ``weights_only=True``; a clear ValueError for anything else. ``raw``: the
    file's bytes, read once by a caller that must know exactly what was loaded (it hashes them)."""
    path = Path(path)
    if path.is_dir():
        found = sorted(p.name for p in path.glob("*.pt"))
        inside = f"; it holds {', '.join(found)}" if found else ", and holds no .pt file"
        raise FileNotFoundError(
            f"{path} is a folder, not a checkpoint file{inside}. Give a file, e.g. {path / 'best.pt'}"
        )
    if not path.is_file():
        raise FileNotFoundError(f"Checkpoint not found: {path}")
    try:
        ckpt = torch.load(path if raw is None else io.BytesIO(raw), map_location=map_location, weights_only=True)
    except Exception as exc:  # corrupt file, not a torch file, or pickled objects weights_only refuses
        raise ValueError(f"{path} is not an srforge checkpoint: torch.load(weights_only=True) failed ({exc})") from None
    if not isinstance(ckpt, dict) or ckpt.get("format") != FORMAT:
        found = f"a dict with keys {sorted(ckpt)[:8]}" if isinstance(ckpt, dict) else type(ckpt).__name__
        raise ValueError(f"{path} is not an srforge checkpoint: expected format '{FORMAT}', found {found}.")
    if ckpt.get("version", 0) > VERSION:
        raise ValueError(f"{path} was written by a newer srforge (checkpoint version {ckpt['version']} > {VERSION}).")
    for key in ("model", "model_args", "size_divisor", "class_names"):
        if key not in ckpt:
            raise ValueError(f"{path} is an incomplete srforge checkpoint: the field '{key}' is missing.")
    _check_plain_data(ckpt, path)
    return ckpt


def _check_plain_data(ckpt: dict[str, Any], path: Path) -> None:
    """Refuse a checkpoint whose plain data could not be printed or written out: class names that are not
    short strings, or a config (or any other part; a tensor counts as one) built of parts shared so often
    that it expands past MAX_CHECKPOINT_CONFIG (a pickle, like YAML, can refer to one list many times)."""
    problem = class_names_problem(ckpt["class_names"])
    if problem:
        raise ValueError(f"{path}: class_names: {problem}; this is not a checkpoint srforge wrote.")
    model_class, norm = ckpt.get("model_class", UNET_CLASS), ckpt.get("model_norm", "keep")
    if not isinstance(model_class, str) or ":" not in model_class or len(model_class) > 1000:
        raise ValueError(f"{path}: model_class must be an import path 'module:Class', found {model_class!r:.80}.")
    if norm not in NORMS:
        raise ValueError(f"{path}: model_norm must be one of {list(NORMS)}, found {norm!r:.80}.")
    if not isinstance(ckpt["model_args"], dict) or not all(isinstance(k, str) for k in ckpt["model_args"]):
        raise ValueError(
            f"{path}: model_args must be a dict of keyword arguments; this is not a checkpoint srforge wrote."
        )
    if expanded_size(ckpt, object_parts, object_weight, MAX_CHECKPOINT_CONFIG) is None:
        raise ValueError(
            f"{path}: its config and training state expand to more than {MAX_CHECKPOINT_CONFIG:,} objects and "
            "characters (parts shared many times over, or containing themselves); this is not a checkpoint "
            "srforge wrote."
        )


def model_from_checkpoint(
    ckpt: dict[str, Any],
    source: str | os.PathLike = "the checkpoint",
    *,
    allowed: Collection[str] = (),
    resolve: Resolver = import_class,
) -> torch.nn.Module:
    """The model a checkpoint describes, rebuilt from the checkpoint alone, its weights and buffers loaded, in eval
    mode on the CPU: ``model_class`` (srforge's UNet when absent), ``model_args`` and ``model_norm`` through
    :func:`srforge.models.create.create_model`, then the ``model`` state_dict.

    Only srforge's own classes are imported unless the class is in ``allowed``: the caller checks the others
    first (:func:`srforge.config.trust.check_checkpoint_model`, as Predictor.from_checkpoint and srforge-export do),
    since importing a module runs its code. ``resolve`` turns the path into the class (importlib alone by
    default). Every problem is a ValueError naming ``source``.
    """
    path = ckpt.get("model_class", UNET_CLASS)
    if not is_srforge_path(path) and path not in allowed:
        raise ValueError(
            f"{source}: its model class {path} is not srforge's own, and it was not allowed: check it with "
            "srforge.config.trust.check_checkpoint_model and pass allowed=[its path] (srforge-predict and "
            f"srforge-export: --allow-model {path})."
        )
    where = f"{source}: model_class {path}"
    model = create_model(
        path, ckpt["model_args"], norm=ckpt.get("model_norm", "keep"), resolve=resolve, where=where, report=None
    )
    try:
        model.load_state_dict(ckpt["model"])
    except (TypeError, ValueError, RuntimeError) as exc:
        raise ValueError(f"{source}: its weights do not fit the {class_name(model)} it describes ({exc})") from None
    if model.size_divisor != ckpt["size_divisor"]:
        raise ValueError(
            f"{source}: its size_divisor {ckpt['size_divisor']} does not match its model's {model.size_divisor}."
        )
    return model.eval()
