"""``benchmarks/gpu_report.py``, the one command for the GPU figures, stays runnable where there
is no GPU: without CUDA it says so and exits 0, and its ``--cpu`` dry run goes through every
section (matmul peak, training shapes under eager / compiled / CUDA graphs, every method's
overhead, structnmt's training command and beam search, Joey NMT or the line saying it is absent)
on tiny sizes, run as a user runs it. No figure is checked: a dry run measures nothing."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "gpu_report.py"


def gpu_report(*args: str | Path, tmp: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "BENCH_RESULTS": str(tmp / "results"), "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, str(SCRIPT), *map(str, args)], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=600)


def headings() -> dict[str, str]:
    sys.path.insert(0, str(SCRIPT.parent))
    try:
        import gpu_report
    finally:
        sys.path.remove(str(SCRIPT.parent))
    return gpu_report.HEADINGS


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is here: the script runs for real")
def test_without_cuda_the_report_says_so_and_measures_nothing(tmp_path):
    done = gpu_report(tmp=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("gpu_report: no CUDA device here") and "nothing was measured" in done.stdout
    assert not (tmp_path / "results").exists()


@pytest.mark.slow
def test_the_dry_run_goes_through_every_section(tmp_path):
    from tests.registry_cases import all_cases

    done = gpu_report("--cpu", "--out", tmp_path / "out", tmp=tmp_path)
    assert done.returncode == 0, f"{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    report = (tmp_path / "out" / "gpu_report.md").read_text(encoding="utf-8")
    data = json.loads((tmp_path / "out" / "gpu_report.json").read_text(encoding="utf-8"))
    assert report.startswith("# GPU report (CPU dry run") and "## Machine" in report
    for key, heading in headings().items():
        assert f"\n## {heading}\n" in report, heading
        status = data["sections"][key]["status"]
        assert status == "done" or (key == "joey" and status == "not measured: Joey NMT is absent"), (key, status)
    training = data["sections"]["training"]["data"]["cells"]
    assert len(training) == 2 * 2 * 3 and all("tokens_per_s" in cell for cell in training), training
    methods = data["sections"]["methods"]
    assert set(methods["data"]) == set(all_cases()) - {"vanilla"}, methods["data"].keys()
    assert data["sections"]["decoding"]["data"]["decode"]["sentences"] == 8
    joey = data["sections"]["joey"]
    if joey["status"] == "done":
        assert joey["data"]["joey_decode"]["sentences"] == 8
    else:
        assert "pip install --no-index" in " ".join(joey["text"])
    assert "not measured" not in report.replace("not measured: Joey NMT is absent", "")


def test_without_joey_the_report_says_how_to_bring_it(tmp_path):
    if importlib.util.find_spec("joeynmt") is not None:
        pytest.skip("this interpreter imports joeynmt")
    done = gpu_report("--cpu", "--sections", "joey", "--joey-python", sys.executable, "--out", tmp_path, tmp=tmp_path)
    assert done.returncode == 0, done.stderr
    report = (tmp_path / "gpu_report.md").read_text(encoding="utf-8")
    assert "**not measured: Joey NMT is absent**" in report and "importlib_metadata<10" in report
    assert "not run: left out by --sections" in report  # the other sections keep their headings
