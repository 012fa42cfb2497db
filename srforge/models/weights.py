"""A state-dict file into a model, or into its encoder only: pretrained weights for a fresh run.

    .pt / .pth      torch.load(weights_only=True): tensors and plain containers, never pickled code
    .safetensors    safetensors.torch.load_file (the ``safetensors`` package)

A file may hold the state dict itself or a dict that keeps it under ``state_dict``, ``model`` or
``model_state_dict`` (Lightning, srforge's own checkpoints, many training scripts). The load compares names and
shapes before anything is copied: names the module has and the file lacks are *missing*, names the file has and the
module lacks are *unexpected*, names in both with another shape are *mismatched*. Strict (the default), any of
them is a ValueError listing the first; not strict, the tensors that fit are loaded and the rest reported. Either
way :func:`load_weights` returns one line that says what happened, for the console.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from srforge.constants import WEIGHTS_INTO
from srforge.extras import MissingExtraError

SUFFIXES = (".pt", ".pth", ".safetensors")
SAFETENSORS_INSTALL = "pip install safetensors"
# Keys a checkpoint file commonly keeps its state dict under, tried in this order when the file is not one itself.
WRAPPER_KEYS = ("state_dict", "model", "model_state_dict")
SHOWN = 5  # names listed per kind in a report or an error


@dataclass(frozen=True)
class WeightsFile:
    """Where a model's initial weights come from: ``path`` (.pt, .pth or .safetensors), loaded into the whole
    model or its ``encoder`` (``into``), ``strict`` or not (see the module's doc)."""

    path: str
    into: str = "model"
    strict: bool = True


def is_state_dict(obj: Any) -> bool:
    """A non-empty mapping of str names to tensors."""
    return (
        isinstance(obj, Mapping)
        and bool(obj)
        and all(isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in obj.items())
    )


def read_state_dict(path: str | os.PathLike) -> dict[str, torch.Tensor]:
    """The state dict in ``path``, on the CPU. ValueError naming the file when it is missing, of another kind, or
    holds no state dict; ImportError naming the package for a .safetensors file without ``safetensors``."""
    path = Path(path)
    if path.suffix not in SUFFIXES:
        raise ValueError(
            f"model.weights: {path}: expected a {', '.join(SUFFIXES)} state-dict file, found '{path.suffix}'."
        )
    if path.is_dir():
        raise ValueError(f"model.weights: {path.resolve()} is a folder, not a state-dict file ({', '.join(SUFFIXES)}).")
    if not path.is_file():
        raise ValueError(
            f"model.weights: {path.resolve()} does not exist; give the path of a state-dict file "
            f"({', '.join(SUFFIXES)})."
        )
    if path.suffix == ".safetensors":
        try:
            from safetensors.torch import load_file
        except ImportError:
            raise MissingExtraError(
                f"model.weights: reading {path} needs the safetensors package, which is not installed: "
                f"`{SAFETENSORS_INSTALL}`, or save the weights with torch.save(model.state_dict(), 'weights.pt')."
            ) from None
        try:
            return load_file(str(path), device="cpu")
        except Exception as exc:  # safetensors' SafetensorError (empty, truncated, another format), OSError
            raise ValueError(
                f"model.weights: {path} is not a readable .safetensors file ({type(exc).__name__}: {exc}); save the "
                "weights with safetensors.torch.save_file(model.state_dict(), path), or as a .pt file."
            ) from None
    try:
        obj = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # corrupt, not a torch file, or pickled objects weights_only refuses
        raise ValueError(
            f"model.weights: {path}: torch.load(weights_only=True) failed ({exc}); save the weights with "
            "torch.save(model.state_dict(), path)."
        ) from None
    if is_state_dict(obj):
        return dict(obj)
    for key in WRAPPER_KEYS:
        if isinstance(obj, Mapping) and is_state_dict(obj.get(key)):
            return dict(obj[key])
    found = f"a dict with keys {sorted(map(str, obj))[:8]}" if isinstance(obj, Mapping) else type(obj).__name__
    raise ValueError(
        f"model.weights: {path}: expected a state dict (names -> tensors), or one under "
        f"{' / '.join(WRAPPER_KEYS)}, found {found}."
    )


def weights_target(model: nn.Module, into: str) -> nn.Module:
    """The module a weights file loads into: ``model`` itself, or its ``encoder`` attribute."""
    if into not in WEIGHTS_INTO:
        raise ValueError(f"model.weights_into: expected one of {list(WEIGHTS_INTO)}, found {into!r}.")
    if into == "model":
        return model
    encoder = getattr(model, "encoder", None)
    if not isinstance(encoder, nn.Module):
        cls = type(model)
        found = "has no attribute 'encoder'" if encoder is None else f"has an encoder that is {type(encoder).__name__}"
        raise ValueError(
            f"model.weights_into: encoder, but {cls.__module__}.{cls.__qualname__} {found} (an nn.Module holding "
            "its backbone). Load into the whole model with weights_into: model, or give the class an encoder."
        )
    return encoder


def compare(module: nn.Module, state: Mapping[str, torch.Tensor]) -> tuple[list[str], list[str], list[str]]:
    """(missing, unexpected, mismatched) names of ``state`` against ``module``'s state dict (see the module's doc);
    mismatched entries read "name: [file shape] in the file, [module shape] in the model"."""
    own = module.state_dict()
    missing = [name for name in own if name not in state]
    unexpected = [name for name in state if name not in own]
    mismatched = [
        f"{name}: {list(state[name].shape)} in the file, {list(own[name].shape)} in the model"
        for name in own
        if name in state and state[name].shape != own[name].shape
    ]
    return missing, unexpected, mismatched


def listed(count_of: str, names: list[str]) -> str:
    """ "2 unexpected: ['a', 'b']" (the first SHOWN names), or "0 unexpected"."""
    if not names:
        return f"0 {count_of}"
    more = f" and {len(names) - SHOWN} more" if len(names) > SHOWN else ""
    return f"{len(names)} {count_of}: {names[:SHOWN]}{more}"


def load_weights(model: nn.Module, weights: WeightsFile) -> str:
    """Load ``weights`` into ``model`` (or its encoder); returns the report line
    ("loaded W.pt into encoder: 120 tensors, 0 missing, 2 unexpected: [...]"). Strict, any missing, unexpected or
    mismatched name is a ValueError listing the first of each and how to allow a partial load."""
    target = weights_target(model, weights.into)
    state = read_state_dict(weights.path)
    missing, unexpected, mismatched = compare(target, state)
    parts = [listed("missing", missing), listed("unexpected", unexpected)]
    if mismatched:
        parts.append(listed("of another shape", mismatched))
    if weights.strict and (missing or unexpected or mismatched):
        cls = type(target)
        raise ValueError(
            f"model.weights: {weights.path} does not fit the {weights.into} ({cls.__module__}.{cls.__qualname__}): "
            f"{', '.join(parts)}. Load only the tensors that fit with model.weights_strict: false, or a backbone's "
            "weights into the encoder alone with model.weights_into: encoder."
        )
    own = target.state_dict()
    fitting = {name: t for name, t in state.items() if name in own and t.shape == own[name].shape}
    check_values(weights, fitting, own, unexpected)
    target.load_state_dict(fitting, strict=False)
    return f"loaded {weights.path} into {weights.into}: {len(fitting)} tensors, {', '.join(parts)}"


def check_values(weights: WeightsFile, fitting: Mapping, own: Mapping, unexpected: list[str]) -> None:
    """A ValueError for a load that would go wrong without a word: none of the file's tensors fits (names that
    differ, often by a prefix), a tensor of another kind (int64 or bool where the model holds floats: casting would
    make up weights), or NaN / infinite weights (training would blame the first batch)."""
    if not fitting and own:
        hint = ""
        if unexpected:
            model_name = next(iter(own))
            hint = f"; the file names e.g. {unexpected[0]!r}, the model {model_name!r} (a prefix to strip?)"
        raise ValueError(
            f"model.weights: {weights.path}: none of its tensors fits the {weights.into}, so nothing would be "
            f"loaded{hint}. Save the weights under the model's own names, or load into the encoder "
            "(model.weights_into: encoder)."
        )
    for name, tensor in fitting.items():
        if tensor.is_floating_point() != own[name].is_floating_point() or (tensor.dtype == torch.bool) != (
            own[name].dtype == torch.bool
        ):
            raise ValueError(
                f"model.weights: {weights.path}: tensor {name!r} is {tensor.dtype} in the file and "
                f"{own[name].dtype} in the model; it would be cast without a word. Save the weights the model holds."
            )
        if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all()):
            raise ValueError(
                f"model.weights: {weights.path}: tensor {name!r} holds NaN or infinite values; these weights would "
                "make every loss non-finite. Use a file saved before training diverged."
            )
