"""Paired bootstrap, approximate randomisation and the sign test on cases with known answers."""

from __future__ import annotations

import random

import numpy as np
import pytest
from sacrebleu.metrics import BLEU

from structnmt.errors import DataError
from structnmt.evaluation.significance import (
    _bleu_exp,
    _Scorer,
    approximate_randomisation,
    paired_bootstrap,
    sign_test,
)


def corpus(n: int = 120, seed: int = 0) -> tuple[list[str], list[str], list[str]]:
    """References, a noisy system A, and B = A with every sentence improved a little."""
    rng = random.Random(seed)
    vocab = "the a cat dog sat ran on under mat house red big small".split()
    refs = [" ".join(rng.choices(vocab, k=rng.randint(5, 12))) for _ in range(n)]
    a, b = [], []
    for ref in refs:
        words = ref.split()
        wrong = rng.sample(range(len(words)), k=3)
        a.append(" ".join("xx" if i in wrong else w for i, w in enumerate(words)))
        b.append(" ".join("xx" if i in wrong[:1] else w for i, w in enumerate(words)))
    return refs, a, b


def test_vectorised_bleu_equals_sacrebleu_on_resampled_statistics():
    refs, a, _ = corpus()
    scorer = _Scorer("bleu")
    stats = scorer.stats(a, [refs])
    rng = np.random.default_rng(1)
    rows = np.stack([rng.multinomial(k, np.full(len(a), 1 / len(a))) for k in (1, 2, 5, 50, 120)]) @ stats
    expected = [BLEU()._compute_score_from_stats(row.tolist()).score for row in rows]
    assert _bleu_exp(rows, 4) == pytest.approx(expected, abs=1e-9)


def test_identical_systems():
    refs, a, _ = corpus()
    boot = paired_bootstrap(a, a, [refs], n_samples=300)
    assert boot.delta == 0 and boot.mean_delta == 0
    assert boot.p_value == pytest.approx(1.0)
    ar = approximate_randomisation(a, a, [refs], n_samples=300)
    assert ar.p_value == pytest.approx(1.0)


def test_system_better_on_every_sentence():
    refs, a, b = corpus()
    boot = paired_bootstrap(a, b, [refs], n_samples=1000, seed=3)
    assert boot.score_b > boot.score_a
    assert boot.score_a == pytest.approx(BLEU().corpus_score(a, [refs]).score)
    assert boot.p_value < 0.01
    assert boot.ci_low <= boot.delta <= boot.ci_high
    assert boot.ci_low > 0
    ar = approximate_randomisation(a, b, [refs], n_samples=1000, seed=3)
    assert ar.p_value < 0.01 and ar.delta == pytest.approx(boot.delta)
    # the other way round, B is never better than A
    assert paired_bootstrap(b, a, [refs], n_samples=200).p_value > 0.99


def test_bootstrap_is_reproducible_and_seeded():
    refs, a, b = corpus(40)
    b = b[:20] + a[20:]
    one = paired_bootstrap(a, b, [refs], n_samples=200, seed=7)
    two = paired_bootstrap(a, b, [refs], n_samples=200, seed=7)
    assert one == two
    assert paired_bootstrap(a, b, [refs], n_samples=200, seed=8).ci_low != one.ci_low


def test_ter_direction_and_chrf():
    refs, a, b = corpus()
    ter = paired_bootstrap(a, b, [refs], metric="ter", n_samples=200)
    assert ter.delta < 0 and ter.p_value < 0.01  # lower TER is better
    chrf = paired_bootstrap(a, b, [refs], metric="chrf", n_samples=200)
    assert chrf.delta > 0 and chrf.p_value < 0.01


def test_sign_test_values():
    assert sign_test(5, 0) == pytest.approx(0.0625)
    assert sign_test(0, 5) == pytest.approx(0.0625)
    assert sign_test(3, 3) == pytest.approx(1.0)
    # 9 wins of 10: 2 * (1 + 10) / 1024
    assert sign_test(9, 1) == pytest.approx(22 / 1024)
    assert sign_test(0, 0) == 1.0


def test_mismatched_systems_are_an_error():
    refs, a, b = corpus(10)
    with pytest.raises(DataError, match="system A has 10 hypotheses but system B has 9"):
        paired_bootstrap(a, b[:9], [refs])
    with pytest.raises(DataError, match="reference stream 1"):
        paired_bootstrap(a, b, [refs[:9]])
