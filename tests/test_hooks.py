"""The Trainer's hooks: EMA of the weights, early stopping, a user's own hook from YAML with state, and the trust
rule (a checkpoint names no hook class srforge imports). Exact resume holds with all of them on."""

import io
import json
import sys
from types import SimpleNamespace

import pytest
import torch
import yaml
from test_train import tiny_config

from srforge.cli import main_train
from srforge.cli.train import _say_done
from srforge.config import ConfigError, resolve
from srforge.runtime.checkpoint import load_checkpoint, model_from_checkpoint
from srforge.train import Hook, train
from srforge.train.hooks import ProgressHook


class CountingHook(Hook):
    """A user's hook with state: counts the events it sees, the steps taken, and adds its count to each row."""

    def __init__(self, label="counted"):
        self.label, self.steps, self.events = label, 0, []

    def before_train(self):
        self.events.append("before_train")

    def before_epoch(self):
        self.events.append("before_epoch")

    def after_step(self):
        self.steps += int(self.trainer.stepped)

    def after_epoch(self):
        self.events.append("after_epoch")
        self.trainer.add_to_row({self.label: self.steps})

    def after_train(self):
        self.events.append("after_train")

    def state_dict(self):
        return {"steps": self.steps}

    def load_state_dict(self, state):
        self.steps = state["steps"]


def _cfg(run_dir, hooks=True, **train_keys):
    cfg = tiny_config(run_dir, **train_keys)
    if hooks:
        cfg["train"]["hooks"] = [{"class": "test_hooks:CountingHook", "args": {"label": "steps_seen"}}]
    return resolve(cfg)


def _rows(run_dir):
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_a_user_hook_from_yaml_runs_at_every_event_and_its_state_is_saved(tmp_path):
    train(_cfg(tmp_path / "run", epochs=2))
    rows = _rows(tmp_path / "run")
    assert [r["steps_seen"] for r in rows] == [r["step"] for r in rows] == [3, 6]  # 8 training scans, batches of 3
    saved = load_checkpoint(tmp_path / "run" / "last.pt")["hooks"]
    assert saved["train.hooks[0] test_hooks:CountingHook"] == {"steps": 6}
    # A bad hook entry is a config error naming it.
    with pytest.raises(ConfigError, match=r"train.hooks\[0\]: expected \{class: 'module.path:Class'"):
        resolve({"train": {"hooks": [{"klass": "x:Y"}]}})
    with pytest.raises(ConfigError, match=r"train.hooks\[0\]: could not build test_hooks:CountingHook"):
        cfg = tiny_config(tmp_path / "bad")
        cfg["train"]["hooks"] = [{"class": "test_hooks:CountingHook", "args": {"nope": 1}}]
        train(resolve(cfg))


@pytest.mark.slow
def test_exact_resume_with_ema_a_user_hook_and_accumulation_mid_epoch(tmp_path, monkeypatch):
    """A Ctrl-C in epoch 2 (inside an update of 2 batches) with EMA and a stateful user hook on: the resumed run
    ends with the straight run's bits in the weights, the averaged weights and the hook's state."""
    import srforge.train.assemble as trainer

    options = {"ema": 0.9, "accumulate": 2}
    train(_cfg(tmp_path / "straight", **options))
    real_loss, calls = trainer.segmentation_loss, []

    def interrupt(*args, **kwargs):
        calls.append(1)
        if len(calls) == 6:  # 3 training batches and 1 validation batch an epoch: epoch 2, its first update
            raise KeyboardInterrupt
        return real_loss(*args, **kwargs)

    monkeypatch.setattr(trainer, "segmentation_loss", interrupt)
    with pytest.raises(KeyboardInterrupt):
        train(_cfg(tmp_path / "cut", **options))
    monkeypatch.setattr(trainer, "segmentation_loss", real_loss)
    assert load_checkpoint(tmp_path / "cut" / "last.pt")["epoch"] == 1
    train(_cfg(tmp_path / "cut", **options), resume=tmp_path / "cut")
    a, b = load_checkpoint(tmp_path / "straight" / "last.pt"), load_checkpoint(tmp_path / "cut" / "last.pt")
    assert a["step"] == b["step"] == 8
    assert all(torch.equal(a["model"][k], b["model"][k]) for k in a["model"])
    ema_a, ema_b = a["hooks"]["ema"], b["hooks"]["ema"]
    assert ema_a["updates"] == ema_b["updates"] == 8
    assert all(torch.equal(ema_a["weights"][k], ema_b["weights"][k]) for k in ema_a["weights"])
    assert a["hooks"]["train.hooks[0] test_hooks:CountingHook"] == b["hooks"]["train.hooks[0] test_hooks:CountingHook"]
    # ... and the EMA is an average, not a copy: it differs from the final weights.
    assert not all(torch.equal(a["model"][k], ema_a["weights"][k]) for k in a["model"])


@pytest.mark.slow
def test_validation_and_best_pt_use_the_averaged_weights(tmp_path):
    summary = train(_cfg(tmp_path / "run", hooks=False, ema=0.5, epochs=2, val_every=1))
    best = load_checkpoint(tmp_path / "run" / "best.pt")
    last = load_checkpoint(tmp_path / "run" / "last.pt")
    if best["epoch"] == 2:  # best.pt's weights are the average at its epoch, last.pt's the trained ones
        averaged = last["hooks"]["ema"]["weights"]
        assert all(torch.equal(best["model"][k], averaged[k]) for k in averaged)
        assert not all(torch.equal(best["model"][k], last["model"][k]) for k in averaged)
    # The validation score recorded is the averaged model's: evaluate it again from best.pt.
    model = model_from_checkpoint(best)
    assert best["best_metric"] == summary["best_mean_iou"] and model.size_divisor == 4
    with pytest.raises(ConfigError, match="train.ema: expected a number between 0 and 1, found 1.5"):
        resolve({"train": {"ema": 1.5}})


def test_early_stopping_ends_the_run_with_a_line_and_a_resume_stays_stopped(tmp_path, capsys):
    """lr 1e-9: validation never improves after the first epoch; patience 2 stops after epoch 3 of 6."""
    cfg = _cfg(tmp_path / "run", hooks=False, epochs=6, lr=1e-9, early_stop={"patience": 2, "min_delta": 0.01})
    summary = train(cfg)
    out = capsys.readouterr().out
    assert summary["epoch"] == 3 and [r["epoch"] for r in _rows(tmp_path / "run")] == [1, 2, 3]
    assert "early stop after epoch 3: the validation mean IoU has not risen by more than 0.01" in out
    assert "at epoch 1, for 2 validations (train.early_stop.patience=2)" in out
    assert load_checkpoint(tmp_path / "run" / "last.pt")["hooks"]["early_stop"]["stopped"] is True
    train(cfg, resume=tmp_path / "run")
    assert "early stopping ended this run after epoch 3; nothing to do" in capsys.readouterr().out
    assert len(_rows(tmp_path / "run")) == 3
    with pytest.raises(ConfigError, match=r"train.early_stop.patience: expected an integer >= 1"):
        resolve({"train": {"early_stop": {"patience": 0}}})


EVIL = """
from pathlib import Path
Path(__file__).with_name("IMPORTED").write_text("code ran")


class Hook:
    def after_step(self):
        pass
"""


@pytest.mark.slow
def test_a_checkpoint_naming_a_hook_class_it_was_not_configured_with_imports_nothing(tmp_path, monkeypatch, capsys):
    """A downloaded run folder: a checkpoint whose embedded config names evil_hooks:Hook, evil_hooks.py beside it,
    the working directory there, and no config.yaml of the user's naming it. --resume refuses before importing."""
    run = tmp_path / "downloaded"
    train(_cfg(run, hooks=False, epochs=1))
    ckpt = torch.load(run / "last.pt", weights_only=True)
    ckpt["config"]["train"]["hooks"] = [{"class": "evil_hooks:Hook", "args": {}}]
    ckpt["hooks"]["train.hooks[0] evil_hooks:Hook"] = {"anything": 1}
    torch.save(ckpt, run / "last.pt")
    (run / "config.yaml").unlink()
    (run / "evil_hooks.py").write_text(EVIL)
    monkeypatch.chdir(run)
    monkeypatch.syspath_prepend(str(run))
    assert main_train(["--resume", str(run), "train.epochs=2"]) == 2
    err = capsys.readouterr().err
    assert "its embedded config asks srforge to import " in err and "which your own config does not name" in err
    assert "train.hooks[0].class=evil_hooks:Hook" in err
    assert not (run / "IMPORTED").exists() and "evil_hooks" not in sys.modules
    # A hook state that no configured hook claims is left alone: the same checkpoint resumed with its hook removed.
    ckpt["config"]["train"]["hooks"] = []
    torch.save(ckpt, run / "last.pt")
    (run / "config.yaml").write_text(yaml.safe_dump(ckpt["config"]))
    assert main_train(["--resume", str(run), "train.epochs=2"]) == 0
    assert not (run / "IMPORTED").exists()


class _Stream(io.StringIO):
    """stderr as a terminal (``tty=True``) or as a log file, a pipe, CI (``tty=False``)."""

    def __init__(self, tty: bool):
        super().__init__()
        self.tty = tty

    def isatty(self) -> bool:
        return self.tty


@pytest.mark.parametrize("tty", [True, False], ids=["terminal", "log-file"])
def test_the_progress_bar_draws_on_a_terminal_only(monkeypatch, tty):
    stream = _Stream(tty)
    monkeypatch.setattr(sys, "stderr", stream)
    hook = ProgressHook()
    hook.trainer = SimpleNamespace(epoch_batches=50, epoch=0, settings=SimpleNamespace(epochs=3))
    hook.trainer.update_batches, hook.trainer.progress = 1, None
    hook.before_epoch()
    for _ in range(50):
        hook.after_step()
    hook.after_epoch()
    written = stream.getvalue()
    assert "epoch 1/3:" in written and "/50" in written if tty else written == ""


def test_the_done_line_names_the_run_folder_by_its_absolute_path(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    summary = {"val_iou": [0.9, 0.8], "val_mean_iou": 0.85, "best_mean_iou": 0.86, "class_names": ["bg", "curve"]}
    _say_done({**summary, "run_dir": "runs/x"})
    line = capsys.readouterr().out
    assert f"run directory {tmp_path / 'runs' / 'x'}" in line and "bg 0.9000, curve 0.8000 (mean 0.8500)" in line


# -- round five: what a hook's state may hold, and what a hook class must build -------------------------------------
class OddStateHook(Hook):
    """A hook whose state is what a checkpoint cannot hold: ``kind`` numpy (a numpy scalar), set, or long (a string
    past the stated limit)."""

    def __init__(self, kind):
        self.kind = kind

    def state_dict(self):
        import numpy as np

        from srforge.train.hooks import MAX_HOOK_STATE

        value = {"numpy": np.float64(0.5), "set": {1, 2}, "long": "x" * (MAX_HOOK_STATE + 1)}[self.kind]
        return {"best": value}

    def load_state_dict(self, state):
        pass


@pytest.mark.parametrize("kind, said", [("numpy", "numpy.float64"), ("set", "builtins.set"), ("long", "1,000,000")])
def test_a_hook_state_no_checkpoint_could_hold_is_refused_before_anything_is_written(tmp_path, kind, said, capsys):
    cfg = tiny_config(tmp_path / "run", epochs=1)
    cfg["train"]["hooks"] = [{"class": "test_hooks:OddStateHook", "args": {"kind": kind}}]
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(cfg))
    assert main_train(["--config", str(path)]) == 2
    err = capsys.readouterr().err
    assert "hook 'train.hooks[0] test_hooks:OddStateHook'" in err and said in err and "Traceback" not in err
    assert not list((tmp_path / "run").glob("*.pt"))  # no checkpoint that then cannot be read


@pytest.mark.parametrize("path", ["os:getcwd", "builtins:int"])
def test_a_hook_class_that_builds_no_hook_is_a_config_error_naming_it(tmp_path, path):
    cfg = tiny_config(tmp_path / "run", epochs=1)
    cfg["train"]["hooks"] = [{"class": path}]
    with pytest.raises(ConfigError, match=rf"train\.hooks\[0\]\.class: {path} built .* not a hook"):
        train(resolve(cfg))


def test_a_hook_state_that_contains_itself_or_shares_parts_is_refused_at_once():
    from srforge.train.hooks import check_hook_state

    looped: list = []
    looped.append(looped)
    shared: list = []
    for _ in range(40):  # 2**40 uses of one list: a walk that expanded it would never end
        shared = [shared, shared]
    for state in (looped, {"x": shared}):
        with pytest.raises(ConfigError, match="or a part that contains itself"):
            check_hook_state("h", state)
    check_hook_state("h", {"w": torch.zeros(2), "n": 3, "s": ["a", (1.5, None)]})  # plain data passes
