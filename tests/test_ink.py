"""srforge.models.ink and UNet(ink=True): the paper's colour by hand, ink of any colour alike, padding never seen."""

import pytest
import torch

from srforge.geometry import level_mask
from srforge.models import UNet
from srforge.models.ink import ink_image, paper_colour


def test_paper_colour_is_the_90th_percentile_of_the_valid_pixels_per_channel():
    # 10 valid pixels with levels 0..9 in channel 0 and 100..109 in channel 1: the 90th percentile is the level at
    # which 9 of the 10 are reached, 8 and 108; two padded pixels at 255 are not counted.
    levels = torch.tensor([[list(range(10)) + [255, 255], list(range(100, 110)) + [255, 255]]])
    valid = torch.tensor([[[1.0] * 10 + [0.0, 0.0]]])
    assert paper_colour(levels, valid).tolist() == [[8, 108]]
    # counted as valid, the two 255s move the percentile up to 255 (11 of 12 needed): the mask is what kept them out
    assert paper_colour(levels, torch.ones(1, 1, 12)).tolist() == [[255, 255]]


def _scan(paper: tuple[int, int, int], ink: tuple[int, int, int]) -> torch.Tensor:
    """uint8 [1, 3, 4, 10]: paper everywhere, one row of ink (row 1)."""
    image = torch.tensor(paper, dtype=torch.uint8).view(1, 3, 1, 1).expand(1, 3, 4, 10).clone()
    image[:, :, 1] = torch.tensor(ink, dtype=torch.uint8).view(1, 3, 1)
    return image


def test_red_ink_on_pink_paper_reads_as_black_ink_on_white_paper():
    white = ink_image(_scan((255, 255, 255), (0, 0, 0)))
    pink = ink_image(_scan((240, 200, 210), (200, 20, 20)))  # red ink: dark in green and blue against the paper
    assert white.shape == (1, 3, 4, 10) and (white[:, :, 1] == 0).all() and (white[:, :, [0, 2, 3]] == 1).all()
    assert (pink[:, :, [0, 2, 3]] == 1).all()  # the pink paper is paper: 1
    assert torch.allclose(pink[:, :, 1], torch.full((1, 3, 10), 20 / 210))  # the darkest channel, blue: 20 / 210
    assert (pink[:, 0] == pink[:, 1]).all() and (pink[:, 1] == pink[:, 2]).all()  # the same value in each channel


def test_padding_does_not_move_the_paper_colour():
    scan = _scan((200, 180, 160), (10, 10, 10))
    padded = torch.full((1, 3, 8, 16), 255, dtype=torch.uint8)  # white padding: the paper colour if it were seen
    padded[:, :, :4, :10] = scan
    mask = level_mask(torch.tensor([[4, 10]]), 8, 16)
    torch.testing.assert_close(ink_image(padded, mask)[:, :, :4, :10], ink_image(scan))
    assert not torch.equal(ink_image(padded)[:, :, :4, :10], ink_image(scan))  # without the mask it does


def test_float_input_is_the_uint8_input_over_255():
    image = torch.randint(0, 256, (2, 3, 6, 9), dtype=torch.uint8, generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(ink_image(image.float() / 255), ink_image(image))


@pytest.mark.parametrize("ink", [False, True])
def test_an_ink_unet_is_batch_invariant_and_differs_from_a_colour_one(ink):
    torch.manual_seed(0)
    model = UNet(base_channels=4, depth=2, ink=ink).eval()
    generator = torch.Generator().manual_seed(1)
    small = torch.randint(0, 256, (1, 3, 5, 7), dtype=torch.uint8, generator=generator)
    batch = torch.zeros(2, 3, 12, 16, dtype=torch.uint8)
    batch[0] = torch.randint(0, 256, (3, 12, 16), dtype=torch.uint8, generator=generator)
    batch[1, :, :5, :7] = small[0]
    alone = torch.zeros(1, 3, 8, 8, dtype=torch.uint8)
    alone[:, :, :5, :7] = small
    with torch.no_grad():
        a = model(alone, torch.tensor([[5, 7]]))[0, :, :5, :7]
        b = model(batch, torch.tensor([[12, 16], [5, 7]]))[1, :, :5, :7]
        assert (a - b).abs().max() <= 1e-5
        # a tinted copy of the scan (every channel scaled): the ink model sees the same scan, the colour model not
        tinted = (small.float() * torch.tensor([0.9, 0.7, 0.8]).view(1, 3, 1, 1)).round().to(torch.uint8)
        alone[:, :, :5, :7] = tinted
        c = model(alone, torch.tensor([[5, 7]]))[0, :, :5, :7]
    assert ((a - c).abs().max() <= 0.05) == ink


def test_model_args_ink_builds_an_ink_unet_that_its_checkpoint_rebuilds(tmp_path):
    from srforge.config import load_config
    from srforge.runtime.checkpoint import load_checkpoint, model_from_checkpoint, save_checkpoint
    from srforge.train.from_config import build_model

    cfg = load_config("configs/quickstart.yaml", ["model.args.ink=true", "model.depth=2", "model.base_channels=4"])
    model, kwargs = build_model(cfg.model, torch.device("cpu"), channels_last=False)
    assert model.ink and kwargs["ink"] is True
    path = save_checkpoint(
        {
            "model": model.state_dict(),
            "model_args": kwargs,
            "size_divisor": model.size_divisor,
            "class_names": ["bg", "curve"],
            "ignore_index": 255,
            "config": {},
        },
        tmp_path / "ink.pt",
    )
    assert model_from_checkpoint(load_checkpoint(path), path).ink


@pytest.mark.slow
def test_an_ink_unet_exports_to_onnx_with_the_same_logits(tmp_path):
    pytest.importorskip("onnxruntime")
    pytest.importorskip("onnxscript")
    import onnxruntime

    from srforge.export.onnx import export_onnx

    torch.manual_seed(0)
    model = UNet(base_channels=4, depth=2, ink=True).eval()
    path = export_onnx(model, tmp_path / "ink.onnx", class_names=["bg", "curve"])
    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    image = torch.randint(0, 256, (2, 3, 16, 24), dtype=torch.uint8, generator=torch.Generator().manual_seed(3))
    image[1, :, 9:] = 255  # padding brighter than the scan: it would move the paper's colour if it were seen
    image[1, :, :, 13:] = 255
    sizes = torch.tensor([[16, 24], [9, 13]])
    names = [i.name for i in session.get_inputs()]
    got = torch.from_numpy(session.run(None, dict(zip(names, (image.numpy(), sizes.numpy()))))[0])
    with torch.no_grad():
        want = model(image, sizes)
    assert (got[0] - want[0]).abs().max() <= 1e-4
    assert (got[1, :, :9, :13] - want[1, :, :9, :13]).abs().max() <= 1e-4


def test_an_integer_image_that_is_not_uint8_is_refused_by_name():
    with pytest.raises(TypeError, match="uint8 .* or float .* got torch.int16"):
        ink_image(torch.zeros(1, 3, 4, 4, dtype=torch.int16))


@pytest.mark.slow  # about 17 s of tracing on 2 cores
def test_an_ink_unet_compiles_to_one_graph_for_varying_sizes():
    torch.manual_seed(0)
    model = UNet(base_channels=4, depth=2, ink=True).eval()
    compiled = torch.compile(model, fullgraph=True, dynamic=True, backend="aot_eager")  # a graph break raises
    generator = torch.Generator().manual_seed(4)
    for shape, sizes in (((2, 3, 16, 24), [[16, 24], [9, 13]]), ((1, 3, 8, 32), [[7, 30]])):
        image = torch.randint(0, 256, shape, dtype=torch.uint8, generator=generator)
        with torch.no_grad():
            assert torch.equal(compiled(image, torch.tensor(sizes)), model(image, torch.tensor(sizes)))
