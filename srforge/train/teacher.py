"""A fixed teacher for self-training (``train.self_training.teacher``): the model of an srforge checkpoint, an
earlier run's best.pt, frozen, which labels the unlabelled scans in place of the EMA of the weights.

:func:`load_teacher` builds it and holds it to the run it teaches: it must read the scans as the student does (the
same in_channels and image mode), pad to what the student pads to (its size divisor a divisor of the student's,
whose multiples the unlabelled batches are), and predict the student's classes (num_classes and class names). The
file itself is vetted by :func:`srforge.config.preflight.teacher_checkpoint` (also run before the run folder is
touched): an srforge checkpoint, outside the run's folder, of srforge's classes or the run's model.class.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from srforge.config import ConfigError
from srforge.config.preflight import TEACHER, teacher_checkpoint
from srforge.runtime.checkpoint import model_from_checkpoint


def load_teacher(
    path: str, facts: Mapping, student: torch.nn.Module, run_dir: str | None = None
) -> tuple[torch.nn.Module, str, str]:
    """(model, ``path``, sha256 of the file): the teacher at ``path``, frozen, in eval mode on the CPU. ``facts`` are
    this run's (model_class, class_names, image_mode), ``student`` its model, ``run_dir`` its folder. ConfigError
    naming the key, the file, what differs and how to fix it otherwise (module docstring)."""
    ckpt, digest = teacher_checkpoint(path, facts["model_class"], run_dir)  # its class srforge's or the run's
    try:
        with torch.random.fork_rng(devices=[]):  # building it draws initial weights: not from the run's stream
            model = model_from_checkpoint(ckpt, path, allowed=[facts["model_class"]])
    except (ValueError, ImportError) as error:
        raise ConfigError(f"{TEACHER}: {error}") from None
    found = {"in_channels": model.in_channels, "image_mode": ckpt.get("image_mode", "RGB"),
             "num_classes": model.num_classes, "class_names": list(ckpt["class_names"])}  # fmt: skip
    wanted = {"in_channels": student.in_channels, "image_mode": facts["image_mode"],
              "num_classes": student.num_classes, "class_names": list(facts["class_names"])}  # fmt: skip
    for name in found:
        if found[name] != wanted[name]:
            key = " (model.class_names)" if name == "class_names" else ""
            raise ConfigError(
                f"{TEACHER}: {path}: its model has {name} {found[name]}, and this run's {wanted[name]}{key}: the "
                "teacher must read the scans as the student does and predict the same classes. Give a checkpoint "
                "trained on this kind of data, or teacher: null for the EMA teacher."
            )
    if student.size_divisor % model.size_divisor:
        raise ConfigError(
            f"{TEACHER}: {path}: its model's size_divisor is {model.size_divisor}, which does not divide this run's "
            f"{student.size_divisor}: the unlabelled batches are padded to multiples of {student.size_divisor}, which "
            "the teacher cannot take. Give a teacher of as many or fewer stride-2 stages (model.depth), or teacher: "
            "null for the EMA teacher."
        )
    return model.requires_grad_(False), path, digest
