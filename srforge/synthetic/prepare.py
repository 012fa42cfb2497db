"""The synthetic scans a config's ``data.synthetic`` asks for, generated into their folder when any is missing.

Training's command runs this before its process group starts (:func:`srforge.train.run.train`), and
``srforge-make-synthetic`` writes the same folders by hand; the Trainer itself never generates.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from pathlib import Path

from srforge.config import ConfigError


def _synthetic_arguments(synthetic: Mapping) -> dict:
    """The generator's keyword arguments (other than root and n) that ``data.synthetic`` sets."""
    return {
        "scale": synthetic["scale"],  # a number, or YAML's [lo, hi]: each scan draws its own scale from the range
        "seed": synthetic["seed"],
        "classes": synthetic["classes"],
        "las": synthetic["las"] or None,
        "randomise": synthetic["randomise"],
    }


def _generate(generator, root: Path, synthetic: Mapping, stale: bool) -> None:
    arguments = _synthetic_arguments(synthetic)
    scale = arguments["scale"]
    shown = f"{scale[0]:g}-{scale[1]:g}" if isinstance(scale, list) else scale
    redo = "; the scans there were drawn with other settings and are redone" if stale else ""
    print(f"srforge: generating {synthetic['n']} synthetic well-log scans into {root.resolve()} (scale {shown}){redo}")
    try:
        generator.make_welllog_scans(root, synthetic["n"], workers=None, only_missing=True, **arguments)
    except generator.LasError as exc:
        raise ConfigError(f"data.synthetic.las: {exc}") from None


def prepare_synthetic_data(synthetic: Mapping, processes, poll_s: float = 0.5) -> None:
    """Generate the synthetic scans ``data.synthetic`` asks for, when any is missing, before the group starts;
    ``processes`` says this process's ``local_rank`` (srforge.runtime.distributed.Processes).

    One process per machine (local rank 0) generates, in parallel processes; the others poll the folder until
    every scan is there. No collective waits meanwhile, so generation may take longer than
    ``train.dist_timeout_s``. Files are written to temporary names and renamed, so a scan present is complete,
    and scan i depends only on (seed, i): a rerun after a kill completes the set, and machines sharing a
    filesystem may both write a scan (the same bytes). The folder's settings file says what its scans were drawn
    with (scale, seed, classes, LAS files by content, randomise, the generator's version): scans drawn with
    other settings are removed and drawn again, never served. A bad ``data.synthetic.las`` is a ConfigError.
    """
    if synthetic["root"] is None:
        return
    from srforge import synthetic as generator  # looked up here, so that tests can slow it down

    root = Path(synthetic["root"])
    arguments = _synthetic_arguments(synthetic)
    try:
        wanted = generator.scan_settings(**arguments)
    except generator.LasError as exc:
        raise ConfigError(f"data.synthetic.las: {exc}") from None

    def ready() -> bool:
        return generator.folder_settings(root) == wanted and not generator.missing_scans(root, synthetic["n"])

    if ready():
        return
    if processes.local_rank == 0:
        _generate(generator, root, synthetic, generator.is_stale(root, wanted))
        return
    while not ready():
        time.sleep(poll_s)
