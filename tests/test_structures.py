"""Sub-word structures: alignment, projection, tree distances and dense batch fields."""

from __future__ import annotations

from collections import deque
from pathlib import Path

import numpy as np
import pytest
import torch

from structnmt.data.example import DepTree
from structnmt.data.structures import (
    align_pieces_to_words,
    build_struct,
    project,
    scene_matrices,
    tree_distances,
)
from structnmt.errors import DataError

UD_DEV = Path(__file__).resolve().parents[2] / "shared" / "data" / "ud" / "en_ewt-ud-dev.conllu"

TEXT = "unbelievable dogs bark loudly"
WORD_SPANS = [(0, 12), (13, 17), (18, 22), (23, 29)]
# pieces as a SentencePiece model would cut them; "▁" pieces start at the space before a word,
# and one lone "▁" (22..23) overlaps no word
PIECE_SPANS = [(0, 2), (2, 8), (8, 12), (12, 16), (16, 17), (17, 22), (22, 23), (23, 27), (27, 29)]
HEADS = [1, 2, 2, 2]  # unbelievable -> dogs -> bark (root) <- loudly


def tree() -> DepTree:
    return DepTree(TEXT, ["unbelievable", "dogs", "bark", "loudly"], WORD_SPANS, HEADS,
                   ["amod", "nsubj", "root", "advmod"])


def test_alignment_by_character_offsets() -> None:
    wi = align_pieces_to_words(PIECE_SPANS, WORD_SPANS)
    assert wi.dtype == np.int32
    # the lone "▁" (index 6) joins the next word
    assert wi.tolist() == [0, 0, 0, 1, 1, 2, 3, 3, 3]


def test_alignment_trailing_orphan_takes_previous_word_and_missing_word_fails() -> None:
    assert align_pieces_to_words([(0, 3), (3, 4)], [(0, 3)]).tolist() == [0, 0]
    with pytest.raises(DataError, match=r"f\.txt:7: word 2 .*received no sub-word"):
        align_pieces_to_words([(0, 5)], [(0, 2), (6, 8)], path="f.txt", line=7)


def test_an_empty_piece_inside_a_word_joins_that_word() -> None:
    # "\u200bThe cat": the parser's first word keeps the zero-width space (characters 0..4);
    # SentencePiece normalises it away and leaves an empty "▁" at character 1, inside that word.
    # Joining the next word instead put "cat" before "The" and refused the sentence.
    assert align_pieces_to_words([(1, 1), (1, 4), (4, 8)], [(0, 4), (5, 8)]).tolist() == [0, 0, 1]
    # between words it still joins the next one, past the last word the last one
    assert align_pieces_to_words([(0, 3), (4, 4), (4, 7), (8, 8)], [(0, 3), (4, 7)]).tolist() == [0, 1, 1, 1]


def test_project_parent_mid_and_parent_first() -> None:
    word_index = np.array([0, 0, 0, 1, 1, 2, 3, 3])  # 8 sub-words
    parent_first, parent_mid = project(tree(), word_index)
    assert parent_mid.dtype == np.float32 and parent_first.dtype == np.int32
    # word middles: 1.0, 3.5, 5.0 (root), 6.5; the root's parent is itself
    assert parent_mid.tolist() == [3.5, 3.5, 3.5, 5.0, 5.0, 5.0, 5.0, 5.0]
    # word-initial -> parent's first sub-word; others -> own word's first; root -> itself
    assert parent_first.tolist() == [3, 0, 0, 5, 3, 5, 5, 6]


def test_project_root_split_in_pieces_points_to_own_middle() -> None:
    t = DepTree("a bc", ["a", "bc"], [(0, 1), (2, 4)], [1, 1], ["nsubj", "root"])
    parent_first, parent_mid = project(t, np.array([0, 1, 1]))
    assert parent_mid.tolist() == [1.5, 1.5, 1.5]
    assert parent_first.tolist() == [1, 1, 1]


def test_tree_distances_known_values() -> None:
    d = tree_distances(HEADS)
    expected = np.array([[0, 1, 2, 3], [1, 0, 1, 2], [2, 1, 0, 1], [3, 2, 1, 0]])
    np.testing.assert_array_equal(d, expected)
    # a deeper, branching tree: 0 root; 1,2 children of 0; 3 child of 1; 4 child of 3; 5 child of 2
    d = tree_distances([0, 0, 0, 1, 3, 2])
    assert d[4, 5] == 5 and d[3, 2] == 3 and d[4, 0] == 3
    np.testing.assert_array_equal(d, d.T)
    assert (np.diag(d) == 0).all()


def test_tree_distances_cycle_raises() -> None:
    with pytest.raises(DataError, match="cycle"):
        tree_distances([1, 2, 1])


def _bfs_distances(heads: list[int]) -> np.ndarray:
    n = len(heads)
    adj: list[list[int]] = [[] for _ in range(n)]
    for i, h in enumerate(heads):
        if h != i:
            adj[i].append(h)
            adj[h].append(i)
    out = np.zeros((n, n), dtype=int)
    for s in range(n):
        seen = {s: 0}
        queue = deque([s])
        while queue:
            u = queue.popleft()
            for v in adj[u]:
                if v not in seen:
                    seen[v] = seen[u] + 1
                    queue.append(v)
        out[s] = [seen[j] for j in range(n)]
    return out


@pytest.mark.shared
@pytest.mark.skipif(not UD_DEV.exists(), reason="../shared/data/ud is not present")
def test_tree_distances_match_bfs_on_real_trees() -> None:
    conllu = pytest.importorskip("conllu")
    with open(UD_DEV, encoding="utf-8") as handle:
        for k, sentence in enumerate(conllu.parse_incr(handle)):
            if k == 60:
                break
            words = [t for t in sentence if isinstance(t["id"], int)]
            heads = [t["head"] - 1 if t["head"] else t["id"] - 1 for t in words]
            np.testing.assert_array_equal(tree_distances(heads), _bfs_distances(heads))


def test_scene_matrices() -> None:
    # words 0..3 in scene 0, words 3..5 in scene 1 (child of 0), word 6 in scene 2 (child of 1),
    # word 7 in no scene
    members = np.array([[0, 0], [1, 0], [2, 0], [3, 0], [3, 1], [4, 1], [5, 1], [6, 2]])
    mask, dist = scene_matrices(8, members, np.array([-1, 0, 1]))
    assert mask[0, 3] and mask[3, 4] and not mask[0, 4]
    assert mask[7].all() and not mask[0, 7] and mask[7, 7]
    assert dist[0, 4] == 1 and dist[0, 6] == 2 and dist[3, 6] == 1 and dist[3, 0] == 0
    assert dist[7].sum() == 0


def _stored(word_index: list[int], heads: list[int], labels: list[int]) -> dict[str, np.ndarray]:
    t = DepTree(" ".join("w" for _ in heads), ["w"] * len(heads),
                [(2 * i, 2 * i + 1) for i in range(len(heads))], heads, ["x"] * len(heads))
    wi = np.array(word_index, dtype=np.int32)
    parent_first, parent_mid = project(t, wi)
    return {
        "ids": np.arange(10, 10 + len(wi), dtype=np.int32),
        "word_index": wi,
        "parent_first": parent_first,
        "parent_mid": parent_mid,
        "heads": np.array(heads, dtype=np.int32),
        "labels": np.array(labels, dtype=np.int16),
        "scene_members": np.array([[i, 0] for i in range(len(heads))], dtype=np.int32).reshape(-1, 2),
        "scene_parent": np.array([-1], dtype=np.int32),
    }


def test_build_struct_target_offset_one() -> None:
    long = _stored([0, 0, 0, 1, 1, 2, 3, 3], HEADS, [4, 5, 6, 7])
    short = _stored([0, 1, 1], [1, 1], [8, 9])
    fields = {"word_index", "parent_mid", "parent_first", "dist", "labels", "scene_mask", "scene_dist"}
    out = build_struct([long, short], fields, [8, 3], offset=1, max_len=9)
    assert set(out) == fields | {"valid"}
    assert out["dist"].shape == (2, 9, 9) and out["dist"].dtype == torch.float32
    assert out["parent_first"].dtype == torch.long and out["scene_mask"].dtype == torch.bool
    assert out["valid"][0].tolist() == [False] + [True] * 8
    assert out["valid"][1].tolist() == [False, True, True, True] + [False] * 5
    # BOS at 0: every position and parent position shifts by one; specials point to themselves
    assert out["parent_mid"][0].tolist() == [0.0, 4.5, 4.5, 4.5, 6.0, 6.0, 6.0, 6.0, 6.0]
    assert out["parent_first"][0].tolist() == [0, 4, 1, 1, 6, 4, 6, 6, 7]
    assert out["parent_mid"][1].tolist() == [0.0, 2.5, 2.5, 2.5, 4.0, 5.0, 6.0, 7.0, 8.0]
    assert out["parent_first"][1].tolist() == [0, 2, 2, 2, 4, 5, 6, 7, 8]
    assert out["word_index"][1].tolist() == [-1, 0, 1, 1, -1, -1, -1, -1, -1]
    assert out["labels"][0].tolist() == [0, 4, 4, 4, 5, 5, 6, 7, 7]
    # token 1 (word 0) to token 8 (word 3): distance 3; same word: 0; BOS row/column: 0
    assert out["dist"][0, 1, 8] == 3 and out["dist"][0, 1, 3] == 0 and out["dist"][0, 4, 6] == 1
    assert out["dist"][0, 0].abs().sum() == 0 and out["dist"][1, :, 4:].abs().sum() == 0
    assert out["scene_mask"].all() and out["scene_dist"].abs().sum() == 0


def test_build_struct_source_offset_zero_builds_only_requested() -> None:
    ex = _stored([0, 0, 1], [1, 1], [1, 2])
    out = build_struct([ex], {"parent_first"}, [3], offset=0, max_len=4)
    assert set(out) == {"valid", "parent_first"}
    assert out["valid"][0].tolist() == [True, True, True, False]
    assert out["parent_first"][0].tolist() == [2, 0, 2, 3]  # EOS at 3 points to itself


def test_build_struct_missing_stored_field_is_a_data_error() -> None:
    ex = {"ids": np.array([5, 6], dtype=np.int32)}
    with pytest.raises(DataError, match="dist"):
        build_struct([ex], {"dist"}, [2], offset=0, max_len=3)


def test_words_sharing_one_sub_word_are_merged_into_one_node():
    from structnmt.data.example import DepTree
    from structnmt.data.structures import merge_words_sharing_pieces

    # spaCy reads "id" as "i" + "d"; the sub-word model has one piece "▁id"
    text = "a couple id sitting"
    tree = DepTree(text, ["a", "couple", "i", "d", "sitting"], [(0, 1), (2, 8), (9, 10), (10, 11), (12, 19)],
                   heads=[1, 4, 4, 4, 4], labels=["det", "nsubj", "nsubj", "aux", "root"])
    pieces = [(0, 1), (2, 8), (9, 11), (12, 19)]
    merged = merge_words_sharing_pieces(tree, pieces)
    assert merged.words == ["a", "couple", "id", "sitting"]
    assert merged.spans == [(0, 1), (2, 8), (9, 11), (12, 19)]
    assert merged.heads == [1, 3, 3, 3] and merged.labels == ["det", "nsubj", "nsubj", "root"]
    merged.check()
    assert list(align_pieces_to_words(pieces, merged.spans)) == [0, 1, 2, 3]
    # the shallowest member gives the node its head, so contraction makes no cycle:
    # "x" -> "y" -> "z" (root), with "x" and "z" inside one piece
    chain = DepTree("xyz", ["x", "y", "z"], [(0, 1), (1, 2), (2, 3)], heads=[1, 2, 2], labels=["a", "b", "root"])
    one = merge_words_sharing_pieces(chain, [(0, 3)])
    assert one.heads == [0] and one.words == ["xyz"]
    assert merge_words_sharing_pieces(tree, [(0, 1), (2, 8), (9, 10), (10, 11), (12, 19)]) is tree


def _random_forest(rng: np.random.Generator, n: int) -> np.ndarray:
    """Heads of n words in random order: each word hangs from another or is a top (-1, or itself)."""
    heads = np.empty(n, dtype=np.int64)
    for i in range(n):
        r = rng.random()
        heads[i] = -1 if i == 0 or r < 0.1 else (i if r < 0.15 else rng.integers(0, i))
    order = rng.permutation(n)  # word i becomes word order[i]
    shuffled = np.empty(n, dtype=np.int64)
    shuffled[order] = np.where(heads < 0, -1, order[np.maximum(heads, 0)])
    return shuffled


def test_batched_tree_distances_equal_each_tree_on_its_own() -> None:
    from structnmt.data.structures import tree_distances_batch

    rng = np.random.default_rng(7)
    trees = [_random_forest(rng, int(n)) for n in rng.integers(0, 14, size=40)]
    batch = tree_distances_batch(trees)
    assert batch.shape == (40, max(map(len, trees)), max(map(len, trees))) and batch.dtype == np.int32
    for b, heads in enumerate(trees):
        n = len(heads)
        assert np.array_equal(batch[b, :n, :n], tree_distances(heads))
        assert not batch[b, n:].any() and not batch[b, :, n:].any()
    with pytest.raises(DataError, match="cycle"):
        tree_distances_batch([np.array([-1, 0]), np.array([1, 0])])


def test_batched_scene_matrices_equal_each_sentence_on_its_own() -> None:
    from structnmt.data.structures import scene_matrices_batch

    rng = np.random.default_rng(11)
    sentences = []
    for _ in range(30):
        words, scenes = int(rng.integers(1, 10)), int(rng.integers(0, 5))
        pairs = [(w, s) for w in range(words) for s in range(scenes) if rng.random() < 0.3]
        sentences.append((words, np.asarray(pairs, dtype=np.int64).reshape(-1, 2), _random_forest(rng, scenes)))
    mask, dist = scene_matrices_batch(*zip(*sentences))
    for b, (words, members, parents) in enumerate(sentences):
        m, d = scene_matrices(words, members, parents)
        assert np.array_equal(mask[b, :words, :words], m) and np.array_equal(dist[b, :words, :words], d)
        assert mask[b, words:].all() and not dist[b, words:].any()


def test_damaged_stored_structure_is_a_data_error_not_a_wrong_batch() -> None:
    """Indices past a sentence's own words or scenes would read a neighbour's cells in a batched
    build: each is refused with the reason."""
    from structnmt.data.structures import scene_matrices_batch, tree_distances_batch

    with pytest.raises(DataError, match="head points past"):
        tree_distances_batch([np.array([-1, 3]), np.array([-1, 0, 1, 2])])
    with pytest.raises(DataError, match="scene membership"):
        scene_matrices_batch([2, 2], [np.array([[0, 0]]), np.array([[1, 0]])], [np.array([-1]), np.array([], int)])
    ex = {"ids": np.array([5, 6]), "word_index": np.array([0, 1]), "labels": np.array([3])}
    with pytest.raises(DataError, match="word index lies outside"):
        build_struct([ex], {"labels"}, [2], 0, 3)


def test_translate_names_its_input_to_the_sentence_encoder() -> None:
    """An alignment error of `translate` says which input and line (it named neither)."""
    from structnmt.config import DecodingConfig, ModelConfig
    from structnmt.decoding.translate import translate_lines
    from structnmt.model.transformer import Transformer

    class Refusing:  # the encoder's part: what a sentence the parser and SentencePiece disagree on raises
        def encode_sources(self, lines, with_structure, split="translate", numbers=None, path=None):
            raise DataError("sub-word 2 aligns to a word before the previous sub-word's word", path, numbers[0])

    model = Transformer(ModelConfig(d_model=16, n_heads=2, d_ff=32, enc_layers=1, dec_layers=1), 20, 20)
    with pytest.raises(DataError, match=r"^in\.txt:2: sub-word 2 aligns"):
        translate_lines(model, Refusing(), ["", "\u200bThe cat ."], DecodingConfig(), source="in.txt")
