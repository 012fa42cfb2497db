"""The per-scan overhead of predicting many tiny scans: counted, never timed (benchmarks/bench_predict.py --tiny
times it). Tiny scans share a model call and a decoding task; a small batch runs on one intra-op thread; what is
written per scan stays one atomic file and one report row."""

from concurrent.futures import ProcessPoolExecutor

import numpy as np
import pytest
import torch
from helpers import torch_threads
from predict_fixtures import members, png, random_checkpoint, write_zip

from srforge.data.archive import ScanArchive
from srforge.predict import background
from srforge.predict.pipeline import predict_archive
from srforge.predict.predictor import CPU_BATCH_PIXELS, ONE_THREAD_PIXELS, Predictor

SCANS = 60  # tiny scans (9-15 x 15-55 px): under a model call each before, in one or two batches now


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return random_checkpoint(tmp_path_factory.mktemp("ckpt") / "random.pt")


def counting_forward(predictor: Predictor) -> list[tuple[int, int]]:
    """[(scans in the batch, intra-op threads during the call)], one a model call of ``predictor``."""
    calls: list[tuple[int, int]] = []
    predictor.model.register_forward_pre_hook(lambda _, args: calls.append((args[0].shape[0], torch.get_num_threads())))
    return calls


@pytest.mark.parametrize("workers", [0, 1])
def test_tiny_scans_share_model_calls_and_decoding_tasks(tmp_path, ckpt, monkeypatch, workers):
    archive = ScanArchive(write_zip(tmp_path / "tiny.zip", members(SCANS)))
    predictor = Predictor.from_checkpoint(ckpt, device="cpu")
    calls = counting_forward(predictor)
    tasks = []
    submit = ProcessPoolExecutor.submit

    def counted(pool, fn, *args, **kwargs):
        if fn is background._decode:
            tasks.append(len(args[0]))
        return submit(pool, fn, *args, **kwargs)

    monkeypatch.setattr(ProcessPoolExecutor, "submit", counted)
    summary = predict_archive(predictor, archive, tmp_path / "out", progress=False, workers=workers)
    assert summary["ok"] == SCANS
    assert sum(n for n, _ in calls) == SCANS and len(calls) <= 3  # was one model call a scan
    if workers:
        assert sum(tasks) == SCANS and len(tasks) <= 3  # was one decoding task a scan
    masks = sorted((tmp_path / "out" / "masks").rglob("*.png"))
    assert len(masks) == SCANS and not list((tmp_path / "out").rglob("*.srforge-tmp"))


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


def test_decoding_tasks_hold_runs_of_small_scans_and_a_big_scan_alone():
    sizes = {0: (10, 10), 1: (10, 10), 2: (1000, 1000), 3: (10, 10), 4: (200, 200), 5: (200, 200)}
    assert background.decode_chunks(list(sizes), sizes) == [[0, 1], [2], [3, 4], [5]]


def test_a_worker_decoding_a_run_reports_each_scan_on_its_own(tmp_path, ckpt):
    files = {
        "a.png": png(np.zeros((9, 9, 3), np.uint8)),
        "b.png": b"\x89PNG\r\n\x1a\n broken",
        "c.png": png(np.ones((5, 7, 3), np.uint8)),
    }
    archive = ScanArchive(write_zip(tmp_path / "mixed.zip", files))
    summary = predict_archive(
        Predictor.from_checkpoint(ckpt, device="cpu"), archive, tmp_path / "out", progress=False, workers=1
    )
    assert (summary["ok"], summary["failed"]) == (2, 1)
