"""Scores, strict file reading, length buckets and the long-dependency subset."""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import pytest

from structnmt.errors import DataError
from structnmt.evaluation.buckets import bleu_by_length, bucket_index
from structnmt.evaluation.challenge import (
    heads_from_conllu,
    long_dependency_subset,
    max_arc_length,
    score_long_dependency,
    write_subset,
)
from structnmt.evaluation.scores import check_parallel, corpus_scores, length_ratio, read_text, ribes, score_files

REFS = ["the cat sat on the mat", "a dog barked loudly at the postman", "it rains again today"]
HYPS = ["the cat sat on a mat", "the dog barked at the postman", "today it rains again"]


def write(path: Path, lines: list[str]) -> Path:
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path


def test_read_text_names_the_undecodable_line(tmp_path):
    path = tmp_path / "bad.txt"
    path.write_bytes(b"fine\nalso fine\nbro\xffken\n")
    with pytest.raises(DataError) as err:
        read_text(path)
    assert err.value.line == 3 and str(path) in str(err.value)


def test_read_text_keeps_unicode_separators_and_strips_crlf(tmp_path):
    path = tmp_path / "t.txt"
    path.write_bytes("a\u2028b\r\nc\n".encode())
    assert read_text(path) == ["a\u2028b", "c"]


def test_check_parallel_line_counts(tmp_path):
    hyp = write(tmp_path / "h", HYPS)
    ref = write(tmp_path / "r", REFS[:2])
    with pytest.raises(DataError, match=r"3 hypothesis lines but 2 lines in reference"):
        check_parallel(hyp, [ref])


def test_check_parallel_empty_hypothesis(tmp_path):
    hyp = write(tmp_path / "h", [HYPS[0], "", HYPS[2]])
    ref = write(tmp_path / "r", REFS)
    with pytest.raises(DataError, match="empty hypothesis") as err:
        check_parallel(hyp, [ref])
    assert err.value.line == 2
    hyps, refs = check_parallel(hyp, [ref], allow_empty=True)
    assert hyps[1] == "" and refs == [REFS]


def test_bleu_and_chrf_match_the_sacrebleu_command_line(tmp_path):
    hyp, ref = write(tmp_path / "h", HYPS), write(tmp_path / "r", REFS)
    ours = score_files(hyp, [ref], metrics=("bleu", "chrf", "ter"))
    for metric in ("bleu", "chrf"):
        cli = subprocess.run(
            [sys.executable, "-m", "sacrebleu", str(ref), "-i", str(hyp), "-b", "-w", "4", "-m", metric],
            capture_output=True, text=True, check=True,
        )
        assert ours[metric] == pytest.approx(float(cli.stdout.strip()), abs=1e-4)
    assert ours["signature"]["bleu"].startswith("nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp")
    assert 0 < ours["ter"] < 100


def test_perfect_output_scores():
    scores = corpus_scores(REFS, [REFS], metrics=("bleu", "chrf", "ter", "ribes"))
    assert scores["bleu"] == pytest.approx(100.0)
    assert scores["chrf"] == pytest.approx(100.0)
    assert scores["ter"] == pytest.approx(0.0)
    assert scores["ribes"] == pytest.approx(100.0)


def test_bleu_parts_give_the_length_behind_the_brevity_penalty():
    # HYPS have 6 + 6 + 4 = 16 tokens against REFS' 6 + 7 + 4 = 17 (13a splits on spaces here)
    parts = corpus_scores(HYPS, [REFS], metrics=("bleu",))["bleu_parts"]
    assert (parts["hyp_len"], parts["ref_len"]) == (16, 17)
    assert parts["ratio"] == pytest.approx(16 / 17) and parts["bp"] == pytest.approx(math.exp(1 - 17 / 16))
    # unigrams: 5 of 6, 5 of 6 (the dog: 'the' is in the reference), 4 of 4 -> 14 of 16
    assert parts["precisions"][0] == pytest.approx(100 * 14 / 16)
    # BLEU is the brevity penalty times the geometric mean of the four precisions
    geo = math.exp(sum(math.log(p / 100) for p in parts["precisions"]) / 4)
    assert corpus_scores(HYPS, [REFS], metrics=("bleu",))["bleu"] == pytest.approx(100 * parts["bp"] * geo)
    assert length_ratio(HYPS, [REFS]) == pytest.approx(16 / 17)
    assert corpus_scores(REFS, [REFS], metrics=("bleu",))["bleu_parts"]["bp"] == 1.0


def test_ribes_penalises_word_order():
    # one swap of adjacent words out of four: 5 of 6 pairs in order, Kendall's tau = (5 - 1) / 6,
    # normalised (tau + 1) / 2 = 5/6, times unigram precision^0.25 = 1 and brevity^0.1 = 1
    assert ribes(["a b d c"], [["a b c d"]]) == pytest.approx(100 * 5 / 6)


def test_bucket_edges_follow_the_paper():
    assert [bucket_index(n) for n in (0, 10, 11, 20, 80, 81, 500)] == [0, 0, 1, 1, 7, 8, 8]


def test_bleu_by_length_scores_each_bucket_alone():
    src = ["w " * 3, "w " * 15, "w " * 4, "w " * 90]
    refs = ["a b c d e", "f g h i j", "k l m n o", "p q r s t"]
    hyps = ["a b c d e", "x x x x x", "k l m n o", "p q r s t"]
    buckets = bleu_by_length(src, hyps, [refs])
    assert [b.n for b in buckets] == [2, 1, 0, 0, 0, 0, 0, 0, 1]
    assert buckets[0].bleu == pytest.approx(100.0)
    assert buckets[1].bleu == pytest.approx(0.0)
    assert buckets[2].bleu is None
    assert buckets[-1].label == "80+" and math.isinf(buckets[-1].high)


def test_long_dependency_subset_selects_by_arc_length():
    heads = [
        [1, 1, 1],  # arcs of length 1
        [7, 7, 7, 7, 7, 7, 7, 7],  # word 0 -> head 7: length 7
        [0, 0, 1, 2, 3, 4, 5, 6],  # a chain, all arcs of length 1
    ]
    assert [max_arc_length(h) for h in heads] == [1, 7, 1]
    assert long_dependency_subset(heads, threshold=7) == [1]
    assert long_dependency_subset(heads, threshold=8) == []


def test_score_and_write_the_subset(tmp_path):
    heads = [[1, 1], [7] * 8, [0, 0]]
    refs = ["a b", "c d e f", "g h"]
    hyps = ["a b", "c d e f", "x y"]
    result = score_long_dependency(heads, hyps, [refs], threshold=7)
    assert result["indices"] == [1] and result["n"] == 1 and result["n_rest"] == 2
    assert result["subset"]["bleu"] == pytest.approx(100.0)
    written = write_subset(result["indices"], tmp_path, src=["s1", "s2", "s3"], ref=refs, hyp=hyps)
    assert written["idx"].read_text() == "2\n"
    assert written["ref"].read_text() == "c d e f\n"
    with pytest.raises(DataError, match="parsed source sentences"):
        score_long_dependency(heads[:2], hyps, [refs])


def test_heads_from_conllu_skips_multiword_tokens(tmp_path):
    path = tmp_path / "t.conllu"
    rows = [
        "1\tI\tI\tPRON\t_\t_\t2\tnsubj\t_\t_",
        "2\tsaw\tsee\tVERB\t_\t_\t0\troot\t_\t_",
        "3-4\tdu\t_\t_\t_\t_\t_\t_\t_\t_",
        "3\tde\tde\tADP\t_\t_\t4\tcase\t_\t_",
        "4\tle\tle\tDET\t_\t_\t2\tobj\t_\t_",
    ]
    path.write_text("# text = x\n" + "\n".join(rows) + "\n\n", encoding="utf-8")
    assert heads_from_conllu(path) == [[1, 1, 3, 1]]


SHARED = Path(__file__).resolve().parents[2] / "shared"


@pytest.mark.shared
@pytest.mark.skipif(not (SHARED / "data" / "ud").is_dir(), reason="../shared/data/ud is not available")
def test_real_treebank_has_long_dependencies():
    files = sorted((SHARED / "data" / "ud").glob("en_ewt-ud-dev*.conllu*"))
    if not files or files[0].suffix == ".gz":
        pytest.skip("no plain en_ewt dev CoNLL-U file")
    heads = heads_from_conllu(files[0])
    subset = long_dependency_subset(heads)
    assert 0 < len(subset) < len(heads)


def test_sacrebleus_detokenise_advice_is_withheld_only_where_the_references_are_tokenised_too(caplog) -> None:
    """Hypotheses ending in `` .`` like their references follow the data's convention (the demo's
    synthetic task, a tokenised corpus): sacreBLEU's "forgot to detokenize" would be wrong advice,
    on every validation and test. Against detokenised references it is right, and stays."""
    from structnmt.evaluation.significance import paired_bootstrap, uncached

    tokenised = [f"word{n} and word{n + 1} ." for n in range(120)]
    detokenised = [line.replace(" .", ".") for line in tokenised]
    with caplog.at_level("WARNING", logger="sacrebleu"):
        assert corpus_scores(tokenised, [tokenised], metrics=["bleu", "chrf"])["bleu"] == pytest.approx(100.0)
        assert length_ratio(tokenised, [tokenised]) == pytest.approx(1.0)
        with uncached():
            paired_bootstrap(tokenised, tokenised, [tokenised], n_samples=10)
    assert not [r for r in caplog.records if "detokenize" in r.getMessage()]
    with caplog.at_level("WARNING", logger="sacrebleu"):
        corpus_scores(tokenised, [detokenised], metrics=["bleu"])
    assert [r for r in caplog.records if "forgot to detokenize" in r.getMessage()]
    caplog.clear()
    with caplog.at_level("WARNING", logger="sacrebleu"), uncached():
        paired_bootstrap(tokenised, tokenised, [detokenised], n_samples=10)
    assert [r for r in caplog.records if "forgot to detokenize" in r.getMessage()]
