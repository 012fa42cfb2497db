"""AlignedCollate: pad each batch to the per-batch maximum of the next multiple of the size divisor.

A network with ``k`` stride-2 stages needs inputs whose H and W are multiples of ``d = 2 ** k``. Scans of
many sizes are therefore padded, top-left aligned, to::

    Hp = max_i ceil(H_i / d) * d        Wp = max_i ceil(W_i / d) * d

and the true sizes travel with the batch as an int64 ``[B, 2]`` tensor of (H, W), so that losses, metrics
and predictions can ignore the padding and crop back to each scan's extent (:func:`crop_to_sizes`).
Each padded field has its own pad value: images 0, masks the loss's ignore index, so that a cross-entropy
with ``ignore_index`` skips the padding with no extra mask.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Hashable

import numpy as np
import torch

from srforge.constants import IGNORE_INDEX
from srforge.data.batch_buffer import new_batch_buffer
from srforge.data.entry import Entry, collate_field, collate_mappings, index_value
from srforge.geometry import crop_to_sizes, divisor_pair, round_up


def pad_to_multiple(tensor: torch.Tensor, divisor: int | Sequence[int], value: float = 0) -> torch.Tensor:
    """Pad one sample ``[..., H, W]`` at the bottom and right to ``[..., ceil(H/dh)*dh, ceil(W/dw)*dw]``."""
    dh, dw = divisor_pair(divisor)
    if tensor.dim() < 2:
        raise ValueError(f"pad_to_multiple needs a tensor [..., H, W]; found shape {list(tensor.shape)}.")
    h, w = tensor.shape[-2:]
    out = tensor.new_full((*tensor.shape[:-2], round_up(h, dh), round_up(w, dw)), value)
    out[..., :h, :w] = tensor
    return out


def _sample_label(sample: Any, index: int) -> str:
    name = sample.get("name") if isinstance(sample, Mapping) else None
    return f"sample {index} ('{name}')" if isinstance(name, str) else f"sample {index}"


def _spatial_tensor(value: Any, where: str) -> torch.Tensor:
    """The value as a tensor ``[..., H, W]`` with H, W >= 1, or an error naming ``where``."""
    if isinstance(value, np.ndarray):
        value = torch.from_numpy(np.ascontiguousarray(value))
    if not isinstance(value, torch.Tensor):
        raise TypeError(
            f"{where}: expected a tensor or numpy array [..., H, W], "
            f"found {type(value).__module__}.{type(value).__name__}. "
            "Convert images with torchvision.transforms.v2.functional.pil_to_tensor (or to_image) in the Dataset."
        )
    if value.dim() < 2:
        raise ValueError(
            f"{where}: expected a tensor [..., H, W] with at least 2 dims, found shape {list(value.shape)}."
        )
    if value.shape[-2] == 0 or value.shape[-1] == 0:
        raise ValueError(f"{where}: H and W must be at least 1, found shape {list(value.shape)}.")
    return value


class AlignedCollate:
    """A ``collate_fn`` that pads the fields named in ``pad`` and records the true sizes.

    Args:
        divisor: an int or (dh, dw); the padded size is the batch maximum of each sample's size rounded up
            to it. Take it from the model (``UNet.size_divisor``); ``divisor=1`` pads to the plain maximum.
        pad: field -> pad value. For Entry or dict samples the fields are keys; for tuple or list samples
            (``(image, mask)`` from a torchvision-style dataset) they are positions, e.g. ``{0: 0, 1: 255}``.
        sizes_key: where the int64 ``[B, 2]`` tensor of true (H, W) is written (Entry / dict samples).
        channels_last: lay out every padded ``[B, C, Hp, Wp]`` field channels-last in memory (strides of
            ``[B, Hp, Wp, C]``, ``torch.channels_last``), as ``train.channels_last`` wants it on the device: a scan
            decoded by :func:`srforge.data.images.read_image` (a view of its [H, W, C] pixels) is then copied into
            the batch row by row, its one copy after decoding, with no transpose on the host.

    Samples in, batch out:

    - Entry -> batched Entry; dict -> dict; tuple/list -> tuple of the collated positions followed by sizes.
    - A padded field ``[..., H, W]`` of every sample becomes ``[B, ..., Hp, Wp]`` of the same dtype
      (uint8 stays uint8), the sample in the top-left corner and the pad value everywhere else.
    - Every other field collates by the Entry rules.

    Inside a DataLoader worker each padded field is one allocation in shared memory, written once.
    """

    def __init__(
        self,
        divisor: int | Sequence[int] = 32,
        pad: Mapping[Hashable, float] | None = None,
        sizes_key: str = "sizes",
        channels_last: bool = False,
    ) -> None:
        self.divisor = divisor_pair(divisor)
        self.channels_last = channels_last
        self.pad = dict({"image": 0, "mask": IGNORE_INDEX} if pad is None else pad)
        if not self.pad:
            raise ValueError("AlignedCollate needs at least one field to pad, e.g. pad={'image': 0}.")
        self.sizes_key = sizes_key

    def __repr__(self) -> str:
        last = ", channels_last=True" if self.channels_last else ""
        return f"AlignedCollate(divisor={self.divisor}, pad={self.pad}, sizes_key={self.sizes_key!r}{last})"

    # -- collate -------------------------------------------------------------------------------------
    def __call__(self, samples: Sequence[Any]) -> Any:
        samples = list(samples)
        if not samples:
            raise ValueError("AlignedCollate got an empty batch: a batch needs at least one sample.")
        positional = isinstance(samples[0], (tuple, list))
        for i, sample in enumerate(samples):
            if isinstance(sample, (tuple, list)) != positional or not isinstance(sample, (tuple, list, Mapping)):
                kind = "tuple/list" if positional else "Entry/dict"
                raise TypeError(
                    f"AlignedCollate: {_sample_label(sample, i)} is a {type(sample).__name__}, but sample 0 is "
                    f"{type(samples[0]).__name__}; every sample of a batch must be an {kind}."
                )
        return self._collate_positional(samples) if positional else self._collate_named(samples)

    def _padded_fields(self, samples: list[Any], pad: Mapping[Hashable, float]) -> tuple[dict, torch.Tensor]:
        """Pad every field of ``pad``; returns (field -> [B, ..., Hp, Wp], sizes [B, 2])."""
        tensors: dict[Hashable, list[torch.Tensor]] = {key: [] for key in pad}
        sizes = []
        for i, sample in enumerate(samples):
            label = _sample_label(sample, i)
            size = None
            for key in pad:
                try:
                    value = sample[key]
                except (KeyError, IndexError):
                    have = list(sample.keys()) if isinstance(sample, Mapping) else f"{len(sample)} positions"
                    raise ValueError(f"AlignedCollate: {label} has no field {key!r} to pad; it has {have}.") from None
                t = _spatial_tensor(value, f"AlignedCollate: {label}, field {key!r}")
                if size is None:
                    size, first_key = tuple(t.shape[-2:]), key
                elif tuple(t.shape[-2:]) != size:
                    raise ValueError(
                        f"AlignedCollate: {label}: padded fields must share (H, W), but field {first_key!r} is "
                        f"{size[0]}x{size[1]} and field {key!r} is {t.shape[-2]}x{t.shape[-1]}."
                    )
                ref = tensors[key][0] if tensors[key] else t
                if t.shape[:-2] != ref.shape[:-2] or t.dtype != ref.dtype:
                    raise ValueError(
                        f"AlignedCollate: {label}, field {key!r}: expected leading dims {list(ref.shape[:-2])} "
                        f"and dtype {ref.dtype} like sample 0, found {list(t.shape[:-2])} and {t.dtype}."
                    )
                tensors[key].append(t)
            sizes.append(size)
        sizes_t = torch.tensor(sizes, dtype=torch.int64)
        dh, dw = self.divisor
        hp = max(round_up(h, dh) for h, _ in sizes)
        wp = max(round_up(w, dw) for _, w in sizes)
        padded = {key: self._pad_stack(ts, sizes, hp, wp, pad[key]) for key, ts in tensors.items()}
        return padded, sizes_t

    def _pad_stack(
        self, tensors: list[torch.Tensor], sizes: list[tuple[int, int]], hp: int, wp: int, value: float
    ) -> torch.Tensor:
        """``[B, ..., hp, wp]``: each sample top-left, ``value`` elsewhere; every element written once. With
        ``channels_last`` a ``[B, C, hp, wp]`` field is a view of a ``[B, hp, wp, C]`` buffer."""
        first = tensors[0]
        if self.channels_last and first.dim() == 3:
            shape = (len(tensors), hp, wp, first.shape[0])
            out = new_batch_buffer(shape, first.dtype, first.device).permute(0, 3, 1, 2)
        else:
            out = new_batch_buffer((len(tensors), *first.shape[:-2], hp, wp), first.dtype, first.device)
        for slot, t, (h, w) in zip(out, tensors, sizes):
            slot[..., :h, :w].copy_(t)
            if w < wp:
                slot[..., :h, w:].fill_(value)
            if h < hp:
                slot[..., h:, :].fill_(value)
        return out

    def _collate_named(self, samples: list[Mapping]) -> Mapping:
        padded, sizes = self._padded_fields(samples, self.pad)
        if self.sizes_key in samples[0]:
            raise ValueError(
                f"AlignedCollate: samples already have a field '{self.sizes_key}'; choose another sizes_key."
            )
        rest = collate_mappings([{k: v for k, v in s.items() if k not in padded} for s in samples])
        first = samples[0]
        fields = {k: padded[k] if k in padded else rest[k] for k in first.keys()}
        fields[self.sizes_key] = sizes
        if isinstance(first, Entry):
            return type(first).batched(fields, len(samples))
        return fields

    def _collate_positional(self, samples: list[Sequence]) -> tuple:
        n = len(samples[0])
        for i, sample in enumerate(samples):
            if len(sample) != n:
                raise ValueError(f"AlignedCollate: sample {i} has {len(sample)} positions but sample 0 has {n}.")
        bad = [k for k in self.pad if not isinstance(k, int) or not -n <= k < n]
        if bad:
            raise ValueError(
                f"AlignedCollate: tuple samples of {n} positions need integer positions as pad keys; found {bad}. "
                "Use e.g. pad={0: 0, 1: 255} for (image, mask) samples."
            )
        padded, sizes = self._padded_fields(samples, {k % n: v for k, v in self.pad.items()})
        out = [padded[j] if j in padded else collate_field([s[j] for s in samples], f"position {j}") for j in range(n)]
        return (*out, sizes)

    # -- the inverse -----------------------------------------------------------------------------
    def uncollate(self, batch: Any) -> list[Any]:
        """The samples of a batch made by this collate, every padded field cropped back to its true size."""
        if isinstance(batch, tuple):
            *fields, sizes = batch
            n = len(fields)
            padded = {k % n for k in self.pad}
            crops = {j: crop_to_sizes(fields[j], sizes) for j in padded}
            return [
                tuple(crops[j][i] if j in padded else index_value(fields[j], i) for j in range(n))
                for i in range(sizes.shape[0])
            ]
        sizes = batch[self.sizes_key]
        crops = {k: crop_to_sizes(batch[k], sizes) for k in self.pad}
        samples = []
        for i in range(sizes.shape[0]):
            fields = {
                k: crops[k][i] if k in crops else index_value(v, i) for k, v in batch.items() if k != self.sizes_key
            }
            samples.append(type(batch)(fields) if isinstance(batch, Entry) else fields)
        return samples
