"""Count, on the CPU, the tensor calls that would make the host wait for the GPU.

On CUDA, reading a value of a device tensor on the host (``item``, ``bool``, ``tolist``, ``cpu``, ...) or running
an op whose output size depends on the values (``nonzero``, boolean-mask indexing, ``bincount``, ``unique``,
``masked_select``) drains the device queue. On the CPU none of these costs anything, so a test cannot time them;
it can count them. ``SyncCounter`` is a ``TorchFunctionMode`` that sees every torch call made from Python inside
its ``with`` block and counts those by name::

    with SyncCounter() as counter:
        loss = model(image, sizes).mean()
        loss.backward()
    assert counter.total == 0, counter.counts

Calls made from C++ (the autograd engine running a backward) are not seen; the ops that need a sync are Python-level
calls in this code base. Import it like the other test helpers: ``from sync_counter import SyncCounter``.
"""

from collections import Counter

import torch
from torch.overrides import TorchFunctionMode

# Read a device value on the host.
HOST_READS = {
    torch.Tensor.item: "item",
    torch.Tensor.tolist: "tolist",
    torch.Tensor.__bool__: "__bool__",
    torch.Tensor.__float__: "__float__",
    torch.Tensor.__int__: "__int__",
    torch.Tensor.cpu: "cpu",
    torch.Tensor.numpy: "numpy",
}
# Output size depends on the values, so the host must learn it before allocating.
DATA_DEPENDENT = {
    torch.Tensor.nonzero: "nonzero",
    torch.nonzero: "nonzero",
    torch.argwhere: "argwhere",
    torch.Tensor.masked_select: "masked_select",
    torch.masked_select: "masked_select",
    torch.Tensor.bincount: "bincount",
    torch.bincount: "bincount",
    torch.unique: "unique",
    torch.Tensor.unique: "unique",
}


def _has_bool_index(index) -> bool:
    """True if a __getitem__ index is, or holds, a bool tensor (boolean-mask indexing runs nonzero)."""
    items = index if isinstance(index, tuple) else (index,)
    return any(isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in items)


class SyncCounter(TorchFunctionMode):
    """Counts calls that force a host-device sync on CUDA. ``counts``: name -> calls; ``total``: their sum."""

    def __init__(self):
        super().__init__()
        self.counts: Counter[str] = Counter()

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    def __torch_function__(self, func, types, args=(), kwargs=None):
        name = HOST_READS.get(func) or DATA_DEPENDENT.get(func)
        if name is None and func is torch.Tensor.__getitem__ and len(args) > 1 and _has_bool_index(args[1]):
            name = "bool_mask_getitem"
        if name is not None:
            self.counts[name] += 1
        return func(*args, **(kwargs or {}))
