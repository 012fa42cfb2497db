"""The CUDA paths, on a real GPU: skipped as a whole where torch sees none; every test otherwise runs for real.

benchmarks/gpu_check.sh runs this module with ``-s``: lines starting with ``FIGURE`` are the measured values it
reports beside PASS/FAIL.
"""

import math

import pytest
import torch
import torch.nn.functional as F

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (torch sees none)")

from srforge.config import resolve  # noqa: E402
from srforge.data.collate import AlignedCollate  # noqa: E402
from srforge.data.datasets import SegmentationFolder  # noqa: E402
from srforge.data.field_view import FieldView  # noqa: E402
from srforge.models import masked_group_norm  # noqa: E402
from srforge.predict.predictor import Predictor  # noqa: E402
from srforge.runtime.checkpoint import load_checkpoint  # noqa: E402
from srforge.train import train  # noqa: E402

CUDA = torch.device("cuda")


def _cfg(tmp, run, **train_cfg):
    return resolve(
        {
            "run": {"dir": str(tmp / run), "device": "cuda", "seed": 0},
            "model": {"base_channels": 8, "depth": 4},
            "data": {
                "synthetic": {"root": str(tmp / "data"), "n": 24, "scale": 0.0625},
                "dataset": {"args": {"root": str(tmp / "data"), "num_classes": 2}},
                "batch_size": 4,
                "num_workers": 2,
                "augment": {"hflip": 0.5},
            },
            "train": {"epochs": 4, "lr": 0.003, "warmup_steps": 4, "dice_weight": 1.0, **train_cfg},
        }
    )


def _finite(summary) -> bool:
    return math.isfinite(summary["train_loss"]) and math.isfinite(summary["val_loss"])


@pytest.fixture(scope="module")
def bf16_run(tmp_path_factory):
    """bf16 + channels_last + 2 loader workers + pinned memory: the configs/welllog.yaml settings, tiny."""
    tmp = tmp_path_factory.mktemp("cuda")
    summary = train(_cfg(tmp, "bf16", precision="bf16", channels_last=True, epochs=6))
    return tmp, summary


def test_bf16_channels_last_workers_pin_memory_training(bf16_run):
    tmp, summary = bf16_run
    print(
        f"FIGURE bf16 training: loss {summary['train_loss']:.4f}, val mIoU {summary['val_mean_iou']:.4f}, "
        f"{summary['real_pixels_per_s']:.3g} real px/s"
    )
    assert _finite(summary) and summary["val_mean_iou"] > 0.3
    rows = (tmp / "bf16" / "metrics.csv").read_text().splitlines()
    assert len(rows) == 7  # a header and 6 epochs


def test_pinned_batches_keep_uint8_masks(bf16_run):
    tmp, _ = bf16_run
    view = FieldView(SegmentationFolder(tmp / "data"), num_classes=2)
    loader = torch.utils.data.DataLoader(
        view,
        batch_size=4,
        collate_fn=AlignedCollate(16, pad={"image": 0, "mask": 255}),
        num_workers=2,
        pin_memory=True,
    )
    batch = next(iter(loader))
    assert batch.image.is_pinned() and batch.mask.is_pinned() and batch.sizes.is_pinned()
    assert batch.image.dtype == batch.mask.dtype == torch.uint8 and batch.is_batched


def test_fp16_with_grad_scaler(tmp_path):
    summary = train(_cfg(tmp_path, "fp16", precision="fp16", epochs=2))
    scaler = load_checkpoint(tmp_path / "fp16" / "last.pt")["scaler"]
    print(f"FIGURE fp16 training: loss {summary['train_loss']:.4f}, grad scale {scaler.get('scale')}")
    assert _finite(summary) and scaler.get("scale", 0) > 0


def test_compile_with_bf16_inductor(tmp_path):
    summary = train(_cfg(tmp_path, "compiled", precision="bf16", compile=True, epochs=2))
    print(f"FIGURE compile+bf16 training: loss {summary['train_loss']:.4f}, val mIoU {summary['val_mean_iou']:.4f}")
    assert _finite(summary)
    ckpt = load_checkpoint(tmp_path / "compiled" / "last.pt")
    assert not any(k.startswith("_orig_mod.") for k in ckpt["model"])  # compiled in place: plain UNet keys


@pytest.mark.parametrize("tf32", [False, True], ids=["fp32 matmul", "TF32 allowed"])
def test_masked_group_norm_numerics_on_the_device(tf32):
    """Max |error| vs float64 at most 2x F.group_norm's on the same input, all pixels valid, at every offset.

    A floor of 1e-6 absorbs float32 rounding where both errors are a few ulps (offset 0)."""
    old = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = tf32
    try:
        g = torch.Generator(device="cuda").manual_seed(0)
        for offset in (0.0, 100.0, 1000.0, 10000.0):
            x = torch.randn(2, 32, 128, 512, device=CUDA, generator=g) + offset
            mask = torch.ones(2, 1, 128, 512, device=CUDA)
            reference = F.group_norm(x.double(), 8)
            ours = (masked_group_norm(x, mask, 8).double() - reference).abs().max().item()
            plain = (F.group_norm(x, 8).double() - reference).abs().max().item()
            print(
                f"FIGURE masked GroupNorm offset {offset:g} (tf32 {tf32}): max error {ours:.2e}, "
                f"F.group_norm {plain:.2e}"
            )
            assert ours <= max(2 * plain, 1e-6), (offset, ours, plain)
        empty = masked_group_norm(x, torch.zeros_like(mask), 8)
        assert torch.equal(empty, torch.zeros_like(empty))
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = old


def test_bf16_prediction_agrees_with_cpu_fp32(bf16_run):
    """The bf16 GPU model and the fp32 CPU model give the same class on >= 99% of pixels of every scan.

    bf16 keeps 8 bits of mantissa, so logits that differ by less than about 1% of their size can swap; a model
    trained for 6 epochs separates most pixels by far more, and 1% leaves room for the pixels near a curve's edge.
    """
    tmp, _ = bf16_run
    ckpt = tmp / "bf16" / "best.pt"
    gpu = Predictor.from_checkpoint(ckpt, device="cuda", precision="bf16")
    cpu = Predictor.from_checkpoint(ckpt, device="cpu", precision="fp32")
    dataset = SegmentationFolder(tmp / "data")
    images = [dataset[i]["image"] for i in range(6)]
    agree = [float((g == c).float().mean()) for g, c in zip(gpu.predict(images), cpu.predict(images))]
    print(f"FIGURE bf16 GPU vs fp32 CPU: same class on {min(agree):.4%} of pixels (worst scan of 6)")
    assert min(agree) >= 0.99
