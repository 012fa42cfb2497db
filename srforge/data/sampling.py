"""Size-aware sampling: batches of similar-sized scans, and a train/val split that spans every size.

Both work from a list of true sizes [(H, W), ...], which any Dataset may offer through ``sizes()``
(SegmentationFolder reads them from file headers, so building either costs no pixel decoding).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np
from torch.utils.data import Sampler

from srforge.geometry import divisor_pair, round_up


def _as_sizes(sizes) -> np.ndarray:
    """Sizes as an int64 array [N, 2] of (H, W); accepts a Dataset with ``sizes()`` or a sequence of pairs."""
    if hasattr(sizes, "sizes") and callable(sizes.sizes):
        sizes = sizes.sizes()
    array = np.asarray(list(sizes), dtype=np.int64).reshape(-1, 2)
    if len(array) and array.min() < 1:
        bad = int(np.flatnonzero((array < 1).any(axis=1))[0])
        raise ValueError(f"size {bad} is {tuple(array[bad])}: every (H, W) must be positive")
    return array


def aligned_sizes(sizes, divisor: int | Sequence[int]) -> np.ndarray:
    """int64 [n, 2]: each (H, W) of ``sizes`` rounded up to ``divisor`` (int or (dh, dw)), as AlignedCollate pads it."""
    array = _as_sizes(sizes)
    dh, dw = divisor_pair(divisor)
    return np.stack([round_up(array[:, 0], dh), round_up(array[:, 1], dw)], axis=1)


def _grouped_order(aligned: np.ndarray, pool: np.ndarray, batch_size: int, rng, jitter: float) -> np.ndarray:
    """Order one pool of indices so that consecutive ones have similar aligned sizes.

    The pool is cut into k bands of the dimension that varies least (relative range), and each band is
    sorted along the other dimension, alternating direction band to band (a snake), so that a batch that
    straddles two bands joins scans of similar extent instead of the widest of one band with the
    narrowest of the next. k balances the two kinds of padding: with B batches in the pool, relative
    spreads s_lo <= s_hi, the per-batch spread is ~s_lo / k across bands and ~s_hi * k / B along them,
    smallest at k = sqrt(B * s_lo / s_hi). Scan sizes with few aligned values (heights of well logs)
    thus get one band per value.
    """
    logs = np.log(aligned[pool].astype(np.float64))  # [P, 2]
    spread = logs.max(axis=0) - logs.min(axis=0)
    across = int(np.argmin(spread))  # ties -> height
    along = 1 - across
    batches = max(1, len(pool) // batch_size)
    k = 1 if spread[along] == 0 else max(1, math.ceil(math.sqrt(batches * spread[across] / spread[along])))
    key = aligned[pool, across]
    edges = np.unique(np.quantile(key, np.linspace(0, 1, k + 1)[1:-1], method="lower"))
    band = np.searchsorted(edges, key, side="left")
    secondary = logs[:, along].copy()
    ties = np.arange(len(pool))
    if rng is not None:
        secondary += jitter * rng.random(len(pool))
        ties = rng.random(len(pool))
    secondary[band % 2 == 1] *= -1
    return pool[np.lexsort((ties, secondary, band))]


def _cut_by_pixels(order: np.ndarray, aligned: np.ndarray, max_pixels: int) -> list[np.ndarray]:
    """Greedy cut: a batch grows while n * max(Hp) * max(Wp) stays within max_pixels."""
    batches, start, hp, wp = [], 0, 0, 0
    for pos, index in enumerate(order):
        h, w = aligned[index]
        nh, nw = max(hp, h), max(wp, w)
        if pos > start and (pos - start + 1) * nh * nw > max_pixels:
            batches.append(order[start:pos])
            start, nh, nw = pos, h, w
        hp, wp = nh, nw
    if len(order) > start:
        batches.append(order[start:])
    return batches


def size_stratified_split(sizes, val_fraction: float = 0.2, seed: int = 0) -> tuple[list[int], list[int]]:
    """Split indices into (train, val) so that both sides cover the whole size range.

    Sorts by pixel count (then width), cuts the order into round(N * val_fraction) strata of consecutive
    scans and deals one random member of each stratum to validation. A plain random split can leave all
    the widest scans on one side. Deterministic by seed; the two lists are disjoint, sorted, and together
    hold every index.
    """
    if not 0 < val_fraction < 1:
        raise ValueError(f"val_fraction must be in (0, 1), got {val_fraction}")
    array = _as_sizes(sizes)
    n = len(array)
    n_val = round(n * val_fraction)
    if n_val < 1 or n_val >= n:
        raise ValueError(
            f"cannot split {n} samples with val_fraction={val_fraction}: that gives {n_val} validation "
            f"and {n - n_val} training samples; both need at least one (add samples or change val_fraction)"
        )
    rng = np.random.default_rng(seed)
    area = array[:, 0] * array[:, 1]
    order = np.lexsort((rng.random(n), array[:, 1], area))
    val = [int(rng.choice(stratum)) for stratum in np.array_split(order, n_val)]
    chosen = set(val)
    return [i for i in range(n) if i not in chosen], sorted(val)


class SizeGroupedBatchSampler(Sampler[list[int]]):
    """Batches of indices whose sizes are alike, so that padding each batch to its maximum wastes little.

    Each epoch: shuffle, cut into pools of ``pool_size``, order every pool by aligned size (see
    ``_grouped_order``), cut into batches, shuffle the batch order. Aligned size = true size rounded up
    to ``divisor`` (int or (dh, dw)), as AlignedCollate pads it.

    Batches hold ``batch_size`` scans, or with ``max_pixels`` as many as fit n * Hp * Wp <= max_pixels
    (Hp, Wp the batch maxima of aligned sizes; a scan that alone exceeds the budget forms its own batch).
    With ``num_replicas`` > 1 each rank takes every num_replicas-th batch of one shared list; as with
    DistributedSampler the list is padded by repeating its first batches (or, with drop_last, cut) so
    that every rank gets the same number. ``drop_last`` also drops the final short batch in batch_size
    mode. Every index appears exactly once per epoch over all ranks, apart from those repeats. The
    order depends only on (seed, epoch): call ``set_epoch`` before each epoch. ``len()`` is exact for the
    current epoch (with max_pixels the batch count may change a little from epoch to epoch).

    ``pool_size`` trades padding for variety: bigger pools hold closer neighbours, but when a pool spans
    the whole dataset the batches change from epoch to epoch only through the jitter of the sort key.
    ``jitter`` is that relative noise, added to the log of the in-band sort key each epoch: more jitter means
    more variety between epochs and more padding. benchmarks/bench_padding.py measures both trade-offs; the
    README's performance section has the figures.

    ``epoch_sizes`` (epoch -> [(H, W), ...], one per index, e.g. training scans rescaled by ``data.augment.scale``):
    sizes that change from epoch to epoch. Each epoch's batches are then grouped and cut by that epoch's sizes
    instead of ``sizes`` (which still fixes the number of indices); the batches still depend only on (seed, epoch).
    """

    def __init__(  # noqa: PLR0913 (keyword-only options, like DataLoader's)
        self,
        sizes,
        *,
        batch_size: int | None = None,
        max_pixels: int | None = None,
        divisor: int | Sequence[int] = 32,
        shuffle: bool = True,
        seed: int = 0,
        drop_last: bool = False,
        num_replicas: int = 1,
        rank: int = 0,
        pool_size: int = 4096,
        jitter: float = 0.02,
        epoch_sizes: Callable[[int], Sequence[Sequence[int]]] | None = None,
    ):
        if (batch_size is None) == (max_pixels is None):
            raise ValueError("give exactly one of batch_size (scans per batch) or max_pixels (pixels per batch)")
        if batch_size is not None and batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        if max_pixels is not None and max_pixels < 1:
            raise ValueError(f"max_pixels must be >= 1, got {max_pixels}")
        if not 0 <= rank < num_replicas:
            raise ValueError(f"rank must be in [0, num_replicas={num_replicas}), got {rank}")
        self.sizes = _as_sizes(sizes)
        if len(self.sizes) == 0:
            raise ValueError("SizeGroupedBatchSampler got no sizes: the dataset is empty")
        self.aligned = aligned_sizes(self.sizes, divisor)
        self.divisor, self.epoch_sizes = divisor, epoch_sizes
        self.batch_size, self.max_pixels = batch_size, max_pixels
        # Pools are whole batches in batch_size mode, so only the epoch's last batch can be short.
        step = batch_size or 1
        self.pool_size = max(step, round_up(int(pool_size), step))
        if jitter < 0:
            raise ValueError(f"jitter must be >= 0, got {jitter}")
        self.jitter = float(jitter)
        self.shuffle, self.seed, self.drop_last = shuffle, int(seed), drop_last
        self.num_replicas, self.rank = num_replicas, rank
        self.epoch = 0
        self._cache: tuple[tuple, list[list[int]]] | None = None

    def set_epoch(self, epoch: int) -> None:
        self.epoch = int(epoch)

    def state_dict(self) -> dict:
        return {"seed": self.seed, "epoch": self.epoch}

    def load_state_dict(self, state: dict) -> None:
        self.seed, self.epoch = int(state["seed"]), int(state["epoch"])

    def epoch_aligned(self) -> np.ndarray:
        """int64 [n, 2]: the aligned sizes this epoch's batches are grouped and cut by (``epoch_sizes`` of the
        epoch when given, else the fixed ones)."""
        if self.epoch_sizes is None:
            return self.aligned
        aligned = aligned_sizes(self.epoch_sizes(self.epoch), self.divisor)
        if len(aligned) != len(self.sizes):
            raise ValueError(
                f"SizeGroupedBatchSampler: epoch_sizes({self.epoch}) gave {len(aligned)} sizes for "
                f"{len(self.sizes)} indices; it must give one (H, W) per index, in the same order as sizes."
            )
        return aligned

    def _global_batches(self) -> list[np.ndarray]:
        """All batches of the epoch, before they are dealt to ranks."""
        n = len(self.sizes)
        rng = np.random.default_rng([self.seed, self.epoch]) if self.shuffle else None
        order = rng.permutation(n) if rng is not None else np.arange(n)
        step = self.batch_size or 1
        aligned = self.epoch_aligned()
        # The band count only needs the rough number of scans per batch.
        per_batch = self.batch_size or max(1, int(self.max_pixels // aligned.prod(axis=1).mean()))
        batches = []
        for start in range(0, n, self.pool_size):
            pool = _grouped_order(aligned, order[start : start + self.pool_size], per_batch, rng, self.jitter)
            if self.max_pixels is not None:
                batches += _cut_by_pixels(pool, aligned, self.max_pixels)
            else:
                batches += [pool[i : i + step] for i in range(0, len(pool), step)]
        if self.drop_last and self.batch_size is not None and len(batches[-1]) < self.batch_size:
            batches.pop()
        if rng is not None:
            batches = [batches[i] for i in rng.permutation(len(batches))]
        return batches

    def _rank_batches(self) -> list[list[int]]:
        key = (self.seed, self.epoch, self.max_pixels)  # the budget too: a trainer may lower it between epochs
        if self._cache is None or self._cache[0] != key:
            batches = self._global_batches()
            total = len(batches)
            if self.drop_last:
                batches = batches[: total - total % self.num_replicas]
            elif total % self.num_replicas:
                extra = self.num_replicas - total % self.num_replicas
                batches = batches + [batches[i % total] for i in range(extra)]
            mine = [b.tolist() for b in batches[self.rank :: self.num_replicas]]
            self._cache = (key, mine)
        return self._cache[1]

    def __iter__(self):
        return iter([list(b) for b in self._rank_batches()])

    def __len__(self) -> int:
        return len(self._rank_batches())


def train_val_indices(sizes, val_fraction: float | None, seed: int) -> tuple[list[int], list[int]]:
    """(train, val) indices of one dataset as the trainer splits it: by size (:func:`size_stratified_split`)
    when ``val_fraction`` is set, else every index trains (a separate validation set)."""
    if val_fraction:
        return size_stratified_split(sizes, val_fraction, seed=seed)
    return list(range(len(_as_sizes(sizes)))), []


def training_sampler(
    sizes, *, divisor, seed: int, batch_size=None, max_pixels=None, **options
) -> SizeGroupedBatchSampler:
    """The sampler the trainer draws its training batches from: size-grouped, shuffled by ``seed`` and epoch.
    ``options`` (num_replicas, rank, pool_size, jitter, and ``epoch_sizes``: epoch -> the training scans' sizes in
    it, with ``data.augment.scale``) go to SizeGroupedBatchSampler."""
    return SizeGroupedBatchSampler(
        sizes, batch_size=batch_size, max_pixels=max_pixels, divisor=divisor, shuffle=True, seed=seed, **options
    )
