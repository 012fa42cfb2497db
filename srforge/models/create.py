"""One builder for every model: an import path, its keyword arguments, the norm option, a weights file -> the model.

    "module:Class" --resolve--> an nn.Module subclass (anything else is refused before it is called)
        --Class(**kwargs)--> --weights file into the model or its encoder (optional)--> --apply_norm(norm)-->
        --ImageOnly when its forward takes no sizes (srforge.models.contract)--> check_model --> the model (CPU)

Training (:func:`srforge.train.from_config.build_model`), a resumed run and
:func:`srforge.runtime.checkpoint.model_from_checkpoint` all build through :func:`create_model`, so the class path,
arguments and norm option a checkpoint records (``model_class``, ``model_args``, ``model_norm``) rebuild exactly
the module that was trained, and its state_dict loads into it. The weights file comes before the norm conversion,
so that a pretrained BatchNorm's statistics are there to be frozen or folded; a checkpoint needs no weights file,
since its state_dict holds every tensor.

Resolving an import path here needs importlib only (:func:`import_class`); a caller passes its own ``resolve``
(srforge.config's ``import_object``, which also looks in the working directory, as it does for datasets).
Whether a path may be imported at all -- the trust rule for checkpoints -- is decided before this module is
called (srforge.config.trust).
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable, Mapping
from typing import Any

from torch import nn

from srforge.constants import NORMS
from srforge.models.contract import check_model, with_sizes
from srforge.models.weights import WeightsFile, load_weights

Resolver = Callable[[str], Any]


def import_class(path: str) -> Any:
    """``"package.module:Name"`` -> the object, by importlib alone; ValueError naming the path when it does not
    import or the module has no such name."""
    module_name, _, attr = path.partition(":")
    if not module_name or not attr:
        raise ValueError(f"expected an import path 'module.path:ClassName', found {path!r}.")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ValueError(f"cannot import module '{module_name}' of {path} ({exc}).") from None
    try:
        return getattr(module, attr)
    except AttributeError:
        raise ValueError(f"module '{module_name}' has no attribute '{attr}' ({path}).") from None


def is_srforge_path(path: Any) -> bool:
    """Whether ``path`` names something in srforge's own modules ("srforge.x:Name"): importing those runs only
    srforge's code, so it is safe whatever a checkpoint says."""
    if not isinstance(path, str):
        return False
    module_name = path.partition(":")[0]
    return module_name == "srforge" or module_name.startswith("srforge.")


def model_class(path: str, resolve: Resolver = import_class, where: str = "model.class") -> type[nn.Module]:
    """The class ``path`` names, once it is known to be an nn.Module subclass; ValueError naming ``where``
    otherwise (a function, an instance or any other class is never called)."""
    obj = resolve(path)
    if isinstance(obj, type) and issubclass(obj, nn.Module):
        return obj
    found = f"the class {obj.__module__}.{obj.__qualname__}" if isinstance(obj, type) else type(obj).__name__
    raise ValueError(
        f"{where}: {path} is {found}, not a torch.nn.Module subclass; srforge builds models only from nn.Module "
        "classes that meet srforge.models.contract (wrap anything else in such a class)."
    )


def construct(cls: type[nn.Module], kwargs: Mapping[str, Any], where: str) -> nn.Module:
    """``cls(**kwargs)``; a TypeError (an argument it does not take, one it needs) is a ValueError naming
    ``where``, the arguments and the signature."""
    try:
        return cls(**kwargs)
    except TypeError as exc:
        try:
            takes = f"; it takes {inspect.signature(cls)}"
        except (TypeError, ValueError):
            takes = ""
        raise ValueError(
            f"{where}: {cls.__module__}.{cls.__qualname__} could not be built with {dict(kwargs)} ({exc}){takes}."
        ) from None
    except (ValueError, ImportError, OSError):  # srforge's own and the adapters' messages: already clear
        raise
    except Exception as exc:  # any other failure of the user's __init__: named, without a traceback
        raise ValueError(
            f"{where}: {cls.__module__}.{cls.__qualname__}({', '.join(f'{k}={v!r}' for k, v in kwargs.items())}) "
            f"raised {type(exc).__name__}: {exc}"
        ) from exc


def convert_norms(model: nn.Module, norm: str, where: str) -> nn.Module:
    """The module to use after the ``norm`` conversion (srforge.models.norms.apply_norm); ``keep`` is ``model``."""
    if norm not in NORMS:
        raise ValueError(f"{where}: norm must be one of {list(NORMS)}, found {norm!r}.")
    if norm == "keep":
        return model
    from srforge.models.norms import apply_norm  # only a conversion loads it

    return apply_norm(model, norm)


def create_model(
    path: str,
    kwargs: Mapping[str, Any],
    *,
    norm: str = "keep",
    weights: WeightsFile | None = None,
    resolve: Resolver = import_class,
    where: str = "model.class",
    report: Callable[[str], Any] | None = print,
) -> nn.Module:
    """The model ``path`` names, built with ``kwargs`` on the CPU, ``weights`` loaded (the report line goes to
    ``report``), norms converted, wrapped to take ``sizes`` where it does not, and checked against the contract.
    ``where`` is how errors name the source (``model.class``, ``CKPT: model_class``); every error is a
    ValueError, or an ImportError for a missing optional package."""
    cls = model_class(path, resolve, where)
    model = construct(cls, kwargs, where)
    if weights is not None:
        line = load_weights(model, weights)
        if report is not None:
            report(line)
    model = with_sizes(convert_norms(model, norm, where))
    check_model(model, where)
    return model
