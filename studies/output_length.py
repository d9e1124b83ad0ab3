"""How much of a study's BLEU differences is output length.

    python studies/output_length.py studies/multi30k_en_de.yaml [--tests test_2016_flickr ...]

BLEU is a brevity penalty times the geometric mean of four n-gram precisions. Models trained
for a short budget often stop early, and then a gap in BLEU between two recipes (or two seeds
of one) can be a gap in length rather than in the words chosen. For every recorded run this
prints, per test set, BLEU, the length ratio (hypothesis over reference, as BLEU counts them),
the brevity penalty and BLEU without it (the precisions' geometric mean: what the words earn),
then each recipe's means and, across all runs, Pearson's r between length ratio and BLEU. A last
table puts every recipe beside the baseline on all test sets: length ratio, and the gaps in
BLEU, in BLEU without the brevity penalty and in chrF (recall-weighted, so it sees omissions).
Reads the records' hypotheses and the references of the prepared dataset on this machine.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from structnmt.evaluation.scores import corpus_scores  # noqa: E402
from structnmt.study.report import run_hypotheses, run_references  # noqa: E402
from structnmt.study.runs import read_record, stale_reason  # noqa: E402
from structnmt.study.spec import load_study  # noqa: E402


def pearson(xs: list[float], ys: list[float]) -> float:
    try:
        return statistics.correlation(xs, ys)
    except statistics.StatisticsError:  # fewer than two runs, or one side constant
        return float("nan")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("study")
    parser.add_argument("--tests", nargs="+", help="default: the study's test sets")
    args = parser.parse_args(argv)
    study = load_study(args.study)
    means: dict[str, dict[str, dict[str, float]]] = {}  # recipe -> test -> mean of each figure
    tests = args.tests or study.test_sets
    for test in tests:
        runs: dict[str, list[dict[str, float]]] = {}
        for recipe, seed in study.runs():
            record = read_record(study, recipe, seed)
            if record is None or test not in record["scores"] or stale_reason(study, recipe, seed, record):
                continue  # as the report: only records that stand for today's recipe
            refs = run_references(study, recipe, seed, test, record["scores"][test])
            if refs is None:
                print(f"{recipe} seed {seed}: no references on this machine (prepare the dataset)", file=sys.stderr)
                continue
            scores = corpus_scores(run_hypotheses(study, recipe, seed, test), [refs], metrics=("bleu", "chrf"))
            parts = scores["bleu_parts"]
            if not parts["bp"] or parts["ratio"] is None:
                print(f"{recipe} seed {seed}: empty output or references on {test}, left out", file=sys.stderr)
                continue
            runs.setdefault(recipe, []).append({"seed": seed, "bleu": scores["bleu"], "ratio": parts["ratio"],
                                                "bp": parts["bp"], "words": scores["bleu"] / parts["bp"],
                                                "chrf": scores["chrf"]})
        if not runs:
            continue
        print(f"\n## {test}\n")
        print("| recipe | seeds | BLEU | length ratio | BP | BLEU without BP | per seed: BLEU / ratio |")
        print("|---|---:|---:|---:|---:|---:|---|")
        for recipe, rows in runs.items():
            mean = {k: statistics.mean(r[k] for r in rows) for k in ("bleu", "ratio", "bp", "words", "chrf")}
            means.setdefault(recipe, {})[test] = mean
            seeds = ", ".join(f"s{r['seed']}: {r['bleu']:.2f} / {r['ratio']:.3f}" for r in rows)
            print(f"| {recipe} | {len(rows)} | {mean['bleu']:.2f} | {mean['ratio']:.3f} | {mean['bp']:.3f} | "
                  f"{mean['words']:.2f} | {seeds} |")
        every = [r for rows in runs.values() for r in rows]
        if len(every) > 2:
            print(f"\nAcross {len(every)} runs, Pearson's r between length ratio and BLEU: "
                  f"{pearson([r['ratio'] for r in every], [r['bleu'] for r in every]):.2f}; "
                  f"BLEU spans {min(r['bleu'] for r in every):.2f}-{max(r['bleu'] for r in every):.2f}, "
                  f"BLEU without BP {min(r['words'] for r in every):.2f}-{max(r['words'] for r in every):.2f}.")
    summary(study.baseline, tests, means)
    return 0


def summary(baseline: str, tests: list[str], means: dict[str, dict[str, dict[str, float]]]) -> None:
    base = means.get(baseline)
    if not base:
        return
    shown = [t for t in tests if t in base]
    print(f"\n## Against `{baseline}` (means over seeds; each cell: {' / '.join(shown)})\n")
    print("| recipe | length ratio | Δ BLEU | Δ BLEU without BP | Δ chrF |\n|---|---|---|---|---|")
    for recipe, by_test in means.items():
        if recipe == baseline or any(t not in by_test for t in shown):
            continue
        ratio = " / ".join(f"{by_test[t]['ratio']:.3f}" for t in shown)
        gaps = [" / ".join(f"{by_test[t][key] - base[t][key]:+.2f}" for t in shown)
                for key in ("bleu", "words", "chrf")]
        print(f"| {recipe} | {ratio} | " + " | ".join(gaps) + " |")
    ratio = " / ".join(f"{base[t]['ratio']:.3f}" for t in shown)
    print(f"| {baseline} (baseline) | {ratio} | " + " | ".join(
        " / ".join(f"{base[t][key]:.2f}" for t in shown) for key in ("bleu", "words", "chrf")) + " |")


if __name__ == "__main__":
    sys.exit(main())
