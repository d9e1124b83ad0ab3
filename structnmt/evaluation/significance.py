"""Significance of a system against a baseline: sacreBLEU's paired tests, and what it lacks.

The paired tests are sacreBLEU's own (``sacrebleu.significance.PairedTest``, what
``sacrebleu REF -i BASE SYS --paired-bs`` / ``--paired-ar`` run), so a p-value here is the
one its command line prints for the same files and seed:

* paired bootstrap resampling (Koehn 2004, as Moses' ``bootstrap-hypothesis-difference-
  significance.pl``): ``p = (1 + #resamples whose centred |delta| exceeds the observed
  |delta|) / (n + 1)``;
* approximate randomisation (Riezler & Maxwell 2005): sentence outputs of the two systems
  swapped at random, ``p = (1 + #trials with |delta| > observed |delta|) / (n + 1)``.

Both are **two-sided**: a small p says the systems differ; the sign of ``delta`` says which
way. Both count only samples *strictly* beyond the observed difference (as MultEval, which
sacreBLEU follows), so ties never count: identical outputs, or outputs differing in a single
sentence under randomisation, get sacreBLEU's smallest p, ``1 / (n + 1)`` (the MultEval report
jhclark/multeval#5). :meth:`PairedResult.direction` calls a zero delta no difference; with
real test sets, where many sentences differ, exact ties are rare.

What sacreBLEU does not have is here: the sign test across test sets, combining several
training seeds of each system into one verdict (:func:`compare_seeds`), the seed-pooled
bootstrap of Clark et al. (2011) (:func:`pooled_bootstrap`), the Almost Stochastic Order test
across seeds of Dror et al. (2019) (:func:`aso_seeds`, with ``deepsig``), Holm's correction of a
family of p-values (:func:`holm`), and mean ± sd.

Conventions: the baseline comes first; ``delta = score(system) − score(baseline)``; "better"
means a higher score, except for TER where lower is better.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import math
import os
import statistics
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

import sacrebleu
from sacrebleu.significance import PairedTest

from structnmt.errors import DataError
from structnmt.evaluation.scores import make_metric, references_tokenised

TestType = Literal["bs", "ar"]
Verdict = Literal["better", "worse", "no significant difference"]


@dataclass
class PairedResult:
    """One system against the baseline on one test set (sacreBLEU's numbers)."""

    metric: str  # sacreBLEU's name of the metric: BLEU, chrF2, TER
    test: TestType  # "bs" paired bootstrap, "ar" approximate randomisation
    baseline_score: float
    system_score: float
    p_value: float  # two-sided
    n_samples: int
    seed: int
    higher_is_better: bool = True
    system_mean: float | None = None  # paired bootstrap: the system's mean over the resamples
    system_ci: float | None = None  # and the half-width of its 95% interval

    @property
    def delta(self) -> float:
        return self.system_score - self.baseline_score

    def direction(self, alpha: float = 0.05) -> Verdict:
        """"better" / "worse" when p < alpha and the score moved that way, else no difference."""
        if self.p_value >= alpha or self.delta == 0:
            return "no significant difference"
        return "better" if (self.delta > 0) == self.higher_is_better else "worse"

    def as_dict(self) -> dict:
        return {**asdict(self), "delta": self.delta}


# ---------------------------------------------------------------------------
# statistics computed once per process
#
# A study report tests every recipe against the baseline's runs on every test set, so the same
# references were n-grammed, the same runs' sentence statistics extracted and the same resamples
# scored once per comparison: most of a report's time. Cached here (keyed by the texts' digests
# and the metric's settings), the numbers are the same ones, computed once.

_MEMO: OrderedDict[tuple, Any] = OrderedDict()
_MEMO_SIZE = 512  # entries; one is a test set's references or one run's statistics (a few MB at most)
_memo_on = True


def _memo(key: tuple, compute: Callable[[], Any]) -> Any:
    if not _memo_on:
        return compute()
    if key in _MEMO:
        _MEMO.move_to_end(key)
        return _MEMO[key]
    value = _MEMO[key] = compute()
    if len(_MEMO) > _MEMO_SIZE:
        _MEMO.popitem(last=False)
    return value


@contextlib.contextmanager
def uncached() -> Iterator[None]:
    """Compute everything afresh inside (a benchmark's baseline; a test that the cache changes nothing)."""
    global _memo_on
    _memo_on, before = False, _memo_on
    try:
        yield
    finally:
        _memo_on = before


def _kept(kind: str, key: list, compute: Callable[[], Any], read: Callable[[Any], Any]) -> Any:
    """A result from disk by its exact inputs (``key``: texts as digests, every setting, the
    library's version), else computed and kept there. A study report makes some five hundred
    paired tests, about two seconds each; made again after one new record, only that record's
    rows are new. ``read`` rebuilds the value from its JSON; a file it cannot read is only a
    lost speed-up, computed again."""
    if not _memo_on:
        return compute()
    name = hashlib.blake2b(json.dumps([kind, *key]).encode(), digest_size=20).hexdigest()
    path = cache_dir() / "significance" / f"{name}.json"
    try:
        return read(json.loads(path.read_text(encoding="utf-8")))
    except (OSError, ValueError, TypeError, KeyError, AttributeError):
        pass
    value = compute()
    with contextlib.suppress(OSError):  # a read-only home: computed again next time
        from structnmt.io import atomic_write_text

        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(path, json.dumps(value, default=asdict))
    return value


def _digest(lines: Sequence[str | None]) -> bytes:
    h = hashlib.blake2b(digest_size=16)
    for line in lines:
        h.update(b"\1" if line is None else line.encode("utf-8", "surrogatepass") + b"\0")
    return h.digest()


def _metric(metric: str, tokenize: str | None):
    """sacreBLEU's metric object, its reference n-grams and sentence statistics memoised (what
    its paired tests and :func:`pooled_bootstrap` compute from)."""
    scorer = make_metric(metric, tokenize)
    extract, cache_references = scorer._extract_corpus_statistics, scorer._cache_references

    def references_of(references):
        if metric == "bleu":  # sacreBLEU's tokenised-period warning, withheld as corpus_scores does
            scorer._force = references_tokenised(references)
        key = ("refs", metric, tokenize, tuple(_digest(r) for r in references))
        ref_cache, num_refs = _memo(key, lambda: (cache_references(references), scorer.num_refs))
        scorer.num_refs = num_refs  # what sacreBLEU's own call leaves behind, for its signature
        return ref_cache

    def statistics_of(hypotheses, references):
        if not references:  # sacreBLEU's own reference cache: not ours to key
            return extract(hypotheses, references)
        key = ("stats", metric, tokenize, _digest(hypotheses), tuple(_digest(r) for r in references))
        references_of(references)
        return _memo(key, lambda: extract(hypotheses, references))

    scorer._cache_references = references_of
    scorer._extract_corpus_statistics = statistics_of
    return scorer


@contextlib.contextmanager
def _sacrebleu_seed(seed: int) -> Iterator[None]:
    """sacreBLEU's paired tests read their seed from ``SACREBLEU_SEED`` (its command line's only
    seed option); set it for the duration of one test and restore what was there."""
    if seed <= 0:
        # sacreBLEU treats a seed of 0 as "not fixed" (it draws fresh entropy): refuse it
        raise ValueError(f"the significance seed must be a positive integer, got {seed}")
    old = os.environ.get("SACREBLEU_SEED")
    os.environ["SACREBLEU_SEED"] = str(seed)
    try:
        yield
    finally:
        if old is None:
            del os.environ["SACREBLEU_SEED"]
        else:
            os.environ["SACREBLEU_SEED"] = old


def _check(baseline: Sequence[str], systems: Sequence[Sequence[str]], refs: Sequence[Sequence[str]]) -> None:
    if not baseline:
        raise DataError("no sentences to compare")
    for k, hyps in enumerate(systems, 1):
        if len(hyps) != len(baseline):
            raise DataError(f"the baseline has {len(baseline)} hypotheses but system {k} has {len(hyps)}")
    for k, ref in enumerate(refs, 1):
        if len(ref) != len(baseline):
            raise DataError(f"{len(baseline)} hypotheses but {len(ref)} lines in reference stream {k}")


def paired_tests(
    baseline: Sequence[str],
    systems: Sequence[Sequence[str]],
    refs: Sequence[Sequence[str]],
    metric: str = "bleu",
    test: TestType = "bs",
    n_samples: int = 1000,
    seed: int = 12345,
    tokenize: str | None = None,
) -> list[PairedResult]:
    """Each of ``systems`` against ``baseline`` with sacreBLEU's paired test, one call.

    ``refs`` are sacreBLEU's reference streams (``[ref_lines]`` for one reference). All
    systems share the seed, so they are tested on the same resamples (or swaps), exactly as
    ``sacrebleu REF -i BASE SYS1 SYS2 --paired-bs --paired-bs-n N`` with ``SACREBLEU_SEED``.
    """
    if test not in ("bs", "ar"):
        raise ValueError(f"test must be 'bs' or 'ar', not {test!r}")
    if metric not in ("bleu", "chrf", "ter"):
        raise ValueError(f"significance tests support bleu, chrf and ter, not {metric!r}")
    if not systems:
        return []
    _check(baseline, systems, refs)
    key = [metric, test, n_samples, seed, tokenize, sacrebleu.__version__, _digest(baseline).hex(),
           [_digest(h).hex() for h in systems], [_digest(r).hex() for r in refs]]
    return _kept("paired", key, lambda: _paired_tests(baseline, systems, refs, metric, test, n_samples, seed,
                                                      tokenize),
                 lambda kept: [PairedResult(**result) for result in kept])


def _paired_tests(baseline: Sequence[str], systems: Sequence[Sequence[str]], refs: Sequence[Sequence[str]],
                  metric: str, test: TestType, n_samples: int, seed: int, tokenize: str | None,
                  ) -> list[PairedResult]:
    named = [("baseline", list(baseline))] + [(f"system {k}", list(h)) for k, h in enumerate(systems, 1)]
    refs = [list(r) for r in refs]
    with _sacrebleu_seed(seed):
        paired = PairedTest(named, {metric: _metric(metric, tokenize)}, references=refs,
                            test_type=test, n_samples=n_samples)
        _signatures, table = paired()
    [name] = [k for k in table if k != "System"]
    base, *results = table[name]
    return [PairedResult(metric=name, test=test, baseline_score=float(base.score), system_score=float(r.score),
                         p_value=float(r.p_value), n_samples=paired.n_samples, seed=seed,
                         higher_is_better=metric != "ter",
                         system_mean=float(r.mean) if r.mean is not None else None,
                         system_ci=float(r.ci) if r.ci is not None else None)
            for r in results]


def paired_bootstrap(baseline: Sequence[str], system: Sequence[str], refs: Sequence[Sequence[str]],
                     metric: str = "bleu", n_samples: int = 1000, seed: int = 12345,
                     tokenize: str | None = None) -> PairedResult:
    """sacreBLEU's paired bootstrap resampling of one system against the baseline."""
    return paired_tests(baseline, [system], refs, metric, "bs", n_samples, seed, tokenize)[0]


def approximate_randomisation(baseline: Sequence[str], system: Sequence[str], refs: Sequence[Sequence[str]],
                              metric: str = "bleu", n_samples: int = 10000, seed: int = 12345,
                              tokenize: str | None = None) -> PairedResult:
    """sacreBLEU's paired approximate randomisation of one system against the baseline."""
    return paired_tests(baseline, [system], refs, metric, "ar", n_samples, seed, tokenize)[0]


# ---------------------------------------------------------------------------
# what sacreBLEU lacks


def sign_test(wins: int, losses: int) -> float:
    """Exact two-sided sign test across test sets: p of a win/loss split at least this uneven
    under p = 0.5. Ties are left out before calling (the usual convention). E.g. 5 wins,
    0 losses: ``2 · 0.5^5 = 0.0625``.
    """
    if wins < 0 or losses < 0:
        raise ValueError("wins and losses must not be negative")
    n = wins + losses
    if n == 0:
        return 1.0
    k = min(wins, losses)
    tail = sum(math.comb(n, i) for i in range(k + 1)) / 2**n
    return min(1.0, 2.0 * tail)


def holm(p_values: Sequence[float]) -> list[float]:
    """Holm–Bonferroni adjusted p-values (Holm 1979), in the order given.

    The i-th smallest of m p-values is multiplied by ``m − i + 1`` (capped at 1), and each adjusted
    p is at least the one before it in that order (step-down), so rejecting the hypotheses whose
    adjusted p is below alpha keeps the chance of any false rejection in the family at most alpha,
    whatever the dependence between the tests. E.g. ``[0.01, 0.04, 0.03, 0.005]`` gives
    ``[0.03, 0.06, 0.06, 0.02]``.
    """
    for p in p_values:
        if not 0.0 <= p <= 1.0:  # NaN fails too
            raise ValueError(f"a p-value must lie in [0, 1], got {p}")
    m = len(p_values)
    adjusted = [0.0] * m
    running = 0.0
    for rank, i in enumerate(sorted(range(m), key=lambda i: p_values[i])):
        running = max(running, min(1.0, (m - rank) * p_values[i]))
        adjusted[i] = running
    return adjusted


def order_by_chance(k: int, n: int) -> float:
    """The chance that every one of ``k`` scores lies above every one of ``n`` others when all
    ``k + n`` are draws of one distribution (no ties): ``1 / C(k + n, k)``; 3 against 3 seeds: 1/20.
    What ASO's ε = 0 amounts to with few seeds."""
    if k < 1 or n < 1:
        raise ValueError("need at least one score on each side")
    return 1.0 / math.comb(k + n, k)


def mean_sd(values: Sequence[float]) -> tuple[float, float]:
    """Mean and sample standard deviation (n − 1); the sd of a single value is NaN, not 0:
    one seed says nothing about the spread."""
    if not values:
        raise ValueError("no values")
    sd = statistics.stdev(values) if len(values) > 1 else math.nan
    return statistics.fmean(values), sd


def format_mean_sd(values: Sequence[float], digits: int = 2) -> str:
    """``"36.42 ± 0.31 (3 seeds)"``; ``"36.42 (1 seed)"`` for one value."""
    mean, sd = mean_sd(values)
    n = len(values)
    spread = "" if math.isnan(sd) else f" ± {sd:.{digits}f}"
    return f"{mean:.{digits}f}{spread} ({n} seed{'s' if n != 1 else ''})"


def format_p(p: float, alpha: float = 0.05, digits: int = 4) -> str:
    """A p-value with ``digits`` decimals, or as many more as keep it on its side of ``alpha``.

    A bootstrap with 1,000 resamples gives p = 50/1001 = 0.04995, which four decimals print as
    0.0500: a reader comparing it with 0.05 would take a significant result for one that is not.
    """
    for places in range(digits, 10):
        text = f"{p:.{places}f}"
        if (float(text) < alpha) == (p < alpha):
            return text
    return repr(p)


#: how :func:`compare_seeds` decides; returned with every verdict, for reports
SEED_RULE = ("better: every seed pair (each system seed against each baseline seed) has the system above "
             "the baseline with p < {alpha} (sacreBLEU paired bootstrap, {n} resamples, seed {seed}, "
             "two-sided); worse: every pair has it below with p < {alpha}; otherwise no significant "
             "difference.")


@dataclass
class SeedComparison:
    """A system's seeds against a baseline's seeds on one test set."""

    verdict: Verdict
    rule: str  # the rule that gave the verdict, in words
    pairs: list[tuple[int, int, PairedResult]]  # (system seed index, baseline seed index, result)
    system_scores: list[float] = field(default_factory=list)
    baseline_scores: list[float] = field(default_factory=list)

    def summary(self) -> str:
        """One line for a report: both means ± sd and the verdict."""
        return (f"system {format_mean_sd(self.system_scores)} vs baseline "
                f"{format_mean_sd(self.baseline_scores)}: {self.verdict}")


def compare_seeds(
    system_runs: Sequence[Sequence[str]],
    baseline_runs: Sequence[Sequence[str]],
    refs: Sequence[Sequence[str]],
    metric: str = "bleu",
    n_samples: int = 1000,
    seed: int = 12345,
    alpha: float = 0.05,
    tokenize: str | None = None,
) -> SeedComparison:
    """Is a system better than the baseline on one test set, over training seeds?

    ``system_runs`` and ``baseline_runs`` hold one hypothesis list per training seed; the
    counts may differ. Every system seed is tested against every baseline seed with
    sacreBLEU's paired bootstrap (same resamples for all pairs). The verdict follows
    :data:`SEED_RULE`: "better" only if *every* pair is significantly better, "worse" only if
    every pair is significantly worse, else "no significant difference". Requiring all pairs
    is an intersection-union test, so a "better" verdict is wrong at most ``alpha`` of the
    time when the system is not better; the price is power: one unlucky seed pair is enough
    to withhold the verdict. With one seed on each side it is the plain paired bootstrap.
    """
    if not system_runs or not baseline_runs:
        raise DataError("need at least one seed of the system and one of the baseline")
    pairs: list[tuple[int, int, PairedResult]] = []
    for b, base in enumerate(baseline_runs):
        results = paired_tests(base, system_runs, refs, metric, "bs", n_samples, seed, tokenize)
        pairs += [(s, b, r) for s, r in enumerate(results)]
    directions = {r.direction(alpha) for _, _, r in pairs}
    verdict: Verdict = directions.pop() if len(directions) == 1 else "no significant difference"
    first_per_system = {s: r.system_score for s, _, r in pairs}
    first_per_baseline = {b: r.baseline_score for _, b, r in pairs}
    return SeedComparison(
        verdict=verdict, rule=SEED_RULE.format(alpha=alpha, n=n_samples, seed=seed), pairs=pairs,
        system_scores=[first_per_system[s] for s in range(len(system_runs))],
        baseline_scores=[first_per_baseline[b] for b in range(len(baseline_runs))],
    )


@dataclass
class PooledResult:
    """The seeds' mean score of a system against the baseline's, by one bootstrap over sentences."""

    metric: str
    system_mean: float  # mean over the system's seeds of each seed's corpus score
    baseline_mean: float
    p_value: float  # two-sided
    n_samples: int
    seed: int
    seeds: tuple[int, int]  # (system seeds, baseline seeds)

    @property
    def delta(self) -> float:
        return self.system_mean - self.baseline_mean


def pooled_bootstrap(system_runs: Sequence[Sequence[str]], baseline_runs: Sequence[Sequence[str]],
                     refs: Sequence[Sequence[str]], metric: str = "bleu", n_samples: int = 1000,
                     seed: int = 12345, tokenize: str | None = None) -> PooledResult:
    """Paired bootstrap of the mean over training seeds (Clark et al. 2011, as MultEval does):
    every resample of the test sentences is scored for every seed of both systems, and the
    statistic is the difference of the two means. Pooling the seeds tests whether the methods
    differ on average, with more power than asking every seed pair to agree
    (:func:`compare_seeds`); it does not make one seed's luck count less, only more seeds do.

    With one seed on each side it is sacreBLEU's paired bootstrap, resample for resample (the
    same generator, the same centring, the same count), so the p-values are the same; sacreBLEU's
    own sentence statistics (``Metric._extract_corpus_statistics``, which its paired tests use)
    make each resample's score the corpus score of those sentences. One exception: equal means
    get p = 1, not sacreBLEU's smallest p (its ties never count, so identical systems would read
    as the most significant difference in a report's Holm family and its † marks).
    """
    import numpy as np

    if not system_runs or not baseline_runs:
        raise DataError("need at least one seed of the system and one of the baseline")
    for hyps in system_runs[1:]:
        _check(system_runs[0], [hyps], [])
    _check(system_runs[0], baseline_runs, refs)
    if seed <= 0:
        raise ValueError(f"the significance seed must be a positive integer, got {seed}")
    key = [metric, n_samples, seed, tokenize, sacrebleu.__version__, np.__version__,
           [_digest(h).hex() for h in system_runs], [_digest(h).hex() for h in baseline_runs],
           [_digest(r).hex() for r in refs]]
    result = _kept("pooled", key, lambda: _pooled_bootstrap(system_runs, baseline_runs, refs, metric, n_samples,
                                                            seed, tokenize),
                   lambda kept: PooledResult(**{**kept, "seeds": tuple(kept["seeds"])}))
    if abs(result.delta) < 1e-9:  # equal up to float sums; applied to kept results too
        result.p_value = 1.0
    return result


def _pooled_bootstrap(system_runs: Sequence[Sequence[str]], baseline_runs: Sequence[Sequence[str]],
                      refs: Sequence[Sequence[str]], metric: str, n_samples: int, seed: int,
                      tokenize: str | None) -> PooledResult:
    import numpy as np

    scorer = _metric(metric, tokenize)
    refs = [list(r) for r in refs]
    n = len(system_runs[0])
    idxs = np.random.default_rng(seed).choice(n, size=(n_samples, n), replace=True)

    def one_run(hyps: list[str]) -> tuple[float, list[float]]:
        stats = scorer._extract_corpus_statistics(hyps, refs)
        array = np.array(stats, dtype="float32")
        return (scorer._aggregate_and_compute(stats).score,
                [scorer._compute_score_from_stats(s.sum(0)).score for s in array[idxs]])

    refs_key = tuple(_digest(r) for r in refs)  # once per call, not once per run

    def scores(runs: Sequence[Sequence[str]]) -> tuple[float, np.ndarray]:
        observed, samples = [], []
        for hyps in runs:
            hyps = list(hyps)
            key = ("resampled", metric, tokenize, _digest(hyps), refs_key, seed, n_samples)
            score, resampled = _memo(key, lambda hyps=hyps: one_run(hyps))
            observed.append(score)
            samples.append(resampled)
        return float(np.mean(observed)), np.mean(np.array(samples), axis=0)

    sys_mean, sys_samples = scores(system_runs)
    base_mean, base_samples = scores(baseline_runs)
    diffs = np.abs(sys_samples - base_samples)
    beyond = int(np.sum(diffs - diffs.mean() > abs(sys_mean - base_mean)))
    return PooledResult(metric={"bleu": "BLEU", "chrf": "chrF2", "ter": "TER"}[metric], system_mean=sys_mean,
                        baseline_mean=base_mean, p_value=(beyond + 1) / (n_samples + 1), n_samples=n_samples,
                        seed=seed, seeds=(len(system_runs), len(baseline_runs)))


#: what :func:`aso_seeds` asks, in words, for reports
ASO_RULE = ("\"ASO ε\": the Almost Stochastic Order test (Dror et al. 2019, with `deepsig`: {n} bootstrap "
            "iterations, seed {seed}, confidence {confidence}) on BLEU per seed, seeds taken as draws of a "
            "training. It asks whether training one recipe gives better models than training the other: ε is "
            "an upper bound on the share of the two score distributions (the area between their quantile "
            "functions) where the first lies below the second. Given both ways, recipe over baseline / "
            "baseline over recipe: ε < 0.5 on the left, the recipe's trainings almost stochastically dominate "
            "the baseline's (0: everywhere above); on the right, the baseline's dominate; both ≥ 0.5, neither "
            "order is shown. It needs two seeds a side, and with two or three the bound is loose.")


def cache_dir() -> Path:
    """Where structnmt keeps what it computed and may need again (``STRUCTNMT_CACHE_DIR``, else
    ``$XDG_CACHE_HOME/structnmt``, else ``~/.cache/structnmt``)."""
    if os.environ.get("STRUCTNMT_CACHE_DIR"):
        return Path(os.environ["STRUCTNMT_CACHE_DIR"])
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "structnmt"


#: ASO ε already computed, by exact inputs and deepsig's version: a study's report asks for
#: about a hundred (each a second or more of deepsig's bootstrap, 600 of the first study's
#: 740 s), and a report made again after one new record needs only that record's rows anew
_ASO_DISK: dict[str, float] | None = None


def _aso_file() -> Path:
    return cache_dir() / "aso.json"


def _quantile_function(scores: Sequence[float]) -> Callable[[Any], Any]:
    """deepsig's empirical quantile function (``deepsig.aso.get_quantile_function``: the sorted
    score at index ceil(n·p) − 1, clipped to the ends), the same values for the same p, as one
    array operation. deepsig's wraps a Python function that sorts the scores again for each p in
    ``np.vectorize``: ten million calls and 90% of a study report's time."""
    import numpy as np

    cdf = np.sort(np.asarray(scores))
    last = len(cdf) - 1

    def quantile(p: Any) -> Any:
        return cdf[np.clip(np.ceil(len(cdf) * np.asarray(p)).astype(np.int64) - 1, 0, last)]

    return quantile


@contextlib.contextmanager
def _fast_deepsig_quantiles() -> Iterator[None]:
    """deepsig's ASO with :func:`_quantile_function` in place of its own, for the calls inside
    (it looks the function up in its module at each use; ``num_jobs=1`` keeps them in-process)."""
    import sys

    import deepsig  # noqa: F401  (``deepsig.aso`` is the function; its module is in sys.modules)

    module = sys.modules["deepsig.aso"]
    own = module.get_quantile_function
    module.get_quantile_function = _quantile_function
    try:
        yield
    finally:
        module.get_quantile_function = own


@functools.lru_cache(maxsize=4096)
def _aso(system: tuple[float, ...], baseline: tuple[float, ...], seed: int, n_bootstrap: int,
         confidence: float) -> float:
    import importlib.metadata
    import warnings

    from deepsig import aso

    global _ASO_DISK
    key = json.dumps([list(system), list(baseline), seed, n_bootstrap, confidence,
                      importlib.metadata.version("deepsig")])
    if _ASO_DISK is None:
        try:
            _ASO_DISK = {k: float(v) for k, v in json.loads(_aso_file().read_text(encoding="utf-8")).items()}
        except (OSError, ValueError, TypeError, AttributeError):  # absent or damaged: only a lost speed-up
            _ASO_DISK = {}
    if key in _ASO_DISK:
        return _ASO_DISK[key]
    with warnings.catch_warnings(), _fast_deepsig_quantiles():  # equal scores on both sides: 0/0, which
        warnings.simplefilter("ignore", UserWarning)                 # it warns about and returns as NaN
        epsilon = float(aso(list(system), list(baseline), confidence_level=confidence,
                            num_bootstrap_iterations=n_bootstrap, num_jobs=1, show_progress=False, seed=seed))
    _ASO_DISK[key] = epsilon
    with contextlib.suppress(OSError):  # a read-only home: computed again next time
        from structnmt.io import atomic_write_text

        _aso_file().parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(_aso_file(), json.dumps(_ASO_DISK, sort_keys=True))
    return epsilon


def aso_seeds(system_scores: Sequence[float], baseline_scores: Sequence[float], seed: int = 12345,
              n_bootstrap: int = 1000, confidence: float = 0.95) -> tuple[float, float] | None:
    """ε_min of the Almost Stochastic Order test (Dror et al. 2019, as ``deepsig.aso``) of a
    system's scores over training seeds against the baseline's: is the system's distribution of
    trained models (almost) stochastically larger? Unlike the bootstraps above, which resample
    test sentences of fixed trainings, it compares the trainings; None with fewer than two
    seeds on a side, where there is no distribution to compare. Both ways, (system over baseline,
    baseline over system): a large ε one way does not show the other order, only a small one does.
    The seed makes it repeatable."""
    if len(system_scores) < 2 or len(baseline_scores) < 2:
        return None
    ours, theirs = tuple(float(s) for s in system_scores), tuple(float(b) for b in baseline_scores)
    both = (_aso(ours, theirs, seed, n_bootstrap, confidence), _aso(theirs, ours, seed, n_bootstrap, confidence))
    return None if any(math.isnan(e) for e in both) else both
