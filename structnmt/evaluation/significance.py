"""Significance tests for comparing two systems (and many test sets).

* :func:`paired_bootstrap` — Koehn (2004): resample test sentences with replacement and
  count how often system B fails to beat system A.
* :func:`approximate_randomisation` — Riezler & Maxwell (2005): randomly swap the two
  systems' outputs sentence by sentence and count how often the difference is as large as the
  one observed.
* :func:`sign_test` — across test sets: an exact two-sided binomial test on wins/losses.

Corpus metrics (BLEU, chrF, TER) are not averages of sentence scores, so each sample is
scored from *summed sufficient statistics*: sacreBLEU's per-sentence statistics are extracted
once, and a sample's corpus statistics are a (count-weighted) sum of them, computed for all
samples at once with one matrix product. BLEU is then computed vectorised; chrF and TER go
through sacreBLEU's own ``_compute_score_from_stats`` per sample (cheap: no text is touched).

Conventions: ``delta = score(B) − score(A)``; A is the baseline. "B better" means a higher
score, except for TER where lower is better.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass

import numpy as np

from structnmt.errors import DataError
from structnmt.evaluation.scores import make_metric

_CHUNK = 200  # samples scored per matrix product (bounds memory for large test sets)


@dataclass
class PairedResult:
    metric: str
    score_a: float
    score_b: float
    delta: float  # observed score_b - score_a
    p_value: float
    n_samples: int
    mean_delta: float | None = None  # bootstrap only
    ci_low: float | None = None  # bootstrap only: 2.5th percentile of the sampled deltas
    ci_high: float | None = None  # bootstrap only: 97.5th percentile

    def as_dict(self) -> dict:
        return asdict(self)


class _Scorer:
    """Per-sentence sufficient statistics of one metric, and corpus scores of summed stats."""

    def __init__(self, metric: str, tokenize: str | None = None):
        if metric not in ("bleu", "chrf", "ter"):
            raise ValueError(f"significance tests support bleu, chrf and ter, not {metric!r}")
        self.name = metric
        self.metric = make_metric(metric, tokenize)
        self.higher_is_better = metric != "ter"

    def stats(self, hyps: Sequence[str], refs: Sequence[Sequence[str]]) -> np.ndarray:
        for k, ref in enumerate(refs):
            if len(ref) != len(hyps):
                raise DataError(f"{len(hyps)} hypotheses but {len(ref)} lines in reference stream {k + 1}")
        stats = self.metric._extract_corpus_statistics(list(hyps), [list(r) for r in refs])
        return np.asarray(stats, dtype=np.float64)

    def scores(self, summed: np.ndarray) -> np.ndarray:
        """Corpus scores of each row of summed statistics, shape (S, k) -> (S,)."""
        summed = np.atleast_2d(summed)
        if self.name == "bleu" and self.metric.smooth_method == "exp" and not self.metric.effective_order:
            return _bleu_exp(summed, self.metric.max_ngram_order)
        return np.array([self.metric._compute_score_from_stats(row.tolist()).score for row in summed])


def _bleu_exp(stats: np.ndarray, order: int) -> np.ndarray:
    """sacreBLEU's corpus BLEU (default 'exp' smoothing) for many stat rows at once.

    Rows hold ``[sys_len, ref_len, correct_1..n, total_1..n]``. Mirrors
    ``BLEU.compute_bleu``: the m-th order with zero matches gets precision
    ``100 / (2^m · total)``; an order with no n-grams at all, or no match of any order, gives 0.
    """
    sys_len, ref_len = stats[:, 0], stats[:, 1]
    correct, total = stats[:, 2:2 + order], stats[:, 2 + order:2 + 2 * order]
    zero = correct == 0
    halvings = np.cumsum(zero, axis=1)
    safe_total = np.where(total > 0, total, 1.0)
    precision = np.where(zero, 100.0 / (2.0 ** halvings * safe_total), 100.0 * correct / safe_total)
    log_mean = np.log(precision).mean(axis=1)
    with np.errstate(divide="ignore", over="ignore"):
        bp = np.where(sys_len < ref_len, np.exp(1.0 - ref_len / np.where(sys_len > 0, sys_len, 1.0)), 1.0)
    bp = np.where(sys_len > 0, bp, 0.0)
    score = bp * np.exp(log_mean)
    degenerate = (total == 0).any(axis=1) | (correct.sum(axis=1) == 0)
    return np.where(degenerate, 0.0, score)


def _check_pair(hyps_a: Sequence[str], hyps_b: Sequence[str]) -> None:
    if len(hyps_a) != len(hyps_b):
        raise DataError(f"system A has {len(hyps_a)} hypotheses but system B has {len(hyps_b)}")
    if not hyps_a:
        raise DataError("no sentences to compare")


def paired_bootstrap(
    hyps_a: Sequence[str],
    hyps_b: Sequence[str],
    refs: Sequence[Sequence[str]],
    metric: str = "bleu",
    n_samples: int = 1000,
    seed: int = 12345,
    tokenize: str | None = None,
) -> PairedResult:
    """Paired bootstrap resampling (Koehn 2004): is B better than baseline A?

    Draws ``n_samples`` test sets of the same size with replacement (the same draw for both
    systems) and scores both on each. ``p_value = (#samples where B is not better + 1) /
    (n_samples + 1)``, the one-sided test with the usual +1 correction, so it is never 0.
    The 95% interval is the percentile interval of the sampled deltas.
    """
    _check_pair(hyps_a, hyps_b)
    scorer = _Scorer(metric, tokenize)
    stats_a, stats_b = scorer.stats(hyps_a, refs), scorer.stats(hyps_b, refs)
    score_a = float(scorer.scores(stats_a.sum(0))[0])
    score_b = float(scorer.scores(stats_b.sum(0))[0])
    n = len(hyps_a)
    rng = np.random.default_rng(seed)
    deltas = np.empty(n_samples)
    for start in range(0, n_samples, _CHUNK):
        size = min(_CHUNK, n_samples - start)
        counts = rng.multinomial(n, np.full(n, 1.0 / n), size=size).astype(np.float64)
        deltas[start:start + size] = scorer.scores(counts @ stats_b) - scorer.scores(counts @ stats_a)
    not_better = deltas <= 0 if scorer.higher_is_better else deltas >= 0
    low, high = np.percentile(deltas, [2.5, 97.5])
    return PairedResult(
        metric=metric, score_a=score_a, score_b=score_b, delta=score_b - score_a,
        p_value=float((not_better.sum() + 1) / (n_samples + 1)), n_samples=n_samples,
        mean_delta=float(deltas.mean()), ci_low=float(low), ci_high=float(high),
    )


def approximate_randomisation(
    hyps_a: Sequence[str],
    hyps_b: Sequence[str],
    refs: Sequence[Sequence[str]],
    metric: str = "bleu",
    n_samples: int = 1000,
    seed: int = 12345,
    tokenize: str | None = None,
) -> PairedResult:
    """Approximate randomisation (Riezler & Maxwell 2005), two-sided.

    Under the null hypothesis the two systems are exchangeable, so each sentence's pair of
    outputs is swapped with probability 0.5; ``p = (#shuffles with |delta| >= |observed| + 1)
    / (n_samples + 1)``.
    """
    _check_pair(hyps_a, hyps_b)
    scorer = _Scorer(metric, tokenize)
    stats_a, stats_b = scorer.stats(hyps_a, refs), scorer.stats(hyps_b, refs)
    sum_a, sum_b = stats_a.sum(0), stats_b.sum(0)
    score_a, score_b = float(scorer.scores(sum_a)[0]), float(scorer.scores(sum_b)[0])
    observed = abs(score_b - score_a)
    diff = stats_b - stats_a
    rng = np.random.default_rng(seed)
    count = 0
    for start in range(0, n_samples, _CHUNK):
        size = min(_CHUNK, n_samples - start)
        swap = (rng.random((size, len(hyps_a))) < 0.5).astype(np.float64)
        moved = swap @ diff  # what swapping moves from B's sums to A's
        shuffled = np.abs(scorer.scores(sum_b - moved) - scorer.scores(sum_a + moved))
        # a tiny tolerance so that exact ties (identical systems) count as "as large"
        count += int((shuffled >= observed - 1e-9).sum())
    return PairedResult(
        metric=metric, score_a=score_a, score_b=score_b, delta=score_b - score_a,
        p_value=(count + 1) / (n_samples + 1), n_samples=n_samples,
    )


def sign_test(wins: int, losses: int) -> float:
    """Exact two-sided sign test: p of a win/loss split at least this uneven under p=0.5.

    Ties are left out before calling (the usual convention). E.g. 5 wins, 0 losses:
    ``2 · 0.5^5 = 0.0625``.
    """
    if wins < 0 or losses < 0:
        raise ValueError("wins and losses must not be negative")
    n = wins + losses
    if n == 0:
        return 1.0
    k = min(wins, losses)
    tail = sum(math.comb(n, i) for i in range(k + 1)) / 2**n
    return min(1.0, 2.0 * tail)
