"""``benchmarks/gpu_report.py``, the one command for the GPU figures, stays runnable where there
is no GPU: without CUDA it says so and exits 0, and its ``--cpu`` dry run goes through every
section's code (matmul peaks, training shapes under eager / compiled / CUDA graphs, every method's
overhead, structnmt's training command and beam search, Joey NMT or the line saying it is not
installed) on tiny sizes, run as a user runs it. No figure is checked, only the report's structure:
a dry run measures nothing."""

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


def module():
    sys.path.insert(0, str(SCRIPT.parent))
    try:
        import gpu_report
    finally:
        sys.path.remove(str(SCRIPT.parent))
    return gpu_report


def read(out: Path) -> tuple[str, dict]:
    return (out / "gpu_report.md").read_text(encoding="utf-8"), json.loads((out / "gpu_report.json").read_text())


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is here: the script runs for real")
def test_without_cuda_the_report_says_so_and_measures_nothing(tmp_path):
    done = gpu_report(tmp=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("gpu_report: no CUDA device here") and "nothing was measured" in done.stdout
    assert not (tmp_path / "results").exists()


@pytest.mark.slow
def test_the_dry_run_goes_through_every_section(tmp_path):
    from tests.registry_cases import all_cases

    g = module()
    out = tmp_path / "out"
    # the dry run measures nothing, so its time only has to stay below the test's: 480 s (not the
    # dry run's 300) keeps a loaded or half-speed machine's methods section inside its share
    done = gpu_report("--cpu", "--out", out, "--time-limit", "480", tmp=tmp_path)
    assert done.returncode == 0, f"{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    assert done.stdout.strip().splitlines()[-1].endswith(f"{out / 'gpu_report.md'} and {out / 'gpu_report.json'}")
    report, data = read(out)
    assert report.startswith("# GPU report (CPU dry run") and data["dry_run"] is True
    machine = data["machine"]
    for key in ("gpu", "driver", "torch", "CUDA (torch built with)", "commit", "training.cuda_graphs"):
        assert key in machine and f"\n- {key}: " in report, key
    sections = data["sections"]
    assert list(sections) == list(g.HEADINGS) and report.index("## Machine") < report.index("## Time per section")
    for key, heading in g.HEADINGS.items():
        assert f"\n## {heading}\n" in report, heading
        sec = sections[key]
        assert sec["status"] == "done" or (key == "joey" and sec["status"] == g.JOEY_ABSENT), (key, sec["status"])
        assert sec["budget_s"] > 0 and sec["until_s"] <= data["time_limit_s"] and sec["seconds"] >= 0, sec
        assert f"| {heading} | {sec['budget_s']:.0f} | {sec['until_s']:.0f} | {sec['seconds']:.1f} |" in report
    assert sum(s["budget_s"] for s in sections.values()) == pytest.approx(data["time_limit_s"])
    assert data["elapsed_s"] < data["time_limit_s"]

    assert set(sections["peak"]["data"]) == {"bf16", "fp32", "tf32", "bf16_small"}
    assert all(v > 0 for v in sections["peak"]["data"].values())

    cells = sections["training"]["data"]["cells"]
    assert sorted((c["shape"], c["precision"], c["mode"]) for c in cells) == sorted(
        (s, p, m) for s in ("small", "big") for p in ("bf16", "fp32") for m in g.MODES)
    graphs_known = machine["training.cuda_graphs"] != g.NOT_AVAILABLE
    for cell in cells:
        if cell["mode"] == "graphs" and not graphs_known:
            assert cell["not_measured"].startswith(g.NOT_AVAILABLE), cell
            continue
        assert cell["tokens_per_s"] > 0 and cell["share_of_peak"] > 0, cell
        assert len(cell["rates"]) == 3 and cell["peak_kind"] == cell["precision"], cell
        assert cell["mode"] == "eager" or cell["graphs"] >= 1, cell  # compiled through the toolkit's own route
        assert cell["host_syncs"] is None, cell  # checked on CUDA only: nothing on the CPU is asynchronous
    if graphs_known:  # CUDA graphs with accumulation: the small shape, each precision, three finite losses
        checks = sections["training"]["data"]["accumulate"]
        assert sorted(c["precision"] for c in checks) == ["bf16", "fp32"], checks
        assert all("error" not in c and c["finite"] and len(c["losses"]) == 3 for c in checks), checks
        assert "CUDA graphs with `training.accumulate` 2" in report
        # the big shape compiled again with the caches warm: what a study's later runs pay
        cached = sections["training"]["data"]["cached_compile"]
        assert [c["precision"] for c in cached] == ["bf16", "fp32"] and all(c["warm_cache_s"] > 0 for c in cached)
        assert "again with inductor's caches warm" in report

    methods = sections["methods"]["data"]
    assert set(methods) == set(all_cases()) - {"vanilla"}, methods.keys()
    for case, m in methods.items():
        assert m["rounds"] == len(m["ratios"]) == 3, case
        assert m["spread"][0] <= m["overhead"] <= m["spread"][1], case
        assert m["kernels"] > m["vanilla_kernels"] > 100, case  # every method adds kernels to an update

    decoding = sections["decoding"]["data"]
    assert decoding["train_tokens_per_s"] > 0 and decoding["decode"]["sentences"] == 8
    defaults = decoding["train_log_defaults"]  # the steady state behind the figure, window by window
    assert len(defaults["windows"]) == 2 and all(r > 0 for r in defaults["windows"]), defaults
    assert "Training (defaults), the log's windows of 2 updates:" in report
    joey = sections["joey"]
    if joey["status"] == "done":
        assert joey["data"]["installed"] and joey["data"]["joeynmt"] == "2.3.0"
        assert joey["data"]["joey_decode"]["sentences"] == 8 and joey["data"]["joey_train_tokens_per_s"] > 0
        assert [row["toolkit"].split()[0] for row in joey["table"]][:2] == ["Joey", "structnmt"]
    else:
        assert joey["data"] == {"installed": False} and "pip install --no-index" in " ".join(joey["text"])
    assert "not measured" not in report.replace(g.JOEY_ABSENT, "")


def test_without_joey_the_report_says_not_installed_and_how_to_bring_it(tmp_path):
    if importlib.util.find_spec("joeynmt") is not None:
        pytest.skip("this interpreter imports joeynmt")
    done = gpu_report("--cpu", "--sections", "joey", "--joey-python", sys.executable, "--out", tmp_path, tmp=tmp_path)
    assert done.returncode == 0, done.stderr
    report, data = read(tmp_path)
    assert "**not measured: Joey NMT is not installed**" in report and "importlib_metadata<10" in report
    assert "not run: left out by --sections" in report  # the other sections keep their headings
    assert [k for k, s in data["sections"].items() if s["budget_s"]] == ["joey"]
    assert data["sections"]["joey"]["budget_s"] == pytest.approx(data["time_limit_s"])


def test_cuda_graphs_go_through_the_config_or_are_not_available():
    g = module()
    if g.cuda_graphs_known():
        assert g.training_config("bf16", "on", "on").cuda_graphs == "on"
        assert g.training_config("bf16", "on").cuda_graphs == "off"
    else:
        with pytest.raises(g.NotMeasured, match=f"^{g.NOT_AVAILABLE}"):
            g.training_config("bf16", "on", "on")
        assert g.training_config("bf16", "on").compile == "on"  # the other modes are unaffected


def test_the_driver_line():
    g = module()
    assert g.driver_of("550.54.15, 1980 MHz, 700.00 W\n", None) == \
        "550.54.15 (nvidia-smi); max SM clock 1980 MHz, power limit 700.00 W"
    assert g.driver_of("550.54.15", None).startswith("550.54.15 (nvidia-smi)")
    assert g.driver_of(None, "NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.54.15\nGCC\n").endswith(
        "550.54.15 (no nvidia-smi)")
    assert g.driver_of(None, None).startswith("unknown")


def test_host_syncs_are_counted_by_where_they_happen(monkeypatch):
    # on CUDA each synchronising call of an update is one warning under set_sync_debug_mode("warn"):
    # counted, and named by file and line; the mode is set back whatever the update does
    import warnings

    g = module()
    modes = []
    monkeypatch.setattr(torch.cuda, "set_sync_debug_mode", modes.append)
    monkeypatch.setattr(torch.cuda, "get_sync_debug_mode", lambda: 0)  # the mode before: set back after

    class Run:
        device = torch.device("cuda")

    class Updater:
        def update(self, batches):
            for _ in batches:
                warnings.warn("called a synchronizing CUDA operation", UserWarning, stacklevel=1)
            warnings.warn("an unrelated warning", UserWarning, stacklevel=1)

    found = g.host_syncs(Run(), Updater(), [1, 2])
    line = Updater.update.__code__.co_firstlineno + 2  # the first warn's line
    assert found["count"] == 2 and found["where"] == [f"test_gpu_report.py:{line}"]
    assert modes == ["warn", 0]
    assert g.syncs_cell(found) == f"2 ({found['where'][0]})" and g.syncs_cell(None) == "-"
    assert g.syncs_cell({"count": 0, "where": []}) == "0"

    class Failing:
        def update(self, batches):
            raise RuntimeError("boom")

    with pytest.raises(RuntimeError):
        g.host_syncs(Run(), Failing(), [1])
    assert modes[-1] == 0

    class Cpu:
        device = torch.device("cpu")

    assert g.host_syncs(Cpu(), Updater(), [1]) is None  # nothing on the CPU is asynchronous

    # a sync inside a library function is named by the line of ours that called it
    library: dict = {}
    exec(compile("import warnings\ndef item():\n    warnings.warn('called a synchronizing CUDA operation')\n",
                 "/site-packages/torch/fake.py", "exec"), library)

    class Calling:
        def update(self, batches):
            library["item"]()

    found = g.host_syncs(Run(), Calling(), [1], ours=Path(__file__).resolve().parent)
    assert found == {"count": 1, "where": [f"test_gpu_report.py:{Calling.update.__code__.co_firstlineno + 1}"]}
    shown = warnings.showwarning
    found = g.host_syncs(Run(), Calling(), [1], ours=Path("/nowhere"))
    assert found == {"count": 1, "where": ["fake.py:3"]}  # no line of ours on the stack: the warning's own place
    assert warnings.showwarning is shown  # put back


@pytest.mark.slow
def test_the_methods_under_cuda_graphs_in_the_dry_run(tmp_path):
    """``--methods-mode graphs``: each model on one fixed batch through the graphs' updater (on the
    CPU: compiled with the eager backend); the section says which route it took."""
    out = tmp_path / "out"
    done = gpu_report("--cpu", "--sections", "methods", "--methods-mode", "graphs", "--methods", "sasa",
                      "--out", out, tmp=tmp_path)
    assert done.returncode == 0, f"{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    report, data = read(out)
    methods = data["sections"]["methods"]["data"]
    assert set(methods) == {"sasa"} and methods["sasa"]["rounds"] == 3, methods
    assert all(r > 0 for r in methods["sasa"]["rates"] + methods["sasa"]["vanilla_rates"])
    assert "under CUDA graphs" in report and "collation outside the timing" in report


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is here: the script runs for real")
def test_a_method_that_fails_under_cuda_graphs_leaves_the_next_one_measured(tmp_path, monkeypatch):
    """A failed replay leaves cudagraph trees unusable (every later case failed with a bare
    AssertionError on an H200): after a failure the graphs route starts afresh, vanilla
    recompiled, and the next method is measured against it."""
    import tests.registry_cases as cases

    made = cases.make_model

    built = []

    def make_model(case, *args, **kwargs):
        built.append(case)
        if case == "pascal":
            raise RuntimeError("accessing tensor output of CUDAGraphs that has been overwritten")
        return made(case, *args, **kwargs)

    monkeypatch.setattr(cases, "make_model", make_model)
    monkeypatch.setenv("BENCH_RESULTS", str(tmp_path / "results"))
    out = tmp_path / "out"
    assert module().main(["--cpu", "--sections", "methods", "--methods-mode", "graphs", "--methods", "pascal,sasa",
                          "--rounds", "1", "--out", str(out)]) == 0
    report, data = read(out)
    methods = data["sections"]["methods"]["data"]
    assert set(methods) == {"sasa", "errors"} and [e.split(":")[0] for e in methods["errors"]] == ["pascal"]
    # afresh after the failure, vanilla too; the first vanilla and the last sasa are the eager kernel counts
    assert built == ["vanilla", "vanilla", "pascal", "vanilla", "sasa", "sasa"]
    assert methods["sasa"]["rounds"] == 1 and all(r > 0 for r in methods["sasa"]["vanilla_rates"])
    assert "| pascal | pascal (parent_ignoring=0.3) | not measured: RuntimeError: accessing tensor output" in report


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is here: the script runs for real")
def test_a_kernel_count_that_fails_costs_its_cell_not_the_row(tmp_path, monkeypatch):
    """The kernel count stands beside the timing: if it raises, the method is still measured,
    its cell says "not counted" and the error is kept in the JSON under the case's name."""
    g = module()
    monkeypatch.syspath_prepend(str(SCRIPT.parent))
    import kernel_counts

    counted = kernel_counts.count_update

    def count_update(case, *args, **kwargs):
        if case == "sasa":
            raise RuntimeError("no dispatch mode here")
        return counted(case, *args, **kwargs)

    monkeypatch.setattr(kernel_counts, "count_update", count_update)
    monkeypatch.setenv("BENCH_RESULTS", str(tmp_path / "results"))
    out = tmp_path / "out"
    assert g.main(["--cpu", "--sections", "methods", "--methods", "sasa", "--rounds", "1", "--out", str(out)]) == 0
    report, data = read(out)
    methods = data["sections"]["methods"]["data"]
    assert methods["sasa"]["rounds"] == 1 and methods["sasa"]["kernels"] is None
    assert methods["sasa"]["vanilla_kernels"] > 100  # vanilla's count went through
    assert [e.split(":")[0] for e in methods["errors"]] == ["sasa (kernel count)"], methods["errors"]
    (row,) = [line for line in report.splitlines() if line.startswith("| sasa |")]
    assert row.rstrip().endswith("| not counted |") and "not measured" not in row
    # a counter that cannot be imported (it leans on a private torch module) costs the column only
    monkeypatch.setitem(sys.modules, "kernel_counts", None)
    assert g.main(["--cpu", "--sections", "methods", "--methods", "sasa", "--rounds", "1", "--out", str(out)]) == 0
    report, data = read(out)
    methods = data["sections"]["methods"]["data"]
    assert methods["sasa"]["rounds"] == 1 and methods["sasa"]["kernels"] is methods["sasa"]["vanilla_kernels"] is None
    assert [e.split(":")[0] for e in methods["errors"]] == ["vanilla (kernel count)", "sasa (kernel count)"]


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is here: the script runs for real")
def test_decoding_beside_joey_is_also_compared_per_output_sub_word(tmp_path, monkeypatch):
    """Models of 200 updates stop at other lengths (an H200 run: structnmt 12.9 sub-words a
    sentence, Joey NMT 25.8), so sentences/s alone flatters the shorter; the table also gives
    output sub-words/s. Joey's commands are stood in for (not installed here): 10 sentences of 20
    sub-words in 2 s, 1,000 target tokens/s."""
    g = module()
    monkeypatch.syspath_prepend(str(SCRIPT.parent))
    import bench_joey

    monkeypatch.setattr(bench_joey, "find_joey_python", lambda given=None: Path(sys.executable))
    monkeypatch.setattr(bench_joey, "joey_version", lambda python: "2.3.0 2.13.0")
    monkeypatch.setattr(bench_joey, "joey_train", lambda python, config, threads: (1000.0, 4))
    monkeypatch.setattr(bench_joey, "joey_decode",
                        lambda *args: {"sentences": 10, "seconds": 2.0, "pieces": 20.0})
    monkeypatch.setenv("BENCH_RESULTS", str(tmp_path / "results"))
    out = tmp_path / "out"
    assert g.main(["--cpu", "--sections", "decoding,joey", "--out", str(out)]) == 0
    report, data = read(out)
    ours = data["sections"]["decoding"]["data"]["decode"]
    ours_pps = ours["sentences"] / ours["seconds"] * ours["pieces"]
    rows = data["sections"]["joey"]["table"]
    assert rows[0]["output sub-words/s (against Joey NMT)"] == "100 (1.00x)"
    assert rows[1]["output sub-words/s (against Joey NMT)"].endswith(f"({ours_pps / 100:.2f}x)")
