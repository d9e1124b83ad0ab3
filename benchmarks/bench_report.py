"""A study's report: computed once per statistic against computed afresh per comparison.

    python benchmarks/bench_report.py --study studies/multi30k_en_de_converged.yaml
    python benchmarks/bench_report.py --smoke      # synthetic hypotheses, no study, no data file

A report tests every recipe against the baseline's runs on every test set. Before the caches
(``structnmt.evaluation.significance``: reference n-grams, each run's sentence statistics and
its resampled scores; ``Study.run_config``: each run's config; ASO ε on disk), every comparison
extracted the baseline runs' statistics, n-grammed the references and read the recipes' YAML
again, and every report ran deepsig's bootstrap for every row. Each round starts as a new
process would (in-memory caches empty); the cached way finds the ASO file the rounds before
it left (a report made again), the fresh way an empty one.
Both ways run here, in the same process, alternately ``--rounds`` times; the fastest round of
each counts, and the two reports must be byte-identical (the caches change when, not what).
``--smoke`` times the comparisons a report makes (:func:`compare_seeds` and
:func:`pooled_bootstrap`, three baseline seeds against three recipes of two seeds) on
synthetic sentences.
"""

from __future__ import annotations

import argparse
import contextlib
import random
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import common  # noqa: E402


@contextlib.contextmanager
def before_the_caches():
    """Every statistic and config computed afresh, as a report did before the caches."""
    from structnmt.evaluation import significance
    from structnmt.evaluation.significance import uncached
    from structnmt.study.spec import Study

    cached, aso_file = Study.run_config, significance._aso_file
    Study.run_config = lambda self, recipe, seed: self._read_run_config(recipe, seed)  # type: ignore[method-assign]
    with tempfile.TemporaryDirectory() as empty:
        significance._aso_file = lambda: Path(empty) / "aso.json"  # type: ignore[assignment]
        significance._ASO_DISK = None
        try:
            with uncached():
                yield
        finally:
            Study.run_config = cached  # type: ignore[method-assign]
            significance._aso_file = aso_file  # type: ignore[assignment]


def as_a_new_process() -> None:
    """The in-memory caches emptied, as a new ``structnmt study --report`` finds them."""
    from structnmt.evaluation import significance

    significance._MEMO.clear()
    significance._aso.cache_clear()
    significance._ASO_DISK = None


def report_once(study_file: str, out: Path) -> tuple[float, dict[str, bytes]]:
    from structnmt.study.report import write_report
    from structnmt.study.spec import load_study

    as_a_new_process()
    study = load_study(study_file)
    start = time.perf_counter()
    path = write_report(study, out=out / "report.md")
    seconds = time.perf_counter() - start
    return seconds, {suffix: path.with_suffix(suffix).read_bytes() for suffix in (".md", ".json", ".png")
                     if path.with_suffix(suffix).is_file()}


def comparisons_once(runs: dict[str, list[list[str]]], refs: list[str]) -> tuple[float, list]:
    from structnmt.evaluation import significance

    as_a_new_process()
    start = time.perf_counter()
    results = []
    for recipe, hyps in runs.items():
        if recipe != "baseline":
            results.append(significance.compare_seeds(hyps, runs["baseline"], [refs]).verdict)
            results.append(significance.pooled_bootstrap(hyps, runs["baseline"], [refs]).p_value)
    return time.perf_counter() - start, results


def synthetic_runs(sentences: int, seed: int = 0) -> tuple[dict[str, list[list[str]]], list[str]]:
    rng = random.Random(seed)
    words = [f"w{k}" for k in range(300)]
    refs = [" ".join(rng.choices(words, k=rng.randint(5, 20))) for _ in range(sentences)]

    def noisy(p: float) -> list[str]:
        return [" ".join(w if rng.random() > p else rng.choice(words) for w in ref.split()) for ref in refs]

    runs = {"baseline": [noisy(0.4) for _ in range(3)]}
    runs.update({f"recipe{k}": [noisy(0.35 + 0.05 * k) for _ in range(2)] for k in range(3)})
    return runs, refs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--study", help="a study file whose records (and references) are here")
    parser.add_argument("--smoke", action="store_true", help="synthetic sentences: no study, no data file")
    parser.add_argument("--sentences", type=int, default=1000, help="with --smoke")
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    if not args.study and not args.smoke:
        parser.error("give --study FILE or --smoke")
    times: dict[str, list[float]] = {"cached": [], "afresh": []}
    outputs: dict[str, object] = {}
    with tempfile.TemporaryDirectory() as tmp:
        runs, refs = synthetic_runs(min(args.sentences, 100) if args.smoke and args.rounds == 1 else args.sentences)
        for _ in range(args.rounds):
            for way in ("afresh", "cached"):
                out = Path(tmp) / way
                out.mkdir(exist_ok=True)
                with before_the_caches() if way == "afresh" else contextlib.nullcontext():
                    seconds, result = report_once(args.study, out) if args.study else comparisons_once(runs, refs)
                times[way].append(seconds)
                if outputs.setdefault(way, result) != result:
                    sys.exit(f"error: two {way} rounds gave different results")
    if outputs["cached"] != outputs["afresh"]:
        sys.exit("error: the cached and the fresh computation differ")
    best = {way: min(t) for way, t in times.items()}
    what = f"`structnmt study {args.study} --report`" if args.study else \
        f"compare_seeds + pooled_bootstrap, 3 baseline seeds against 3 recipes x 2 seeds, {len(refs)} sentences"
    rows = [[way, f"{best[way]:.2f}", " ".join(f"{t:.2f}" for t in times[way])] for way in ("afresh", "cached")]
    table = common.markdown_table(["statistics", "fastest round (s)", "rounds (s)"], rows)
    ratio = best["afresh"] / best["cached"]
    print(table)
    print(f"cached: {ratio:.2f}x faster than afresh; outputs identical")
    sections = [("What", what), ("Time", table + f"\n\nSpeed-up: **{ratio:.2f}x**, outputs identical.")]
    path = common.write_report("report", "A study's report: cached statistics against afresh", sections,
                               common.machine())
    print(f"written to {path}")


if __name__ == "__main__":
    main()
