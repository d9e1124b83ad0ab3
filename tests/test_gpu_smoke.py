"""``benchmarks/gpu_smoke.py`` stays runnable on machines without a GPU: it says so and exits 0,
and its ``--cpu`` dry run goes through every step (training under bf16 and fp16, beam search
against the CPU, the report) on a tiny model."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "gpu_smoke.py"


def smoke(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], cwd=ROOT, capture_output=True, text=True, timeout=600)


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is here: the script runs for real")
def test_without_cuda_the_smoke_test_says_so_and_checks_nothing():
    done = smoke()
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("gpu_smoke: no CUDA device here") and "nothing was checked" in done.stdout


@pytest.mark.slow
def test_the_dry_run_goes_through_every_step(tmp_path):
    done = smoke("--cpu", "--updates", "2", "--only", "vanilla,dbsa", "--out", str(tmp_path))
    assert done.returncode == 0, done.stderr
    report = (tmp_path / "gpu_smoke.md").read_text()
    assert "| dbsa | fp16 | " in report and re.search(r"\| dbsa \| bf16 \| [\d.]+% of 16 \|", report)
    assert "all checks passed" in report  # DDP (--ddp-cpu 2) is left out: two more processes, ~30 s here


@pytest.mark.slow
def test_a_case_that_raises_is_reported_and_the_others_still_run(tmp_path):
    # the first GPU run stopped at its fourth method on a compiler error and reported nothing
    done = smoke("--cpu", "--updates", "2", "--only", "no_such_case,vanilla", "--out", str(tmp_path))
    assert done.returncode == 1
    report = (tmp_path / "gpu_smoke.md").read_text()
    assert "| no_such_case | bf16 | **error** |" in report and "| vanilla | fp16 | " in report
    assert "FAILED: no_such_case bf16: " in report and "FAILED: vanilla" not in report
