"""The training step's memory: measured before the first epoch, turned into a pixel budget, lowered on running out.

    probe_memory -> StepMemory (bytes per padded pixel, fixed bytes)       srforge.runtime.device_memory measures
    plan_memory  -> the budget data.max_pixels resolves to (auto: from the probe and the free memory), printed
    PixelBudget  -> the one owner of the budget while training: the step's parts and the sampler's batches

A scan whose step cannot fit even alone is refused before training (:func:`too_large`, with what would make it
fit: :func:`fit_hints`), or, when the device runs short later all the same, ends the run resumably
(:class:`ScanTooLargeError`).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import Any

import torch

from srforge.config import ConfigError
from srforge.config.schema import Config, DataSection
from srforge.data.sampling import SizeGroupedBatchSampler
from srforge.geometry import aligned_size
from srforge.models.contract import class_name
from srforge.runtime.device import autocast
from srforge.runtime.device_memory import (
    PROBE_DOUBLINGS,
    StepMemory,
    auto_budget,
    free_memory,
    is_out_of_memory,
    measure_step_memory,
    pixels_text,
    planning_share,
    probe_shapes,
    processes_per_device,
    smallest_across_ranks,
)
from srforge.runtime.distributed import Processes
from srforge.train.from_config import Data, set_checkpointing
from srforge.train.losses import segmentation_loss
from srforge.train.update import scans_within

# A resumed run keeps the pixel budgets its checkpoint records unless the budget it resolves now is smaller by more
# than this share: data.max_pixels: auto measures free memory, which varies a little from start to start, and the
# same budget cuts the same batches, so that the resumed epoch skips exactly the batches done.
RESUME_BUDGET_SLACK = 0.1

# loss(logits [B, K, H, W], mask [B, H, W]) -> scalar: the training loss the probe's step takes.
Loss = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


class ScanTooLargeError(RuntimeError):
    """One scan's training step does not fit in the device's memory even alone; the message names the scan."""


class PixelBudget:
    """The padded pixels (B x Hp x Wp) one forward and backward may take at once: the one owner of the budget.

    ``pixels`` starts at the run's resolved ``data.max_pixels`` (None: data.batch_size, no bound). :meth:`lower`
    takes it down when the device runs out of memory (``events`` counts those times), for the rest of the run: a
    batch above it runs in parts of at most this many pixels straight away, and the ``sampler`` (which cuts
    batches by its ``max_pixels``, set only here) cuts smaller batches from the next epoch on
    (:meth:`start_epoch`). ``resolved`` is the budget this start of the run resolved, against which a
    checkpoint's budgets are reconciled (:meth:`load_state_dict`).
    """

    def __init__(self, pixels: int | None, sampler: SizeGroupedBatchSampler | None = None):
        self.pixels, self.resolved, self.sampler, self.events = pixels, pixels, sampler, 0

    def scans_per_part(self, shape: torch.Size) -> int:
        """How many scans of a batch ``shape`` [B, C, Hp, Wp] one part may hold: all of them without a bound."""
        return scans_within(self.pixels, shape)

    def lower(self, proposal: float) -> None:
        """Lower the budget to ``proposal`` (pixels; infinite: no proposal) when it is a lower one."""
        if math.isfinite(proposal) and (self.pixels is None or proposal < self.pixels):
            self.pixels = max(1, int(proposal))
            self.events += 1

    def start_epoch(self, fresh: bool) -> None:
        """Before an epoch's batches are cut: the sampler takes up a budget lowered in an earlier epoch. Not in a
        resumed epoch (``fresh`` false), whose batches must be those it was cut into at its start."""
        sampler = self.sampler
        if fresh and self.pixels is not None and sampler is not None and sampler.max_pixels is not None:
            sampler.max_pixels = min(sampler.max_pixels, self.pixels)

    def state_dict(self) -> dict[str, Any]:
        sampler = self.sampler.max_pixels if self.sampler is not None else None
        return {"sampler_max_pixels": sampler, "step_max_pixels": self.pixels}

    def load_state_dict(self, state: dict[str, Any] | None) -> None:
        """Continue with a checkpoint's budgets, as long as the budget resolved now is not more than
        RESUME_BUDGET_SLACK below them (a smaller device, or a smaller data.max_pixels given on purpose): then with
        the one resolved now, and the resumed epoch's batches are cut anew. The step's budget may sit below the
        sampler's (the device ran out of memory during the saved epoch). A checkpoint from before these budgets
        (``state`` None or without them): the resolved budget for both."""
        state, resolved = state or {}, self.resolved

        def kept(value: int | None) -> int | None:
            if value is None:
                return resolved
            return value if resolved is None or resolved >= value * (1 - RESUME_BUDGET_SLACK) else min(value, resolved)

        self.pixels = kept(state.get("step_max_pixels"))
        if self.sampler is not None and resolved is not None:
            self.sampler.max_pixels = kept(state.get("sampler_max_pixels"))


def probe_memory(
    model: torch.nn.Module, device: torch.device, precision: str, loss: Loss, *, channels_last: bool = False
) -> StepMemory:
    """The measured memory of one training step of ``model`` on ``device`` under ``precision`` (and
    ``channels_last``, and the model's own checkpointing), from device_memory.measure_step_memory.

    The step: forward of a blank [1, C, H, W] uint8 image, ``loss`` against an all-class-0 mask, backward; its
    gradients are dropped after. AdamW's two moments per parameter (the optimizer state a real step adds) are
    counted into the fixed part; the gradients' bytes tell the measurement how large its inputs must be for the
    activations to set the peak. The model's weights, mode and the random number generators are left as they were.
    """

    def run_at(height: int, width: int) -> None:
        image = torch.zeros((1, model.in_channels, height, width), dtype=torch.uint8, device=device)
        if channels_last:
            image = image.contiguous(memory_format=torch.channels_last)
        mask = torch.zeros((1, height, width), dtype=torch.int64, device=device)
        sizes = torch.tensor([[height, width]], device=device)
        with autocast(device, precision):
            logits = model(image, sizes)
        want = (1, model.num_classes, height, width)
        if not isinstance(logits, torch.Tensor) or tuple(logits.shape) != want:
            found = f"shape {list(logits.shape)}" if isinstance(logits, torch.Tensor) else type(logits).__name__
            raise ValueError(
                f"model.class: {class_name(model)} returned {found} in training mode for an image [1, "
                f"{model.in_channels}, {height}, {width}]; expected logits {list(want)} in training mode too "
                "(srforge.models.contract): [B, num_classes, H, W] at the input's size, a tensor, not a tuple or dict."
            )
        loss(logits, mask).backward()
        model.zero_grad(set_to_none=True)

    trainable = [p for p in model.parameters() if p.requires_grad]
    gradient_bytes = float(sum(p.numel() * p.element_size() for p in trainable))
    was_training = model.training
    model.train()
    try:
        with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
            return measure_step_memory(
                run_at,
                model.size_divisor,
                device,
                precision,
                optimizer_bytes=2.0 * gradient_bytes,
                gradient_bytes=gradient_bytes,
                checkpointing=bool(getattr(model, "checkpointing", False)),
            )
    except RuntimeError as error:
        if not is_out_of_memory(error):
            raise
        (h, w), (h2, w2) = probe_shapes(model.size_divisor, device)
        raise ConfigError(
            f"the start-of-run memory probe ran out of memory on {device}: one training step of {class_name(model)} "
            f"over inputs from {h} x {w} to {h2} x {w2} px, or up to {2**PROBE_DOUBLINGS} times as wide, did not fit "
            f"({str(error).splitlines()[0][:200]}). Free "
            "memory on the device, or make the step smaller: model.checkpointing=true, train.precision=bf16, or a "
            "smaller model (fewer model.base_channels)."
        ) from None
    finally:
        model.zero_grad(set_to_none=True)
        model.train(was_training)


def plan_memory(
    cfg: Config, model: torch.nn.Module, data: Data, device: torch.device, processes: Processes
) -> tuple[StepMemory, int | None]:
    """The training step's measured memory and the pixel budget ``data.max_pixels`` resolves to.

    ``auto``: the budget from the probe and the device's free memory, the smallest over the ranks; a training scan
    that cannot fit even alone is a ConfigError naming it, before training starts. A number is taken as given,
    None (data.batch_size) leaves batches uncut. The main process prints the figures.
    """
    loss = functools.partial(segmentation_loss, ignore_index=cfg.data.ignore_index, dice_weight=cfg.train.dice_weight)
    memory = probe_memory(model, device, cfg.train.precision, loss, channels_last=cfg.train.channels_last)
    free = free_memory(device)
    local = processes_per_device() if device.type == "cuda" else processes.local_world
    share = planning_share(free, device.type, local)
    aligned = [aligned_size(h, w, model.size_divisor) for h, w in data.train_sizes]
    largest = max(h * w for h, w in aligned)
    pixels = cfg.data.max_pixels
    if pixels == "auto":
        budget = auto_budget(memory, share, device.type, model.size_divisor)
        pixels, capacity = smallest_across_ranks(list(budget), device)
        if largest > capacity:
            raise too_large(model, data, aligned, (device, cfg.train.precision, loss), (memory, free, share))
    if processes.main:
        print(memory_line(memory, cfg.data, pixels, largest, (free, share, device)))
    return memory, pixels


def memory_line(memory: StepMemory, data_cfg: DataSection, pixels: int | None, largest: int, where: tuple) -> str:
    """The start-of-run line: 'srforge: memory: 1.80 KB per padded pixel in bf16, 0.40 GB fixed; 62.0 GB free on
    cuda:0; budget 30.0 Mpx (data.max_pixels: auto), the largest training scan 8.2 Mpx', and for a given budget
    whose step would not fit the share of free memory that auto plans with, what that means."""
    free, share, device = where
    room = "free" if device.type == "cuda" else "of RAM available"
    line = f"srforge: memory: {memory.describe()}; {free / 1e9:.1f} GB {room} on {device}; "
    if pixels is None:
        batch = data_cfg.batch_size * largest
        line += f"batches of {data_cfg.batch_size} scans (data.batch_size), at most {pixels_text(batch)}"
    else:
        given = "auto" if data_cfg.max_pixels == "auto" else "given"
        line += f"budget {pixels_text(pixels)} (data.max_pixels: {given})"
        batch = max(pixels, largest)
    line += f", the largest training scan {pixels_text(largest)}"
    if data_cfg.max_pixels != "auto" and memory.peak(batch) > share:
        line += (
            f". A step over {pixels_text(batch)} needs about {memory.peak(batch) / 1e9:.1f} GB: batches that run "
            "out of memory are redone in parts and the budget lowered (data.max_pixels: auto fits the device)"
        )
    return line


def too_large(model, data: Data, aligned: list, step: tuple, measured: tuple) -> ConfigError:
    """The ConfigError for training scans whose step cannot fit the device even alone: how many, the largest by
    name, what it needs against what there is, and what would make it fit (measured where that is quick).
    ``step`` is (device, precision, loss); ``measured`` (memory, free bytes, the share a step may plan with)."""
    memory, free, share = measured
    capacity = memory.fitting(share)
    areas = [h * w for h, w in aligned]
    over = sorted((i for i, area in enumerate(areas) if area > capacity), key=lambda i: -areas[i])
    first = over[0]
    (h, w), (ha, wa) = data.train_sizes[first], aligned[first]
    names = ", ".join(f"'{data.train[i]['name']}'" for i in over[:3]) + (", ..." if len(over) > 3 else "")
    return ConfigError(
        f"data.max_pixels: auto: {len(over)} training scan(s) cannot train on {step[0]} even alone "
        f"({names}). The largest, {h} x {w} px ({pixels_text(ha * wa)} padded), needs about "
        f"{memory.peak(ha * wa) / 1e9:.1f} GB for one step at {memory.describe()}; a step may plan with "
        f"{share / 1e9:.1f} GB of the {free / 1e9:.1f} GB free, enough for {pixels_text(capacity)}. To make it "
        f"fit: {'; '.join(fit_hints(model, step, memory, share, (ha, wa)))}.",
        keys=("data.max_pixels",),
    )


def fit_hints(model, step: tuple, memory: StepMemory, share: float, scan: tuple[int, int]) -> list[str]:
    """What would let a scan of padded size ``scan`` train in ``share`` bytes: checkpointing (measured), bf16
    (measured on CUDA), a crop that fits, a smaller model. ``step`` is (device, precision, loss)."""
    device, precision, loss = step
    hints, divisor, needed = [], model.size_divisor, scan[0] * scan[1]
    capacity = memory.fitting(share)
    if not memory.checkpointing and any("checkpointing" in vars(m) for m in model.modules()):
        set_checkpointing(model, True)
        try:
            with_checkpointing = probe_memory(model, device, precision, loss).fitting(share)
        finally:
            set_checkpointing(model, False)
        fits = "fits" if with_checkpointing >= needed else "not enough alone"
        hints.append(f"model.checkpointing=true (measured: room for {pixels_text(with_checkpointing)}, {fits})")
    if precision == "fp32":
        if device.type == "cuda":
            bf16 = probe_memory(model, device, "bf16", loss).fitting(share)
            hints.append(f"train.precision=bf16 (measured: room for {pixels_text(bf16)})")
        else:
            hints.append("train.precision=bf16 (fewer bytes per pixel)")
    height = scan[0] if capacity >= scan[0] * divisor else max(divisor, int(capacity**0.5) // divisor * divisor)
    width = max(divisor, capacity // height // divisor * divisor)
    hints.append(f"data.crop=[{height}, {width}] (train on random crops of the larger scans)")
    hints.append("a smaller model (fewer model.base_channels: bytes per pixel shrink about in proportion)")
    return hints


def scan_too_large(names: list, sizes: torch.Tensor, index: int, shape: torch.Size, device) -> ScanTooLargeError:
    """The error for scan ``index`` of a batch (``names``, true ``sizes`` [B, 2], padded ``shape``), which ran out
    of memory as a batch of its own."""
    height, width = sizes[index].tolist()
    pixels = shape[-2] * shape[-1]
    return ScanTooLargeError(
        f"scan '{names[index]}' ({height} x {width} px, padded to {shape[-2]} x {shape[-1]} = {pixels_text(pixels)}) "
        f"does not fit in the memory of {device} even as a batch of its own. Make its step smaller: "
        "model.checkpointing=true, train.precision=bf16, data.crop=[H, W] (train on random crops of large scans), "
        "or a smaller model (model.base_channels)."
    )
