"""Alignments (grow-diag-final, attention argmax, AER, Pharaoh files) and trees (CLE, UAS, UF)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from structnmt.errors import DataError
from structnmt.evaluation.alignment import (
    aer,
    alignments_from_attention,
    corpus_aer,
    grow_diag_final,
    read_alignments,
    read_pharaoh,
    read_talp,
    symmetrised_alignments,
    word_level_attention,
)
from structnmt.evaluation.trees import (
    bracket_string,
    corpus_uas,
    corpus_unlabeled_f1,
    decode_tree_from_scores,
    is_tree,
    right_branching_brackets,
    right_branching_heads,
    tree_from_distances,
    uas,
    unlabeled_f1,
)

# ---------------------------------------------------------------- alignments


def test_grow_diag_final_hand_example():
    # intersection {(0,0), (1,1)}; (2,1) neighbours (1,1) and source 2 is unaligned -> grown;
    # (1,0) neighbours both but its source and target are aligned -> never added;
    # (4,4) and (0,3) are far from everything -> only the final step adds them.
    src2tgt = {(0, 0), (1, 1), (2, 1), (4, 4)}
    tgt2src = {(0, 0), (1, 1), (0, 3), (1, 0)}
    assert grow_diag_final(src2tgt, tgt2src, final=False) == {(0, 0), (1, 1), (2, 1)}
    assert grow_diag_final(src2tgt, tgt2src) == {(0, 0), (1, 1), (2, 1), (4, 4), (0, 3)}


def test_grow_diag_follows_a_diagonal_chain():
    inter = {(0, 0)}
    chain = {(1, 1), (2, 2), (3, 3)}
    assert grow_diag_final(inter | chain, inter, final=False) == inter | chain


def test_alignments_from_attention_both_directions():
    attn = np.array([  # 3 target rows x 2 source columns
        [0.9, 0.1],
        [0.2, 0.8],
        [0.4, 0.6],
    ])
    assert alignments_from_attention(attn) == {(0, 0), (1, 1), (1, 2)}
    assert alignments_from_attention(attn, "src2tgt") == {(0, 0), (1, 1)}
    assert symmetrised_alignments(attn) == {(0, 0), (1, 1), (1, 2)}


def test_word_level_attention_averages_pieces():
    attn = np.array([  # target pieces: w0 w0 w1 EOS; source pieces: v0 v1 v1 EOS
        [0.1, 0.2, 0.4, 0.3],
        [0.3, 0.2, 0.2, 0.3],
        [0.5, 0.1, 0.1, 0.3],
        [0.0, 0.0, 0.0, 1.0],
    ])
    words = word_level_attention(attn, [0, 1, 1, -1], [0, 0, 1, -1])
    assert words == pytest.approx(np.array([[0.2, 0.25], [0.5, 0.1]]))
    summed = word_level_attention(attn, [0, 1, 1, -1], [0, 0, 1, -1], source_reduce="sum")
    assert summed == pytest.approx(np.array([[0.2, 0.5], [0.5, 0.2]]))


def test_aer_hand_cases():
    sure = {(0, 0), (1, 1)}
    possible = {(2, 1)}
    assert aer(sure, possible, sure) == {"aer": 0.0, "precision": 1.0, "recall": 1.0}
    # A = {(0,0), (2,1), (2,2)}: |A∩S| = 1, |A∩P| = 2 -> AER = 1 - 3/5
    result = aer(sure, possible, {(0, 0), (2, 1), (2, 2)})
    assert result["aer"] == pytest.approx(0.4)
    assert result["precision"] == pytest.approx(2 / 3)
    assert result["recall"] == pytest.approx(0.5)
    assert aer(sure, possible, set())["aer"] == pytest.approx(1.0)
    both = corpus_aer([sure, sure], [possible, possible], [sure, set()])
    assert both["aer"] == pytest.approx(1 - 4 / 6)


def test_read_pharaoh(tmp_path):
    path = tmp_path / "gold.align"
    path.write_text("0-0 1?2 2-1-P 3-3-S\n\n", encoding="utf-8")
    sure, possible = read_pharaoh(path)[0]
    assert sure == {(0, 0), (3, 3)}
    assert possible == {(0, 0), (1, 2), (2, 1), (3, 3)}
    assert read_pharaoh(path)[1] == (set(), set())
    path.write_text("0-0\n0-x\n", encoding="utf-8")
    with pytest.raises(DataError, match="bad alignment link") as err:
        read_pharaoh(path)
    assert err.value.line == 2


def test_read_talp_counts_from_one_and_marks_possible_links_with_p(tmp_path):
    path = tmp_path / "gold.talp"
    path.write_text("1-1 2p3 3-2\n4-4\n", encoding="utf-8")
    (sure, possible), second = read_talp(path)
    assert sure == {(0, 0), (2, 1)}
    assert possible == {(0, 0), (1, 2), (2, 1)}
    assert second == ({(3, 3)}, {(3, 3)})
    # the same links written the Pharaoh way read the same
    pharaoh = tmp_path / "gold.align"
    pharaoh.write_text("0-0 1?2 2-1\n3-3\n", encoding="utf-8")
    assert read_pharaoh(pharaoh) == read_talp(path)


def test_gold_format_is_recognised_or_refused(tmp_path):
    path = tmp_path / "gold"
    n_words = [(3, 3), (4, 4)]
    path.write_text("1-1 2p3\n4-4\n", encoding="utf-8")  # written ipj: talp
    assert read_alignments(path, "auto", n_words)[1] == ({(3, 3)}, {(3, 3)})
    path.write_text("0-0 1-2\n3-3\n", encoding="utf-8")  # a word 0: Pharaoh
    assert read_alignments(path, "auto", n_words)[1] == ({(3, 3)}, {(3, 3)})
    path.write_text("1-1 3-2\n4-4\n", encoding="utf-8")  # word 3 of a 3-word sentence: talp
    assert read_alignments(path, "auto", n_words)[0][0] == {(0, 0), (2, 1)}
    path.write_text("1-1 2-2\n1-3\n", encoding="utf-8")  # could be either
    with pytest.raises(DataError, match="--gold-format pharaoh or talp"):
        read_alignments(path, "auto", n_words)
    assert read_alignments(path, "talp", n_words)[1] == ({(0, 2)}, {(0, 2)})


def test_a_gold_link_outside_its_sentence_is_named(tmp_path):
    path = tmp_path / "gold.talp"
    path.write_text("1-1\n1-5\n", encoding="utf-8")
    with pytest.raises(DataError) as err:
        read_alignments(path, "talp", [(3, 3), (4, 4)])
    assert err.value.line == 2
    assert "link '1-5' is outside the sentence of 4 source and 4 target words (talp links count words from 1)" \
        in str(err.value)
    path.write_text("0-1\n", encoding="utf-8")  # talp has no word 0
    with pytest.raises(DataError, match="link '0-1' is outside the sentence"):
        read_talp(path)
    path.write_text("2-0\n", encoding="utf-8")
    with pytest.raises(DataError, match=r"link '2-0' is outside the sentence of 2 source"):
        read_alignments(path, "pharaoh", [(2, 5)])


# ---------------------------------------------------------------- dependency trees


def test_cle_fixes_a_cycle():
    # word 0 is clearly the root; words 1 and 2 prefer each other (a cycle), word 1's second
    # choice (the root) is cheaper to take than word 2's, so the tree is 0 -> 1 -> 2.
    s = np.full((3, 3), -5.0)
    s[0, 0] = 10.0
    s[1, 2], s[1, 0] = 5.0, 4.0
    s[2, 1], s[2, 0] = 5.0, 1.0
    heads = decode_tree_from_scores(s)
    assert heads == [0, 0, 1]
    assert is_tree(heads)


def test_cle_is_optimal_against_brute_force():
    rng = np.random.default_rng(0)
    for _ in range(40):
        n = int(rng.integers(2, 6))
        s = rng.normal(size=(n, n))
        heads = decode_tree_from_scores(s)
        root = int(np.diag(s).argmax())
        assert is_tree(heads) and heads[root] == root

        def total(h, s=s, root=root):
            return sum(s[t, h[t]] for t in range(len(h)) if t != root)

        best = max(total(h) for h in itertools.product(range(n), repeat=n) if h[root] == root and is_tree(h))
        assert total(heads) == pytest.approx(best)


def test_uas_and_baseline():
    assert right_branching_heads(4) == [0, 0, 1, 2]
    assert is_tree(right_branching_heads(5))
    assert uas([0, 0, 1, 2], [1, 1, 1, 2]) == pytest.approx(0.5)
    assert uas([0, 0, 1, 2], [1, 1, 1, 2], mask=[False, True, True, True]) == pytest.approx(2 / 3)
    assert corpus_uas([[0, 0], [1, 1, 1]], [[0, 0], [0, 0, 0]]) == pytest.approx(2 / 5)


# ---------------------------------------------------------------- brackets


def test_tree_from_distances_hand_example():
    words = "the cat sat down".split()
    # boundary the|cat: 1, cat|sat: 3 (largest, split first), sat|down: 2
    spans = tree_from_distances([1, 3, 2])
    assert spans == [(0, 4), (0, 2), (2, 4)]
    assert bracket_string(words, spans) == "((the cat) (sat down))"
    # ties split leftmost: a right-branching tree
    assert tree_from_distances([0, 0, 0]) == right_branching_brackets(4)
    assert tree_from_distances([]) == []


def test_unlabeled_f1_hand_example():
    gold = [(0, 5), (0, 2), (2, 5), (3, 5)]
    pred = [(0, 5), (0, 3), (0, 2), (3, 5)]
    # without trivial spans: gold {(0,2),(2,5),(3,5)}, pred {(0,3),(0,2),(3,5)}: 2 matches
    result = unlabeled_f1(pred, gold)
    assert result["precision"] == pytest.approx(2 / 3) and result["f1"] == pytest.approx(2 / 3)
    assert unlabeled_f1(pred, gold, ignore_trivial=False)["f1"] == pytest.approx(3 / 4)
    corpus = corpus_unlabeled_f1([pred, [(0, 2)]], [gold, [(0, 2)]])
    assert corpus["sentence_f1"] == pytest.approx(2 / 3)  # the 2-word sentence has no gold bracket
    assert corpus["corpus_f1"] == pytest.approx(2 / 3)
