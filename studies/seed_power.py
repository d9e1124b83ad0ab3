"""How many seeds a seed-level test would need to settle a study's gaps: a planning figure.

    python studies/seed_power.py studies/multi30k_en_de_converged.yaml [--effect 0.5] [--power 0.8]

The report's tests are the every-seed-pair rule (declared before the runs) and a seed-pooled
bootstrap, which resamples test sentences, not trainings. The question a reviewer asks of a
gap is whether another set of trainings would show it again; the textbook answer treats each
training's BLEU as one observation. For each recipe against the baseline on each test set in the
study's report (``RECORDS/report.json``: regenerate it with ``structnmt study STUDY --report``
first), this prints:

- the gap of the seed means, and each side's seed standard deviation;
- Welch's t-test over seeds (two-sided): raw p, and Holm-adjusted over the same family as the
  report (every recipe x test set printed). It was not declared before the runs: a check, not a
  verdict. With five seeds it leans on the seeds' BLEU being normal; beside it, the permutation
  test over seeds assumes only that the runs are exchangeable, and its smallest p is set by the
  seed counts (2/252 with five against five, 1/56 with three against five): above 0.05/m, Holm's
  first step, once a family has m >= 7 comparisons, so then nothing passes it (exact up to
  100,000 splits of the runs, sampled beyond);
- seeds per recipe for a two-sample t-test to find the observed gap with the stated power, at
  alpha 0.05 and at alpha 0.05 / family (the strictest step of Holm's), with both sides' pooled
  seed deviation. The observed gap is the estimate that made the cell interesting, so it is
  likely too large (the winner's curse) and these counts likely too small; ``--effect`` gives the
  counts for a gap fixed in advance instead (default 0.5 BLEU). The counts grow with the
  deviation squared, read off a few seeds: rough planning figures, not a promise.

A second table pairs each recipe's run with the baseline's run of the same seed (the same data
order, initial weights where the models share them, machine and commit in a seed-major study)
and gives the paired t-test and the seeds it would need, from the deviation of the same-seed
gaps: where seeds move both runs alike that deviation is smaller, and a study that declares the
paired test before its runs needs fewer of them.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from structnmt.evaluation.significance import holm  # noqa: E402
from structnmt.study.spec import load_study  # noqa: E402

MOST = 200  # seeds per recipe beyond which the count is printed as "> 200"
EXACT = 100_000  # splits of the runs that the permutation test enumerates; beyond, it samples this many


def t_power(n: int, effect: float, sd: float, alpha: float, paired: bool = False) -> float:
    """Power of a two-sided two-sample t-test with n observations a side, or (``paired``) of a
    one-sample t-test on n same-seed gaps of deviation ``sd`` (scipy, which deepsig brings for
    the reports' ASO, is imported where used, as structnmt's own modules do)."""
    from scipy import stats

    df = n - 1 if paired else 2 * n - 2
    shift = abs(effect) / (sd * math.sqrt(1 / n if paired else 2 / n))
    cut = stats.t.ppf(1 - alpha / 2, df)
    return float(stats.nct.sf(cut, df, shift) + stats.nct.cdf(-cut, df, shift))


def seeds_needed(effect: float, sd: float, alpha: float, power: float, paired: bool = False) -> int | None:
    """The fewest seeds a side (2 to MOST) that give ``power``; None: more than MOST."""
    if effect == 0:
        return None
    if sd <= 0:
        return 2
    return next((n for n in range(2, MOST + 1) if t_power(n, effect, sd, alpha, paired) >= power), None)


def welch_p(a: list[float], b: list[float]) -> float:
    """Two-sided Welch p; two sets of identical runs, where its t is undefined, are level (1)
    or as far apart as runs can be (0)."""
    from scipy import stats

    if statistics.pvariance(a) == statistics.pvariance(b) == 0:
        return 1.0 if statistics.mean(a) == statistics.mean(b) else 0.0
    return float(stats.ttest_ind(a, b, equal_var=False).pvalue)


def permutation_p(a: list[float], b: list[float]) -> float:
    """Two-sided permutation p over seeds: the share of the ways to split the pooled runs into
    groups of len(a) and len(b) whose mean gap is at least the observed one; every split where
    there are at most EXACT, else EXACT random ones (seeded: the same p on every call), counting
    the observed split once more so that p is never 0."""
    import random
    from itertools import combinations

    runs, gap = a + b, abs(statistics.mean(a) - statistics.mean(b))
    total = sum(runs)

    def as_far(chosen: tuple[int, ...]) -> bool:
        inside = sum(runs[i] for i in chosen)
        return abs(inside / len(a) - (total - inside) / len(b)) >= gap - 1e-12

    if math.comb(len(runs), len(a)) <= EXACT:
        splits = list(combinations(range(len(runs)), len(a)))
        return sum(map(as_far, splits)) / len(splits)
    rng = random.Random(0)
    hits = sum(as_far(tuple(rng.sample(range(len(runs)), len(a)))) for _ in range(EXACT))
    return (hits + 1) / (EXACT + 1)


def paired_p(gaps: list[float]) -> float:
    """Two-sided p of the one-sample t-test that the same-seed gaps average 0 (identical gaps:
    1 when all are 0, else 0, as :func:`welch_p`)."""
    from scipy import stats

    if statistics.pvariance(gaps) == 0:
        return 1.0 if gaps[0] == 0 else 0.0
    return float(stats.ttest_1samp(gaps, 0.0).pvalue)


def pooled_sd(a: list[float], b: list[float]) -> float:
    """Both sides' seed deviation pooled, as the equal-n power calculation takes it."""
    return math.sqrt(((len(a) - 1) * statistics.variance(a) + (len(b) - 1) * statistics.variance(b))
                     / (len(a) + len(b) - 2))


def cells(report: dict, baseline: str) -> list[dict]:
    """One row per (test set, recipe) with two seeds or more on both sides, in the report's order."""
    rows = []
    for test, by_recipe in report.items():
        by_seed = (by_recipe.get(baseline) or {}).get("bleu", {})
        base = list(by_seed.values())
        for recipe, cell in by_recipe.items():
            seeds = list(cell.get("bleu", {}).values())
            if recipe == baseline or len(seeds) < 2 or len(base) < 2:
                continue
            gaps = [bleu - by_seed[seed] for seed, bleu in cell["bleu"].items() if seed in by_seed]
            rows.append({"test": test, "recipe": recipe, "n": len(seeds), "n_base": len(base),
                         "gap": statistics.mean(seeds) - statistics.mean(base), "sd": statistics.stdev(seeds),
                         "sd_base": statistics.stdev(base), "pooled": pooled_sd(seeds, base),
                         "p": welch_p(seeds, base), "p_perm": permutation_p(seeds, base), "pairs": len(gaps),
                         "gap_paired": statistics.mean(gaps) if len(gaps) >= 2 else None,
                         "sd_paired": statistics.stdev(gaps) if len(gaps) >= 2 else None,
                         "p_paired": paired_p(gaps) if len(gaps) >= 2 else None})
    for row, adjusted in zip(rows, holm([r["p"] for r in rows]), strict=True):
        row["p_holm"] = adjusted
    paired = [r for r in rows if r["p_paired"] is not None]
    for row, adjusted in zip(paired, holm([r["p_paired"] for r in paired]), strict=True):
        row["p_paired_holm"] = adjusted
    return rows


def count(n: int | None) -> str:
    """A seed count as printed: beyond MOST, only that it is beyond."""
    return str(n) if n is not None else f"> {MOST}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("study", help="the study file (its records' report.json is read)")
    parser.add_argument("--effect", type=float, default=0.5, help="a gap fixed in advance, in BLEU (default 0.5)")
    parser.add_argument("--power", type=float, default=0.8, help="the chance of finding the gap (default 0.8)")
    args = parser.parse_args(argv)
    if not 0 < args.power < 1:
        parser.error(f"--power must lie between 0 and 1, got {args.power}")
    if args.effect <= 0:
        parser.error(f"--effect must be a positive gap in BLEU, got {args.effect}")
    study = load_study(args.study)
    path = study.records / "report.json"
    if not path.is_file():
        print(f"error: {path} is missing: run `structnmt study {args.study} --report` first", file=sys.stderr)
        return 1
    rows = cells(json.loads(path.read_text(encoding="utf-8")), study.baseline)
    if not rows:
        print(f"error: {path} has no recipe with two seeds or more beside {study.baseline}'s", file=sys.stderr)
        return 1
    strict = 0.05 / len(rows)
    print(f"Against `{study.baseline}`, from {path} ({len(rows)} comparisons; power {args.power:.2f}; "
          f"seeds per recipe for a two-sample t-test at alpha 0.05 and at 0.05/{len(rows)} = {strict:.5f})\n")
    print("| test set | recipe | seeds | gap | seed SD (recipe / baseline) | Welch p | Holm | permutation p | "
          f"seeds for the gap (0.05 / {strict:.4f}) | seeds for {args.effect:.2f} BLEU |")
    print("|---|---|---:|---:|---|---:|---:|---:|---|---|")
    for r in rows:
        observed = [count(seeds_needed(r["gap"], r["pooled"], a, args.power)) for a in (0.05, strict)]
        fixed = [count(seeds_needed(args.effect, r["pooled"], a, args.power)) for a in (0.05, strict)]
        print(f"| {r['test']} | {r['recipe']} | {r['n']} / {r['n_base']} | {r['gap']:+.2f} | "
              f"{r['sd']:.2f} / {r['sd_base']:.2f} | {r['p']:.4f} | {r['p_holm']:.4f} | {r['p_perm']:.4f} | "
              f"{' / '.join(observed)} | {' / '.join(fixed)} |")
    below = [r for r in rows if r["p_holm"] < 0.05]
    print(f"\n{len(below)} of {len(rows)} comparisons have Holm-adjusted Welch p < 0.05"
          + (": " + ", ".join(f"{r['recipe']} on {r['test']}" for r in below) if below else "") + ".")
    paired = [r for r in rows if r["p_paired"] is not None]
    if paired:
        strict = 0.05 / len(paired)  # the paired tests' own family: the rows with same-seed pairs
        print(f"\nPaired by seed (each recipe's run against `{study.baseline}`'s run of the same seed; "
              f"seeds for a paired t-test, power {args.power:.2f}, at 0.05 / {strict:.4f})\n")
        print("| test set | recipe | pairs | same-seed gap | its SD | paired p | Holm | "
              f"seeds for the gap | seeds for {args.effect:.2f} BLEU |")
        print("|---|---|---:|---:|---:|---:|---:|---|---|")
        for r in paired:
            observed = [count(seeds_needed(r["gap_paired"], r["sd_paired"], a, args.power, paired=True))
                        for a in (0.05, strict)]
            fixed = [count(seeds_needed(args.effect, r["sd_paired"], a, args.power, paired=True))
                     for a in (0.05, strict)]
            print(f"| {r['test']} | {r['recipe']} | {r['pairs']} | {r['gap_paired']:+.2f} | {r['sd_paired']:.2f} | "
                  f"{r['p_paired']:.4f} | {r['p_paired_holm']:.4f} | {' / '.join(observed)} | {' / '.join(fixed)} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
