"""The pipelined predictor: the bytes of in-process prediction, out of memory handled, many processes, one archive."""

import json
import os
import signal
import subprocess
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import run_once_more_after_native_abort
from predict_fixtures import (  # noqa: F401  (one_thread: a fixture)
    members,
    one_thread,
    output_files,
    png,
    random_checkpoint,
    scan,
    write_folder,
    write_tar,
    write_zip,
)
from test_predictor import counting_forward

from srforge.cli import main_predict
from srforge.data.archive import ScanArchive
from srforge.predict import background
from srforge.predict.pipeline import predict_archive
from srforge.predict.predictor import CPU_BATCH_PIXELS, Predictor, batch_cap, batch_pixels
from srforge.predict.sharding import split_by_pixels

ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}


pytestmark = pytest.mark.usefixtures("one_thread")


def predict(ckpt, source, out, *extra) -> int:
    return main_predict(
        ["--checkpoint", str(ckpt), "--input", str(source), "--output", str(out), "--no-progress", *extra]
    )


def report(out: Path) -> dict:
    return json.loads((out / "report.json").read_text())


@pytest.mark.parametrize("kind", ["folder", "zip", "tar.gz"])
def test_pipelined_outputs_are_byte_identical_to_in_process(tmp_path, ckpt, kind):
    files = {**members(13), "broken.png": b"not an image"}
    source = {
        "folder": lambda: write_folder(tmp_path / "scans", files),
        "zip": lambda: write_zip(tmp_path / "scans.zip", files),
        "tar.gz": lambda: write_tar(tmp_path / "scans.tar.gz", files),
    }[kind]()
    extra = ["--overlay", "--probabilities", "--max-batch", "0"]  # real batches of several scans
    assert predict(ckpt, source, tmp_path / "inline", "--workers", "0", *extra) == 1  # broken.png failed
    assert predict(ckpt, source, tmp_path / "piped", "--workers", "2", *extra) == 1
    inline, piped = output_files(tmp_path / "inline"), output_files(tmp_path / "piped")
    assert len(inline) == 3 * 13 and inline.keys() == piped.keys()
    assert all(inline[k] == piped[k] for k in inline), [k for k in inline if inline[k] != piped[k]]
    strip = [{k: v for k, v in r.items() if k != "ms"} for r in report(tmp_path / "inline")["scans"]]
    assert strip == [{k: v for k, v in r.items() if k != "ms"} for r in report(tmp_path / "piped")["scans"]]
    rows = {r["name"]: r for r in report(tmp_path / "piped")["scans"]}
    assert rows["broken.png"]["status"] == "failed" and "broken.png: cannot" in rows["broken.png"]["error"]


def test_class_map_from_logits_matches_the_probabilities(ckpt):
    predictor = Predictor.from_checkpoint(ckpt, device="cpu", max_batch=0)
    images = [torch.from_numpy(scan(i)).permute(2, 0, 1) for i in range(6)]
    for mask, probs in zip(predictor.predict(images), predictor.probabilities(images)):
        assert mask.dtype == torch.int64 and probs.dtype == torch.float32
        top = probs.topk(2, dim=0).values
        differ = mask != probs.argmax(0)
        assert not differ.any() or (top[0] - top[1])[differ].max() < 1e-5


class OutOfMemoryAbove(torch.nn.Module):
    """The model, but a CUDA out-of-memory error for any input of more than ``limit`` padded pixels."""

    def __init__(self, model, limit, error=torch.cuda.OutOfMemoryError):
        super().__init__()
        self.model, self.limit, self.seen, self.error = model, limit, [], error
        self.size_divisor, self.num_classes, self.in_channels = model.size_divisor, model.num_classes, model.in_channels

    def forward(self, image, sizes):
        pixels = image.shape[0] * image.shape[2] * image.shape[3]
        self.seen.append((image.shape[0], image.shape[2], image.shape[3], pixels > self.limit))
        if pixels > self.limit:
            raise self.error(f"injected: {pixels} px > {self.limit}")
        return self.model(image, sizes)


def test_out_of_memory_splits_the_batch_then_tiles_never_fails(tmp_path, ckpt):
    plain = Predictor.from_checkpoint(ckpt, device="cpu", max_batch=0)
    images = [torch.from_numpy(scan(i, h=20, w=40)).permute(2, 0, 1) for i in range(4)]  # aligned 20 x 40 each
    oom = OutOfMemoryAbove(plain.model, limit=2 * 20 * 40)
    predictor = Predictor(oom, device="cpu", max_batch=0)
    assert predictor.plan([(20, 40)] * 4) == [[0, 1, 2, 3]]
    split = predictor.predict(images)
    assert [(b, fail) for b, _, _, fail in oom.seen] == [(4, True), (2, False), (2, False)]  # split once, in halves
    assert all(torch.equal(a, b) for a, b in zip(split, plain.predict(images)))

    oom.seen.clear()
    oom.limit = 20 * 40 // 2  # not even one scan fits: tiles
    tiled = predictor.predict(images[:1])[0]
    assert oom.seen[0] == (1, 20, 40, True) and all(not fail for *_, fail in oom.seen[2:])
    assert any(h * w <= oom.limit for _, h, w, fail in oom.seen if not fail)
    expected = Predictor(plain.model, device="cpu", max_pixels=oom.limit, overlap=predictor.overlap)
    assert torch.equal(tiled, expected.predict(images[:1])[0])  # the tiles a budget this small would choose

    oom.limit = 0  # nothing fits, not even the smallest tile: only now is the scan failed
    with pytest.raises(torch.cuda.OutOfMemoryError):
        predictor.predict(images[:1])


def test_cublas_allocation_failure_counts_as_out_of_memory_and_other_errors_do_not(ckpt):
    plain = Predictor.from_checkpoint(ckpt, device="cpu", max_batch=0)
    images = [torch.from_numpy(scan(i, h=20, w=40)).permute(2, 0, 1) for i in range(2)]

    def cublas(message):  # what cuBLAS raises when its workspace cannot be allocated
        return RuntimeError(f"CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)` ({message})")

    oom = OutOfMemoryAbove(plain.model, limit=20 * 40, error=cublas)
    predictor = Predictor(oom, device="cpu", max_batch=0)
    assert all(torch.equal(a, b) for a, b in zip(predictor.predict(images), plain.predict(images)))
    assert [(b, fail) for b, _, _, fail in oom.seen] == [(2, True), (1, False), (1, False)]
    oom.error, oom.seen = (lambda message: RuntimeError(f"a bug, not memory: {message}")), []
    with pytest.raises(RuntimeError, match="a bug"):
        predictor.predict(images)
    assert len(oom.seen) == 1  # raised at once, never retried


def test_out_of_memory_in_an_archive_run_fails_no_scan(tmp_path, ckpt):
    source = write_zip(tmp_path / "s.zip", members(8, h=20, w=40))
    plain = Predictor.from_checkpoint(ckpt, device="cpu", max_batch=0)
    oom = OutOfMemoryAbove(plain.model, limit=20 * 40 // 2)
    with ScanArchive(source) as archive:
        summary = predict_archive(Predictor(oom, device="cpu", max_batch=0), archive, tmp_path / "oom", progress=False)
        assert summary["ok"] == 8 and summary["failed"] == 0
        oom.limit = 0
        summary = predict_archive(
            Predictor(oom, device="cpu", max_batch=0), archive, tmp_path / "none", progress=False, workers=1
        )
    assert summary["failed"] == 8  # a scan fails only as one smallest tile
    assert all("inference failed: injected" in r["error"] for r in report(tmp_path / "none")["scans"])


def test_max_batch_has_one_meaning_per_value():
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert batch_cap("auto", cpu) is None and batch_cap("auto", cuda) is None
    assert batch_pixels("auto", cpu, 2**22) == CPU_BATCH_PIXELS and batch_pixels("auto", cpu, 100) == 100
    assert batch_pixels("auto", cuda, 2**30) == 2**30 and batch_pixels(1, cpu, 2**22) == 2**22
    assert batch_cap(None, cpu) is None and batch_cap(0, cpu) is None and batch_cap(5, cuda) == 5
    for bad in (-1, 1.5, "3", True):
        with pytest.raises(ValueError, match="max_batch must be 'auto', None, 0"):
            batch_cap(bad, cpu)


def test_predictor_takes_keywords_after_the_model(ckpt):
    model = Predictor.from_checkpoint(ckpt, device="cpu").model
    with pytest.raises(TypeError):
        Predictor(model, ["a", "b", "c"])


def test_split_by_pixels_is_balanced_and_deterministic():
    keys = [f"s{i:03d}" for i in range(50)]
    pixels = [(i * 7919) % 97 + 3 for i in range(50)]
    shares = split_by_pixels(keys, pixels, 3)
    assert sorted(p for share in shares for p in share) == list(range(50))
    loads = [sum(pixels[p] for p in share) for share in shares]
    assert max(loads) - min(loads) <= max(pixels)
    assert split_by_pixels(keys, pixels, 3) == shares and split_by_pixels(keys, pixels, 1) == [list(range(50))]


def torchrun(n: int, ckpt, source, out, *extra, popen=False, fresh: tuple[Path, ...] = ()):
    """scripts/predict.py in ``n`` processes under torchrun: started (``popen``) or run to its end, once more after a
    native abort with the folders ``fresh`` removed first (a rerun into a kept ``out`` resumes)."""
    args = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={n}"]
    args += [str(ROOT / "scripts" / "predict.py"), "--checkpoint", str(ckpt), "--input", str(source)]
    args += ["--output", str(out), "--no-progress", "--device", "cpu", *extra]
    if popen:
        return subprocess.Popen(
            args, env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
        )
    return run_once_more_after_native_abort(args, fresh=fresh, env=ENV)


@pytest.mark.slow
def test_two_processes_under_torchrun_give_the_masks_of_one_and_one_report(tmp_path, ckpt):
    files = {**members(12), "bad.png": b"junk"}
    source = write_zip(tmp_path / "s.zip", files)
    assert predict(ckpt, source, tmp_path / "one", "--workers", "0") == 1
    done = torchrun(2, ckpt, source, tmp_path / "two", "--workers", "1", fresh=(tmp_path / "two",))
    assert done.returncode == 1, done.stderr[-3000:]  # bad.png failed, in either process's share
    assert done.stdout.count("srforge-predict: 13 scans: 12 ok, 0 skipped, 1 failed") == 1  # rank 0 alone prints
    assert output_files(tmp_path / "one") == output_files(tmp_path / "two")
    merged = report(tmp_path / "two")
    assert merged["summary"]["processes"] == 2 and merged["summary"]["scans"] == 13
    assert [r["name"] for r in merged["scans"]] == sorted(files)
    assert not list((tmp_path / "two" / ".partial").glob("*"))


@pytest.mark.slow
def test_rerun_with_another_world_size_after_a_kill_completes_the_set(tmp_path, ckpt):
    files = members(120, h=40, w=120)
    source = write_tar(tmp_path / "many.tar.gz", files)
    out = tmp_path / "out"
    proc = torchrun(2, ckpt, source, out, "--workers", "0", popen=True)
    deadline = time.time() + 180
    while proc.poll() is None and time.time() < deadline and len(list((out / "masks").rglob("*.png"))) < 5:
        time.sleep(0.02)
    os.killpg(proc.pid, signal.SIGKILL)  # torchrun and both of its processes
    proc.wait(timeout=60)
    finished = list((out / "masks").rglob("*.png"))
    assert 0 < len(finished) < len(files), "the run finished before it could be killed: give it more scans"
    done = torchrun(3, ckpt, source, out, "--workers", "1")
    assert done.returncode == 0, done.stderr[-3000:]
    summary = report(out)["summary"]
    assert summary["skipped"] >= len(finished) and summary["ok"] + summary["skipped"] == len(files)
    assert summary["processes"] == 3
    assert predict(ckpt, source, tmp_path / "fresh", "--workers", "0") == 0
    assert output_files(out) == output_files(tmp_path / "fresh")


# -- many tiny scans ------------------------------------------------------------------------------------------------
SCANS = 60  # tiny scans (9-15 x 15-55 px): under a model call each before, in one or two batches now


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
