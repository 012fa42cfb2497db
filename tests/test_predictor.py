"""The Predictor (srforge.predict.predictor) on tiny scans, counted, never timed (benchmarks/bench_predict.py --tiny
times it): a small batch runs on one intra-op thread, auto batches hold small scans up to CPU_BATCH_PIXELS; the
image mode comes from the checkpoint.
"""

import numpy as np
import torch
from helpers import torch_threads
from predict_fixtures import random_checkpoint

from srforge.predict.predictor import CPU_BATCH_PIXELS, ONE_THREAD_PIXELS, Predictor


def counting_forward(predictor: Predictor) -> list[tuple[int, int]]:
    """[(scans in the batch, intra-op threads during the call)], one a model call of ``predictor``."""
    calls: list[tuple[int, int]] = []
    predictor.model.register_forward_pre_hook(lambda _, args: calls.append((args[0].shape[0], torch.get_num_threads())))
    return calls


def test_a_small_batch_runs_on_one_thread_and_a_big_one_on_all(ckpt):
    predictor = Predictor.from_checkpoint(ckpt, device="cpu")
    calls = counting_forward(predictor)
    with torch_threads(2):
        small = [torch.from_numpy(np.zeros((12, 30, 3), np.uint8)).permute(2, 0, 1)] * 4
        big_side = int(ONE_THREAD_PIXELS**0.5) + 8  # one scan just over ONE_THREAD_PIXELS once aligned
        big = [torch.zeros(3, big_side, big_side, dtype=torch.uint8)]
        predictor.predict(small)
        predictor.predict(big)
        assert torch.get_num_threads() == 2  # restored after the small batch
    assert calls == [(4, 1), (1, 2)]


def test_auto_batches_hold_small_scans_up_to_cpu_batch_pixels_and_big_ones_alone(ckpt):
    predictor = Predictor.from_checkpoint(ckpt, device="cpu")
    sizes = [(12, 30)] * 200 + [(300, 300)] * 2
    batches = predictor.plan(sizes)
    for batch in batches:
        area = len(batch) * max(predictor.aligned_area(sizes[i]) for i in batch)
        assert area <= CPU_BATCH_PIXELS or len(batch) == 1
    assert len(batches) < 20 and sum(map(len, batches)) == 202
    assert sorted(len(b) for b in batches if sizes[b[0]] == (300, 300)) == [1, 1]


def test_image_mode_comes_from_the_checkpoint(tmp_path):
    recorded = random_checkpoint(tmp_path / "new.pt", image_mode="YCbCr")
    plain = random_checkpoint(tmp_path / "plain.pt")
    assert Predictor.from_checkpoint(recorded, device="cpu").image_mode == "YCbCr"
    assert Predictor.from_checkpoint(plain, device="cpu").image_mode == "RGB"
