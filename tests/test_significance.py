"""sacreBLEU's paired tests as we call them, the seed verdict, the sign test, mean ± sd."""

from __future__ import annotations

import json
import math
import os
import random
import subprocess
import sys

import pytest
from sacrebleu.metrics import BLEU

from structnmt.errors import DataError
from structnmt.evaluation.significance import (
    compare_seeds,
    format_mean_sd,
    mean_sd,
    paired_bootstrap,
    paired_tests,
    pooled_bootstrap,
    sign_test,
)

# hand-written: a reference, a baseline and two systems (one a line better, one far better)
REF = """the cat sat on the mat
a dog runs in the park
the house at the corner is big
it rains in the city today
she reads a book in the garden
two men play football on the grass
a woman sells fruit at the market
the children swim in the lake
an old man walks with his dog
a girl rides a red bicycle
the bus stops in front of the school
a boy throws a ball to his father
people wait for the train
the chef cooks soup in a large pot
a cyclist climbs the steep hill
the band plays music on the stage
""".splitlines()
BASE = """the cat sat on mat
a dog run in the park
the house on the corner is large
it rains in city today
she reads book in garden
two man play football on grass
a woman sell fruits at market
the children swims in lake
an old man walk with the dog
a girl ride a red bike
the bus stop in front of school
a boy throw the ball to father
people waits for train
the cook cooks soup in big pot
a cyclist climb the hill
the band play music on stage
""".splitlines()
NEAR = BASE[:14] + ["a cyclist climbs the hill"] + BASE[15:]  # one line better
GOOD = """the cat sat on the mat
a dog runs in the park
the house at the corner is big
it rains in the city
she reads a book in the garden
two men play football on grass
a woman sells fruit at the market
the children swim in the lake
an old man walks with the dog
a girl rides a red bike
the bus stops in front of the school
a boy throws a ball to his father
people wait for the train
the cook cooks soup in a large pot
a cyclist climbs the hill
the band plays music on the stage
""".splitlines()


def cli(tmp_path, test: str, seed: int, n: int) -> list[dict]:
    """sacreBLEU's own command line on the files, as a user would run it."""
    names = {"ref": REF, "base": BASE, "near": NEAR, "good": GOOD}
    for name, lines in names.items():
        (tmp_path / name).write_text("\n".join(lines) + "\n", encoding="utf-8")
    env = {**os.environ, "SACREBLEU_SEED": str(seed)}
    out = subprocess.run(
        [sys.executable, "-m", "sacrebleu", "ref", "-i", "base", "near", "good", f"--paired-{test}",
         f"--paired-{test}-n", str(n), "-m", "bleu", "-f", "json"],
        cwd=tmp_path, env=env, capture_output=True, text=True, check=True)
    return [row["BLEU"] for row in json.loads(out.stdout)]


@pytest.mark.parametrize("test, seed", [("bs", 12345), ("bs", 7), ("ar", 12345)])
def test_p_values_equal_sacrebleus_command_line(tmp_path, test, seed):
    expected = cli(tmp_path, test, seed, 1000)
    ours = paired_tests(BASE, [NEAR, GOOD], [REF], test=test, n_samples=1000, seed=seed)
    assert [r.baseline_score for r in ours] == [expected[0]["score"]] * 2
    assert [r.system_score for r in ours] == [row["score"] for row in expected[1:]]
    assert [r.p_value for r in ours] == [row["p_value"] for row in expected[1:]]
    assert ours[1].p_value == pytest.approx(1 / 1001)  # far better: sacreBLEU's smallest p
    if test == "bs":
        assert ours[0].p_value > 0.05  # one line better on 16: the bootstrap cannot tell
        assert [r.system_mean for r in ours] == [row["mean"] for row in expected[1:]]
        # one system at a time gives the same as both at once (same resamples)
        assert paired_bootstrap(BASE, NEAR, [REF], n_samples=1000, seed=seed).p_value == ours[0].p_value
    else:
        # approximate randomisation counts only shuffles strictly beyond the observed |delta|;
        # with one differing line every shuffle ties, so sacreBLEU gives its smallest p
        assert ours[0].p_value == pytest.approx(1 / 1001)


def test_seed_is_restored_and_zero_refused(monkeypatch):
    monkeypatch.setenv("SACREBLEU_SEED", "99")
    paired_bootstrap(BASE, GOOD, [REF], n_samples=50, seed=3)
    assert os.environ["SACREBLEU_SEED"] == "99"
    monkeypatch.delenv("SACREBLEU_SEED")
    paired_bootstrap(BASE, GOOD, [REF], n_samples=50, seed=3)
    assert "SACREBLEU_SEED" not in os.environ
    with pytest.raises(ValueError, match="positive"):
        paired_bootstrap(BASE, GOOD, [REF], n_samples=50, seed=0)


def test_direction_and_ter():
    good = paired_bootstrap(BASE, GOOD, [REF], n_samples=300)
    assert good.delta == pytest.approx(BLEU().corpus_score(GOOD, [REF]).score - BLEU().corpus_score(BASE, [REF]).score)
    assert good.direction() == "better"
    assert paired_bootstrap(GOOD, BASE, [REF], n_samples=300).direction() == "worse"
    assert paired_bootstrap(BASE, NEAR, [REF], n_samples=300).direction() == "no significant difference"
    # identical outputs: sacreBLEU's strict count gives its smallest p, but there is no difference
    same = paired_bootstrap(BASE, BASE, [REF], n_samples=300)
    assert same.p_value == pytest.approx(1 / 301) and same.direction() == "no significant difference"
    ter = paired_bootstrap(BASE, GOOD, [REF], metric="ter", n_samples=300)
    assert ter.delta < 0 and ter.direction() == "better"  # lower TER is better


def noisy(refs: list[str], wrong: int, seed: int) -> list[str]:
    """Each reference with ``wrong`` of its words replaced: a system of a given quality."""
    rng = random.Random(seed)
    out = []
    for ref in refs:
        words = ref.split()
        bad = set(rng.sample(range(len(words)), k=min(wrong, len(words) - 1)))
        out.append(" ".join("xx" if i in bad else w for i, w in enumerate(words)))
    return out


@pytest.fixture(scope="module")
def big_refs() -> list[str]:
    rng = random.Random(0)
    vocab = "the a cat dog sat ran on under mat house red big small green tree river".split()
    return [" ".join(rng.choices(vocab, k=rng.randint(7, 12))) for _ in range(150)]


def test_seed_verdicts(big_refs):
    baseline = [noisy(big_refs, 3, s) for s in (1, 2, 3)]
    better = [noisy(big_refs, 1, s) for s in (4, 5)]  # two seeds against three: counts may differ
    result = compare_seeds(better, baseline, [big_refs], n_samples=200)
    assert result.verdict == "better" and len(result.pairs) == 6
    assert {(s, b) for s, b, _ in result.pairs} == {(s, b) for s in range(2) for b in range(3)}
    assert all(r.p_value < 0.05 for _, _, r in result.pairs)
    assert result.system_scores == [BLEU().corpus_score(h, [big_refs]).score for h in better]
    assert "every seed pair" in result.rule and "200 resamples" in result.rule
    assert compare_seeds(baseline, better, [big_refs], n_samples=200).verdict == "worse"
    # one system seed as good as the baseline: not every pair is better
    mixed = compare_seeds([better[0], noisy(big_refs, 3, 9)], baseline, [big_refs], n_samples=200)
    assert mixed.verdict == "no significant difference"
    assert mixed.summary().endswith(": no significant difference")
    assert mixed.summary().startswith("system ") and "(2 seeds) vs baseline" in mixed.summary()


@pytest.mark.parametrize("metric", ["bleu", "chrf"])
def test_the_pooled_bootstrap_of_one_seed_each_is_sacrebleus_paired_bootstrap(big_refs, metric):
    base, system = noisy(big_refs, 3, 1), noisy(big_refs, 2, 2)
    ours = pooled_bootstrap([system], [base], [big_refs], metric=metric, n_samples=300, seed=7)
    theirs = paired_bootstrap(base, system, [big_refs], metric=metric, n_samples=300, seed=7)
    assert ours.p_value == theirs.p_value and 0 < ours.p_value < 1
    assert (ours.system_mean, ours.baseline_mean) == pytest.approx((theirs.system_score, theirs.baseline_score))


def test_the_pooled_bootstrap_tests_the_mean_over_seeds(big_refs):
    import numpy as np

    baseline = [noisy(big_refs, 3, s) for s in (1, 2)]
    system = [noisy(big_refs, 2, 4), noisy(big_refs, 3, 9)]  # one seed better, one as good
    n = 60
    result = pooled_bootstrap(system, baseline, [big_refs], n_samples=n, seed=11)
    scores = [[BLEU().corpus_score(h, [big_refs]).score for h in runs] for runs in (system, baseline)]
    assert result.system_mean == pytest.approx(np.mean(scores[0]))
    assert result.baseline_mean == pytest.approx(np.mean(scores[1]))
    assert result.seeds == (2, 2)
    # the same statistic by brute force: each resample's corpus BLEU from the resampled lines
    idxs = np.random.default_rng(11).choice(len(big_refs), size=(n, len(big_refs)), replace=True)

    def mean_bleu(runs: list[list[str]], rows: np.ndarray) -> float:
        refs = [big_refs[i] for i in rows]
        return float(np.mean([BLEU().corpus_score([h[i] for i in rows], [refs]).score for h in runs]))

    diffs = np.abs([mean_bleu(system, rows) - mean_bleu(baseline, rows) for rows in idxs])
    beyond = int(np.sum(diffs - diffs.mean() > abs(result.delta)))
    assert result.p_value == pytest.approx((beyond + 1) / (n + 1))
    # pooled, the seeds show a difference that not every seed pair does
    assert compare_seeds(system, baseline, [big_refs], n_samples=200).verdict == "no significant difference"
    assert pooled_bootstrap(system, baseline, [big_refs], n_samples=200).p_value < 0.05


def test_equal_means_are_no_evidence_of_a_difference(big_refs):
    """sacreBLEU's ties never count, so identical systems would get its smallest p (1/(n+1)) and
    lead a report's secondary findings; the pooled test gives them p = 1."""
    system = [big_refs[:], [r + " x" for r in big_refs]]
    result = pooled_bootstrap(system, [list(s) for s in system], [big_refs], n_samples=100)
    assert result.delta == 0 and result.p_value == 1.0
    sacrebleus = paired_bootstrap(big_refs, big_refs, [big_refs], n_samples=100)
    assert sacrebleus.p_value == pytest.approx(1 / 101) and sacrebleus.direction() == "no significant difference"


@pytest.mark.parametrize("metric", ["bleu", "chrf"])
def test_statistics_computed_once_give_the_numbers_computed_afresh(big_refs, metric, monkeypatch):
    """A report compares every recipe with the same baseline runs: their statistics are cached per
    process. Cached or afresh, every number is the same; the cache is keyed by the references
    too (the same hypotheses against other references are other statistics)."""
    from structnmt.evaluation import significance

    baseline = [noisy(big_refs, 3, s) for s in (1, 2, 3)]
    recipes = [[noisy(big_refs, 2, s) for s in (4, 5)], [noisy(big_refs, 4, s) for s in (6, 7)]]
    other_refs = noisy(big_refs, 1, 8)

    def everything():
        out = []
        for refs in (big_refs, other_refs, big_refs):
            for system in recipes:
                seeds = compare_seeds(system, baseline, [refs], metric=metric, n_samples=100)
                out.append((seeds.verdict, [(r.p_value, r.system_score, r.baseline_score) for _, _, r in seeds.pairs]))
                pooled = pooled_bootstrap(system, baseline, [refs], metric=metric, n_samples=100)
                out.append((pooled.p_value, pooled.system_mean, pooled.baseline_mean))
        return out

    with significance.uncached():
        afresh = everything()
    significance._MEMO.clear()
    extracted = []
    real = significance.make_metric

    def counting(name, tokenize=None):
        scorer = real(name, tokenize)
        extract = scorer._extract_corpus_statistics
        scorer._extract_corpus_statistics = lambda h, r: extracted.append(1) or extract(h, r)
        return scorer

    monkeypatch.setattr(significance, "make_metric", counting)
    assert everything() == afresh
    assert afresh[0] != afresh[4] and afresh[0] == afresh[8]  # other references, other numbers
    assert len(extracted) == 2 * (3 + 4)  # each run once per set of references


def test_paired_and_pooled_results_are_kept_on_disk_by_their_exact_inputs(big_refs, tmp_path, monkeypatch):
    # a report made again after one new record tests only that record's rows anew
    from structnmt.evaluation import significance

    monkeypatch.setenv("STRUCTNMT_CACHE_DIR", str(tmp_path))
    baseline = [noisy(big_refs, 3, s) for s in (1, 2)]
    system = [noisy(big_refs, 2, s) for s in (4, 5)]

    def numbers(seed: int = 12345):
        significance._MEMO.clear()  # what another process would start from
        seeds = compare_seeds(system, baseline, [big_refs], n_samples=100, seed=seed)
        pooled = pooled_bootstrap(system, baseline, [big_refs], n_samples=100, seed=seed)
        return [(r.p_value, r.system_score, r.baseline_score, r.system_ci) for _, _, r in seeds.pairs], pooled

    first = numbers()
    kept = sorted((tmp_path / "significance").glob("*.json"))
    assert len(kept) == 3  # one paired call per baseline seed, one pooled bootstrap
    assert numbers() == first
    # read back, not computed: every kept p-value doctored to 0.5 comes back as 0.5
    for path in kept:
        value = json.loads(path.read_text())
        for result in value if isinstance(value, list) else [value]:
            result["p_value"] = 0.5
        path.write_text(json.dumps(value))
    pairs, pooled = numbers()
    assert {p for p, *_ in pairs} == {pooled.p_value} == {0.5}
    assert pooled.seeds == (2, 2) and [s for _, s, *_ in pairs] == [s for _, s, *_ in first[0]]
    with significance.uncached():  # afresh: the true numbers, and nothing read or written
        assert numbers() == first
    # other inputs (another seed of the test) are computed, and join the folder
    assert numbers(seed=7)[1].p_value != 0.5
    assert len(list((tmp_path / "significance").glob("*.json"))) == 6
    # a damaged or foreign file is only a lost speed-up
    kept[0].write_text("{not json")
    kept[1].write_text("[1, 2]")
    kept[2].write_text('{"p_value": 0.1}')
    assert numbers() == first


def test_the_pooled_bootstrap_refuses_runs_of_different_lengths(big_refs):
    with pytest.raises(DataError, match="system 1 has 149"):
        pooled_bootstrap([big_refs, big_refs[:-1]], [big_refs], [big_refs])


def test_mean_sd():
    assert mean_sd([1.0, 2.0, 3.0]) == (2.0, 1.0)
    mean, sd = mean_sd([36.42])
    assert mean == 36.42 and math.isnan(sd)
    assert format_mean_sd([36.0, 37.0, 38.0]) == "37.00 ± 1.00 (3 seeds)"
    assert format_mean_sd([36.42]) == "36.42 (1 seed)"
    with pytest.raises(ValueError):
        mean_sd([])


def test_sign_test_values():
    assert sign_test(5, 0) == pytest.approx(0.0625)
    assert sign_test(0, 5) == pytest.approx(0.0625)
    assert sign_test(3, 3) == pytest.approx(1.0)
    # 9 wins of 10: 2 * (1 + 10) / 1024
    assert sign_test(9, 1) == pytest.approx(22 / 1024)
    assert sign_test(0, 0) == 1.0


def test_holm_adjusts_known_values_step_down():
    from structnmt.evaluation.significance import holm

    # sorted 0.005, 0.01, 0.03, 0.04 times 4, 3, 2, 1: 0.02, 0.03, 0.06, 0.04 -> 0.06 (never below the one before)
    assert holm([0.01, 0.04, 0.03, 0.005]) == pytest.approx([0.03, 0.06, 0.06, 0.02])
    assert holm([0.5, 0.6]) == pytest.approx([1.0, 1.0])  # capped at 1
    assert holm([0.02]) == [0.02] and holm([]) == []  # a family of one is not corrected
    assert holm([0.01, 0.01]) == pytest.approx([0.02, 0.02])  # ties: one value
    # the 15 pooled p-values of the converged study: only the window and LPSI on 2016 Flickr stay below 0.05
    pooled = [k / 1001 for k in (2, 1, 429, 29, 38, 5, 129, 19, 142, 379, 343, 218, 206, 5, 4)]
    assert [k for k, p in enumerate(holm(pooled)) if p < 0.05] == [0, 1]
    assert holm([0.0, 0.5]) == [0.0, 0.5] and holm([1.0, 0.5]) == [1.0, 1.0]  # the ends of [0, 1]
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        holm([0.1, float("nan")])
    with pytest.raises(ValueError):
        holm([1.5])


@pytest.mark.parametrize("seed", range(5))
def test_holm_is_monotone_never_below_the_raw_p_and_never_above_bonferroni(seed):
    from structnmt.evaluation.significance import holm

    rng = random.Random(seed)
    p = [rng.random() ** 3 for _ in range(rng.randint(1, 30))]
    adjusted = holm(p)
    order = sorted(range(len(p)), key=lambda i: p[i])
    assert all(adjusted[a] <= adjusted[b] for a, b in zip(order, order[1:]))  # the raw p's order kept
    assert all(raw <= adj <= min(1.0, raw * len(p)) for raw, adj in zip(p, adjusted))
    assert holm([p[i] for i in order]) == [adjusted[i] for i in order]  # the order given changes nothing


def test_order_by_chance_is_one_over_the_binomial_coefficient():
    from structnmt.evaluation.significance import order_by_chance

    assert order_by_chance(3, 3) == pytest.approx(1 / 20)  # ASO epsilon 0 with 3 seeds against 3
    assert order_by_chance(2, 2) == pytest.approx(1 / 6) and order_by_chance(1, 1) == 0.5
    with pytest.raises(ValueError):
        order_by_chance(0, 3)


def test_mismatched_systems_are_an_error():
    with pytest.raises(DataError, match="the baseline has 16 hypotheses but system 1 has 15"):
        paired_bootstrap(BASE, GOOD[:15], [REF])
    with pytest.raises(DataError, match="reference stream 1"):
        paired_bootstrap(BASE, GOOD, [REF[:15]])
