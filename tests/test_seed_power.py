"""studies/seed_power.py: seed-level tests and the seeds a study would need."""

from __future__ import annotations

import importlib.util
import json

import pytest

from tests.test_record_figures import ROOT

_spec = importlib.util.spec_from_file_location("seed_power", ROOT / "studies" / "seed_power.py")
power = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(power)


def test_the_seed_counts_are_the_textbook_ones():
    # a two-sample t-test at alpha 0.05 with power 0.8: 17 a side for a gap of one SD, 64 for half
    assert power.seeds_needed(1.0, 1.0, 0.05, 0.8) == 17
    assert power.seeds_needed(-0.5, 1.0, 0.05, 0.8) == 64  # the sign of the gap does not matter
    assert power.seeds_needed(0.5, 1.0, 0.05 / 42, 0.8) == 136  # Holm's first step over 42: about twice as many
    assert power.seeds_needed(0.01, 1.0, 0.05, 0.8) is None  # beyond MOST
    assert power.t_power(17, 1.0, 1.0, 0.05) == pytest.approx(0.807, abs=0.002)
    # paired by seed, a one-sample t-test on the same-seed gaps: 10 for one SD of those gaps, 34 for half
    assert power.seeds_needed(1.0, 1.0, 0.05, 0.8, paired=True) == 10
    assert power.seeds_needed(0.5, 1.0, 0.05, 0.8, paired=True) == 34


def test_the_permutation_p_counts_the_splits_of_the_runs():
    # 3 against 3 fully apart: 2 of the 20 splits (this one and its mirror) are as far apart
    assert power.permutation_p([3.0, 4.0, 5.0], [0.0, 1.0, 2.0]) == pytest.approx(2 / 20)
    assert power.permutation_p([1.0, 2.0], [1.0, 2.0]) == 1.0
    # five against five fully apart: 2/252, the smallest p five seeds a side can give
    assert power.permutation_p([5.0, 6, 7, 8, 9], [0.0, 1, 2, 3, 4]) == pytest.approx(2 / 252)
    # three against five (lpsi and sasa against vanilla): one split of 56 as far; a mirror has other sizes
    assert power.permutation_p([10.0, 11, 12], [0.0, 1, 2, 3, 4]) == pytest.approx(1 / 56)
    # beyond EXACT splits it samples, seeded: apart runs give (0 + 1) / (EXACT + 1), twice alike
    many = power.permutation_p([float(i) for i in range(20, 40)], [float(i) for i in range(20)])
    assert many == pytest.approx(1 / (power.EXACT + 1))
    level = [power.permutation_p([0.0, 2] * 10, [1.0, 1] * 10) for _ in range(2)]
    assert level[0] == level[1] == 1.0


def test_cells_give_gaps_welch_p_and_holm_over_the_family():
    report = {"test": {"base": {"bleu": {"1": 30.0, "2": 31.0, "3": 32.0, "4": 31.0}},
                       "level": {"bleu": {"1": 30.5, "2": 31.0, "3": 31.5}},  # first: the larger p
                       "up": {"bleu": {"1": 32.0, "2": 35.0, "3": 38.0}},
                       "alone": {"bleu": {"1": 40.0}}}}  # one seed: no seed-level test
    rows = power.cells(report, "base")
    assert [r["recipe"] for r in rows] == ["level", "up"]
    level, up = rows
    assert up["gap"] == pytest.approx(4.0) and up["sd"] == pytest.approx(3.0)
    assert up["sd_base"] == pytest.approx((2 / 3) ** 0.5)
    assert up["pooled"] == pytest.approx(((2 * 9 + 3 * 2 / 3) / 5) ** 0.5)
    # Welch, not Student: t = 4 / sqrt(9/3 + (2/3)/4) = 2.248 on 2.22 degrees of freedom (Student's
    # pooled test would give 0.0472 on 5)
    assert up["p"] == pytest.approx(0.1407, abs=1e-4)
    assert up["p_holm"] == pytest.approx(2 * up["p"])  # the smaller of two p's, times two, in its own row
    assert level["gap"] == pytest.approx(0.0) and level["p"] == pytest.approx(1.0) and level["p_holm"] == 1.0
    assert power.welch_p([1.0, 1.0], [1.0, 1.0]) == 1.0 and power.welch_p([2.0, 2.0], [1.0, 1.0]) == 0.0


def test_the_paired_cells_pair_runs_of_the_same_seed_only():
    report = {"test": {"base": {"bleu": {"1": 30.0, "2": 32.0, "3": 34.0}},
                       "up": {"bleu": {"1": 31.0, "2": 34.0, "3": 37.0, "9": 20.0}}}}  # seed 9: no partner
    (row,) = power.cells(report, "base")
    assert row["pairs"] == 3 and row["gap_paired"] == pytest.approx(2.0)  # gaps 1, 2, 3
    assert row["gap"] == pytest.approx(30.5 - 32.0)  # unpaired: every seed, seed 9 too
    assert row["sd_paired"] == pytest.approx(1.0)
    assert row["p_paired"] == pytest.approx(0.0742, abs=1e-4)  # t = 2 / (1 / sqrt(3)) = 3.464 on 2
    assert row["p_paired_holm"] == row["p_paired"]  # a family of one
    assert power.paired_p([0.0, 0.0]) == 1.0 and power.paired_p([0.5, 0.5]) == 0.0


def test_it_runs_on_the_committed_study(capsys, monkeypatch):
    monkeypatch.chdir(ROOT)
    assert power.main(["studies/multi30k_en_de_converged.yaml"]) == 0
    out = capsys.readouterr().out
    report = json.loads((ROOT / "studies" / "multi30k_en_de_converged" / "report.json").read_text())
    comparisons = sum(len(by_recipe) - 1 for by_recipe in report.values())
    assert f"({comparisons} comparisons; power 0.80;" in out
    row = next(line for line in out.splitlines() if line.startswith("| test_2017_flickr_longdep | lpsi_synchmse |"))
    # the study's six seeds of LPSI + SynchMSE all lie above vanilla's six there (ASO 0.00)
    assert f"| {2 / 924:.4f} |" in row
    paired = [line for line in out.splitlines() if line.startswith("| test_2017_flickr_longdep | lpsi_synchmse |")]
    assert len(paired) == 2 and "| 6 | +1.61 |" in paired[1]  # the paired table: six same-seed pairs


def test_it_says_what_is_wrong_with_its_arguments(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(ROOT)
    for flag, value, message in (("--power", "1.5", "--power must lie between 0 and 1"),
                                 ("--effect", "0", "--effect must be a positive gap in BLEU")):
        with pytest.raises(SystemExit):
            power.main(["studies/multi30k_en_de_converged.yaml", flag, value])
        assert message in capsys.readouterr().err
    # a study whose report was never written: the command that writes it
    study = tmp_path / "fresh.yaml"
    study.write_text((ROOT / "studies" / "multi30k_en_de_converged.yaml").read_text())  # records: tmp_path/fresh
    assert power.main([str(study)]) == 1
    assert f"report.json is missing: run `structnmt study {study} --report` first" in capsys.readouterr().err
