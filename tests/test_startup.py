"""What a command costs before its first scan: torchvision (about a second to import, its ops load torch._dynamo)
only when a JPEG, an overlay or an augmentation needs it."""

import subprocess
import sys

import numpy as np
import pytest
from PIL import Image
from predict_fixtures import random_checkpoint

# Run in a fresh interpreter: whether torchvision is loaded after importing the command-line modules, after
# predicting a folder of PNGs in this process (--workers 0), and after decoding a JPEG.
PROBE = """
import sys
loaded = lambda: 'torchvision' in sys.modules
import srforge.cli.train, srforge.cli.predict, srforge.cli.evaluate, srforge.train, srforge.predict
steps = [loaded()]
from srforge.cli import main_predict
ckpt, source, out = sys.argv[1:4]
assert main_predict(['--checkpoint', ckpt, '--input', source, '--output', out, '--workers', '0']) == 0
steps.append(loaded())
from srforge.data.images import decode_fast
assert decode_fast(sys.argv[4]).shape == (3, 9, 13)  # libjpeg-turbo's decoder, not PIL's (None)
steps.append(loaded())
print(steps)
"""


@pytest.mark.slow
def test_torchvision_is_imported_for_a_jpeg_not_for_the_commands_or_pngs(tmp_path):
    ckpt = random_checkpoint(tmp_path / "m.pt")
    (tmp_path / "in").mkdir()
    for i, (h, w) in enumerate([(9, 13), (12, 20)]):
        pixels = np.random.default_rng(i).integers(0, 256, (h, w, 3), dtype=np.uint8)
        Image.fromarray(pixels).save(tmp_path / "in" / f"s{i}.png")
        Image.fromarray(pixels).save(tmp_path / f"s{i}.jpg")
    args = [ckpt, tmp_path / "in", tmp_path / "out", tmp_path / "s0.jpg"]
    done = subprocess.run([sys.executable, "-c", PROBE, *map(str, args)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split("\n")[-2] == "[False, False, True]"
    assert sorted(p.name for p in (tmp_path / "out" / "masks").iterdir()) == ["s0.png", "s1.png"]
