"""EXIF orientation: images and masks are read as viewers show them, in folders, archives, header sizes and
prediction, so a mask drawn over a turned photo lines up with it."""

import io
import zipfile

import numpy as np
import pytest
from PIL import Image
from predict_fixtures import one_thread, random_checkpoint  # noqa: F401

from srforge.cli import main_predict
from srforge.data.archive import ScanArchive
from srforge.data.datasets import SegmentationFolder, check_folder
from srforge.data.images import read_image, read_mask, read_size

# Stored pixel (row, col) of a marker in a 10 x 16 picture -> where a viewer shows it, per orientation.
STORED = (1, 2)
SHOWN = {1: ((10, 16), (1, 2)), 3: ((10, 16), (8, 13)), 6: ((16, 10), (2, 8)), 8: ((16, 10), (13, 1))}


def turned(stored: np.ndarray, orientation: int, fmt: str = "JPEG") -> bytes:
    """``stored`` saved with an EXIF orientation tag (the pixels as stored, the tag says how to show them)."""
    exif = Image.Exif()
    exif[0x0112] = orientation
    buffer = io.BytesIO()
    options = {"quality": 100, "subsampling": 0} if fmt == "JPEG" else {}
    Image.fromarray(stored).save(buffer, format=fmt, exif=exif.tobytes(), **options)
    return buffer.getvalue()


def marked(shape) -> np.ndarray:
    picture = np.zeros((*shape, 3), np.uint8)
    picture[STORED] = 255
    return picture


@pytest.mark.parametrize("fmt", ["JPEG", "PNG", "TIFF"])
@pytest.mark.parametrize("orientation", sorted(SHOWN))
def test_images_decode_and_measure_as_displayed(orientation, fmt):
    data = turned(marked((10, 16)), orientation, fmt)
    shape, at = SHOWN[orientation]
    image = read_image(io.BytesIO(data))
    assert read_size(io.BytesIO(data)) == shape == tuple(image.shape[1:])
    bright = (image[0] > 128).nonzero().tolist()
    assert bright == [list(at)]


def test_a_turned_photo_and_the_mask_drawn_over_it_pair_up_in_a_folder(tmp_path):
    """Orientation 6 (a phone held upright): stored 10 x 16, shown 16 x 10; the mask is drawn as shown."""
    (tmp_path / "images").mkdir()
    (tmp_path / "masks").mkdir()
    (tmp_path / "images" / "photo.jpg").write_bytes(turned(marked((10, 16)), 6))
    mask = np.zeros((16, 10), np.uint8)
    mask[SHOWN[6][1]] = 1
    Image.fromarray(mask).save(tmp_path / "masks" / "photo.png")
    assert check_folder(tmp_path, num_classes=2) == (1, [])
    folder = SegmentationFolder(tmp_path, num_classes=2)
    entry = folder[0]
    assert folder.sizes() == [(16, 10)] == [tuple(entry.image.shape[1:])]
    assert (entry.image[0] > 128).nonzero().tolist() == (entry.mask == 1).nonzero().tolist()


def test_a_mask_file_with_an_orientation_tag_is_turned_too(tmp_path):
    stored = np.zeros((10, 16), np.uint8)
    stored[STORED] = 1
    exif = Image.Exif()
    exif[0x0112] = 3
    Image.fromarray(stored).save(tmp_path / "m.png", exif=exif.tobytes())
    assert (read_mask(tmp_path / "m.png") == 1).nonzero().tolist() == [list(SHOWN[3][1])]


def test_archives_give_displayed_sizes_and_pixels(tmp_path):
    path = tmp_path / "scans.zip"
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr("photo.jpg", turned(marked((10, 16)), 8))
    with ScanArchive(path) as archive:
        assert archive.size(0) == (16, 10) == tuple(archive.read(0).shape[1:])


@pytest.mark.usefixtures("one_thread")
def test_predict_writes_the_mask_at_the_displayed_size(tmp_path):
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "photo.jpg").write_bytes(turned(marked((40, 96)), 6))
    ckpt = random_checkpoint(tmp_path / "model.pt")
    argv = ["--checkpoint", str(ckpt), "--input", str(tmp_path / "in"), "--output", str(tmp_path / "out")]
    assert main_predict([*argv, "--no-progress", "--workers", "0"]) == 0
    with Image.open(tmp_path / "out" / "masks" / "photo.png") as mask:
        assert mask.size == (40, 96)  # (W, H): shown 96 high and 40 wide
