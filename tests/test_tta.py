"""Test-time augmentation: each scan mirrored within its own extent, probabilities the mean of the four views, the
result independent of batch company, marked in the fingerprint, and on predict.py's command line."""

import numpy as np
import pytest
import torch
from PIL import Image
from predict_fixtures import members, one_thread, random_checkpoint, write_folder  # noqa: F401

from srforge.cli import main_predict
from srforge.predict.predictor import Predictor
from srforge.tta import mirror_within, tta_mode

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return random_checkpoint(tmp_path_factory.mktemp("ckpt") / "random.pt")


def test_each_scan_is_mirrored_within_its_extent_and_padding_stays():
    batch = torch.arange(2 * 3 * 4, dtype=torch.float32).view(2, 1, 3, 4)
    sizes = torch.tensor([[2, 3], [3, 4]])
    lr = mirror_within(batch, sizes, (-1,))
    assert lr[0, 0].tolist() == [[2, 1, 0, 3], [6, 5, 4, 7], [10, 9, 8, 11]]  # row 2 and column 3: padding
    assert torch.equal(lr[1, 0], batch[1, 0].flip(-1))
    both = mirror_within(batch, sizes, (-2, -1))
    assert both[0, 0].tolist() == [[6, 5, 4, 7], [2, 1, 0, 3], [10, 9, 8, 11]]  # padding stays padding
    assert torch.equal(mirror_within(both, sizes, (-2, -1)), batch)  # its own inverse


def test_flip_averages_the_probabilities_of_the_four_mirror_images(ckpt):
    plain = Predictor.from_checkpoint(ckpt, device="cpu")
    flipped = Predictor.from_checkpoint(ckpt, device="cpu", tta="flip")
    image = torch.randint(0, 256, (3, 13, 22), dtype=torch.uint8)
    views = []
    for dims in ((), (-1,), (-2,), (-2, -1)):
        (probs,) = plain.probabilities([image.flip(dims) if dims else image])
        views.append(probs.flip(dims) if dims else probs)
    expected = torch.stack(views).mean(0)
    (found,) = flipped.probabilities([image])
    assert torch.allclose(found, expected, atol=1e-6)
    (mask,) = flipped.predict([image])
    assert torch.equal(mask, expected.argmax(0))


def test_tta_predictions_do_not_depend_on_batch_company(ckpt):
    images = [torch.randint(0, 256, (3, h, w), dtype=torch.uint8) for h, w in ((9, 15), (14, 31), (11, 20), (5, 7))]
    alone = Predictor.from_checkpoint(ckpt, device="cpu", tta="flip", max_batch=1)
    together = Predictor.from_checkpoint(ckpt, device="cpu", tta="flip", max_batch=0)
    assert len(together.plan([tuple(i.shape[-2:]) for i in images])) == 1  # one padded batch of four sizes
    for a, b in zip(alone.probabilities(images), together.probabilities(images)):
        assert torch.allclose(a, b, atol=1e-5)
    for a, b in zip(alone.predict(images), together.predict(images)):
        assert torch.equal(a, b)


def test_tta_is_read_once_and_marks_the_fingerprint(ckpt):
    assert tta_mode(None) is None and tta_mode("none") is None and tta_mode("flip") == "flip"
    with pytest.raises(ValueError, match="tta must be one of none, flip"):
        Predictor.from_checkpoint(ckpt, device="cpu", tta="rotate")
    plain, none = Predictor.from_checkpoint(ckpt, device="cpu"), Predictor.from_checkpoint(ckpt, tta="none")
    flip = Predictor.from_checkpoint(ckpt, device="cpu", tta="flip")
    assert plain.fingerprint == none.fingerprint != flip.fingerprint


def test_predict_cli_tta_flip_writes_the_predictor_masks(tmp_path, ckpt):
    source = write_folder(tmp_path / "scans", members(3))
    out = tmp_path / "out"
    args = ["--checkpoint", str(ckpt), "--input", str(source), "--output", str(out), "--no-progress", "--workers", "0"]
    assert main_predict([*args, "--tta", "flip"]) == 0
    predictor = Predictor.from_checkpoint(ckpt, device="cpu", tta="flip")
    for path in sorted(source.rglob("*.png")):
        rel = path.relative_to(source).with_suffix(".png")
        image = torch.from_numpy(np.asarray(Image.open(path).convert("RGB")).copy()).permute(2, 0, 1)
        (mask,) = predictor.predict([image])
        assert np.array_equal(np.asarray(Image.open(out / "masks" / rel)), mask.numpy().astype(np.uint8))
