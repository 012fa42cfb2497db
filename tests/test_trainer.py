"""The Trainer's training pass: accumulated batches make the update of one batch of them all (the cross-entropy
over every valid pixel of the update, whatever each batch holds), the training loss is validation's quantity, and
uint8 masks become int64 on the device only.
"""

import numpy as np
import torch
from helpers import run_pass, stepping_trainer
from test_train import TinyStrips
from torch.utils.data import DataLoader, Dataset

import srforge.train.assemble as epoch
from srforge.config import resolve
from srforge.data.collate import AlignedCollate
from srforge.data.field_view import FieldView
from srforge.models import UNet
from srforge.train import Trainer, train
from srforge.train.losses import segmentation_loss


# -- train.accumulate -----------------------------------------------------------------------------------------------
class PatchyStrips(Dataset):
    """Scans of several sizes whose masks leave out (ignore index 255) a different share of pixels each, so that
    averaging batch means would weight pixels unequally."""

    def __len__(self):
        return 6

    def __getitem__(self, i):
        rng = np.random.default_rng(i)
        h, w = 9 + 2 * i, 14 + 5 * i
        mask = rng.integers(0, 3, (h, w)).astype(np.uint8)
        mask[: (i * h) // 7] = 255  # from none to most rows unlabelled
        image = rng.integers(0, 256, (3, h, w), dtype=np.uint8)
        return {"image": image, "mask": mask, "name": f"p{i}"}


def _batches(sizes_per_batch):
    view = FieldView(PatchyStrips(), num_classes=3)
    collate = AlignedCollate(4, pad={"image": 0, "mask": 255})
    batches, start = [], 0
    for count in sizes_per_batch:
        batches.append(collate([view[i] for i in range(start, start + count)]))
        start += count
    return batches


def _update(tmp_path, batches, accumulate, dice=0.0):
    """The trainer (its weights from seed 0) after one SGD(lr=1) pass over ``batches``: weights - the gradient."""
    trainer = stepping_trainer(
        tmp_path / f"run{accumulate}{dice}", "test_trainer:PatchyStrips", num_classes=3,
        accumulate=accumulate, dice_weight=dice,
    )  # fmt: skip
    torch.manual_seed(0)
    trainer.model.load_state_dict(UNet(num_classes=3, base_channels=4, depth=2).state_dict())
    run_pass(trainer, batches)
    return trainer.model, trainer


def test_accumulated_batches_equal_one_batch_of_them_all(tmp_path):
    one, progress_one = _update(tmp_path, _batches([6]), accumulate=1)
    three, progress_three = _update(tmp_path, _batches([2, 2, 2]), accumulate=3)
    assert (progress_one.step, progress_three.step) == (1, 1) and progress_three.batches_done == 3
    worst = max((a - b).abs().max().item() for a, b in zip(one.parameters(), three.parameters()))
    assert worst <= 1e-6, worst
    # ... and the test can fail: the mean of the three batches' mean losses weights pixels unequally.
    torch.manual_seed(0)
    naive = UNet(num_classes=3, base_channels=4, depth=2)
    for batch in _batches([2, 2, 2]):
        (segmentation_loss(naive(batch.image, batch.sizes), batch.mask.long(), 255) / 3).backward()
    with torch.no_grad():
        for p in naive.parameters():
            p -= p.grad
    assert max((a - b).abs().max().item() for a, b in zip(one.parameters(), naive.parameters())) > 1e-4


def test_an_epoch_ends_with_a_shorter_update_and_dice_is_weighted_by_valid_pixels(tmp_path):
    model, progress = _update(tmp_path, _batches([2, 2, 2]), accumulate=2)  # updates of 2 batches, then of 1
    assert (progress.step, progress.batches_done) == (2, 3)
    one, _ = _update(tmp_path, _batches([6]), accumulate=1, dice=1.0)
    three, _ = _update(tmp_path, _batches([2, 2, 2]), accumulate=3, dice=1.0)
    # Dice is a ratio over the batch: the valid-pixel-weighted mean of the parts' Dice is close, not equal.
    worst = max((a - b).abs().max().item() for a, b in zip(one.parameters(), three.parameters()))
    assert worst < 0.05


# -- the loss and the masks -----------------------------------------------------------------------------------------
def test_train_and_validation_loss_are_the_same_quantity_on_the_same_batch(tmp_path):
    """The training pass's loss (taken before the step) equals validation's on the same batch and weights, Dice
    included."""
    from helpers import run_pass, stepping_trainer

    from srforge.data.collate import AlignedCollate
    from srforge.data.field_view import FieldView

    fields = {"image": "scan", "mask": "labels", "name": "id"}
    view = FieldView(TinyStrips(n=3), fields, num_classes=2)
    loader = DataLoader(view, batch_size=3, collate_fn=AlignedCollate(4, pad={"image": 0, "mask": 255}))

    def losses(dice):
        trainer = stepping_trainer(tmp_path / f"run{dice}", "test_train:TinyStrips", fields=fields, dice_weight=dice)
        trainer.val_loader = loader
        val = trainer.validate(trainer.model)["loss"]
        trainer.start_pass()
        run_pass(trainer, loader)
        return float(trainer.totals[0] / trainer.totals[1]), val

    train_loss, val_loss = losses(0.5)
    assert abs(train_loss - val_loss) < 1e-6
    # ... and the comparison can fail: without the Dice term the same weights' loss differs.
    assert abs(losses(0.0)[1] - train_loss) > 1e-3


def test_the_trainer_moves_uint8_and_the_loss_sees_int64(tmp_path, monkeypatch):
    seen_batches, seen_targets = [], []
    real_to_device, real_loss = Trainer.to_device, epoch.segmentation_loss

    def to_device(self, batch):
        seen_batches.append(batch.mask.dtype)
        return real_to_device(self, batch)

    def loss(logits, target, *args, **kwargs):
        seen_targets.append(target.dtype)
        return real_loss(logits, target, *args, **kwargs)

    monkeypatch.setattr(Trainer, "to_device", to_device)
    monkeypatch.setattr(epoch, "segmentation_loss", loss)
    cfg = resolve(
        {
            "run": {"dir": str(tmp_path / "run"), "device": "cpu"},
            "data": {"dataset": {"class": "test_field_view:Scans"}, "batch_size": 2, "augment": {"hflip": 0.5}},
            "model": {"base_channels": 4, "depth": 2},
            "train": {"epochs": 1},
        }
    )
    train(cfg)
    assert set(seen_batches) == {torch.uint8} and set(seen_targets) == {torch.int64} and len(seen_targets) >= 3
