"""srforge.train.trainer.Trainer built from objects: a user's model and DataLoader, the same bits as from a config,
hooks that change the trainer only through its documented calls."""

import ast
import json
import re
from pathlib import Path

import pytest
import torch
from test_train import tiny_config
from torch.utils.data import DataLoader

from srforge import load_checkpoint
from srforge.models.unet import UNet
from srforge.runtime.distributed import Processes
from srforge.train import Trainer, TrainSettings
from srforge.train.assemble import trainer_parts

ROOT = Path(__file__).resolve().parents[1]
HOOKS = ROOT / "srforge" / "train" / "hooks.py"


def _library_example() -> str:
    text = (ROOT / "docs" / "library.md").read_text()
    section = text.split("## Train your own model on your own loader", 1)[1]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def test_the_library_example_trains_a_users_model_on_a_users_loader(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    scope: dict = {"__name__": "notebook"}
    exec(compile(_library_example(), "docs/library.md", "exec"), scope)
    run = tmp_path / "runs" / "notebook"
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["epoch"] for r in rows] == list(range(1, 21)) and len(scope["summary"]["val_iou"]) == 2
    assert rows[0]["val_iou"][1] < 0.5 < scope["summary"]["val_iou"][1]  # it learns the one-pixel curve
    ckpt = load_checkpoint(run / "last.pt")
    assert ckpt["model_class"] == "notebook:TinyNet" and ckpt["epoch"] == 20 and ckpt["size_divisor"] == 4
    assert (run / "best.pt").is_file()

    # The same Trainer continued from its last.pt trains the epochs left, from the saved state.
    model = scope["TinyNet"]()
    resumed = Trainer(
        model,
        scope["train_loader"],
        scope["val_loader"],
        optimizer=torch.optim.AdamW(model.parameters(), lr=0.02),
        settings=TrainSettings(epochs=21, grad_clip=None),
        run_dir=run,
    )
    resumed.load_state_dict(ckpt)
    assert resumed.epoch == 20 and torch.equal(model.body[0].weight, ckpt["model"]["body.0.weight"])
    assert resumed.train()["epoch"] == 21


def _from_objects(cfg, run_dir: Path) -> Trainer:
    """The Trainer a user would build by hand from the parts a config makes: a plain DataLoader over the training
    view with the size-grouped sampler as its batch sampler, the validation loader, the optimizer and schedule."""
    parts = trainer_parts(cfg, Processes(), run_dir, None)
    loaders = parts["train_loader"]
    loader = DataLoader(loaders.train, batch_sampler=loaders.sampler, collate_fn=loaders.collate)
    keep = ("model", "val_loader", "optimizer", "scheduler", "loss", "settings", "budget")
    return Trainer(train_loader=loader, run_dir=run_dir, **{k: parts[k] for k in keep})


def _out_of_memory_on_every_third_batch(monkeypatch):
    real = UNet.forward

    def forward(self, image, sizes=None):
        self.calls = getattr(self, "calls", 0) + 1
        if self.training and image.shape[0] > 1 and self.calls % 3 == 0:
            raise torch.OutOfMemoryError("CUDA out of memory (simulated)")
        return real(self, image, sizes)

    monkeypatch.setattr(UNet, "forward", forward)


@pytest.mark.parametrize("case", ["plain", "accumulate_and_out_of_memory"])
def test_a_trainer_built_from_objects_gives_the_weights_of_the_one_from_the_config(tmp_path, monkeypatch, case):
    overrides = {"epochs": 2}
    if case != "plain":
        overrides["accumulate"] = 2
        _out_of_memory_on_every_third_batch(monkeypatch)
    cfg = tiny_config(tmp_path / "config", **overrides)
    (tmp_path / "config").mkdir()
    configured = Trainer.from_config(cfg)
    configured.train()
    built = _from_objects(cfg, tmp_path / "objects")
    built.train()
    assert built.step == configured.step > 0
    if case != "plain":
        assert built.budget.events == configured.budget.events == 1  # a batch was redone in halves
    for name, value in configured.model.state_dict().items():
        assert torch.equal(value, built.model.state_dict()[name]), name


def test_a_trainer_without_a_run_folder_trains_and_writes_nothing(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    cfg = tiny_config(tmp_path / "unused", epochs=1)
    (tmp_path / "unused").mkdir()
    parts = trainer_parts(cfg, Processes(), tmp_path / "unused", None)
    trainer = Trainer(parts["model"], parts["train_loader"], parts["val_loader"], settings=parts["settings"])
    summary = trainer.train()
    assert summary["epoch"] == 1 and 0 <= summary["val_mean_iou"] <= 1
    assert sorted(p.name for p in (tmp_path / "unused").iterdir()) == ["sizes_cache.json"]  # the data's, not a run's
    assert sorted(p.name for p in tmp_path.iterdir()) == ["unused"]


def test_a_model_outside_the_contract_is_refused_by_name():
    with pytest.raises(ValueError, match=r"Trainer\(model\): torch.nn.modules.conv.Conv2d has no such attribute"):
        Trainer(torch.nn.Conv2d(3, 2, 1), [])


# -- hooks change the trainer only through its documented calls --------------------------------------------------
CALLS = {"request_stop", "add_to_row", "add_to_summary", "use_averaged", "save", "validate"}


def _trainer_uses(path: Path) -> tuple[set[str], list[str]]:
    """(the trainer attributes a hooks module reads, what it writes or changes): every chain rooted at the trainer
    (``t``, ``trainer`` or ``self.trainer``) that is assigned to, or on which a method other than CALLS is called."""
    tree = ast.parse(path.read_text())
    reads, writes = set(), []

    def root(node):  # the trainer attribute a chain starts from, or None
        chain = []
        while isinstance(node, (ast.Attribute, ast.Subscript)):
            if isinstance(node, ast.Attribute):
                chain.append(node.attr)
            node = node.value
        if isinstance(node, ast.Name) and node.id in ("t", "trainer"):
            return chain[::-1]
        if chain[-1:] == ["trainer"] and isinstance(node, ast.Name) and node.id == "self":
            return chain[::-1][1:]
        return None

    for node in ast.walk(tree):
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(
            node, (ast.AugAssign, ast.AnnAssign)
        ) else []  # fmt: skip
        for target in targets:
            for part in target.elts if isinstance(target, ast.Tuple) else [target]:
                chain = root(part) if isinstance(part, (ast.Attribute, ast.Subscript)) else None
                if chain:
                    writes.append(f"line {node.lineno}: assigns trainer.{'.'.join(chain)}")
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            chain = root(node.func)
            if chain and not (len(chain) == 1 and chain[0] in CALLS):
                if len(chain) > 1 and chain[-1] not in ("get", "items", "keys", "values"):
                    writes.append(f"line {node.lineno}: calls trainer.{'.'.join(chain)}()")
        if isinstance(node, ast.Attribute):
            chain = root(node)
            if chain:
                reads.add(chain[0])
    return reads, writes


def _documented_attributes() -> set[str]:
    doc = Trainer.__doc__.split("Documented attributes", 1)[1]
    return set(re.findall(r"``(\w+)``", doc))


def test_hooks_change_the_trainer_only_through_documented_calls():
    reads, writes = _trainer_uses(HOOKS)
    assert writes == []
    assert "epoch" in reads and "row" in reads  # the check sees what the hooks read
    assert reads - CALLS <= _documented_attributes(), reads - CALLS - _documented_attributes()


def test_the_hook_check_catches_writes_and_mutations(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text(
        "class H:\n"
        "    def after_epoch(self):\n"
        "        t = self.trainer\n"
        "        t.stop_requested = True\n"
        "        self.trainer.row['x'] = 1\n"
        "        t.row.update({'y': 2})\n"
        "        t.request_stop()\n"
    )
    reads, writes = _trainer_uses(bad)
    assert writes == [
        "line 4: assigns trainer.stop_requested",
        "line 5: assigns trainer.row",
        "line 6: calls trainer.row.update()",
    ]
