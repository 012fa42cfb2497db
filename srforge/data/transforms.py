"""DataTransform: a transform that names the Entry fields it reads by its parameter names.

A subclass defines ``transform(self, image, mask)`` for batched data (``image`` is ``[B, C, H, W]``),
``transform_unbatched(self, image, mask)`` for one sample (``[C, H, W]``), or both. Calling the
transform on an Entry reads the fields named by the parameters, calls the method that fits the
Entry's ``is_batched`` and writes the returned values back to the same fields (a tuple when there
are several). When only one of the two methods exists it still serves both kinds of Entry:

- a batch given to a ``transform_unbatched``-only transform is split into samples, transformed one
  by one, and collated again;
- a sample given to a ``transform``-only transform is collated into a batch of one, transformed,
  and indexed back out.

``with_fields(image="lr")`` returns a copy that reads and writes ``lr`` where its parameter says
``image``. The input Entry is never modified: the result is a new Entry.
"""

from __future__ import annotations

import copy
import inspect
from collections.abc import Mapping
from typing import Any

from srforge.data.entry import Entry


def _field_parameters(method) -> list[str]:
    """Names of the positional parameters of a bound method: the fields it reads."""
    kinds = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    return [p.name for p in inspect.signature(method).parameters.values() if p.kind in kinds]


class DataTransform:
    """Base class; see the module docstring for the contract."""

    def __init__(self, fields: Mapping[str, str] | None = None) -> None:
        self.fields: dict[str, str] = dict(fields or {})
        if not (self._defines("transform") or self._defines("transform_unbatched")):
            raise TypeError(
                f"{type(self).__name__} defines neither transform() (batched) nor transform_unbatched() "
                "(one sample): define at least one."
            )

    def _defines(self, name: str) -> bool:
        return getattr(type(self), name) is not getattr(DataTransform, name)

    # Defaults that mark "not defined"; subclasses override one or both.
    def transform(self, *values: Any) -> Any:
        raise NotImplementedError

    def transform_unbatched(self, *values: Any) -> Any:
        raise NotImplementedError

    def with_fields(self, **fields: str) -> "DataTransform":
        """A copy that maps parameter names to other field names: ``with_fields(image="lr")``."""
        clone = copy.copy(self)
        clone.fields = {**self.fields, **fields}
        return clone

    def __call__(self, entry: Entry) -> Entry:
        if not isinstance(entry, Entry):
            raise TypeError(f"{type(self).__name__} expects an Entry, found {type(entry).__name__}.")
        if entry.is_batched:
            if self._defines("transform"):
                return self._apply(self.transform, entry)
            return type(entry).collate([self._apply(self.transform_unbatched, s) for s in entry.unbatch()])
        if self._defines("transform_unbatched"):
            return self._apply(self.transform_unbatched, entry)
        # Only the fields it reads gain (and lose) the batch dimension; the others pass through untouched.
        names = [self.fields.get(p, p) for p in _field_parameters(self.transform)]
        if any(n not in entry for n in names):
            return self._apply(self.transform, entry)  # raises the KeyError that names what is missing
        fields = self._apply(self.transform, type(entry).collate([{n: entry[n] for n in names if n in entry}]))[0]
        out = entry.copy()
        out.update(fields)
        return out

    def _apply(self, method, entry: Entry) -> Entry:
        params = _field_parameters(method)
        names = [self.fields.get(p, p) for p in params]
        missing = [n for n in names if n not in entry]
        if missing:
            raise KeyError(
                f"{type(self).__name__}.{method.__name__} reads fields {missing} that the Entry lacks; "
                f"it has {sorted(map(str, entry.keys()))}. Map parameters to fields with with_fields(param='field')."
            )
        result = method(*(entry[n] for n in names))
        if len(names) == 1:
            values = (result,)
        elif isinstance(result, tuple) and len(result) == len(names):
            values = result
        else:
            found = f"a tuple of {len(result)}" if isinstance(result, tuple) else type(result).__name__
            raise ValueError(
                f"{type(self).__name__}.{method.__name__} reads {len(names)} fields {names} and must return a "
                f"tuple of {len(names)} new values in that order; it returned {found}."
            )
        out = entry.copy()
        out.update(zip(names, values))
        return out

    def __repr__(self) -> str:
        mapping = f"fields={self.fields}" if self.fields else ""
        return f"{type(self).__name__}({mapping})"
