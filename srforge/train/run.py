"""``train(cfg)``: what surrounds a :class:`srforge.train.trainer.Trainer` -- the resume checkpoint checked, the
run folder held, synthetic data made, the process group started -- and the run itself.

    cfg -> datasets (size-stratified split) -> size-grouped batches -> AlignedCollate(model.size_divisor)
        -> model(image, sizes) -> cross-entropy (+ Dice) on valid pixels -> AdamW, warm-up + cosine
        -> validation (confusion matrix over valid pixels) -> last.pt every epoch, best.pt by mean IoU

Exact resume: the batch order depends only on (seed, epoch), augmentation on (seed, epoch, sample), and the
checkpoint holds every stateful part's state, so on the CPU a run stopped after epoch 2 and resumed to epoch 4
ends with the same bits as one that ran 4 epochs straight. A Ctrl-C or SIGTERM (srforge-train turns SIGTERM into
:class:`srforge.runtime.signals.Terminated`), or a DataLoader worker the system killed
(:class:`srforge.train.stop.WorkerLostError`), writes ``last.pt`` at the batch it reached, and the resumed run
skips the batches already done: bit-identical too.

Distributed: under ``torchrun`` each process takes its rank's batches (gloo on CPU, nccl on CUDA), gradients are
averaged once per optimizer update, losses and confusion matrices are summed across ranks, and only rank 0 writes
files and shows the progress bar.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from srforge.atomic import disk_full_names
from srforge.config import ConfigError
from srforge.config.schema import Config
from srforge.runtime import distributed
from srforge.train.prepare import (
    checkpoint_file,
    claim_run_dir,
    config_changes,
    resume_checkpoint,
)
from srforge.train.trainer import Trainer


def check_changes(saved: dict[str, Any], cfg: Config, allow: bool, main: bool) -> None:
    """Refuse a resume that would train on other data than its checkpoint's config (unless ``allow``); say every
    other change (main process)."""
    data, other = config_changes(saved, cfg)
    if data and not allow:
        raise ConfigError(
            f"--resume: the config trains on other data than the checkpoint's ({'; '.join(data)}), so the run's "
            "validation scores and best.pt would compare two datasets. Start a new run in another run.dir, or pass "
            "--allow-changes (from Python: train(..., allow_changes=True)) if that is what you mean."
        )
    if main:
        for change in (*data, *other):
            print(f"srforge: resuming with a changed config: {change}")


def train(
    cfg: Config,
    resume: str | os.PathLike | None = None,
    checkpoint: dict[str, Any] | None = None,
    *,
    overwrite: bool = False,
    allow_changes: bool = False,
) -> dict[str, Any]:
    """Train by ``cfg`` (a resolved config); returns a summary with the final validation scores.

    ``resume`` (RUN_DIR or a checkpoint file) continues a run from its checkpoint; ``checkpoint`` is that file's
    content when the caller has read it already (srforge-train does, for its config), so it is read once.
    ``run.dir`` is held for the whole run (a second process into it is refused) and must not hold another run
    (last.pt, best.pt or metrics.jsonl) unless ``resume`` continues that very run, or ``overwrite`` removes its
    files first: a RunExistsError otherwise, before anything is written. A resume whose config trains on other data
    than its checkpoint's (DATA_KEYS) is a ConfigError unless ``allow_changes``; other changes are printed.
    """
    processes = distributed.environment()
    ckpt = resume_checkpoint(resume, cfg.model, checkpoint)
    if ckpt is not None and isinstance(ckpt.get("config"), dict):
        check_changes(ckpt["config"], cfg, allow_changes, processes.main)
    run_dir = Path(cfg.run.dir).absolute()  # every message names the folder wherever the job was started
    lock = None
    if processes.main:
        continues = resume is not None and checkpoint_file(resume).parent.resolve() == run_dir.resolve()
        lock = claim_run_dir(run_dir, continues=continues, overwrite=overwrite)
    try:
        from srforge.synthetic.prepare import prepare_synthetic_data  # the command's step, not the Trainer's

        prepare_synthetic_data(cfg.data.synthetic, processes)
        processes = distributed.start(processes, cfg.train.dist_timeout_s, cfg.run.device)
        try:
            with disk_full_names(run_dir):  # a full disk anywhere else (size caches, TensorBoard): the run folder
                return Trainer.from_config(cfg, processes, run_dir, ckpt, lock=lock).train()
        finally:
            if processes.owns_group:
                distributed.stop()
    finally:
        if lock is not None:
            lock.release()
