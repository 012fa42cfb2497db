"""The training step's memory (srforge.train.pixel_budget): the probe's bytes per pixel (against a real step's, at
inputs large enough that the activations, not the weights' gradients, set the peak), data.max_pixels: auto,
out-of-memory recovery in a step, and a resume that keeps the budgets. No GPU here: free memory and out-of-memory
errors are simulated (monkeypatched free_memory, a forward that raises torch.OutOfMemoryError), the probe is
measured on the CPU (the GPU's comparison is skipped without one).
"""

import json

import numpy as np
import pytest
import torch
import yaml
from helpers import run_pass, scan_folder, stepping_trainer, torch_threads
from test_model_create import _config, _yaml
from test_train import ROOT, TinyStrips, tiny_config, torchrun_two
from torch.utils.data import DataLoader

from srforge.cli import main_train
from srforge.config import ConfigError
from srforge.data.collate import AlignedCollate
from srforge.data.field_view import FieldView
from srforge.models import UNet
from srforge.runtime import device_memory as mem
from srforge.runtime.checkpoint import load_checkpoint
from srforge.runtime.device_memory import peak_bytes
from srforge.train import pixel_budget as train_memory
from srforge.train import train
from srforge.train.losses import segmentation_loss
from srforge.train.pixel_budget import PixelBudget, ScanTooLargeError, probe_memory

CPU = torch.device("cpu")


FIELDS = {"image": "scan", "mask": "labels", "name": "id"}


def _loss(dice=0.0):
    return lambda logits, mask: segmentation_loss(logits, mask, 255, dice_weight=dice)


# -- the probe ------------------------------------------------------------------------------------------------------
@pytest.mark.slow
def test_the_probe_measures_a_cost_per_pixel_and_leaves_the_model_as_it_was():
    torch.manual_seed(0)
    model = UNet(base_channels=8, depth=4)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    rng = torch.get_rng_state()
    memory = probe_memory(model, CPU, "fp32", _loss(1.0))
    assert memory.device == "cpu" and memory.precision == "fp32" and not memory.checkpointing
    # Forward + backward keep several base-channel float32 maps per pixel: hundreds of bytes, not a few.
    assert 200 < memory.bytes_per_pixel < 5000
    adam = 2 * sum(p.numel() * 4 for p in model.parameters())
    assert memory.optimizer_bytes == adam and memory.fixed_bytes >= adam
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert all(p.grad is None for p in model.parameters()) and torch.equal(torch.get_rng_state(), rng)


@pytest.mark.slow
def test_checkpointing_lowers_the_measured_bytes_per_pixel():
    model = UNet(base_channels=8, depth=5)
    plain = probe_memory(model, CPU, "fp32", _loss())
    model.checkpointing = True
    checkpointed = probe_memory(model, CPU, "fp32", _loss())
    assert checkpointed.checkpointing and checkpointed.bytes_per_pixel * 1.8 < plain.bytes_per_pixel


class LateGradient(torch.nn.Module):
    """A step that peaks at its heavy weight's gradient for inputs under about 0.5 Mpx and at its activations above:
    ``heavy`` (``weights`` floats) is used first in the forward, so its gradient is made last in the backward, when
    the activations saved by the chain of sines are gone. [B, 1, H, W] uint8 -> logits [B, 2, H, W]."""

    in_channels, num_classes, size_divisor = 1, 2, 8

    def __init__(self, weights: int = 8_000_000):
        super().__init__()
        self.heavy = torch.nn.Parameter(torch.zeros(weights))
        self.head = torch.nn.Conv2d(1, 2, 1)

    def forward(self, image: torch.Tensor, sizes: torch.Tensor | None = None) -> torch.Tensor:
        x = image.float() + self.heavy.sum()
        for _ in range(6):
            x = x.sin()  # each saves its input for the backward: the activations
        return self.head(x)


def step_bytes_per_pixel(model: torch.nn.Module, device: torch.device, shapes: list[tuple[int, int]]) -> float:
    """(peak_2 - peak_1) / (pixels_2 - pixels_1) of a real step (forward, loss, backward into kept gradients, an
    AdamW step) over two inputs, after a warm-up step that creates AdamW's state."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)

    def step(height: int, width: int) -> None:
        optimizer.zero_grad(set_to_none=True)
        image = torch.randint(0, 256, (1, model.in_channels, height, width), dtype=torch.uint8, device=device)
        mask = torch.randint(0, model.num_classes, (1, height, width), device=device)
        logits = model(image, torch.tensor([[height, width]], device=device))
        _loss(1.0)(logits, mask).backward()
        optimizer.step()

    step(*shapes[0])
    peaks = [peak_bytes(lambda shape=shape: step(*shape), device) for shape in shapes]
    (h1, w1), (h2, w2) = shapes
    return (peaks[1] - peaks[0]) / (h2 * w2 - h1 * w1)


@pytest.fixture
def two_threads():
    """Two intra-op threads, as the probe was measured against real steps (the suite's workers run one). At one
    thread a step of LateGradient takes about half the bytes a pixel and the probe says 9-19% more than the real
    step's (94 against 79-86 B/px): an overestimate, the safe side of a memory budget."""
    with torch_threads(2):
        yield


@pytest.mark.slow
def test_the_probe_measures_the_activations_cost_even_where_small_inputs_peak_at_the_gradients(two_threads):
    torch.manual_seed(0)
    model = LateGradient()
    probed = probe_memory(model, CPU, "fp32", _loss(1.0)).bytes_per_pixel
    # 2 and 4 Mpx: past both the gradient's peak and the optimizer step's (AdamW's state and temporaries)
    real = step_bytes_per_pixel(model, CPU, [(128, 16384), (128, 32768)])
    assert real > 40  # six saved float maps and the loss's: tens of bytes a pixel, not the gradient's few
    assert probed == pytest.approx(real, rel=0.1)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (torch sees none)")
@pytest.mark.parametrize("checkpointing", [False, True])
def test_on_a_gpu_the_probe_agrees_with_a_real_checkpointed_step(checkpointing):
    torch.manual_seed(0)
    device = torch.device("cuda")
    model = UNet(num_classes=4, base_channels=16, depth=5, checkpointing=checkpointing).to(device)
    probed = probe_memory(model, device, "fp32", _loss(1.0)).bytes_per_pixel
    real = step_bytes_per_pixel(model, device, [(512, 4096), (512, 8192)])
    assert probed == pytest.approx(real, rel=0.1)


def test_out_of_memory_in_the_memory_probe_is_exit_2_with_what_to_do(tmp_path, capsys, monkeypatch):
    from srforge.models import UNet

    real = UNet.forward

    def forward(self, image, sizes=None):
        if torch.is_grad_enabled():
            raise RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried to allocate 9 GB (simulated)")
        return real(self, image, sizes)

    monkeypatch.setattr(UNet, "forward", forward)
    root = scan_folder(tmp_path / "data", n=4)
    cfg = _config(tmp_path / "run", root, **{"class": "srforge.models.unet:UNet", "args": {}})
    cfg["model"].update(base_channels=4, depth=2)
    assert main_train(["--config", _yaml(tmp_path, cfg)]) == 2
    err = capsys.readouterr().err
    assert "the start-of-run memory probe ran out of memory on cpu" in err and "model.checkpointing=true" in err
    assert "Traceback" not in err


# -- data.max_pixels: auto ------------------------------------------------------------------------------------------
def _auto_config(run_dir, **train_keys):
    cfg = tiny_config(run_dir, epochs=1, **train_keys)
    cfg["data"]["batch_size"] = None
    cfg["data"]["max_pixels"] = "auto"
    return cfg


def test_auto_budget_from_a_simulated_free_memory_drives_the_batches(tmp_path, monkeypatch, capsys):
    """The probe and the free memory simulated: 2 KB a pixel, 30 MB fixed, 70 MB of RAM available -> half of it,
    less the fixed part, over 2 KB: 2,500 px per batch (the scans here hold 240-1,344 px when padded)."""
    memory = mem.StepMemory(2000.0, 30e6, "cpu", "fp32")
    monkeypatch.setattr(train_memory, "probe_memory", lambda *args, **kw: memory)
    monkeypatch.setattr(train_memory, "free_memory", lambda device: 70 * 10**6)
    train(_auto_config(tmp_path / "run"))
    out = capsys.readouterr().out
    assert "srforge: memory: 2.00 KB per padded pixel in fp32, 0.03 GB fixed; 0.1 GB of RAM available on cpu; " in out
    assert "budget 2,500 px (data.max_pixels: auto), the largest training scan 1,344 px" in out
    row = json.loads((tmp_path / "run" / "metrics.jsonl").read_text().splitlines()[0])
    assert row["max_pixels"] == 2500 and row["bytes_per_pixel"] == 2000.0 and row["out_of_memory"] == 0
    assert yaml.safe_load((tmp_path / "run" / "config.yaml").read_text())["data"]["max_pixels"] == "auto"


def test_a_scan_that_cannot_fit_alone_is_named_before_training(tmp_path, monkeypatch):
    """Room for 1,000 px: the scans of 1,232 px padded (16 x 77 true) cannot train, even alone."""
    monkeypatch.setattr(train_memory, "probe_memory", lambda *args, **kw: mem.StepMemory(2000.0, 0.0, "cpu", "fp32"))
    monkeypatch.setattr(train_memory, "free_memory", lambda device: 4 * 10**6)
    with pytest.raises(ConfigError) as caught:
        train(_auto_config(tmp_path / "run"))
    message = str(caught.value)
    assert "data.max_pixels: auto: " in message and "training scan(s) cannot train on cpu even alone" in message
    assert "'strip_009'" in message and "16 x 83 px (1,344 px padded)" in message
    for hint in ("model.checkpointing=true (measured: room for", "train.precision=bf16", "data.crop=[16, ", "smaller"):
        assert hint in message, hint
    assert not (tmp_path / "run" / "metrics.jsonl").exists() and not (tmp_path / "run" / "last.pt").exists()


AGREE = """
import os, sys
import torch
import srforge.train.pixel_budget as loop
from srforge.models import UNet
from srforge.runtime.device_memory import StepMemory

rank = int(os.environ["RANK"])
# Rank 0 has 400 MB of RAM available, rank 1 only 240 MB: both must use rank 1's budget.
loop.free_memory = lambda device: (400 if rank == 0 else 240) * 10**6
loop.probe_memory = lambda *args, **kw: StepMemory(2000.0, 0.0, "cpu", "fp32")
real_forward, hit = UNet.forward, []


def forward(self, image, sizes=None):  # rank 1 runs out of memory once, on its first batch of several scans
    if rank == 1 and torch.is_grad_enabled() and image.shape[0] > 1 and not hit:
        hit.append(1)
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB (simulated)")
    return real_forward(self, image, sizes)


UNet.forward = forward
from srforge.cli import main_train

sys.exit(main_train())
"""


@pytest.mark.slow
def test_two_ranks_agree_on_the_smallest_auto_budget_and_on_a_lowered_one(tmp_path):
    """Under torchrun (gloo): each rank's auto budget differs, every rank uses the smallest (one all-reduce MIN);
    rank 1 runs out of memory once, redoes its batch in parts, and both ranks lower the budget through the step's
    one read, so their samplers cut the same batches in the next epoch (else the run would hang)."""
    script = tmp_path / "train_two_budgets.py"
    script.write_text(AGREE)
    done = torchrun_two(
        script,
        "--config",
        str(ROOT / "configs" / "custom_dataset.yaml"),
        f"run.dir={tmp_path / 'ddp'}",
        "data.dataset.args.n=12",
        "data.batch_size=null",
        "data.max_pixels=auto",
        "model.base_channels=4",
        "train.epochs=2",
        cwd=ROOT,
        fresh=(tmp_path / "ddp",),
    )
    assert done.returncode == 0, done.stderr[-3000:]
    # The two processes share the machine's RAM: 240 MB x 0.5 / 2 / 2,000 B = 30,000 px (rank 1's), not rank 0's
    # 50,000.
    assert "budget 30,000 px (data.max_pixels: auto)" in done.stdout
    assert "srforge: out of memory (rank 1) at step " in done.stdout
    rows = [json.loads(line) for line in (tmp_path / "ddp" / "metrics.jsonl").read_text().splitlines()]
    assert [r["epoch"] for r in rows] == [1, 2]
    assert rows[0]["max_pixels"] < 30_000 and rows[0]["max_pixels"] == rows[1]["max_pixels"]
    assert rows[0]["out_of_memory"] == 1


# -- out of memory in a step ----------------------------------------------------------------------------------------
def _strips_loader(n=3, batch_size=3):
    """TinyStrips 0..n-1 (12 x 20, 13 x 27, 14 x 34, 15 x 41 px, ...) in batches padded to multiples of 4."""
    view = FieldView(TinyStrips(n=n), FIELDS, num_classes=2)
    return DataLoader(view, batch_size=batch_size, collate_fn=AlignedCollate(4, pad={"image": 0, "mask": 255}))


def _trainer(tmp_path, budget=None, **train_keys):
    """A Trainer over TinyStrips whose pass starts from the UNet of seed 0 (SGD, lr 1), with a pixel budget."""
    trainer = stepping_trainer(tmp_path / "run", "test_train:TinyStrips", fields=FIELDS, **train_keys)
    torch.manual_seed(0)
    trainer.model.load_state_dict(UNet(base_channels=4, depth=2).state_dict())
    trainer.budget = PixelBudget(budget)
    return trainer


def _one_epoch(trainer, loader):
    trainer.start_pass()
    run_pass(trainer, loader)
    return trainer.totals


def _run_with(monkeypatch, fail, trainer, n=3, batch_size=3):
    """Weights after one SGD epoch of ``trainer``, with ``fail(image, calls)`` deciding when forward raises."""
    model = trainer.model
    real, calls = UNet.forward, []

    def forward(self, image, sizes=None):
        calls.append(image.shape[0])
        if torch.is_grad_enabled() and fail(image, calls):
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB (simulated)")
        return real(self, image, sizes)

    monkeypatch.setattr(UNet, "forward", forward)
    totals = _one_epoch(trainer, _strips_loader(n, batch_size))
    monkeypatch.setattr(UNet, "forward", real)
    return model, calls, totals


@pytest.mark.slow
@pytest.mark.parametrize("dice", [0.0, 0.5])
def test_an_out_of_memory_batch_is_redone_in_parts_to_the_same_weights(tmp_path, monkeypatch, capsys, dice):
    plain, _, plain_totals = _run_with(
        monkeypatch, lambda image, calls: False, _trainer(tmp_path / "a", dice_weight=dice)
    )
    trainer = _trainer(tmp_path / "b", dice_weight=dice)
    once = lambda image, calls: image.shape[0] > 1 and len(calls) == 1  # noqa: E731
    split, calls, totals = _run_with(monkeypatch, once, trainer)
    assert calls == [3, 1, 2]  # the whole batch failed; halves of 1 and 2 scans
    worst = max((a - b).abs().max().item() for a, b in zip(plain.parameters(), split.parameters()))
    if dice == 0.0:  # cross-entropy: the same update up to float rounding
        assert worst <= 1e-6, worst
        assert abs(float(totals[0]) - float(plain_totals[0])) < 1e-6
    else:  # Dice is a ratio over the batch: the parts' Dice weighted by their valid pixels is close, not equal
        assert worst < 0.05
    assert trainer.budget.pixels == 2 * 16 * 36 and trainer.budget.events == 1  # the largest part that fit
    out = capsys.readouterr().out
    assert "out of memory at step 1 (epoch 1) on 1,728 px of a batch of 3 scans padded to 16 x 36" in out
    assert "lowered from none (data.batch_size) to 1,152 px" in out


@pytest.mark.slow
def test_out_of_memory_in_backward_leaves_no_trace_in_the_gradients(tmp_path, monkeypatch):
    """Two batches accumulated into one update; the second runs out of memory halfway through its backward (after
    the head's and the decoder's gradients were added): the update equals the one without the failure."""
    plain, _, _ = _run_with(monkeypatch, lambda image, calls: False, _trainer(tmp_path / "a", accumulate=2), 4, 2)
    trainer = _trainer(tmp_path / "b", accumulate=2)
    model, failed = trainer.model, []

    def hook(module, inputs, output):
        if output.requires_grad and not failed and model.calls == 2:  # the second batch, whole

            def boom(grad):
                failed.append(1)
                raise torch.OutOfMemoryError("CUDA out of memory (simulated, in backward)")

            output.register_hook(boom)

    model.calls = 0
    model.register_forward_pre_hook(lambda module, args: setattr(module, "calls", module.calls + 1))
    model.down[0].register_forward_hook(hook)
    _one_epoch(trainer, _strips_loader(4, batch_size=2))
    assert failed == [1]
    worst = max((a - b).abs().max().item() for a, b in zip(plain.parameters(), model.parameters()))
    assert worst <= 1e-6, worst


def test_a_scan_that_fails_alone_ends_the_run_naming_it(tmp_path, monkeypatch):
    always = lambda image, calls: True  # noqa: E731
    with pytest.raises(ScanTooLargeError, match=r"scan 'strip_000' \(12 x 20 px, padded to 16 x 36 = 576 px\)"):
        _run_with(monkeypatch, always, _trainer(tmp_path))


def test_a_lowered_budget_splits_later_batches_without_trying_them_whole(tmp_path, monkeypatch):
    trainer = _trainer(tmp_path, budget=900)  # 16 x 36 = 576 px a scan: one scan a part
    _, calls, _ = _run_with(monkeypatch, lambda image, calls: False, trainer)
    assert calls == [1, 1, 1]


@pytest.mark.slow
def test_the_run_goes_on_after_an_out_of_memory_step(tmp_path, monkeypatch):
    real, calls = UNet.forward, []

    def forward(self, image, sizes=None):
        if torch.is_grad_enabled() and image.shape[0] > 1:
            calls.append(image.shape[0])
            if len(calls) == 2:  # the second training batch
                raise torch.OutOfMemoryError("CUDA out of memory (simulated)")
        return real(self, image, sizes)

    monkeypatch.setattr(UNet, "forward", forward)
    cfg = tiny_config(tmp_path / "run", epochs=2)
    cfg["data"]["batch_size"], cfg["data"]["max_pixels"] = None, 3000
    summary = train(cfg)
    rows = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert summary["epoch"] == 2 and rows[0]["out_of_memory"] == 1 and rows[0]["max_pixels"] < 3000
    assert np.isfinite(rows[-1]["train_loss"]) and rows[1]["max_pixels"] == rows[0]["max_pixels"]


def test_resume_keeps_the_checkpoints_budgets(tmp_path, monkeypatch):
    """A run whose budget was lowered resumes with it (exact resume needs the same batches), and auto budgets that
    differ a little from start to start keep the saved one; a much smaller device lowers it."""
    from types import SimpleNamespace

    def resumed(saved, resolved):
        sampler = SimpleNamespace(max_pixels=resolved)
        budget = PixelBudget(resolved, sampler)
        budget.load_state_dict(saved)
        return sampler.max_pixels, budget.pixels

    saved = {"sampler_max_pixels": 10_000, "step_max_pixels": 6_000}
    assert resumed(saved, 9_500) == (10_000, 6_000)  # within 10%: the saved budgets
    assert resumed(saved, 5_000) == (5_000, 5_000)  # a smaller device
    assert resumed(saved, None) == (None, 6_000)  # data.batch_size: parts of at most 6,000 px
    assert resumed({}, 7_000) == (7_000, 7_000)  # a checkpoint from before the budgets
    cfg = tiny_config(tmp_path / "run", epochs=2, stop_after=1)
    cfg["data"]["batch_size"], cfg["data"]["max_pixels"] = None, 3000
    train(cfg)
    saved = torch.load(tmp_path / "run" / "last.pt", weights_only=True)["memory"]
    assert saved == {"sampler_max_pixels": 3000, "step_max_pixels": 3000}


def test_a_scan_too_large_mid_run_ends_it_naming_the_scan_with_last_pt_written(tmp_path, monkeypatch, capsys):
    real = UNet.forward

    def forward(self, image, sizes=None):
        if torch.is_grad_enabled():
            raise torch.OutOfMemoryError("CUDA out of memory (simulated)")
        return real(self, image, sizes)

    monkeypatch.setattr(train_memory, "probe_memory", lambda *args, **kw: mem.StepMemory(500.0, 0.0, "cpu", "fp32"))
    monkeypatch.setattr(UNet, "forward", forward)
    named = r"scan 'strip_\d+' \(\d+ x \d+ px, padded to .* even as a batch of its own"
    with pytest.raises(ScanTooLargeError, match=named) as caught:
        train(tiny_config(tmp_path / "run", epochs=1))
    wrote = f"Wrote {tmp_path / 'run' / 'last.pt'} at epoch 1, batch 0; once it fits, continue with --resume"
    assert wrote in str(caught.value)
    assert load_checkpoint(tmp_path / "run" / "last.pt")["batches_done"] == 0
    # the same from the command line: exit status 3, the scan named, last.pt written
    root = scan_folder(tmp_path / "data", n=4)
    cfg = _config(tmp_path / "cli", root, **{"class": "srforge.models.unet:UNet", "args": {}})
    cfg["model"].update(base_channels=4, depth=2)
    assert main_train(["--config", _yaml(tmp_path, cfg)]) == 3
    err = capsys.readouterr().err
    assert "even as a batch of its own" in err and "continue with --resume" in err and "Traceback" not in err
    assert (tmp_path / "cli" / "last.pt").is_file()


@pytest.mark.slow
def test_a_run_that_ran_out_of_memory_resumes_exactly(tmp_path, monkeypatch):
    """Out of memory inside epoch 2 lowers the budget; a Ctrl-C at its fourth update writes last.pt; the resumed
    run cuts epoch 2 as it was cut at its start (not by the lowered budget), splits its batches as the lowered
    budget says, lowers the sampler's budget from epoch 3 on, and ends with the straight run's bits. The model has
    dropout, and the failed forward draws its masks before it fails, as a real one can partway, in both runs before
    the cut: the resumed run's split batches draw as the straight run's did after it."""
    from srforge.train.trainer import Trainer

    real_forward, real_finish = UNet.forward, Trainer.apply_update

    def run(name, interrupt):
        armed = []

        def forward(self, image, sizes=None):
            if torch.is_grad_enabled() and image.shape[0] > 1 and armed == [1]:
                armed.append(2)  # once
                real_forward(self, image, sizes)  # the dropout masks drawn, then the failure
                raise torch.OutOfMemoryError("CUDA out of memory (simulated)")
            return real_forward(self, image, sizes)

        def finish(trainer, update):
            if trainer.epoch == 1 and not armed:
                armed.append(1)  # the next batch of several scans runs out of memory
            if interrupt and trainer.epoch == 1 and trainer.batches_done == 3:
                raise KeyboardInterrupt
            real_finish(trainer, update)

        monkeypatch.setattr(UNet, "forward", forward)
        monkeypatch.setattr(Trainer, "apply_update", finish)
        cfg = tiny_config(tmp_path / name, epochs=3)
        cfg["data"]["batch_size"], cfg["data"]["max_pixels"] = None, 3000
        cfg["model"]["args"] = {"dropout": 0.3}
        try:
            train(cfg)
        finally:
            monkeypatch.setattr(UNet, "forward", real_forward)
            monkeypatch.setattr(Trainer, "apply_update", real_finish)
        return cfg

    run("straight", interrupt=False)
    with pytest.raises(KeyboardInterrupt):
        run("cut", interrupt=True)
    saved = load_checkpoint(tmp_path / "cut" / "last.pt")
    assert (saved["epoch"], saved["batches_done"]) == (1, 3)
    assert saved["memory"]["step_max_pixels"] < saved["memory"]["sampler_max_pixels"] == 3000
    cfg = tiny_config(tmp_path / "cut", epochs=3)
    cfg["data"]["batch_size"], cfg["data"]["max_pixels"] = None, 3000
    cfg["model"]["args"] = {"dropout": 0.3}
    train(cfg, resume=tmp_path / "cut")
    a = load_checkpoint(tmp_path / "straight" / "last.pt")
    b = load_checkpoint(tmp_path / "cut" / "last.pt")
    assert a["step"] == b["step"] and a["memory"] == b["memory"] and a["model_args"]["dropout"] == 0.3
    assert all(torch.equal(a["model"][k], b["model"][k]) for k in a["model"])
