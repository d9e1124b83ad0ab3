"""ASO ε (the report's seed-level test): deepsig's own quantile function against structnmt's array one.

    python benchmarks/bench_aso.py                  # 12 comparisons of 3-5 seeds, 1,000 bootstrap iterations
    python benchmarks/bench_aso.py --smoke          # 2 comparisons, 50 iterations

``deepsig.aso`` draws each bootstrap sample through an empirical quantile function that it wraps
in ``np.vectorize``: a Python call, and a sort of the scores, for every point of every sample
(about 400,000 calls per ε). ``structnmt.evaluation.significance`` swaps in one array operation
that returns the same values; both ways run here on the same score lists, alternately
``--rounds`` times, the fastest round of each counts, and every ε must be identical.
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import common  # noqa: E402


def score_lists(pairs: int) -> list[tuple[list[float], list[float]]]:
    """BLEU-like scores of 3 to 5 seeds a side, as a study's report compares them."""
    rng = random.Random(7)
    return [([round(rng.gauss(30.0, 0.4), 2) for _ in range(rng.randint(3, 5))],
             [round(rng.gauss(29.8, 0.4), 2) for _ in range(rng.randint(3, 5))]) for _ in range(pairs)]


def epsilons(pairs: list[tuple[list[float], list[float]]], iterations: int, fast: bool) -> tuple[float, list[float]]:
    import contextlib
    import warnings

    from deepsig import aso

    from structnmt.evaluation.significance import _fast_deepsig_quantiles

    start = time.perf_counter()
    with warnings.catch_warnings(), _fast_deepsig_quantiles() if fast else contextlib.nullcontext():
        warnings.simplefilter("ignore", UserWarning)
        out = [float(aso(a, b, num_bootstrap_iterations=iterations, num_jobs=1, show_progress=False, seed=12345))
               for a, b in pairs]
    return time.perf_counter() - start, out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--smoke", action="store_true", help="2 comparisons of 50 iterations: checks the script")
    parser.add_argument("--pairs", type=int, default=12)
    parser.add_argument("--iterations", type=int, default=1000, help="deepsig's num_bootstrap_iterations")
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    pairs, iterations, rounds = (2, 50, 1) if args.smoke else (args.pairs, args.iterations, args.rounds)
    data = score_lists(pairs)
    times: dict[str, list[float]] = {"deepsig's own": [], "array": []}
    results: dict[str, list[float]] = {}
    for _ in range(rounds):
        for way in times:
            seconds, eps = epsilons(data, iterations, fast=way == "array")
            times[way].append(seconds)
            if results.setdefault(way, eps) != eps:
                sys.exit(f"error: two rounds of {way} gave different ε")
    if results["array"] != results["deepsig's own"]:
        sys.exit(f"error: the ε differ: {results}")
    best = {way: min(t) for way, t in times.items()}
    rows = [[way, f"{best[way]:.2f}", " ".join(f"{t:.2f}" for t in times[way])] for way in times]
    table = common.markdown_table(["quantile function", "fastest round (s)", "rounds (s)"], rows)
    ratio = best["deepsig's own"] / best["array"]
    print(table)
    print(f"array: {ratio:.1f}x faster than deepsig's own; {len(data)} ε identical")
    if args.smoke:
        print("smoke: ASO measured both ways")
        return
    what = f"deepsig.aso on {len(data)} pairs of 3-5 seeds, {iterations} bootstrap iterations, num_jobs=1"
    sections = [("What", what), ("Time", table + f"\n\nSpeed-up: **{ratio:.1f}x**, every ε identical.")]
    path = common.write_report("aso", "ASO ε: deepsig's quantile function against an array one", sections,
                               common.machine())
    print(f"written to {path}")


if __name__ == "__main__":
    main()
