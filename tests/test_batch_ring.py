"""BatchRing: DataLoader workers reuse the shared-memory buffers of batches the consumer has released, and never
overwrite a batch that is still held; the trainer's batches are the same with it as without."""

import time
from types import SimpleNamespace

import pytest
import torch
from test_train import tiny_config
from torch.utils.data import DataLoader, Dataset

import srforge.data.memory as memory
from srforge.data.collate import AlignedCollate
from srforge.data.entry import Entry
from srforge.data.memory import BatchRing, release_batch
from srforge.runtime.checkpoint import load_checkpoint
from srforge.train import train


class Scans(Dataset):
    """Entry samples of different sizes, pixels that depend on the index alone: uint8 image [3, h, w], mask [h, w]."""

    def __len__(self):
        return 24

    def __getitem__(self, i):
        h, w = 5 + i % 7, 9 + 3 * i
        g = torch.Generator().manual_seed(i)
        image = torch.randint(0, 256, (3, h, w), dtype=torch.uint8, generator=g)
        return Entry(image=image, mask=(image[0] > 127).to(torch.uint8), name=f"scan_{i}")


BATCHES = [[i, (i + 5) % 24, (i + 11) % 24] for i in range(24)]  # batch sizes vary, so slots grow too
COLLATE = AlignedCollate(8, pad={"image": 0, "mask": 255})


def ticket(batch):
    """(worker, slot, use) of the ring slot a batch holds, None for fresh buffers."""
    return None if batch._ring is None else batch._ring[1:]


def assert_same(batch, indices, collate=COLLATE):
    want = collate([Scans()[i] for i in indices])
    assert batch.image.stride() == want.image.stride()  # the layout too: channels-last stays channels-last
    for key in ("image", "mask", "sizes"):
        assert torch.equal(batch[key], want[key]), (indices, key)
    assert batch.name == want.name


@pytest.fixture
def in_worker(monkeypatch):
    """The ring's code as it runs in DataLoader worker 0."""
    monkeypatch.setattr(memory, "get_worker_info", lambda: SimpleNamespace(id=0))


def collated(ring, shape=(2, 3, 4), fill=0):
    """A batch as AlignedCollate makes it in a worker: image from the ring, the ticket in the Entry."""
    ring.begin()
    batch = Entry.batched({"image": ring.buffer(0, shape, torch.uint8).fill_(fill)}, shape[0])
    batch._ring = ring.ticket()
    return batch


def test_a_released_slot_is_reused_and_a_held_one_never(in_worker):
    ring = BatchRing(workers=1, slots=2)
    a, b = collated(ring, fill=1), collated(ring, fill=2)
    assert ticket(a) == (0, 0, 1) and ticket(b) == (0, 1, 2)
    c = collated(ring, fill=3)  # both slots held: fresh buffers, no ticket
    assert ticket(c) is None and bool((a.image == 1).all()) and bool((b.image == 2).all())
    assert ring.release(b) and not ring.release(c)
    d = collated(ring)
    assert d.image.untyped_storage().data_ptr() == b.image.untyped_storage().data_ptr() and ticket(d) == (0, 1, 3)
    assert bool((a.image == 1).all())  # slot 0 still held: untouched
    assert not ring.release(b) and int(ring.busy[0, 1]) == 3  # b's second release leaves d's slot busy
    e = collated(ring, shape=(5, 3, 4, 4))  # slot 0 still held, slot 1 holds d: fresh again
    assert ticket(e) is None and ring.release(a)
    f = collated(ring, shape=(5, 3, 4, 4))  # slot 0 again, grown for a larger batch
    assert ticket(f) == (0, 0, 4) and f.image.untyped_storage().nbytes() >= f.image.numel()


def test_release_batch_finds_the_ring_by_the_ticket_and_copies_hold_none(in_worker):
    ring, other = BatchRing(workers=1, slots=1), BatchRing(workers=1, slots=1)
    batch = collated(ring)
    assert batch.copy()._ring is None and batch.to("cpu")._ring is None  # only the batch itself releases
    assert not other.release(batch) and int(ring.busy[0, 0]) == 1
    assert not release_batch(Entry(image=torch.zeros(1, 3, 8, 8, dtype=torch.uint8)))
    assert release_batch(batch) and int(ring.busy[0, 0]) == 0 and batch._ring is None
    assert not release_batch(batch)


def test_a_batch_that_fails_to_collate_gives_its_slot_back(in_worker):
    ring = BatchRing(workers=1, slots=1)
    collate = AlignedCollate(8, pad={"image": 0, "mask": 255}).with_ring(ring)
    bad = Scans()[1]
    bad["mask"] = bad.mask[:-1]  # the mask a row short of the image
    with pytest.raises(ValueError, match="padded fields must share"):
        collate([Scans()[0], bad])
    assert int(ring.busy.sum()) == 0 and ticket(collate([Scans()[0]])) == (0, 0, 1)


def test_outside_a_worker_the_ring_gives_plain_tensors():
    ring = BatchRing(workers=1, slots=2)
    batch = COLLATE.with_ring(ring)([Scans()[0]])
    assert batch._ring is None and int(ring.busy.sum()) == 0
    with pytest.raises(ValueError, match="needs workers >= 1 and slots >= 1, found 0 and 2"):
        BatchRing(workers=0, slots=2)


@pytest.mark.parametrize("workers, channels_last", [(1, False), (2, False), (2, True)])
def test_workers_reuse_released_buffers_and_every_batch_is_as_without_a_ring(workers, channels_last):
    ring = BatchRing(workers, slots=4)
    collate = AlignedCollate(8, pad={"image": 0, "mask": 255}, channels_last=channels_last)
    loader = DataLoader(Scans(), batch_sampler=BATCHES, collate_fn=collate.with_ring(ring), num_workers=workers)
    seen = []
    for indices, batch in zip(BATCHES, ring.batches(loader)):
        seen.append(ticket(batch))
        time.sleep(0.01)  # the workers run ahead meanwhile: they must not write into the batch held
        assert_same(batch, indices, collate)
    assert None not in seen  # a free slot at every batch
    assert len({t[:2] for t in seen}) < len(BATCHES)  # slots reused, not one a batch


def test_a_consumer_that_keeps_every_batch_gets_fresh_buffers_once_the_slots_are_full():
    ring = BatchRing(2, slots=2)
    loader = DataLoader(Scans(), batch_sampler=BATCHES, collate_fn=COLLATE.with_ring(ring), num_workers=2)
    kept = list(loader)  # nothing released
    for indices, batch in zip(BATCHES, kept):
        assert_same(batch, indices)  # no batch was written over by a later one
    assert sum(ticket(b) is not None for b in kept) == 4  # two slots a worker, then fresh buffers


@pytest.fixture(scope="module")
def spawn_tracker():
    """multiprocessing's resource tracker, which the first spawned process starts and which outlives the test:
    started here, before the test's processes are counted (conftest's no_process_left_behind)."""
    from multiprocessing import resource_tracker

    resource_tracker.ensure_running()


def test_workers_started_by_spawn_use_the_ring_too(spawn_tracker):
    ring = BatchRing(1, slots=4)
    loader = DataLoader(
        Scans(), batch_sampler=BATCHES[:8], collate_fn=COLLATE.with_ring(ring), num_workers=1,
        multiprocessing_context="spawn",
    )  # fmt: skip
    seen = [(ticket(batch), assert_same(batch, indices)) for indices, batch in zip(BATCHES, ring.batches(loader))]
    assert all(t is not None for t, _ in seen) and max(t[2] for t, _ in seen) == 8 and len({t[1] for t, _ in seen}) < 8


def test_training_with_workers_gives_the_weights_of_training_without(tmp_path, monkeypatch):
    released, real = [], BatchRing.release

    def counted(ring, batch):
        held = batch._ring
        freed = real(ring, batch)
        released.append(held[:3] if freed else None)  # (ring, worker, slot)
        return freed

    monkeypatch.setattr(BatchRing, "release", counted)
    for workers in (0, 2):  # batches of one: 4 a worker an epoch, so that the slots are reused
        cfg = tiny_config(tmp_path / f"w{workers}", epochs=2)
        cfg.data.num_workers, cfg.data.batch_size = workers, 1
        train(cfg)
    a, b = load_checkpoint(tmp_path / "w0" / "last.pt"), load_checkpoint(tmp_path / "w2" / "last.pt")
    assert a["step"] == b["step"] > 0
    # every batch released (the last when the trainer finds the epoch over), each from a slot, slots used again
    assert len(released) == a["step"] and None not in released and len(set(released)) < len(released)
    for key in a["model"]:
        assert torch.equal(a["model"][key], b["model"][key]), key
