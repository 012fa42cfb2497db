"""The contract every model meets (srforge.models.contract): the check names the class and what is wrong, also in
training mode only; a forward without sizes is called with the image alone; the probe changes nothing a run could
see; a forward that writes into ``sizes`` changes neither the masks nor the counts.
"""

import json

import pytest
import torch
from helpers import scan_folder
from PIL import Image
from test_model_create import PlainNet, TinyNet, _config, _yaml
from torch import nn

from srforge.cli import main_predict, main_train
from srforge.config import resolve
from srforge.models.contract import ImageOnly, check_model
from srforge.models.create import create_model
from srforge.predict.predictor import Predictor
from srforge.train import train


def _build(cls, **kwargs):
    return create_model("test:Model", kwargs, resolve=lambda path: cls, where="model.class")


def test_the_contract_check_names_the_class_and_what_is_wrong():
    class NoDivisor(TinyNet):
        def __init__(self, **kwargs):
            super().__init__(**kwargs)
            del self.size_divisor

    class BoolClasses(TinyNet):
        num_classes = True

        def __init__(self, **kwargs):
            super().__init__(**kwargs)
            self.num_classes = True

    class Shrinks(TinyNet):
        def forward(self, image, sizes=None):
            return self.encoder(image.float())

    class Fails(TinyNet):
        def forward(self, image, sizes=None):
            raise RuntimeError("boom")

    with pytest.raises(ValueError, match=r"model.class: .*NoDivisor has no such attribute; .*self.size_divisor"):
        _build(NoDivisor)
    with pytest.raises(ValueError, match=r"BoolClasses has num_classes=True"):
        _build(BoolClasses)
    with pytest.raises(ValueError, match=r"Shrinks returned shape \[1, 8, 2, 3\] for an image \[1, 3, 8, 12\]"):
        _build(Shrinks)
    with pytest.raises(ValueError, match=r"Fails's forward failed on a zero image uint8 \[1, 3, 8, 12\].*boom"):
        _build(Fails)
    with pytest.raises(ValueError, match=r"TinyNet could not be built with \{'depth': 3\}.*it takes"):
        _build(TinyNet, depth=3)


def test_a_forward_without_sizes_is_called_with_the_image_alone():
    model = _build(PlainNet)
    assert isinstance(model, ImageOnly) and model.size_divisor == 4 and model.padding_aware is False
    image = torch.randint(0, 256, (2, 3, 8, 12), dtype=torch.uint8)
    assert torch.equal(model(image, torch.tensor([[8, 12], [5, 7]])), model.model(image))
    assert isinstance(_build(TinyNet), TinyNet)  # a forward that takes sizes is used as it is
    predictor = Predictor(PlainNet(), device="cpu")  # a model handed to the Predictor directly, too
    assert predictor.predict([image[0]])[0].shape == (8, 12)


def test_the_probe_changes_nothing_a_run_could_see():
    class Counting(TinyNet):
        def __init__(self, **kwargs):
            super().__init__(**kwargs)
            self.norm = nn.BatchNorm2d(3)

        def forward(self, image, sizes=None):
            return super().forward(self.norm(image.float()))

    model = _build(Counting)  # probed once in create_model
    assert model.training and torch.equal(model.norm.running_mean, torch.zeros(3))
    assert int(model.norm.num_batches_tracked) == 0
    state = torch.get_rng_state()
    model.encoder.eval()  # a submodule the user keeps in eval mode stays there
    check_model(model, "here")
    assert torch.equal(torch.get_rng_state(), state) and model.training and not model.encoder.training
    assert torch.equal(model.norm.running_mean, torch.zeros(3)) and int(model.norm.num_batches_tracked) == 0


class SizeWriter(TinyNet):
    """Writes into the ``sizes`` it is given, as a careless forward may: srforge must not crop or count with it."""

    def forward(self, image, sizes=None):
        if sizes is not None:
            sizes.fill_(1)
        return super().forward(image, sizes)


class WrongInTraining(TinyNet):
    """Meets the contract in eval mode, returns half-size logits in training mode."""

    def forward(self, image, sizes=None):
        logits = super().forward(image, sizes)
        return logits[..., ::2, ::2] if self.training else logits


def test_a_model_that_writes_into_sizes_changes_neither_the_masks_nor_the_counts(tmp_path):
    root = scan_folder(tmp_path / "data", n=6)
    cfg = _config(tmp_path / "run", root, **{"class": "test_model_contract:SizeWriter"})
    cfg["train"]["epochs"] = 1
    train(resolve(cfg))
    row = json.loads((tmp_path / "run" / "metrics.jsonl").read_text().splitlines()[0])
    assert row["real_pixels_per_s"] * row["seconds"] > 100  # the scans' real pixels, not 1 px a scan
    out = tmp_path / "masks"
    assert main_predict(["--checkpoint", str(tmp_path / "run" / "best.pt"), "--input", str(root / "images"),
                         "--output", str(out), "--allow-model", "test_model_contract:SizeWriter"]) == 0  # fmt: skip
    for image in sorted((root / "images").iterdir()):
        with Image.open(image) as scan, Image.open(out / "masks" / f"{image.stem}.png") as mask:
            assert mask.size == scan.size


def test_a_model_wrong_only_in_training_mode_is_named_before_training(tmp_path, capsys):
    root = scan_folder(tmp_path / "data", n=6)
    cfg = _config(tmp_path / "run", root, **{"class": "test_model_contract:WrongInTraining"})
    assert main_train(["--config", _yaml(tmp_path, cfg)]) == 2
    err = capsys.readouterr().err
    assert "WrongInTraining returned shape [1, 2, 64, 256] in training mode" in err and "Traceback" not in err
    assert not (tmp_path / "run" / "config.yaml").exists()  # refused before anything is written
