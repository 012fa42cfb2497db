"""Before the process group starts: the resume checkpoint checked, the run folder made, the synthetic data there.

Each step here either fails before anything is written (a resume that would change the model) or is work a rank
does alone, without a collective waiting on it (the run folder: the main process; synthetic data: one process
per machine), so that ``train.dist_timeout_s`` bounds only the collectives that follow.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from srforge.atomic import DiskFullError, atomic_write_text, disk_full_names, remove_stale_temporaries
from srforge.config import ConfigError, dump
from srforge.config.schema import Config, ModelSection, SyntheticSection
from srforge.runtime.checkpoint import load_checkpoint
from srforge.runtime.distributed import Processes
from srforge.train.build import MODEL_ARGS


def checkpoint_file(resume: str | os.PathLike) -> Path:
    """The checkpoint ``--resume`` names: RUN_DIR/last.pt for a folder, else the file itself."""
    path = Path(resume)
    return path / "last.pt" if path.is_dir() else path


def resume_checkpoint(
    resume: str | os.PathLike | None, model_cfg: ModelSection, checkpoint: dict[str, Any] | None = None
) -> dict[str, Any] | None:
    """The checkpoint to resume from, checked against the config's model; None without ``resume``.

    ``checkpoint`` is that file's content when the caller has read it already (srforge-train reads it for its
    config), else it is read here. A resumed run keeps its model: any model argument that differs
    (``model.num_classes`` above all) is a ConfigError here, before the run folder is touched.
    """
    if resume is None:
        return None
    path = checkpoint_file(resume)
    ckpt = load_checkpoint(path) if checkpoint is None else checkpoint
    saved = ckpt["model_args"]
    differ = [k for k in MODEL_ARGS if k in saved and saved[k] != model_cfg[k]]
    if differ:
        found = ", ".join(f"model.{k}={model_cfg[k]!r} (the checkpoint has {saved[k]!r})" for k in differ)
        raise ConfigError(
            f"--resume {path}: the config asks for {found}. A resumed run keeps its model: drop these overrides, "
            "or start a new run in another run.dir without --resume."
        )
    return ckpt


def prepare_run_dir(run_dir: Path, cfg: Config) -> None:
    """Create the run folder, sweep temporary files a killed run left there, write config.yaml.

    A folder that cannot be written is a ConfigError naming it (rather than a traceback at the first checkpoint).
    Only the main process calls this, before any other process can write into the folder.
    """
    try:
        with disk_full_names(run_dir / "config.yaml"):
            run_dir.mkdir(parents=True, exist_ok=True)
            remove_stale_temporaries(run_dir)
            atomic_write_text(run_dir / "config.yaml", dump(cfg))
    except DiskFullError:
        raise
    except OSError as exc:
        raise ConfigError(
            f"run.dir: cannot write into {run_dir} ({exc.strerror or exc}); set run.dir to a folder you can write."
        ) from None


def prepare_synthetic_data(synthetic: SyntheticSection, processes: Processes, poll_s: float = 0.5) -> None:
    """Generate the synthetic scans ``data.synthetic`` asks for, when any is missing, before the group starts.

    One process per machine (local rank 0) generates, in parallel processes; the others poll the folder until
    every scan is there. No collective waits meanwhile, so generation may take longer than
    ``train.dist_timeout_s``. Files are written to temporary names and renamed, so a scan present is complete,
    and scan i depends only on (seed, i): a rerun after a kill completes the set, and machines sharing a
    filesystem may both write a scan (the same bytes).
    """
    if synthetic["root"] is None:
        return
    from srforge.data import synthetic as generator  # looked up here, so that tests can slow it down

    root = Path(synthetic["root"])
    if not generator.missing_scans(root, synthetic["n"]):
        return
    if processes.local_rank == 0:
        print(f"srforge: generating {synthetic['n']} synthetic well-log scans into {root} (scale {synthetic['scale']})")
        generator.make_welllog_scans(
            root,
            synthetic["n"],
            scale=synthetic["scale"],
            seed=synthetic["seed"],
            classes=synthetic["classes"],
            workers=None,
            only_missing=True,
        )
        return
    while generator.missing_scans(root, synthetic["n"]):
        time.sleep(poll_s)
