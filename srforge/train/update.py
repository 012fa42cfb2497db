"""The pieces of one optimizer update that a first reading of :meth:`srforge.train.trainer.Trainer.run_step` may skip.

    Update             what an update gathers: its batches' sums, names, and the loss weights' state
    parts_of           a batch cut into parts of at most the pixel budget's scans
    each_part          the parts tried in turn, one that runs out of memory redone in halves
    PartWeights        each part's loss weighted by its share of the update's valid pixels (accumulation, parts)
    backward_or_none   one part's backward added to the gradients, or no trace of it when memory ran out
    no_sync            DDP's no_sync context (every backward of an update; one reduction at its end)
    average_gradients  that reduction: every gradient averaged across the ranks, one all-reduce per dtype
    Reading            what an update's one device read returned: finite, the budget proposed, the progress

Valid-pixel weighting: with ``train.accumulate`` > 1, or when a batch is redone in parts, each part's loss is
weighted by its share of the update's valid pixels (:func:`srforge.train.losses.valid_pixels`), so that the
gradients add up to those of one batch holding every part (exactly for the cross-entropy; the Dice term becomes the
valid-pixel-weighted mean of the parts' Dice). The update's total is unknown before its last part, so each part is
weighted against the first part's count (``unit``) and the gradients are rescaled by unit / total at the end.

Under torchrun every backward runs in DDP's ``no_sync`` mode and the gradients are averaged by one all-reduce at the
end of the update: a rank that runs out of memory redoes its batch in parts alone while the others wait there.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from contextlib import nullcontext
from dataclasses import dataclass, field

import torch
from torch.nn.parallel import DistributedDataParallel

from srforge.runtime import distributed
from srforge.runtime.device_memory import is_out_of_memory
from srforge.train.losses import valid_pixels


@dataclass
class Update:
    """The optimizer update being gathered: its batches' sums (added to the epoch's only if it is stepped), their
    sample names, the loss weights (:class:`PartWeights`), and ``proposal``, the budget this rank proposes after
    running out of memory (infinite when it did not)."""

    totals: torch.Tensor  # float64 [3]: loss sum, batches, real pixels
    confusion: torch.Tensor  # int64 [K, K]
    weights: PartWeights
    names: list = field(default_factory=list)
    batches: int = 0
    proposal: float = math.inf

    @classmethod
    def empty(cls, num_classes: int, device: torch.device, ignore_index: int) -> Update:
        totals, confusion = zero_sums(num_classes, device)
        return cls(totals, confusion, PartWeights(ignore_index))


def zero_sums(num_classes: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """(float64 [3], int64 [K, K]) zeros on ``device``: loss sum, batches, real pixels; a confusion matrix."""
    return (
        torch.zeros(3, dtype=torch.float64, device=device),
        torch.zeros(num_classes, num_classes, dtype=torch.int64, device=device),
    )


class PartWeights:
    """The valid-pixel weights of an update's parts (module docstring): ``unit`` (valid pixels of its first weighted
    part, at least 1), ``valid`` (of every weighted part so far), ``used`` (whether any part was weighted, so the
    gradients need rescaling)."""

    def __init__(self, ignore_index: int):
        self.ignore_index = ignore_index
        self.unit: torch.Tensor | None = None
        self.valid: torch.Tensor | None = None
        self.used = False

    def scaled(self, loss: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, tuple]:
        """(``loss`` weighted by the part's valid pixels against ``unit``, the pending (valid, unit) to
        :meth:`count` once the part is in the gradients)."""
        valid = valid_pixels(mask, self.ignore_index)
        unit = self.unit if self.unit is not None else valid.clamp_min(1)
        return loss * (valid.double() / unit).to(loss.dtype), (valid, unit)

    def count(self, pending: tuple) -> None:
        valid, unit = pending
        self.unit, self.valid = unit, valid if self.valid is None else self.valid + valid

    def rescale(self, params: list[torch.Tensor]) -> None:
        """Gradients of weighted parts rescaled by unit / valid: as if one batch held them all."""
        if not self.used:
            return
        factor = (self.unit.double() / self.valid.clamp_min(1)).float()
        for p in params:
            if p.grad is not None:
                p.grad.mul_(factor.to(p.grad.dtype))


def parts_of(count: int, per_part: int) -> list[tuple[int, int]]:
    """[(lo, hi), ...]: ``count`` scans in runs of at most ``per_part``."""
    return [(lo, min(lo + per_part, count)) for lo in range(0, count, per_part)]


def scans_within(pixels: int | None, shape: torch.Size) -> int:
    """How many scans of a batch ``shape`` [B, C, Hp, Wp] ``pixels`` padded pixels hold: at least 1, at most B; all
    of them without a bound (None)."""
    if pixels is None:
        return shape[0]
    return max(1, min(shape[0], pixels // (shape[-2] * shape[-1])))


def halves(lo: int, hi: int) -> list[tuple[int, int]]:
    return [(lo, (lo + hi) // 2), ((lo + hi) // 2, hi)]


def each_part(parts: list[tuple[int, int]], run: Callable[[int, int], object]) -> Iterator[tuple[int, int, object]]:
    """``run(lo, hi)`` for each part in turn, yielding (lo, hi, what it returned) for every try: a part of several
    scans for which it returned None (out of memory) is followed by its two halves, a single scan's None is the
    caller's to handle (the caller may stop there). The caller's reaction to a None comes before the next try."""
    queue = list(parts)
    while queue:
        lo, hi = queue.pop(0)
        done = run(lo, hi)
        if done is None and hi - lo > 1:
            queue[:0] = halves(lo, hi)
        yield lo, hi, done
        del done  # not held through the next part's forward: the caller frees what it returned


def backward_or_none(params: list[torch.Tensor], run: Callable[[], object], device: torch.device) -> object | None:
    """``run()`` (a part's forward, loss and backward) with its gradients added to those held so far; returns what
    it returned, or None when the device ran out of memory, with no trace of the part left in the gradients (those
    so far are set aside during the backward and put back)."""
    held = [p.grad for p in params]
    for p in params:
        p.grad = None
    try:
        done = run()
    except RuntimeError as error:
        if not is_out_of_memory(error):
            raise
        done = None
    for p, old in zip(params, held):
        p.grad = old if done is None or p.grad is None else (p.grad if old is None else old.add_(p.grad))
    if done is None and device.type == "cuda":
        torch.cuda.empty_cache()  # the failed part's blocks, in sizes the halves may not reuse
    return done


def no_sync(net: torch.nn.Module):
    """DDP's ``no_sync`` for a wrapped model (the update reduces once, at its end); a no-op otherwise."""
    return net.no_sync() if isinstance(net, DistributedDataParallel) else nullcontext()


def average_gradients(params: list[torch.Tensor], world: int) -> None:
    """Every parameter's gradient averaged over the ``world`` ranks, one all-reduce per dtype (a parameter with
    no gradient on this rank takes part with zeros, and receives the average)."""
    by_dtype: dict[torch.dtype, list[torch.Tensor]] = {}
    for p in params:
        if p.requires_grad:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
            by_dtype.setdefault(p.grad.dtype, []).append(p)
    for group in by_dtype.values():
        flat = torch.cat([p.grad.reshape(-1) for p in group])
        distributed.reduce_sum(flat).div_(world)
        for p, chunk in zip(group, flat.split([p.numel() for p in group])):
            p.grad.copy_(chunk.view(p.grad.shape))


@dataclass
class Progress:
    """The running epoch's sums as last read: loss sum, batches stepped, real pixels, and the confusion matrix
    [K, K] of the training predictions (float64, on the host)."""

    loss_sum: float
    batches: float
    pixels: float
    confusion: torch.Tensor


@dataclass
class Reading:
    """What an update's one device read returned: whether every rank's loss was finite, the smallest budget any
    rank proposed after running out of memory (infinite: none), and, when asked, the epoch's :class:`Progress`."""

    finite: bool
    proposal: float
    progress: Progress | None = None


def read_update(update: Update, totals: torch.Tensor, confusion: torch.Tensor, log: bool) -> Reading:
    """The update's one read: whether every rank's loss is finite and the smallest budget any rank proposes (one
    all-reduce MIN of both), and with ``log`` the epoch's ``totals`` and ``confusion`` so far, in one transfer. All
    ranks must agree to step or to skip, or DDP hangs, and on the budget, or their samplers part ways."""
    finite = torch.isfinite(update.totals[0]).double().reshape(1)
    proposal = torch.full((1,), update.proposal, dtype=torch.float64, device=finite.device)
    agreed = distributed.reduce_min(torch.cat([finite, proposal]))
    if not log:
        packet = agreed.tolist()
        return Reading(packet[0] > 0, packet[1])
    values = torch.cat([agreed, totals, confusion.flatten().double()]).tolist()
    k = confusion.shape[0]
    progress = Progress(*values[2:5], torch.tensor(values[5:], dtype=torch.float64).view(k, k))
    return Reading(values[0] > 0, values[1], progress)
