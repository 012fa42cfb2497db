"""Bounds on what srforge accepts from files it did not write: class names, and how far shared parts expand.

A YAML alias, and a pickled object referenced twice in a checkpoint, is one object used many times: nine levels
of nine aliases are a 479-byte file that reads as 9**9 names, cheap to hold and ruinous to print, hash or write
out. Sizes are therefore counted with every use of a shared part expanded (:func:`expanded_size`), without
expanding anything, and class names are held to short strings.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

MAX_CLASS_NAMES = 1024
MAX_CLASS_NAME_LENGTH = 64
# What the aliases of a YAML config may add to its own size, in units of one per node plus one per character.
MAX_ALIAS_EXPANSION = 1_000_000
# The expanded size of the training config embedded in a checkpoint, in the same units.
MAX_CHECKPOINT_CONFIG = 16_000_000


def class_names_problem(names: Any) -> str | None:
    """Why ``names`` is not a list of at most MAX_CLASS_NAMES distinct strings of 1 to MAX_CLASS_NAME_LENGTH
    characters (None when it is). Looks at each item once, so a list built of shared parts is not expanded."""
    if not isinstance(names, (list, tuple)):
        return f"expected a list of class names, found {type(names).__name__}"
    if len(names) > MAX_CLASS_NAMES:
        return f"expected at most {MAX_CLASS_NAMES} class names, found {len(names)}"
    first: dict[str, int] = {}
    for i, name in enumerate(names):
        if not isinstance(name, str):
            return f"class name {i} must be a string, found {type(name).__name__}"
        if not 1 <= len(name) <= MAX_CLASS_NAME_LENGTH:
            return f"class name {i} must have 1 to {MAX_CLASS_NAME_LENGTH} characters, found {len(name)}"
        if name in first:  # report columns and overlays are keyed by name
            return f"class name {i} {name!r} repeats class name {first[name]}; every class needs its own name"
        first[name] = i
    return None


def expanded_size(
    root: Any, parts: Callable[[Any], Iterable[Any]], weight: Callable[[Any], int], limit: int
) -> int | None:
    """The size of ``root`` with every shared part counted at each of its uses: the sum of ``weight`` over
    the tree that ``parts`` (an object -> its direct parts) unfolds. Returns None as soon as it exceeds
    ``limit``, or when a part contains itself (a cycle, which expands without end).

    Each distinct object is visited once (sizes are memoised by identity), so a 9**9 expansion costs 81
    visits. Iterative, so deep nesting cannot exhaust Python's recursion limit.
    """
    sizes: dict[int, int] = {}
    open_: set[int] = set()
    keep = []  # holds every visited object so that no id is reused while counting
    stack: list[tuple[Any, list | None]] = [(root, None)]
    while stack:
        obj, children = stack[-1]
        key = id(obj)
        if children is None:
            if key in sizes:
                stack.pop()
                continue
            if key in open_:
                return None  # an object still being counted is an ancestor of this use: a cycle
            open_.add(key)
            keep.append(obj)
            children = list(parts(obj))
            stack[-1] = (obj, children)
            stack.extend((child, None) for child in reversed(children) if id(child) not in sizes)
            continue
        total = weight(obj) + sum(sizes[id(child)] for child in children)
        if total > limit:
            return None
        sizes[key] = total
        open_.discard(key)
        stack.pop()
    return sizes[id(root)]


def object_parts(obj: Any) -> Iterable[Any]:
    """The direct parts of a plain-data object (dict keys and values, list and tuple items)."""
    if isinstance(obj, Mapping):
        for key, value in obj.items():
            yield key
            yield value
    elif isinstance(obj, (list, tuple)):
        yield from obj


def object_weight(obj: Any) -> int:
    """One unit per object, plus one per character of a string."""
    return 1 + (len(obj) if isinstance(obj, (str, bytes)) else 0)
