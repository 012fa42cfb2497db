"""Before the process group starts: the resume checkpoint checked, the run folder claimed.

Each step here either fails before anything is written (a resume that would change the model, a run folder that
holds another run) or is work a rank does alone, without a collective waiting on it (the run folder: the main
process), so that ``train.dist_timeout_s`` bounds only the collectives
that follow.

The run folder is one run's: :func:`claim_run_dir` holds it with a :class:`srforge.locks.FolderLock` for the
whole run (a second process into it is refused, naming the holder), and refuses a folder that holds a finished
or stopped run (``last.pt``, ``best.pt`` or ``metrics.jsonl``) unless the run continues it (``--resume``) or
``overwrite`` removes that run's files first: a new run would replace its checkpoints and append its epochs to
the old metrics.
"""

from __future__ import annotations

import fcntl
import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from srforge.atomic import DiskFullError, atomic_write_text, disk_full_names, remove_stale_temporaries
from srforge.config import ConfigError, dump
from srforge.config.schema import Config, ModelSection
from srforge.constants import UNET_CLASS, UNET_CLASSES
from srforge.locks import LOCK_NAME, FolderLock
from srforge.runtime.checkpoint import load_checkpoint
from srforge.train.from_config import model_kwargs


def checkpoint_file(resume: str | os.PathLike) -> Path:
    """The checkpoint ``--resume`` names: RUN_DIR/last.pt for a folder, else the file itself."""
    path = Path(resume)
    return path / "last.pt" if path.is_dir() else path


def resume_checkpoint(
    resume: str | os.PathLike | None, model_cfg: ModelSection, checkpoint: dict[str, Any] | None = None
) -> dict[str, Any] | None:
    """The checkpoint to resume from, checked against the config's model; None without ``resume``.

    ``checkpoint`` is that file's content when the caller has read it already (srforge-train reads it for its
    config), else it is read here. A resumed run keeps its model: another model class, norm option or argument
    (``model.num_classes`` above all) is a ConfigError here (:func:`model_differences`), before the run folder is
    touched and before any class is imported.
    """
    if resume is None:
        return None
    path = checkpoint_file(resume)
    ckpt = load_checkpoint(path) if checkpoint is None else checkpoint
    differ = model_differences(ckpt, model_cfg)
    if differ:
        raise ConfigError(
            f"--resume {path}: the config asks for {', '.join(differ)}. A resumed run keeps its model: drop these "
            "overrides, or start a new run in another run.dir without --resume."
        )
    return ckpt


# What a run trains on: a resumed run that changed one of these would continue on other data (run.seed draws the
# split), so that is refused unless asked for (allow_changes); any other change is said and taken.
DATA_KEYS = ("data.dataset", "data.val_dataset", "data.fields", "data.val_fraction", "data.ignore_index", "run.seed")


def config_changes(saved: dict[str, Any], cfg: Config) -> tuple[list[str], list[str]]:
    """(changes of DATA_KEYS, other changes) between the checkpoint's embedded config ``saved`` and ``cfg``, each
    "key: SAVED -> NOW"; run.dir, train.epochs and train.stop_after are a resume's own business and not listed."""
    own = {"run.dir", "train.epochs", "train.stop_after"}
    data, other = [], []
    for path, before, value in leaf_changes(saved, cfg.to_dict()):
        if path in own or path.startswith("model."):
            continue
        meaning = any(path == key or path.startswith(f"{key}.") for key in DATA_KEYS)
        (data if meaning else other).append(f"{path}: {before!r:.60} -> {value!r:.60}")
    return data, other


def leaf_changes(before: Any, now: Any, path: str = "") -> list[tuple[str, Any, Any]]:
    """(dotted path, before, now) of every value that differs between two nested configs; a key ``before`` lacks
    (a checkpoint from an older srforge) is no change."""
    if isinstance(before, dict) and isinstance(now, dict):
        found = []
        for key, value in now.items():
            if key in before:
                found += leaf_changes(before[key], value, f"{path}.{key}" if path else str(key))
        return found
    return [] if before == now else [(path, before, now)]


# UNet arguments that change what it computes and that a run may leave out: a resume that turns one on or off
# changes the model.
UNET_OFF = {"ink": False, "dropout": 0.0}


def model_differences(ckpt: dict[str, Any], model_cfg: ModelSection) -> list[str]:
    """How the config's model differs from the checkpoint's, one "model.KEY=VALUE (the checkpoint has SAVED)" each:
    the class (srforge's UNet under any of its paths counts as one), the norm option, the arguments. A checkpoint
    without ``model_class`` holds srforge's UNet; its arguments are compared where both sides name them, since
    older checkpoints record only some (``ink`` and ``dropout`` always: off where not named). Another class's
    arguments are compared whole."""
    saved_class, wanted_class = ckpt.get("model_class", UNET_CLASS), model_cfg.class_
    unet = saved_class in UNET_CLASSES
    if unet != (wanted_class in UNET_CLASSES) or (not unet and saved_class != wanted_class):
        return [f"model.class={wanted_class!r} (the checkpoint has {saved_class!r})"]
    differ = []
    saved_norm = ckpt.get("model_norm", "keep")
    if saved_norm != model_cfg.norm:
        differ.append(f"model.norm={model_cfg.norm!r} (the checkpoint has {saved_norm!r})")
    saved, wanted = ckpt["model_args"], model_kwargs(model_cfg)
    if unet:  # off where not named, as in the checkpoints written before UNet had them
        saved, wanted = {**UNET_OFF, **saved}, {**UNET_OFF, **wanted}
    names = [k for k in wanted if k in saved] if unet else sorted(set(wanted) | set(saved))
    for name in names:
        if (name in saved, saved.get(name)) != (name in wanted, wanted.get(name)):
            where = f"model.{name}" if name in model_cfg and name not in model_cfg.args else f"model.args.{name}"
            differ.append(f"{where}={_shown(wanted, name)} (the checkpoint has {_shown(saved, name)})")
    return differ


def _shown(args: dict[str, Any], name: str) -> str:
    return repr(args[name]) if name in args else "nothing"


# A run folder holds a run when one of these is there; --overwrite removes PREVIOUS_RUN (the user's own files and
# the size caches stay).
RUN_FILES = ("last.pt", "best.pt", "metrics.jsonl")
PREVIOUS_RUN = (*RUN_FILES, "metrics.csv", "tensorboard")


class RunExistsError(ConfigError):
    """The run folder holds another run, and the new one neither continues it nor was told to overwrite it."""


def claim_run_dir(run_dir: Path, *, continues: bool = False, overwrite: bool = False) -> FolderLock:
    """Hold ``run_dir`` for this run (main process) and prepare it; returns the lock, to release when the run ends.

    ``continues``: the run resumes the checkpoint of this very folder. A folder holding another run is a
    RunExistsError before anything is written, unless ``overwrite`` (its PREVIOUS_RUN files are removed once the
    lock is held); one in use by another process is a FolderLockedError naming it, also before any write.
    """
    if overwrite and continues:
        raise ConfigError(
            f"--overwrite with --resume {run_dir}: overwriting would remove the run that --resume continues. Drop "
            "--overwrite to continue it, or give the resumed run another folder with run.dir=OTHER_FOLDER."
        )
    if not (continues or overwrite) and _previous_run(run_dir) and not _in_use(run_dir):
        raise _run_exists(run_dir)
    with _writable(run_dir):
        run_dir.mkdir(parents=True, exist_ok=True)
        lock = FolderLock(run_dir, "run folder").acquire()
    try:
        if not continues and _previous_run(run_dir):  # again under the lock: a run may have ended there meanwhile
            if not overwrite:
                raise _run_exists(run_dir)
            with _writable(run_dir):
                _remove_previous_run(run_dir)
        prepare_run_dir(run_dir)
    except BaseException:
        lock.release()
        raise
    return lock


def _previous_run(run_dir: Path) -> list[str]:
    return [name for name in RUN_FILES if (run_dir / name).exists()]


def _run_exists(run_dir: Path) -> RunExistsError:
    return RunExistsError(
        f"{run_dir} already holds a run ({', '.join(_previous_run(run_dir))}); a new run there would replace its "
        f"checkpoints and mix its metrics. Continue that run with --resume {run_dir}, start over with --overwrite "
        "(removes its checkpoints, metrics.jsonl/csv and tensorboard/ first), or give the new run another folder: "
        "run.dir=OTHER_FOLDER. (From Python: train(cfg, resume=RUN_DIR) or train(cfg, overwrite=True).)"
    )


def _in_use(run_dir: Path) -> bool:
    """Whether another process holds ``run_dir``'s FolderLock; only reads (no lock file is made or written)."""
    try:
        fd = os.open(run_dir / LOCK_NAME, os.O_RDONLY)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)  # drops the shared lock, when it was taken
    return False


def _remove_previous_run(run_dir: Path) -> None:
    """The previous run's checkpoints, metrics files and TensorBoard events, so that none survives into the new."""
    for name in PREVIOUS_RUN:
        path = run_dir / name
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        else:
            path.unlink(missing_ok=True)


@contextmanager
def _writable(run_dir: Path) -> Iterator[None]:
    """A folder that cannot be written is a ConfigError naming it (rather than a traceback at the first write);
    a full disk stays a DiskFullError."""
    try:
        with disk_full_names(run_dir):
            yield
    except DiskFullError:
        raise
    except OSError as exc:
        raise ConfigError(
            f"run.dir: cannot write into {run_dir} ({exc.strerror or exc}); set run.dir to a folder you can write."
        ) from None


def prepare_run_dir(run_dir: Path) -> None:
    """Create the run folder and sweep temporary files a killed run left there.

    A folder that cannot be written is a ConfigError naming it. Only the main process calls this, holding the
    folder (:func:`claim_run_dir`), before any other process can write into it.
    """
    with _writable(run_dir):
        run_dir.mkdir(parents=True, exist_ok=True)
        remove_stale_temporaries(run_dir)


def write_run_config(run_dir: Path, cfg: Config) -> None:
    """config.yaml: the resolved config, written (atomically) once the run is built -- its data read, its model
    built and checked, its checkpoint restored -- so that a run refused on the way leaves the folder's config.yaml
    as it was."""
    with _writable(run_dir), disk_full_names(run_dir / "config.yaml"):
        atomic_write_text(run_dir / "config.yaml", dump(cfg))
