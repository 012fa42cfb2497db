"""Does a change to the trainer change its arithmetic? The weights' digest after two tiny runs, to compare commits.

Two runs of the quickstart recipe on 12 synthetic scans, two epochs each, on the CPU with one thread: as configured,
and with ``train.accumulate=2`` under a pixel budget where every third forward of several scans runs out of memory
(simulated), so that batches are redone in halves. Each line prints the sha256 (first 16 hex digits) of the final
weights; a refactor of the step is bit-identical when both lines match those printed at the commit before it::

    python benchmarks/trainer_digest.py                 # here
    git stash; git checkout OLD; python benchmarks/trainer_digest.py; git checkout -; git stash pop
"""

from __future__ import annotations

import hashlib
import shutil
import sys
import tempfile
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(Path(__file__).resolve().parent)]
from srforge.config import load_config  # noqa: E402
from srforge.models.unet import UNet  # noqa: E402
from srforge.train import train  # noqa: E402


class OOMUNet(UNet):
    """srforge's UNet that runs out of memory (simulated) on every third training forward of more than one scan."""

    def forward(self, image, sizes=None):
        self.calls = getattr(self, "calls", 0) + 1
        if self.training and image.shape[0] > 1 and self.calls % 3 == 0:
            raise torch.OutOfMemoryError("CUDA out of memory (simulated)")
        return super().forward(image, sizes)


def digest(path: Path) -> str:
    state = torch.load(path, weights_only=True)["model"]
    h = hashlib.sha256()
    for name in sorted(state):
        h.update(name.encode())
        h.update(state[name].detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()[:16]


def main() -> None:
    torch.set_num_threads(1)
    work = Path(tempfile.mkdtemp(prefix="srforge-digest-"))
    data = work / "data"
    base = [
        f"data.synthetic={{root: {data}, n: 12, scale: 0.0625, classes: binary, seed: 0}}",
        f"data.dataset.args.root={data}",
        "train.epochs=2",
        "run.device=cpu",
    ]
    runs = {
        "quickstart": [],
        "accumulate + out-of-memory halves": [
            "train.accumulate=2",
            "data.max_pixels=60000",
            "model.class=trainer_digest:OOMUNet",
            "model.args={base_channels: 8, depth: 3}",
        ],
    }
    try:
        for i, (name, extra) in enumerate(runs.items()):
            cfg = load_config(str(ROOT / "configs" / "quickstart.yaml"), [*base, f"run.dir={work / str(i)}", *extra])
            summary = train(cfg)
            print(f"{name}: weights {digest(Path(cfg.run.dir) / 'last.pt')}, steps {summary['step']}, "
                  f"out-of-memory events {summary['out_of_memory']}")  # fmt: skip
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
