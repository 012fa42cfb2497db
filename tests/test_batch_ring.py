"""BatchRing: DataLoader workers reuse the shared-memory buffers of batches the consumer has released, and never
overwrite a batch that is still held; the trainer's batches are the same with it as without."""

from types import SimpleNamespace

import pytest
import torch
from test_train import tiny_config
from torch.utils.data import DataLoader, Dataset

import srforge.data.memory as memory
from srforge.data.collate import AlignedCollate
from srforge.data.entry import Entry
from srforge.data.memory import HEADER, BatchRing, release_batch
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


def header(tensor):
    """(ring id, worker, slot, use) of a ring buffer, None for any other tensor."""
    found = memory._ring_header(tensor.untyped_storage())
    return None if found is None else tuple(found[1:])


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


def test_a_released_slot_is_reused_and_a_held_one_never(in_worker):
    ring = BatchRing(workers=1, slots=2)
    ring.start_batch()
    a = ring.buffer(0, (2, 3, 4), torch.uint8).fill_(1)
    ring.start_batch()
    b = ring.buffer(0, (2, 3, 4), torch.uint8).fill_(2)
    assert header(a)[2:] == (0, 1) and header(b)[2:] == (1, 2) and a.storage_offset() == HEADER
    ring.start_batch()  # both slots held: a fresh buffer, no header
    c = ring.buffer(0, (2, 3, 4), torch.uint8).fill_(3)
    assert header(c) is None and bool((a == 1).all()) and bool((b == 2).all())
    assert ring.release(b) == 1 and ring.release(c) == 0
    ring.start_batch()
    d = ring.buffer(0, (2, 3, 4), torch.uint8)
    assert d.untyped_storage().data_ptr() == b.untyped_storage().data_ptr() and header(d)[2:] == (1, 3)
    assert bool((a == 1).all())  # slot 0 still held: untouched
    ring.start_batch()
    e = ring.buffer(0, (5, 3, 4, 4), torch.uint8)  # slot 0 still held, slot 1 now holds d: fresh again
    assert header(e) is None and ring.release(a) == 1
    ring.start_batch()
    f = ring.buffer(0, (5, 3, 4, 4), torch.uint8)  # slot 0 again, grown for a larger batch
    assert header(f)[2] == 0 and f.untyped_storage().nbytes() >= HEADER + f.numel()


def test_release_batch_finds_the_ring_by_the_buffer_and_ignores_other_tensors(in_worker):
    ring, other = BatchRing(workers=1, slots=1), BatchRing(workers=1, slots=1)
    ring.start_batch()
    batch = Entry(image=ring.buffer(0, (1, 3, 8, 8), torch.uint8), mask=ring.buffer(1, (1, 8, 8), torch.uint8))
    assert other.release(batch) == 0 and int(ring.busy[0, 0]) == 1
    assert release_batch(Entry(image=torch.zeros(1, 3, 8, 8, dtype=torch.uint8))) == 0
    assert release_batch(batch) == 1 and int(ring.busy[0, 0]) == 0  # the two fields of one batch: one slot


def test_outside_a_worker_the_ring_gives_plain_tensors():
    ring = BatchRing(workers=1, slots=2)
    ring.start_batch()
    assert header(ring.buffer(0, (2, 3), torch.uint8)) is None and int(ring.busy.sum()) == 0
    with pytest.raises(ValueError, match="needs workers >= 1 and slots >= 1, found 0 and 2"):
        BatchRing(workers=0, slots=2)


@pytest.mark.parametrize("workers, channels_last", [(1, False), (2, False), (2, True)])
def test_workers_reuse_released_buffers_and_every_batch_is_as_without_a_ring(workers, channels_last):
    ring = BatchRing(workers, slots=4)
    collate = AlignedCollate(8, pad={"image": 0, "mask": 255}, channels_last=channels_last)
    loader = DataLoader(Scans(), batch_sampler=BATCHES, collate_fn=collate.with_ring(ring), num_workers=workers)
    seen = []
    for indices, batch in zip(BATCHES, ring.batches(loader)):
        assert_same(batch, indices, collate)
        seen.append(header(batch.image))
    assert None not in seen  # a free slot at every batch
    slots = {h[1:3] for h in seen}
    assert len(slots) < len(BATCHES) and {h[0] for h in seen} == {ring.id}  # slots reused, not one a batch


def test_a_consumer_that_keeps_every_batch_gets_fresh_buffers_once_the_slots_are_full():
    ring = BatchRing(2, slots=2)
    loader = DataLoader(Scans(), batch_sampler=BATCHES, collate_fn=COLLATE.with_ring(ring), num_workers=2)
    kept = list(loader)  # nothing released
    for indices, batch in zip(BATCHES, kept):
        assert_same(batch, indices)  # no batch was written over by a later one
    assert sum(header(b.image) is not None for b in kept) == 4  # two slots a worker, then fresh buffers


def test_training_with_workers_gives_the_weights_of_training_without(tmp_path):
    for workers in (0, 2):  # batches of one: 4 a worker an epoch, so that the slots are reused
        cfg = tiny_config(tmp_path / f"w{workers}", epochs=2)
        cfg.data.num_workers, cfg.data.batch_size = workers, 1
        train(cfg)
    a, b = load_checkpoint(tmp_path / "w0" / "last.pt"), load_checkpoint(tmp_path / "w2" / "last.pt")
    assert a["step"] == b["step"] > 0
    for key in a["model"]:
        assert torch.equal(a["model"][key], b["model"][key]), key
