"""The probe's bytes per pixel against a real step's: measured at inputs large enough that the activations, not the
weights' gradients, set the peak (srforge.runtime.device_memory.measure_step_memory). On the CPU from torch's allocator
(the profiler's record); on a GPU from max_memory_allocated (skipped without one)."""

import pytest
import torch
from helpers import torch_threads

from srforge.models import UNet
from srforge.runtime.device_memory import peak_bytes
from srforge.train.losses import segmentation_loss
from srforge.train.pixel_budget import probe_memory

CPU = torch.device("cpu")


def _loss(logits: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return segmentation_loss(logits, mask, 255, dice_weight=1.0)


class LateGradient(torch.nn.Module):
    """A step that peaks at its heavy weight's gradient for inputs under about 0.5 Mpx and at its activations above:
    ``heavy`` (``weights`` floats) is used first in the forward, so its gradient is made last in the backward, when
    the activations saved by the chain of sines are gone. [B, 1, H, W] uint8 -> logits [B, 2, H, W]."""

    in_channels, num_classes, size_divisor = 1, 2, 8

    def __init__(self, weights: int = 8_000_000):
        super().__init__()
        self.heavy = torch.nn.Parameter(torch.zeros(weights))
        self.head = torch.nn.Conv2d(1, 2, 1)

    def forward(self, image: torch.Tensor, sizes: torch.Tensor | None = None) -> torch.Tensor:
        x = image.float() + self.heavy.sum()
        for _ in range(6):
            x = x.sin()  # each saves its input for the backward: the activations
        return self.head(x)


def step_bytes_per_pixel(model: torch.nn.Module, device: torch.device, shapes: list[tuple[int, int]]) -> float:
    """(peak_2 - peak_1) / (pixels_2 - pixels_1) of a real step (forward, loss, backward into kept gradients, an
    AdamW step) over two inputs, after a warm-up step that creates AdamW's state."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)

    def step(height: int, width: int) -> None:
        optimizer.zero_grad(set_to_none=True)
        image = torch.randint(0, 256, (1, model.in_channels, height, width), dtype=torch.uint8, device=device)
        mask = torch.randint(0, model.num_classes, (1, height, width), device=device)
        logits = model(image, torch.tensor([[height, width]], device=device))
        _loss(logits, mask).backward()
        optimizer.step()

    step(*shapes[0])
    peaks = [peak_bytes(lambda shape=shape: step(*shape), device) for shape in shapes]
    (h1, w1), (h2, w2) = shapes
    return (peaks[1] - peaks[0]) / (h2 * w2 - h1 * w1)


@pytest.fixture
def two_threads():
    """Two intra-op threads, as the probe was measured against real steps (the suite's workers run one). At one
    thread a step of LateGradient takes about half the bytes a pixel and the probe says 9-19% more than the real
    step's (94 against 79-86 B/px): an overestimate, the safe side of a memory budget."""
    with torch_threads(2):
        yield


def test_the_probe_measures_the_activations_cost_even_where_small_inputs_peak_at_the_gradients(two_threads):
    torch.manual_seed(0)
    model = LateGradient()
    probed = probe_memory(model, CPU, "fp32", _loss).bytes_per_pixel
    # 2 and 4 Mpx: past both the gradient's peak and the optimizer step's (AdamW's state and temporaries)
    real = step_bytes_per_pixel(model, CPU, [(128, 16384), (128, 32768)])
    assert real > 40  # six saved float maps and the loss's: tens of bytes a pixel, not the gradient's few
    assert probed == pytest.approx(real, rel=0.1)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (torch sees none)")
@pytest.mark.parametrize("checkpointing", [False, True])
def test_on_a_gpu_the_probe_agrees_with_a_real_checkpointed_step(checkpointing):
    torch.manual_seed(0)
    device = torch.device("cuda")
    model = UNet(num_classes=4, base_channels=16, depth=5, checkpointing=checkpointing).to(device)
    probed = probe_memory(model, device, "fp32", _loss).bytes_per_pixel
    real = step_bytes_per_pixel(model, device, [(512, 4096), (512, 8192)])
    assert probed == pytest.approx(real, rel=0.1)
