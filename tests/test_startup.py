"""What a command costs before its first scan: torchvision (about a second to import, its ops load torch._dynamo)
only when a JPEG, an overlay or an augmentation needs it."""

import subprocess
import sys

import numpy as np
from PIL import Image
from predict_fixtures import random_checkpoint


def _torchvision_loaded_after(code: str) -> bool:
    """Whether torchvision is in sys.modules after ``code`` runs in a fresh interpreter (which must succeed)."""
    probe = f"{code}\nimport sys\nprint('torchvision' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout.split()[-1] == "True"


def _scans(folder, suffix: str) -> None:
    folder.mkdir()
    for i, (h, w) in enumerate([(9, 13), (12, 20)]):
        pixels = np.random.default_rng(i).integers(0, 256, (h, w, 3), dtype=np.uint8)
        Image.fromarray(pixels).save(folder / f"s{i}{suffix}")


def test_predicting_pngs_never_imports_torchvision_and_jpegs_do(tmp_path):
    ckpt = random_checkpoint(tmp_path / "m.pt")
    for suffix, expected in ((".png", False), (".jpg", True)):
        source, out = tmp_path / f"in{suffix}", tmp_path / f"out{suffix}"
        _scans(source, suffix)
        run = f"from srforge.cli import main_predict\nassert main_predict(['--checkpoint', r'{ckpt}', '--input', "
        run += f"r'{source}', '--output', r'{out}', '--workers', '0']) == 0"  # decoded in this process
        assert _torchvision_loaded_after(run) is expected, suffix
        assert sorted(p.name for p in (out / "masks").iterdir()) == ["s0.png", "s1.png"]


def test_the_command_line_modules_load_without_torchvision():
    modules = "srforge.cli.train, srforge.cli.predict, srforge.cli.evaluate, srforge.train, srforge.predict"
    assert not _torchvision_loaded_after(f"import {modules}")
