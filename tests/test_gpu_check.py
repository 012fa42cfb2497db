"""benchmarks/gpu_check.sh, the one script meant for the first GPU, run here without one: it must still find
srforge, say that there is no CUDA device, write its JSON and exit 2, so that it cannot rot unseen."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
@pytest.mark.skipif(
    subprocess.run([sys.executable, "-c", "import torch; assert not torch.cuda.is_available()"]).returncode != 0,
    reason="a CUDA device is present: gpu_check.sh runs its real checks there",
)
def test_gpu_check_without_a_gpu_says_so_and_exits_2(tmp_path):
    env = {**os.environ, "PYTHON": sys.executable, "OUT": str(tmp_path)}
    done = subprocess.run(
        ["bash", str(ROOT / "benchmarks" / "gpu_check.sh")], env=env, capture_output=True, text=True, timeout=240
    )
    assert done.returncode == 2, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    assert lines[-1].startswith("gpu_check: no CUDA device: nothing checked (7 skipped)"), done.stdout
    assert not any(line.startswith("FAIL") for line in lines), done.stdout  # the install step did not fail
    report = json.loads((tmp_path / "gpu_check.json").read_text())
    assert report["exit_status"] == 2 and report["device"] is None
    checks = ["test_cuda", "bench_train", "bench_model", "bench_predict"]
    checks += ["memory_probe", "oom_recovery", "checkpointing"]
    assert [c["check"] for c in report["checks"]] == checks
    assert [c["status"] for c in report["checks"]] == ["SKIP"] * 7
