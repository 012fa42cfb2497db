"""A user's own Dataset, brought to srforge with one line of YAML (configs/custom_dataset.yaml).

It knows nothing of srforge: it returns plain dicts, keeps its image under ``scan`` (numpy, H x W x 3
turned into [3, H, W]) and its mask under ``labels``, and has no ``sizes()`` -- srforge measures the
sizes once and caches them in the run directory. The scans are random paper-toned strips of varying
size with dark horizontal strokes to segment.
"""

import numpy as np
from torch.utils.data import Dataset


class MyScans(Dataset):
    def __init__(self, n: int = 24, seed: int = 0, min_width: int = 64, max_width: int = 256, height: int = 40):
        rng = np.random.default_rng(seed)
        self.shapes = [
            (int(height - rng.integers(0, 9)), int(rng.integers(min_width, max_width + 1))) for _ in range(n)
        ]
        self.seed = seed

    def __len__(self):
        return len(self.shapes)

    def __getitem__(self, i):
        h, w = self.shapes[i]
        rng = np.random.default_rng([self.seed, i])
        labels = np.zeros((h, w), dtype=np.int64)
        for _ in range(rng.integers(1, 4)):
            row, thick = int(rng.integers(2, h - 4)), int(rng.integers(1, 3))
            start, stop = sorted(rng.integers(0, w, size=2))
            labels[row : row + thick, start : stop + 1] = 1
        paper = rng.normal(225, 12, size=(h, w, 3))
        scan = np.where(labels[..., None] == 1, rng.normal(40, 15, size=(h, w, 3)), paper)
        return {
            "id": f"strip_{i:03d}",
            "scan": np.clip(scan, 0, 255).astype(np.uint8).transpose(2, 0, 1),
            "labels": labels,
        }
