"""srforge-train: train from a YAML config, or resume a run.

A run folder is one run's: a folder that holds a run already is refused unless ``--resume`` continues it or
``--overwrite`` starts over there, and a second srforge-train into a folder in use is refused, naming the holder
(both exit status 2, before anything is written). SIGTERM -- Slurm's, Kubernetes', a spot instance's notice --
stops the run as Ctrl-C does: last.pt at the batch reached, then exit status 143 (130 for Ctrl-C); a DataLoader
worker the system killed writes last.pt too and exits with 3. ``--resume RUN_DIR`` continues bit-identically.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from srforge.cli.errors import fail

PROG = "srforge-train"


def _names_run_dir(overrides: list[str]) -> bool:
    """Whether the command line sets run.dir (``run.dir=X`` or ``run={dir: X}``)."""
    from srforge.config import parse_override

    for text in overrides:
        path, value = parse_override(text)
        if path == "run.dir" or (path == "run" and isinstance(value, dict) and "dir" in value):
            return True
    return False


def _nothing_saved_yet(resume: str, config: str | None) -> bool:
    """Whether ``--resume RUN_DIR`` names a run folder (there or not yet) that holds no checkpoint and no metrics,
    while a config to start it from is at hand (``--config``, or the folder's config.yaml): a job stopped during
    set-up or its first epoch, requeued with the same command line."""
    folder = Path(resume)
    if folder.suffix == ".pt" or (folder.exists() and not folder.is_dir()):
        return False
    saved = any((folder / name).exists() for name in ("last.pt", "best.pt", "metrics.jsonl"))
    return not saved and (config is not None or (folder / "config.yaml").is_file())


def _train_config(config: str | None, resume: str | None, overrides: list[str]) -> tuple[dict, dict | None]:
    """The resolved config for srforge-train and the checkpoint to resume from (None without --resume).

    The config is --config FILE, or with --resume alone the checkpoint's own config, whose import paths must be
    named by the user too (srforge.config.trust). A resume writes into the folder it was given (for a checkpoint
    file, the folder it sits in) unless run.dir is set on the command line. The checkpoint is read here, once,
    and handed to training.
    """
    from srforge.config import ConfigError, load_config, parse_override, read_yaml_file, resolve
    from srforge.config.trust import check_checkpoint_imports
    from srforge.runtime.checkpoint import load_checkpoint
    from srforge.train.prepare import checkpoint_file

    if resume is None:
        return load_config(config or "configs/quickstart.yaml", overrides), None
    checkpoint = checkpoint_file(resume)
    folder = checkpoint.parent
    if not checkpoint.exists() and (folder / "best.pt").is_file():
        raise FileNotFoundError(
            f"{checkpoint.resolve()} does not exist (the run's first last.pt was not written: a full disk?), but "
            f"{(folder / 'best.pt').resolve()} does: continue from it with --resume {folder / 'best.pt'}"
        )
    ckpt = load_checkpoint(checkpoint)  # refuses what is not a well-formed srforge checkpoint, before any write
    if config is not None:
        cfg = load_config(config, overrides)
    else:
        if not isinstance(ckpt.get("config"), dict):
            raise ConfigError(f"{checkpoint} holds no training config; pass the run's config with --config FILE.")
        cfg = resolve(ckpt["config"], overrides)
        trusted = []
        if (folder / "config.yaml").is_file():
            trusted.append((str(folder / "config.yaml"), read_yaml_file(folder / "config.yaml") or {}))
        trusted.append(("the command line", dict(parse_override(text) for text in overrides)))
        check_checkpoint_imports(cfg, str(checkpoint), trusted)
    if not _names_run_dir(overrides):
        cfg.run.dir = str(folder)
    return cfg, ckpt


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=PROG, description=main_train.__doc__)
    parser.add_argument(
        "--config", help="YAML config (default: configs/quickstart.yaml, or the run's own config with --resume)"
    )
    parser.add_argument(
        "--resume",
        metavar="RUN_DIR|CKPT",
        help="continue a run from RUN_DIR/last.pt or a checkpoint file, writing into RUN_DIR (or the checkpoint's "
        "folder) unless run.dir is given",
    )
    parser.add_argument(
        "--overwrite",
        action="store_true",
        help="start a new run in a run folder that holds one: its checkpoints, metrics.jsonl/csv and tensorboard/ "
        "are removed first (without it such a folder is refused)",
    )
    parser.add_argument(
        "--allow-changes",
        action="store_true",
        help="with --resume: continue although the config trains on other data than the checkpoint's (data.dataset, "
        "data.fields, data.val_fraction, run.seed, ...); without it such a resume is refused",
    )
    parser.add_argument("overrides", nargs="*", metavar="key.path=value", help="config overrides, values read as YAML")
    return parser


def _requeued(args) -> None:
    """``--resume RUN_DIR`` of a run stopped before its first checkpoint: start it again from its config (the
    ``--config`` given, else the folder's config.yaml), in that folder; ``args`` changed in place."""
    if args.resume is None or not _nothing_saved_yet(args.resume, args.config):
        return
    folder = Path(args.resume).resolve()
    args.config = args.config or str(folder / "config.yaml")
    args.resume, args.overrides = None, [*args.overrides, f"run.dir={folder}"]
    print(f"srforge: {folder} holds no checkpoint yet (the run stopped before its first epoch ended): starting it "
          f"again from {args.config}")  # fmt: skip


def _say_done(summary: dict) -> None:
    """The closing line (rank 0 alone under torchrun): validation IoU per class, the best, the run folder."""
    from srforge.runtime.distributed import environment

    if summary.get("val_iou") is None or not environment().main:
        return
    per_class = ", ".join(f"{n} {v:.4f}" for n, v in zip(summary["class_names"], summary["val_iou"]))
    print(
        f"srforge: done. validation IoU {per_class} (mean {summary['val_mean_iou']:.4f}); best validation mean IoU "
        f"{summary['best_mean_iou']:.4f}; run directory {Path(summary['run_dir']).resolve()}"
    )


def main_train(argv=None) -> int:
    """Train a padding-aware U-Net from a YAML config: srforge-train --config configs/X.yaml [key.path=value ...]."""
    from srforge.atomic import DiskFullError
    from srforge.config import ConfigError
    from srforge.config.preflight import check_before_training
    from srforge.extras import MissingExtraError
    from srforge.locks import FolderLockedError, FolderLostError
    from srforge.runtime.signals import terminate_as_interrupt
    from srforge.train import NonFiniteLossError, ScanTooLargeError, WorkerLostError, train
    from srforge.train.stop import PeerLostError

    args = _parser().parse_args(argv)
    try:
        _requeued(args)
        cfg, ckpt = _train_config(args.config, args.resume, args.overrides)
        check_before_training(cfg)
    except (ConfigError, FileNotFoundError, ValueError, MissingExtraError) as exc:
        return fail(PROG, exc)
    try:
        with terminate_as_interrupt():  # SIGTERM: last.pt at the batch reached, as for Ctrl-C
            summary = train(
                cfg, resume=args.resume, checkpoint=ckpt, overwrite=args.overwrite, allow_changes=args.allow_changes
            )
    except (
        NonFiniteLossError,
        WorkerLostError,
        PeerLostError,
        ScanTooLargeError,
        DiskFullError,
        FolderLockedError,
        FolderLostError,
        ValueError,
        FileNotFoundError,
        MissingExtraError,
        KeyboardInterrupt,
    ) as exc:
        # ValueError: ConfigError (RunExistsError included), DataError, a mask value beyond model.num_classes;
        # FileNotFoundError: pretrained weights that cannot be had offline (WeightsUnavailableError), a file gone;
        # MissingExtraError: a model or weights file needs an optional package (the message names its extra)
        return fail(PROG, exc)
    _say_done(summary)
    return 0
