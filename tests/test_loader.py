"""GeneralCollation and DataLoaderFactory: Entry batches, workers, pin_memory, __getitems__."""

import warnings

import pytest
import torch
from helpers import same
from torch.utils.data import Dataset

from srforge import DataLoaderFactory, Entry, GeneralCollation


class Scenes(Dataset):
    def __len__(self):
        return 10

    def __getitem__(self, i):
        g = torch.Generator().manual_seed(i)
        return Entry(
            name=f"scene_{i:03d}", image=torch.randn(3, 8, 8, generator=g), scale=i % 3, w=i / 4, ok=i % 2 == 0
        )


class Batched(Scenes):
    """Records how it was asked: the DataLoader calls ``__getitems__`` (a batched fetch) when a dataset has one."""

    def __init__(self):
        self.calls = []

    def __getitems__(self, indices):
        self.calls.append(list(indices))
        return [self[i] for i in indices]


def test_factory_batches_are_entries_as_in_the_seed():
    loader = DataLoaderFactory(Scenes(), batch_size=4).get_loader()
    batches = list(loader)
    assert [b.batch_size for b in batches] == [4, 4, 2]
    assert batches[0].image.shape == (4, 3, 8, 8) and batches[0].is_batched
    assert batches[0].name == ["scene_000", "scene_001", "scene_002", "scene_003"]
    assert batches[0].w.dtype == torch.float32


def test_two_workers_with_pin_memory_give_the_same_batches_as_the_main_process():
    reference = list(DataLoaderFactory(Scenes(), batch_size=3).get_loader())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "pin_memory set but no accelerator" on CPU-only machines
        workers = list(DataLoaderFactory(Scenes(), batch_size=3, num_workers=2, pin_memory=True).get_loader())
    assert len(workers) == len(reference)
    for a, b in zip(workers, reference):
        assert isinstance(a, Entry) and same(a.to("cpu"), b)


def _collate_and_report_sharing(samples):
    batch = GeneralCollation()(samples)
    batch.shared = batch.image.is_shared()
    return batch


def test_worker_batches_are_written_straight_into_shared_memory():
    loader = DataLoaderFactory(
        Scenes(), batch_size=5, num_workers=1, collate_fn=_collate_and_report_sharing
    ).get_loader()
    assert [bool(b.shared) for b in loader] == [True, True]
    main = DataLoaderFactory(Scenes(), batch_size=5, collate_fn=_collate_and_report_sharing).get_loader()
    assert [bool(b.shared) for b in main] == [False, False]


def test_getitems_is_called_once_per_batch():
    ds = Batched()
    batches = list(DataLoaderFactory(ds, batch_size=4).get_loader())
    assert ds.calls == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
    assert batches[2].name == ["scene_008", "scene_009"]


def test_batch_sampler_replaces_batch_size_and_shuffle():
    loader = DataLoaderFactory(Scenes(), batch_size=99, shuffle=True, batch_sampler=[[9, 0], [5]]).get_loader()
    assert [b.name for b in loader] == [["scene_009", "scene_000"], ["scene_005"]]


def test_general_collation_rejects_mixed_entry_subclasses_and_non_entries():
    class Scan(Entry):
        pass

    with pytest.raises(TypeError, match="mixed Entry subclasses.*sample 1 is Scan"):
        GeneralCollation()([Entry(a=1), Scan(a=2)])
    with pytest.raises(TypeError, match="sample 0 is a dict"):
        GeneralCollation()([{"a": 1}])
    with pytest.raises(ValueError, match="empty batch"):
        GeneralCollation()([])
    assert type(GeneralCollation()([Scan(a=1), Scan(a=2)])) is Scan
