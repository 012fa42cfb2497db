"""GeneralCollation and DataLoaderFactory: Entry batches out of a torch DataLoader.

A Dataset that defines ``__getitems__(indices)`` is asked once per batch with the whole index list
(torch's map-style fetcher does this for any DataLoader with a batch size or a batch sampler).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from torch.utils.data import DataLoader, Dataset, Sampler

from srforge.data.entry import Entry


class GeneralCollation:
    """A ``collate_fn`` for lists of Entry: ``Entry.collate`` with a check that all share one type."""

    def __call__(self, samples: Sequence[Entry]) -> Entry:
        if not samples:
            raise ValueError("GeneralCollation got an empty batch: a batch needs at least one sample.")
        first = type(samples[0])
        for i, sample in enumerate(samples):
            if not isinstance(sample, Entry):
                raise TypeError(
                    f"GeneralCollation collates Entry samples; sample {i} is a {type(sample).__name__}. "
                    "Return Entry from the Dataset, or use AlignedCollate / default_collate."
                )
            if type(sample) is not first:
                raise TypeError(
                    f"Cannot collate mixed Entry subclasses: sample 0 is {first.__name__}, "
                    f"sample {i} is {type(sample).__name__}."
                )
        return first.collate(samples)

    def __repr__(self) -> str:
        return "GeneralCollation()"


class DataLoaderFactory:
    """Builds a DataLoader whose batches are Entries.

    ``collate_fn`` defaults to :class:`GeneralCollation`. With ``batch_sampler`` (for example the
    size-grouped sampler), ``batch_size``, ``shuffle`` and ``drop_last`` are left to the sampler.
    Other keyword arguments go to ``torch.utils.data.DataLoader`` unchanged.
    """

    def __init__(
        self,
        dataset: Dataset,
        batch_size: int = 1,
        shuffle: bool = False,
        num_workers: int = 0,
        collate_fn: Callable[[list], Any] | None = None,
        batch_sampler: Sampler | None = None,
        pin_memory: bool = False,
        drop_last: bool = False,
        **loader_kwargs: Any,
    ) -> None:
        self.dataset = dataset
        self.collate_fn = collate_fn or GeneralCollation()
        self.kwargs: dict[str, Any] = dict(num_workers=num_workers, pin_memory=pin_memory, **loader_kwargs)
        if batch_sampler is not None:
            self.kwargs["batch_sampler"] = batch_sampler
        else:
            self.kwargs.update(batch_size=batch_size, shuffle=shuffle, drop_last=drop_last)

    def get_loader(self) -> DataLoader:
        return DataLoader(self.dataset, collate_fn=self.collate_fn, **self.kwargs)
