"""Entry: a dict with attribute access that knows how to collate and un-collate itself.

Samples keep their natural shape (an image is ``[C, H, W]``, a name a bare string). ``Entry.collate``
adds the batch dimension following SR-Forge's batch convention:

=========================  ===================  ==========================================
field type                 one sample           after collation (B samples)
=========================  ===================  ==========================================
tensor, same shape+dtype   ``[C, H, W]``        ``[B, C, H, W]`` (stacked)
tensor, shapes differ      varies               list of the B tensors
numpy array                like a tensor        like a tensor
str                        ``"scene_042"``      list of B strings
int / numpy integer        ``4``                int64 tensor ``[B]``
float / numpy floating     ``0.5``              float32 tensor ``[B]`` (never float64)
bool / numpy bool          ``True``             bool tensor ``[B]``
list / tuple               ``["b2", "b8"]``     list of the B values (collected)
dict / Entry               ``{"a": t}``         same mapping type, each key collated (recurse)
None in every sample       ``None``             ``[None] * B``
None mixed with values     ``None`` or value    list of the raw values
anything else              object               list of the B objects
=========================  ===================  ==========================================

All non-None values of one field must share one of those types, or collation raises TypeError.
Integer indexing (``batch[i]``) removes the batch dimension and gives an unbatched Entry; a slice
(``batch[1:3]``, steps too) keeps it; ``unbatch()`` is ``[batch[i] for i in range(B)]``, and
``Entry.collate(batch.unbatch())`` equals ``batch``.

Names of Entry's own methods and properties (``to``, ``items``, ``batch_size``, ...) are still valid
field names, but such a field is read with ``entry["items"]`` rather than ``entry.items``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch
from torch.utils.data import get_worker_info

from srforge.data.batch_buffer import new_batch_buffer


def _kind(value: Any) -> str:
    """The collation kind of one value; values of one field must share it (None aside)."""
    if isinstance(value, (torch.Tensor, np.ndarray)):
        return "tensor"
    # bool before int: bool is a subclass of int, but collates to a bool tensor.
    if isinstance(value, (bool, np.bool_)):
        return "bool"
    if isinstance(value, (int, np.integer)):
        return "int"
    if isinstance(value, (float, np.floating)):
        return "float"
    if isinstance(value, str):
        return "str"
    if isinstance(value, (list, tuple)):
        return "list"
    if isinstance(value, Mapping):
        return "mapping"
    return "object"


_SCALAR_DTYPES = {"bool": torch.bool, "int": torch.int64, "float": torch.float32}


def _stack(tensors: list[torch.Tensor]) -> torch.Tensor | list[torch.Tensor]:
    """``[B, *shape]`` if every tensor shares shape and dtype, else the list itself.

    In a DataLoader worker the output is written straight into shared memory (see memory.py).
    """
    first = tensors[0]
    if any(t.shape != first.shape or t.dtype != first.dtype or t.device != first.device for t in tensors):
        return list(tensors)
    if get_worker_info() is None:
        return torch.stack(tensors)  # (also keeps autograd: stack with out= refuses tensors that need grad)
    return torch.stack(tensors, out=new_batch_buffer((len(tensors), *first.shape), first.dtype, first.device))


def collate_field(values: list[Any], path: str) -> Any:
    """Collate one field's values (one per sample); ``path`` names the field in errors."""
    present = [v for v in values if v is not None]
    if len(present) < len(values):
        # None marks missing data: keep the raw values so that batch[i] gives each one back.
        if present:
            _check_one_kind(present, path)
        return list(values)
    kind = _check_one_kind(values, path)
    if kind == "tensor":
        return _stack([torch.as_tensor(v) for v in values])
    if kind in _SCALAR_DTYPES:
        return torch.tensor([v.item() if isinstance(v, np.generic) else v for v in values], dtype=_SCALAR_DTYPES[kind])
    if kind == "mapping":
        return collate_mappings(values, path)
    return list(values)


def _check_one_kind(values: list[Any], path: str) -> str:
    kinds = {_kind(v) for v in values}
    if len(kinds) > 1:
        types = sorted({type(v).__name__ for v in values})
        raise TypeError(
            f"Cannot collate field '{path}': its values have mixed types {', '.join(types)}. "
            "All non-None values of a field must share one type; use None for missing data."
        )
    return kinds.pop()


def collate_mappings(samples: Sequence[Mapping], path: str = "") -> Mapping:
    """Collate same-keyed mappings key by key; the result has the type of the first sample."""
    first = samples[0]
    keys = list(first.keys())
    for i, sample in enumerate(samples[1:], start=1):
        if sample.keys() != first.keys():
            missing = [k for k in keys if k not in sample]
            extra = [k for k in sample.keys() if k not in first]
            where = f"field '{path}' of sample {i}" if path else f"sample {i}"
            raise ValueError(
                f"Cannot collate: {where} has different keys from sample 0: "
                f"missing {missing}, extra {extra}. Every sample must have the same fields."
            )
    collated = {k: collate_field([s[k] for s in samples], f"{path}.{k}" if path else str(k)) for k in keys}
    if isinstance(first, Entry):
        return type(first).batched(collated, len(samples))
    try:
        return type(first)(collated)
    except TypeError:  # a Mapping type that cannot be built from a dict
        return collated


def index_value(value: Any, index: int | slice) -> Any:
    """Index one batched field: tensors and sequences along dim 0, mappings recursively."""
    if isinstance(value, Entry):
        return value._index(index)
    if isinstance(value, Mapping):
        return type(value)({k: index_value(v, index) for k, v in value.items()})
    if isinstance(value, torch.Tensor) and isinstance(index, slice) and (index.step or 1) < 0:
        # Tensors reject negative slice steps; pick the same rows explicitly.
        rows = torch.tensor(range(*index.indices(value.shape[0])), dtype=torch.long, device=value.device)
        return value.index_select(0, rows)
    if isinstance(value, (torch.Tensor, np.ndarray)) and value.ndim == 0:
        return value  # a 0-dim value has no batch dimension: like a bare setting, it belongs to every sample
    if isinstance(value, (torch.Tensor, np.ndarray, list, tuple)):
        return value[index]
    # A value without a batch dimension (a hand-built batch's shared setting) belongs to every sample.
    return value


def _first_length(mapping: Mapping) -> int | None:
    """Length along dim 0 of the first tensor or list field, looking into nested mappings."""
    for value in mapping.values():
        if isinstance(value, (torch.Tensor, np.ndarray)) and value.ndim > 0:
            return int(value.shape[0])
        if isinstance(value, (list, tuple)):
            return len(value)
        if isinstance(value, Mapping):
            n = _first_length(value)
            if n is not None:
                return n
    return None


def _map_tensors(value: Any, fn) -> Any:
    """Apply ``fn`` to every tensor inside ``value`` (mappings, lists and tuples included)."""
    if isinstance(value, torch.Tensor):
        return fn(value)
    if isinstance(value, Entry):
        return value._with({k: _map_tensors(v, fn) for k, v in value.items()})
    if isinstance(value, Mapping):
        return type(value)({k: _map_tensors(v, fn) for k, v in value.items()})
    if isinstance(value, (list, tuple)):
        return type(value)(_map_tensors(v, fn) for v in value)
    return value


def _describe(value: Any) -> str:
    if isinstance(value, torch.Tensor):
        return f"Tensor{list(value.shape)} {str(value.dtype).removeprefix('torch.')}"
    if isinstance(value, np.ndarray):
        return f"ndarray{list(value.shape)} {value.dtype}"
    if isinstance(value, Entry):
        return repr(value)
    if isinstance(value, Mapping):
        return "{" + ", ".join(f"{k!r}: {_describe(v)}" for k, v in value.items()) + "}"
    if isinstance(value, (list, tuple)) and len(value) > 4:
        return f"{type(value).__name__}[{len(value)}]({_describe(value[0])}, ...)"
    if isinstance(value, (list, tuple)):
        inner = ", ".join(_describe(v) for v in value)
        return f"[{inner}]" if isinstance(value, list) else f"({inner})"
    return repr(value)


class Entry(dict):
    """A sample or a batch: a dict whose fields are also attributes (``entry.image``).

    Example::

        e1 = Entry(name="scene_042", image=torch.randn(3, 64, 64), scale=4)
        e2 = Entry(name="scene_043", image=torch.randn(3, 64, 64), scale=2)
        batch = Entry.collate([e1, e2])   # batch.image: [2, 3, 64, 64], batch.scale: tensor([4, 2])
        batch[0].name                     # "scene_042", and batch[0].is_batched is False
    """

    __slots__ = ("_is_batched", "_batch_size")

    def __init__(self, *args: Any, **fields: Any) -> None:
        super().__init__(*args, **fields)
        self._is_batched = False
        self._batch_size: int | None = None

    # -- attribute access ---------------------------------------------------------------------
    def __getattr__(self, name: str) -> Any:
        try:
            return self[name]
        except KeyError:
            raise AttributeError(
                f"{type(self).__name__} has no field '{name}'; fields: {sorted(map(str, self.keys()))}"
            ) from None

    def __setattr__(self, name: str, value: Any) -> None:
        if name in Entry.__slots__ or isinstance(getattr(type(self), name, None), property):
            object.__setattr__(self, name, value)
        else:
            self[name] = value

    def __delattr__(self, name: str) -> None:
        try:
            del self[name]
        except KeyError:
            raise AttributeError(f"{type(self).__name__} has no field '{name}'") from None

    # -- batch state ----------------------------------------------------------------------------
    @property
    def is_batched(self) -> bool:
        """True for the result of ``collate`` (or a slice of it), False for a sample."""
        return self._is_batched

    @is_batched.setter
    def is_batched(self, value: bool) -> None:
        # For hand-built batches; the batch size is then inferred from the first tensor or list.
        self._is_batched = bool(value)
        self._batch_size = None

    @property
    def batch_size(self) -> int:
        """B: recorded by ``collate``, else inferred from the first tensor or list field."""
        if self._batch_size is not None:
            return self._batch_size
        n = _first_length(self)
        if n is None:
            raise ValueError(
                f"Cannot infer batch size of {type(self).__name__} with fields {sorted(map(str, self.keys()))}: "
                "it was not made by Entry.collate and has no tensor or list field to measure."
            )
        return n

    def __len__(self) -> int:
        if not self._is_batched:
            raise TypeError(
                f"len() of an unbatched {type(self).__name__} is undefined: it is one sample, not a batch. "
                "Use len(entry.keys()) for the number of fields."
            )
        return self.batch_size

    def __bool__(self) -> bool:
        # dict's truth is its field count; without this, `if entry:` would call __len__ and raise.
        return dict.__len__(self) > 0

    @classmethod
    def batched(cls, fields: Mapping, batch_size: int) -> "Entry":
        """A batched Entry of ``batch_size`` samples holding already-collated ``fields`` (e.g. image [B, C, H, W]).

        For collate functions that build some fields themselves (as AlignedCollate pads its spatial fields)."""
        entry = cls(fields)
        entry._is_batched = True
        entry._batch_size = batch_size
        return entry

    def _with(self, fields: Mapping) -> "Entry":
        """A new Entry of the same type and batch state holding ``fields``."""
        entry = type(self)(fields)
        entry._is_batched = self._is_batched
        entry._batch_size = self._batch_size
        return entry

    # -- collation --------------------------------------------------------------------------
    @classmethod
    def collate(cls, samples: Sequence[Mapping]) -> "Entry":
        """Combine samples into one batched Entry by the rules in this module's docstring."""
        samples = list(samples)
        if not samples:
            raise ValueError("Cannot collate an empty list of samples: a batch needs at least one.")
        for i, sample in enumerate(samples):
            if not isinstance(sample, Mapping):
                raise TypeError(f"Cannot collate sample {i}: expected an Entry or dict, found {type(sample).__name__}.")
        result = collate_mappings(samples)
        if not isinstance(result, Entry):  # plain dict samples: still give back a batched Entry
            result = cls.batched(result, len(samples))
        return result

    # -- indexing -------------------------------------------------------------------------------
    def __getitem__(self, key: Any) -> Any:
        # Slices are not hashable before Python 3.12, so they never name a field.
        if isinstance(key, slice):
            return self._index(key)
        if isinstance(key, (int, np.integer)) and not isinstance(key, bool) and not super().__contains__(key):
            return self._index(key)
        return super().__getitem__(key)

    def _index(self, index: int | slice) -> "Entry":
        size = self.batch_size
        if isinstance(index, slice):
            fields = {k: index_value(v, index) for k, v in self.items()}
            return type(self).batched(fields, len(range(*index.indices(size))))
        i = int(index)
        if not -size <= i < size:
            raise IndexError(f"Index {i} is out of range for a batch of size {size}.")
        i %= size
        entry = type(self)({k: index_value(v, i) for k, v in self.items()})
        return entry

    def unbatch(self) -> list["Entry"]:
        """The samples of this batch: ``[self[i] for i in range(batch_size)]``."""
        return [self._index(i) for i in range(self.batch_size)]

    # -- devices -----------------------------------------------------------------------------------
    def to(self, device: torch.device | str, non_blocking: bool = False) -> "Entry":
        """A new Entry with every tensor (nested too) moved to ``device``."""
        return _map_tensors(self, lambda t: t.to(device, non_blocking=non_blocking))

    def pin_memory(self, device: Any = None) -> "Entry":
        """A new Entry with every tensor in page-locked memory (``DataLoader(pin_memory=True)`` calls this)."""
        return _map_tensors(self, lambda t: t.pin_memory())

    # -- display -------------------------------------------------------------------------------
    def __repr__(self) -> str:
        fields = ", ".join(f"{k}={_describe(v)}" for k, v in self.items())
        state = f"batched, B={self._batch_size or _first_length(self)}" if self._is_batched else "sample"
        return f"{type(self).__name__}({state}: {fields})"

    def copy(self) -> "Entry":
        """A shallow copy that keeps the type and the batch state."""
        return self._with(self)
