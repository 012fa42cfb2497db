"""Every scan's true (H, W), found without decoding where possible and cached in one JSON format.

The size-grouped sampler and the size-covering split need all sizes before the first batch. A folder's sizes
come from file headers (no pixels decoded); a Dataset with a ``sizes()`` method gives them itself; any other
Dataset is read once, with a progress bar. Both kinds of result are cached in one format::

    {"version": 2, "key": "<what was measured>", "entries": {"<id>": [H, W, *stamp]}}

where ``id`` is a file's path relative to the cache (stamp: its byte size and mtime, so a changed file is measured
again) or a sample's index (no stamp; the key names the dataset and its arguments). A cache that is damaged, of
another version or of another key is measured again, never trusted, and a read-only folder is measured every time.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path

from torch.utils.data import Dataset
from tqdm import tqdm

from srforge.atomic import atomic_write_text
from srforge.data.field_view import FieldView
from srforge.data.images import DataError, read_size
from srforge.data.naming import posix_name

CACHE_VERSION = 3  # 3: sizes as displayed, EXIF orientation applied
FILES_KEY = "files"  # the key of a cache of file headers


def read_cache(path: Path | None, key: str) -> dict[str, list[int]]:
    """The entries of the cache at ``path`` if it is readable, of this version and of ``key``; else {}."""
    if path is None or not path.is_file():
        return {}
    try:
        stored = json.loads(path.read_text())
        if stored["version"] == CACHE_VERSION and stored["key"] == key and isinstance(stored["entries"], dict):
            return stored["entries"]
    except (OSError, ValueError, KeyError, TypeError):
        pass  # damaged: measured again
    return {}


def write_cache(path: Path | None, key: str, entries: Mapping[str, list[int]]) -> None:
    """Write the cache atomically; a read-only folder is not an error (sizes are then measured every time)."""
    if path is None:
        return
    try:
        atomic_write_text(path, json.dumps({"version": CACHE_VERSION, "key": key, "entries": dict(entries)}))
    except OSError:
        pass


def measure_sizes(paths: Sequence, cache=None) -> list[tuple[int, int]]:
    """(H, W) of each image file from its header, never its pixels; ``cache`` is an optional JSON file.

    A file's entry is re-read when its byte size or mtime changes.
    """
    paths = [Path(p) for p in paths]
    cache = Path(cache) if cache is not None else None
    entries = read_cache(cache, FILES_KEY)
    sizes, changed = [], False
    for path in paths:
        name = posix_name(os.path.relpath(path, cache.parent)) if cache is not None else str(path)
        try:
            stat = path.stat()
        except OSError as error:
            raise DataError(f"{path}: cannot stat ({error})") from error
        stamp = [stat.st_size, stat.st_mtime_ns]
        entry = entries.get(name)
        if entry is not None and entry[2:] == stamp:
            sizes.append((entry[0], entry[1]))
            continue
        height, width = read_size(path)
        entries[name] = [height, width, *stamp]
        sizes.append((height, width))
        changed = True
    if changed:
        write_cache(cache, FILES_KEY, entries)
    return sizes


def dataset_sizes(
    dataset: Dataset, fields: Mapping[str, str] | None = None, cache: Path | None = None, key: str = ""
) -> list[tuple[int, int]]:
    """(H, W) of every sample: ``dataset.sizes()`` when it has one, else measured once and cached.

    Measuring reads every sample (a progress bar shows it); the result is kept in ``cache`` under ``key``
    (e.g. the dataset's class and arguments) and reused while the key and the length still match.
    """
    if callable(getattr(dataset, "sizes", None)):
        return [tuple(map(int, s)) for s in dataset.sizes()]
    entries = read_cache(cache, key)
    if len(entries) == len(dataset) and all(str(i) in entries for i in range(len(dataset))):
        return [tuple(entries[str(i)][:2]) for i in range(len(dataset))]
    view = FieldView(dataset, fields)
    sizes = []
    for i in tqdm(range(len(view)), desc="measuring sizes (once)", unit="scan", leave=False):
        image = view[i]["image"]
        sizes.append((int(image.shape[-2]), int(image.shape[-1])))
    write_cache(cache, key, {str(i): list(s) for i, s in enumerate(sizes)})
    return sizes
