"""Scans without masks as training data (``data.unlabelled``), for self-training (:mod:`srforge.train.self_training`).

    UnlabelledScans(paths, cache=, image_mode=)   the scans of folders / .zip / .tar[.gz], read like predict.py's
                                                  inputs (:class:`srforge.data.archive.ScanArchive`): hostile members
                                                  are refused and listed in ``rejected``, never read
    UnlabelledStream(scans, ...)                  an endless stream of this rank's size-grouped, padded batches:
                                                  pass after pass, each pass's order fixed by (seed, pass), its
                                                  position {pass, done} part of the checkpoint (exact resume)

Sizes come from the image headers (nothing is decoded to list an archive of 136,771 scans); batches are grouped by
size and cut under the same pixel budget (or batch size) as the labelled ones, padded to the model's divisor with
the true sizes recorded. Under torchrun each rank takes every world-th batch of one shared list per pass, the list
cut to a multiple of the world so that every rank has as many (an archive too small to give each rank one batch is
an error). A scan whose header reads but whose pixels do not decode (a damaged file, one changed since the start)
is left out of its batch with a warning naming it, the first time it fails, and the run goes on: one bad file in an
archive of a hundred thousand should not stop a day of training. A batch none of whose scans decodes is handed out
as None (its update learns nothing unlabelled), so that every rank still takes one batch an update; a pass's worth
of such batches in a row is an error.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from torch.utils.data import DataLoader, Dataset

from srforge.data.archive import ScanArchive
from srforge.data.collate import AlignedCollate
from srforge.data.entry import Entry
from srforge.data.images import DataError
from srforge.data.sampling import SizeGroupedBatchSampler

STREAM_SEED = 7919  # added to run.seed: the unlabelled order is not the labelled one
NAMED_UNREADABLE = 20  # scans that do not decode, named one by one; past it they are counted (a replaced archive)


@dataclass(frozen=True)
class Unreadable:
    """A scan that did not decode: its ``name`` and ``why`` (the DataError's message), in place of its Entry."""

    name: str
    why: str


class SkippingCollate:
    """``collate`` over the samples that decoded: samples -> (batch Entry or None when none did, [Unreadable])."""

    def __init__(self, collate):
        self.collate = collate

    def __call__(self, samples: list) -> tuple[Entry | None, list[Unreadable]]:
        failed = [s for s in samples if isinstance(s, Unreadable)]
        read = [s for s in samples if not isinstance(s, Unreadable)]
        return (self.collate(read) if read else None), failed


class UnlabelledScans(Dataset):
    """The scans under ``paths`` (each a folder, .zip or .tar[.gz]): sample i -> Entry(image uint8 [C, H, W],
    name). ``sizes`` [(H, W), ...] from the headers; ``rejected`` [(where, why)] for members refused or whose header
    does not read (left out, like predict.py's rejected rows). ``cache``: a DecodedCache the images go through.
    Archives are opened again in each process that reads (DataLoader workers), never shared across a fork."""

    def __init__(self, paths: str | Sequence[str], cache=None, image_mode: str = "RGB"):
        self.paths = [Path(p) for p in ([paths] if isinstance(paths, (str, os.PathLike)) else paths)]
        self.cache, self.image_mode = cache, image_mode
        self.members: list[tuple[int, int]] = []  # (archive, member)
        self.sizes: list[tuple[int, int]] = []
        self.names: list[str] = []
        self.rejected: list[tuple[str, str]] = []
        for a, path in enumerate(self.paths):
            if not path.exists():
                raise DataError(f"data.unlabelled: {path} does not exist; expected a folder, .zip or .tar of scans.")
            with ScanArchive(path) as archive:
                self.rejected += [(f"{path}:{name}", why) for name, why in archive.rejected]
                for i in range(len(archive)):
                    try:
                        size = archive.size(i)
                    except DataError as error:
                        self.rejected.append((archive.label(i), str(error)))
                        continue
                    self.members.append((a, i))
                    self.sizes.append(tuple(size))
                    self.names.append(archive.label(i))
        if not self.members:
            raise DataError(
                f"data.unlabelled: no readable scan in {', '.join(map(str, self.paths))} ({len(self.rejected)} "
                "member(s) refused); expected images (.png, .jpg, .tif, ...) in a folder, .zip or .tar."
            )
        self._open: tuple[int, list[ScanArchive]] | None = None  # (pid, archives) of the process reading

    def __len__(self) -> int:
        return len(self.members)

    def leave_out(self, too_large, why: str) -> None:
        """Leave out the scans whose (H, W) ``too_large(h, w)`` is true, each listed in ``rejected`` with ``why``;
        an error when none is left."""
        keep = [i for i, (h, w) in enumerate(self.sizes) if not too_large(h, w)]
        kept = set(keep)
        self.rejected += [(self.names[i], why) for i in range(len(self.members)) if i not in kept]
        self.members = [self.members[i] for i in keep]
        self.sizes = [self.sizes[i] for i in keep]
        self.names = [self.names[i] for i in keep]
        if not self.members:
            raise DataError(f"data.unlabelled: every scan was left out ({why}); nothing to learn from.")

    def _archives(self) -> list[ScanArchive]:
        """The archives, opened by the process that reads (after a fork, anew)."""
        if self._open is None or self._open[0] != os.getpid():
            self._open = (os.getpid(), [ScanArchive(p, cache=self.cache) for p in self.paths])
        return self._open[1]

    def __getitem__(self, index: int) -> Entry | Unreadable:
        """Entry(image uint8 [C, H, W], name), or :class:`Unreadable` for a scan that does not decode to the size
        its header gave."""
        a, i = self.members[index]
        try:
            image = self._archives()[a].read(i, self.image_mode)
        except DataError as error:
            return Unreadable(self.names[index], str(error))
        if tuple(image.shape[-2:]) != self.sizes[index]:
            return Unreadable(
                self.names[index],
                f"the header said {self.sizes[index][0]} x {self.sizes[index][1]} px but the image decodes to "
                f"{image.shape[-2]} x {image.shape[-1]}; the file changed since the run started",
            )
        return Entry(image=image, name=self.names[index])

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_open": None}  # a worker opens its own handles


class UnlabelledStream:
    """This rank's batches of ``scans``, pass after pass, without end: ``next()`` -> a batch (Entry: image uint8
    [B, C, Hp, Wp] padded with 0 to ``divisor``, sizes int64 [B, 2], name). Grouped by size under ``max_pixels``
    (or ``batch_size``), shuffled by (``seed`` + STREAM_SEED, pass). ``state_dict()`` {pass, done} is where the
    stream stands once its batches are committed (:meth:`commit`, when their update is taken); a stream loaded from
    it goes on with the batch after."""

    def __init__(  # noqa: PLR0913 (keyword-only options, like the labelled loaders')
        self,
        scans: UnlabelledScans,
        *,
        divisor: int,
        seed: int,
        batch_size: int | None = None,
        max_pixels: int | None = None,
        num_replicas: int = 1,
        rank: int = 0,
        num_workers: int = 0,
        pin_memory: bool = False,
        channels_last: bool = False,
    ):
        self.scans, self.num_workers, self.pin_memory = scans, num_workers, pin_memory
        self.sampler = SizeGroupedBatchSampler(
            scans.sizes, batch_size=batch_size, max_pixels=max_pixels, divisor=divisor, shuffle=True,
            seed=seed + STREAM_SEED, num_replicas=num_replicas, rank=rank, drop_last=num_replicas > 1,
        )  # fmt: skip
        self.collate = SkippingCollate(AlignedCollate(divisor, pad={"image": 0}, channels_last=channels_last))
        self.unreadable: dict[str, str] = {}  # name -> why, each warned about once
        self.empty = 0  # batches in a row none of whose scans decoded
        self.position = (0, 0)  # (pass, batches done in it) of the last batch committed to a taken update
        self._cursor = (0, 0)  # of the next batch to hand out
        self._batches = None
        if len(self.sampler) == 0:
            raise DataError(
                f"data.unlabelled: {len(scans)} scan(s) make fewer batches than the {num_replicas} processes; "
                "every process needs at least one. Add scans, or lower data.batch_size / data.max_pixels."
            )

    def __len__(self) -> int:
        """Batches in one pass, on this rank."""
        return len(self.sampler)

    @property
    def cursor(self) -> tuple[int, int]:
        """(pass, batches handed out in it): where the next batch comes from."""
        return self._cursor

    def state_dict(self) -> dict:
        """{pass, done, max_pixels}: the committed position (a batch handed out but not committed is drawn again)
        and the budget the passes are cut by."""
        return {"pass": self.position[0], "done": self.position[1], "max_pixels": self.sampler.max_pixels}

    def load_state_dict(self, state: dict) -> None:
        """Go on from a checkpoint's position, the passes cut by its budget (a budget resolved anew, e.g.
        data.max_pixels: auto on this start's free memory, would cut other batches and move the position)."""
        self.close()
        self.position = self._cursor = (int(state["pass"]), int(state["done"]))
        if state.get("max_pixels") is not None and self.sampler.max_pixels is not None:
            self.sampler.max_pixels = int(state["max_pixels"])

    def close(self) -> None:
        """End the running pass's loader (and its workers); the next batch starts from the committed position."""
        self._batches, self._cursor = None, self.position

    def commit(self) -> None:
        """The batches handed out so far are in a taken update: a checkpoint from now on starts after them."""
        self.position = self._cursor

    def next(self) -> Entry | None:
        """The next batch of the scans that decode (:class:`Unreadable` ones left out and named, the first
        NAMED_UNREADABLE of them, on the console), or None when none of its scans does: one batch a call whatever
        happens, so that ranks taking one each update stay in step; a finished pass starts the next. A whole pass
        of batches in a row without a scan that decodes is an error."""
        batch, failed = self._next()
        for scan in failed:
            if scan.name not in self.unreadable:
                self.unreadable[scan.name] = scan.why
                if len(self.unreadable) <= NAMED_UNREADABLE:
                    print(f"srforge: warning: data.unlabelled: left out {scan.name}, which does not decode: {scan.why}")
                elif len(self.unreadable) == NAMED_UNREADABLE + 1:
                    print(f"srforge: warning: data.unlabelled: more scans do not decode; from here on they are left "
                          f"out unnamed (the first {NAMED_UNREADABLE} are above)")  # fmt: skip
        self.empty = 0 if batch is not None else self.empty + 1
        if self.empty > len(self.sampler):
            (name, why), tried = next(iter(self.unreadable.items())), self.empty
            raise DataError(
                f"data.unlabelled: not one scan of {tried} batches in a row decodes ({len(self.unreadable)} "
                f"unreadable so far, e.g. {name}: {why}); replace the damaged files or leave them out of "
                "data.unlabelled."
            )
        return batch

    def _next(self) -> tuple[Entry | None, list[Unreadable]]:
        pass_, done = self._cursor
        self.sampler.set_epoch(pass_)  # the pass's own length: under a pixel budget it varies from pass to pass
        if done >= len(self.sampler):
            self._batches, pass_, done = None, pass_ + 1, 0
        if self._batches is None:
            self.sampler.set_epoch(pass_)
            loader = DataLoader(
                self.scans, batch_sampler=list(self.sampler)[done:], collate_fn=self.collate,
                num_workers=self.num_workers, pin_memory=self.pin_memory,
            )  # fmt: skip
            with torch.random.fork_rng(devices=[]):  # the loader's base seed leaves the run's generator as it was
                self._batches = iter(loader)
        batch = next(self._batches)
        self._cursor = (pass_, done + 1)
        return batch
