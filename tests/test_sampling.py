"""Size-grouped batch sampler and size-stratified split."""

from collections import Counter

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from srforge.data.sampling import SizeGroupedBatchSampler, size_stratified_split


def welllog_sizes(n, seed=0):
    rng = np.random.default_rng(seed)
    return list(zip(rng.integers(480, 641, n).tolist(), rng.integers(3200, 12801, n).tolist()))


def aligned(size, d=32):
    return tuple(-(-x // d) * d for x in size)


def waste(batches, sizes):
    padded = sum(len(b) * max(aligned(sizes[i])[0] for i in b) * max(aligned(sizes[i])[1] for i in b) for b in batches)
    return padded / sum(h * w for h, w in sizes) - 1


@pytest.mark.parametrize("kwargs", [{"batch_size": 7}, {"max_pixels": 4 * 640 * 12800}])
def test_every_index_once_per_epoch(kwargs):
    sizes = welllog_sizes(300)
    sampler = SizeGroupedBatchSampler(sizes, pool_size=64, **kwargs)
    for epoch in range(3):
        sampler.set_epoch(epoch)
        batches = list(sampler)
        assert len(batches) == len(sampler)
        assert sorted(i for b in batches for i in b) == list(range(300))


def test_ranks_are_disjoint_cover_everything_and_match_in_length():
    sizes = welllog_sizes(103)
    samplers = [SizeGroupedBatchSampler(sizes, batch_size=4, num_replicas=3, rank=r, seed=1) for r in range(3)]
    per_rank = [list(s) for s in samplers]
    assert len({len(b) for b in per_rank}) == 1 and all(len(s) == len(per_rank[0]) for s in samplers)
    counts = Counter(i for batches in per_rank for b in batches for i in b)
    assert set(counts) == set(range(103))
    total_batches = -(-103 // 4)  # 26 -> padded to 27 with one repeated batch
    assert sum(len(b) for b in per_rank) == 27 and total_batches == 26
    assert sum(c - 1 for c in counts.values()) <= 4  # only the padding repeats
    dropped = [
        list(SizeGroupedBatchSampler(sizes, batch_size=4, num_replicas=3, rank=r, drop_last=True)) for r in range(3)
    ]
    seen = [i for batches in dropped for b in batches for i in b]
    assert len(seen) == len(set(seen)) and all(len(b) == 4 for batches in dropped for b in batches)
    assert [len(b) for b in dropped] == [8, 8, 8]


def test_max_pixels_respected_and_oversized_alone():
    sizes = welllog_sizes(200) + [(3000, 20000)]
    budget = 6 * 640 * 12800
    batches = list(SizeGroupedBatchSampler(sizes, max_pixels=budget))
    for b in batches:
        hp = max(aligned(sizes[i])[0] for i in b)
        wp = max(aligned(sizes[i])[1] for i in b)
        assert len(b) == 1 or len(b) * hp * wp <= budget
    assert [200] in batches
    assert np.mean([len(b) for b in batches]) > 4  # the budget is used, not one scan per batch


def test_deterministic_by_seed_and_epoch():
    sizes = welllog_sizes(200)
    a, b = SizeGroupedBatchSampler(sizes, batch_size=8, seed=3), SizeGroupedBatchSampler(sizes, batch_size=8, seed=3)
    a.set_epoch(4)
    b.set_epoch(4)
    assert list(a) == list(b)
    b.set_epoch(5)
    assert list(a) != list(b)
    assert list(a) != list(SizeGroupedBatchSampler(sizes, batch_size=8, seed=4, pool_size=8 * 4))
    restored = SizeGroupedBatchSampler(sizes, batch_size=8)
    restored.load_state_dict(a.state_dict())
    assert restored.state_dict() == {"seed": 3, "epoch": 4} and list(restored) == list(a)


def test_no_shuffle_is_deterministic_and_grouped():
    sizes = welllog_sizes(64)
    s = SizeGroupedBatchSampler(sizes, batch_size=8, shuffle=False)
    first = list(s)
    s.set_epoch(9)
    assert list(s) == first
    assert waste(first, sizes) < 0.5 * waste([list(range(i, i + 8)) for i in range(0, 64, 8)], sizes)


def test_grouping_cuts_padding_far_below_random():
    sizes = welllog_sizes(2000)
    grouped = list(SizeGroupedBatchSampler(sizes, batch_size=16))
    order = np.random.default_rng(0).permutation(2000).tolist()
    shuffled = [order[i : i + 16] for i in range(0, 2000, 16)]
    assert waste(grouped, sizes) < 0.1 < 0.5 < waste(shuffled, sizes)


def test_exact_len_with_drop_last_and_tuple_divisor():
    sizes = welllog_sizes(50)
    s = SizeGroupedBatchSampler(sizes, batch_size=8, drop_last=True, divisor=(16, 64))
    assert len(s) == 6 == len(list(s)) and all(len(b) == 8 for b in s)
    assert len(SizeGroupedBatchSampler(sizes, batch_size=8)) == 7


def test_accepts_a_dataset_with_sizes_and_rejects_bad_arguments():
    class Data:
        def sizes(self):
            return [(5, 5), (6, 7), (8, 9)]

    assert sorted(i for b in SizeGroupedBatchSampler(Data(), batch_size=2) for i in b) == [0, 1, 2]
    for kwargs in [
        {},
        {"batch_size": 2, "max_pixels": 10},
        {"batch_size": 0},
        {"batch_size": 2, "rank": 2, "num_replicas": 2},
    ]:
        with pytest.raises(ValueError):
            SizeGroupedBatchSampler([(5, 5)], **kwargs)


@settings(max_examples=40, deadline=None)
@given(
    sizes=st.lists(st.tuples(st.integers(1, 300), st.integers(1, 300)), min_size=1, max_size=80),
    batch_size=st.integers(1, 9),
    budget=st.integers(1, 300_000),
    use_budget=st.booleans(),
    replicas=st.integers(1, 4),
    seed=st.integers(0, 5),
    epoch=st.integers(0, 3),
    pool=st.integers(1, 40),
)
def test_property_ranks_cover_each_index(sizes, batch_size, budget, use_budget, replicas, seed, epoch, pool):
    kwargs = {"max_pixels": budget} if use_budget else {"batch_size": batch_size}
    samplers = [
        SizeGroupedBatchSampler(sizes, num_replicas=replicas, rank=r, seed=seed, pool_size=pool, divisor=8, **kwargs)
        for r in range(replicas)
    ]
    for s in samplers:
        s.set_epoch(epoch)
    per_rank = [list(s) for s in samplers]
    assert all(len(s) == len(b) == len(per_rank[0]) for s, b in zip(samplers, per_rank))
    counts = Counter(i for batches in per_rank for b in batches for i in b)
    assert set(counts) == set(range(len(sizes)))
    repeats = sum(c - 1 for c in counts.values())
    longest = max(len(b) for batches in per_rank for b in batches)
    assert repeats <= (replicas - 1) * longest
    for batches in per_rank:
        for b in batches:
            assert len(b) == len(set(b)) and b
            if use_budget and len(b) > 1:
                assert (
                    len(b) * max(-(-sizes[i][0] // 8) * 8 for i in b) * max(-(-sizes[i][1] // 8) * 8 for i in b)
                    <= budget
                )
            if not use_budget:
                assert len(b) <= batch_size


def test_split_is_disjoint_complete_and_deterministic():
    sizes = welllog_sizes(101)
    train, val = size_stratified_split(sizes, 0.2, seed=1)
    assert len(val) == 20 and sorted(train + val) == list(range(101)) and not set(train) & set(val)
    assert (train, val) == size_stratified_split(sizes, 0.2, seed=1)
    assert val != size_stratified_split(sizes, 0.2, seed=2)[1]


def test_split_spans_the_size_range_on_both_sides():
    sizes = welllog_sizes(200, seed=4)
    area = np.array([h * w for h, w in sizes])
    ranked = np.sort(area)
    for seed in range(5):
        for side in size_stratified_split(sizes, 0.2, seed=seed):
            assert area[side].min() <= ranked[4] and area[side].max() >= ranked[-5]
            # every fifth of the range is represented in proportion
            counts = np.histogram(area[side], bins=ranked[[0, 40, 80, 120, 160, 199]])[0]
            assert counts.min() >= 0.8 * len(side) / 5


@pytest.mark.parametrize("fraction, n", [(0.0, 10), (1.0, 10), (-0.1, 10), (0.2, 2), (0.5, 1)])
def test_split_rejects_bad_fraction_or_too_few(fraction, n):
    with pytest.raises(ValueError, match="val_fraction|samples"):
        size_stratified_split(welllog_sizes(n), fraction)


def test_more_jitter_mixes_batches_more_between_epochs():
    rng = np.random.default_rng(0)
    sizes = [(int(h), int(w)) for h, w in zip(rng.integers(480, 641, 600), rng.integers(3200, 12801, 600))]

    def repeated_pairs(jitter):
        sampler = SizeGroupedBatchSampler(sizes, batch_size=8, seed=1, jitter=jitter)
        pairs = []
        for epoch in (0, 1):
            sampler.set_epoch(epoch)
            pairs.append({frozenset((a, b)) for batch in sampler for a in batch for b in batch if a < b})
        return len(pairs[0] & pairs[1]) / len(pairs[0])

    assert repeated_pairs(0.2) < repeated_pairs(0.02)
    with pytest.raises(ValueError, match="jitter must be >= 0"):
        SizeGroupedBatchSampler(sizes, batch_size=8, jitter=-1)
