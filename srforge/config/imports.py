"""Import paths (``"package.module:Name"``) that configs name: the Dataset classes."""

from __future__ import annotations

import importlib
import os
import sys
from typing import Any

from srforge.config.errors import ConfigError


def import_object(spec: str, key: str) -> Any:
    """``"package.module:Name"`` -> the object; ``key`` names the config entry in errors.

    Users' own packages live beside their configs, in the working directory, so the import looks there too;
    the folder is on ``sys.path`` during the import only, so ``sys.path`` is left as it was found.
    """
    module_name, _, attr = spec.partition(":")
    here = os.getcwd()
    added = here not in sys.path
    if added:
        sys.path.insert(0, here)
    try:
        module = importlib.import_module(module_name)
    except (ImportError, ValueError) as exc:  # ValueError: an empty module name (":Name")
        raise ConfigError(f"{key}: cannot import module '{module_name}' ({exc}).") from None
    finally:
        if added and here in sys.path:
            sys.path.remove(here)
    try:
        return getattr(module, attr)
    except AttributeError:
        raise ConfigError(f"{key}: module '{module_name}' has no attribute '{attr}'.") from None
