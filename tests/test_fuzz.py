"""Property-based tests (Hypothesis) of the readers and the word -> sub-word projection.

Readers, fed random bytes, either return clean lines or raise the project's own
:class:`~structnmt.errors.StructNMTError` (never a ``UnicodeDecodeError``, ``IndexError`` ...).
The projection, fed random trees and random splits of words into pieces, keeps its
invariants: every sub-word has exactly one word and words keep their order, every parent
position lies inside the sentence, and tree distances are symmetric, zero on the diagonal
and one along every arc.
"""

from __future__ import annotations

import unicodedata
from pathlib import Path

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from structnmt.config import CleanConfig, SplitFiles
from structnmt.data.corpus import read_parallel, read_raw
from structnmt.data.example import DepTree
from structnmt.data.parsing.conllu_backend import ConlluParser
from structnmt.data.structures import align_pieces_to_words, build_struct, project, tree_distances
from structnmt.errors import DataError, StructNMTError

# no example database: tests leave no .hypothesis directory in the checkout; derandomised, so a
# failure CI finds is the one a rerun finds (and a slow, loaded machine fails no health check)
FAST = settings(max_examples=60, deadline=None, database=None, derandomize=True,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])

# lines mixing ordinary text, whitespace, control characters, lone surrogates written as
# (invalid) UTF-8 bytes, stray continuation bytes and CR/LF
FRAGMENTS = [b"a", b"Hund", b"\xc3\xa4", b" ", b"\t", b"\r", b"\n", b"\n\n", b"\x00", b"\x07", b"\x1b",
             b"\xed\xa0\x80", b"\xff", b"\x80", b"\xe2\x80\xa8", b"\xef\xbb\xbf", b"\x7f", b"\xc2\x85"]
raw_bytes = st.lists(st.sampled_from(FRAGMENTS), max_size=40).map(b"".join)


def _bad_char(text: str) -> bool:
    return any(ch != "\t" and unicodedata.category(ch) == "Cc" for ch in text)


@FAST
@given(data=raw_bytes, drop=st.booleans())
def test_read_raw_returns_clean_lines_or_a_data_error(tmp_path_factory, data: bytes, drop: bool) -> None:
    path = tmp_path_factory.mktemp("raw") / "f.txt"
    path.write_bytes(data)
    try:
        raw = read_raw(path, drop_bad_lines=drop)
    except DataError as err:
        assert not drop and err.path == str(path) and err.line is not None
        return
    # lines end at b"\n" only (CR, U+2028 and NEL stay inside a line)
    assert len(raw.lines) == data.count(b"\n") + (1 if data and not data.endswith(b"\n") else 0)
    for number, line in enumerate(raw.lines, start=1):
        if line is None:
            assert number in raw.bad
        else:
            assert "\n" not in line and not _bad_char(line)


@FAST
@given(src=raw_bytes, tgt=raw_bytes, drop=st.booleans(), max_len=st.integers(1, 5))
def test_read_parallel_never_crashes(tmp_path_factory, src: bytes, tgt: bytes, drop: bool, max_len: int) -> None:
    root = tmp_path_factory.mktemp("par")
    (root / "s").write_bytes(src)
    (root / "t").write_bytes(tgt)
    clean = CleanConfig(max_len=max_len, max_ratio=2.0, drop_bad_lines=drop)
    try:
        pairs, report = read_parallel(SplitFiles(src=str(root / "s"), tgt=str(root / "t")), clean)
    except DataError as err:
        assert err.path in (str(root / "s"), str(root / "t"))
        return
    assert report["kept"] == len(pairs) and sum(v for k, v in report.items() if k not in ("read", "kept")) \
        == report["read"] - report["kept"]
    for _, s, t in pairs:
        assert 1 <= len(s.split()) <= max_len and 1 <= len(t.split()) <= max_len


CONLLU_FRAGMENTS = ["1", "2", "3", "0", "-", ".", "_", "\t", "\n", "\n\n", "#", " ", "root", "dep", "a", "b",
                    "1-2", "2.1", "x", "-1", "99"]


@FAST
@given(body=st.lists(st.sampled_from(CONLLU_FRAGMENTS), max_size=60).map("".join),
       text=st.sampled_from(["a b", "a", "ab", "b a", "a b ."]))
def test_conllu_reader_only_raises_data_errors(tmp_path_factory, body: str, text: str) -> None:
    path = tmp_path_factory.mktemp("conllu") / "p.conllu"
    path.write_text(body, encoding="utf-8")
    try:
        trees = ConlluParser(path).parse([text])
    except StructNMTError as err:
        assert isinstance(err, DataError) and err.path == str(path)
        return
    (tree,) = trees
    tree.check()
    assert all(text[a:b].replace(" ", "") == "".join(w.split()) for w, (a, b) in zip(tree.words, tree.spans))


row = st.tuples(
    st.sampled_from(["1", "2", "3", "4", "1-2", "2-3", "3.1", "0", "x"]),  # id: word, range, empty node, junk
    st.sampled_from(["a", "b", "ab", ".", "c", "_"]),  # form
    st.sampled_from(["0", "1", "2", "3", "4", "_", "-1"]),  # head
).map(lambda r: "\t".join([r[0], r[1], "_", "_", "_", "_", r[2], "dep", "_", "_"]))


@FAST
@given(rows=st.lists(row, min_size=1, max_size=6), text=st.sampled_from(["a b", "ab", "a b .", "a ab c"]),
       merge=st.booleans())
def test_conllu_rows_with_random_ids_and_heads(tmp_path_factory, rows: list[str], text: str, merge: bool) -> None:
    """Well-formed rows, random ids and heads: a checked tree over the text or a DataError on line 1."""
    path = tmp_path_factory.mktemp("rows") / "p.conllu"
    path.write_text("\n".join(rows) + "\n\n", encoding="utf-8")
    try:
        (tree,) = ConlluParser(path, merge_multiword=merge).parse([text])
    except StructNMTError as err:
        assert isinstance(err, DataError) and err.path == str(path) and err.line == 1
        return
    tree.check()
    assert all(0 <= a < b <= len(text) for a, b in tree.spans)


# ---------------------------------------------------------------------------
# random trees and random sub-word splits


@st.composite
def trees(draw, max_words: int = 12) -> list[int]:
    """0-based heads of a random single-rooted tree (root points to itself), nodes shuffled."""
    n = draw(st.integers(1, max_words))
    parent = [0] + [draw(st.integers(0, i - 1)) for i in range(1, n)]  # node i hangs below an earlier node
    order = draw(st.permutations(range(n)))  # node k of the construction is word order[k]
    heads = [0] * n
    for k in range(n):
        heads[order[k]] = order[parent[k]]
    return heads


@st.composite
def sentences(draw):
    """A tree over random words, the sentence text, and a random split of each word into pieces.

    Pieces are contiguous character ranges inside a word; some words get a lone "▁" piece
    with an empty span first, as SentencePiece produces before a piece of its own.
    """
    heads = draw(trees())
    words = [draw(st.text("abcdéü", min_size=1, max_size=6)) for _ in heads]
    gaps = [draw(st.sampled_from([" ", "  ", "\t"])) for _ in heads]
    text, spans = "", []
    for word, gap in zip(words, gaps):
        text += gap if text else ""
        spans.append((len(text), len(text) + len(word)))
        text += word
    pieces, truth = [], []
    for w, (start, end) in enumerate(spans):
        if draw(st.booleans()) and draw(st.booleans()):
            pieces.append((start, start))
            truth.append(w)
        cuts = sorted(draw(st.sets(st.integers(start + 1, end - 1), max_size=3)) if end - start > 1 else set())
        bounds = [start, *cuts, end]
        pieces += list(zip(bounds[:-1], bounds[1:]))
        truth += [w] * (len(bounds) - 1)
    tree = DepTree(text, words, spans, heads, ["root" if h == i else "dep" for i, h in enumerate(heads)])
    return tree, pieces, np.asarray(truth)


@FAST
@given(sentence=sentences())
def test_projection_invariants(sentence) -> None:
    tree, pieces, truth = sentence
    tree.check()
    word_index = align_pieces_to_words(pieces, tree.spans)
    np.testing.assert_array_equal(word_index, truth)  # each piece gets the word it lies in
    n = len(pieces)
    assert np.all(np.diff(word_index) >= 0) and set(word_index.tolist()) == set(range(len(tree)))

    parent_first, parent_mid = project(tree, word_index)
    assert parent_first.shape == parent_mid.shape == (n,)
    assert np.all((0 <= parent_first) & (parent_first < n))
    assert np.all((0 <= parent_mid) & (parent_mid <= n - 1))
    heads = np.asarray(tree.heads)
    first_of = {w: int(np.flatnonzero(word_index == w)[0]) for w in range(len(tree))}
    for m, w in enumerate(word_index):
        # a word-initial piece points at its head word's first piece; the others at their own word's
        expected = first_of[heads[w]] if m == first_of[w] else first_of[w]
        assert parent_first[m] == expected
        assert np.isclose(parent_mid[m], np.flatnonzero(word_index == heads[w]).mean())

    dist = tree_distances(tree.heads)
    assert np.array_equal(dist, dist.T) and not np.diag(dist).any()
    for i, h in enumerate(tree.heads):
        assert dist[i, h] == (0 if h == i else 1)
    assert np.all(dist[~np.eye(len(tree), dtype=bool)] > 0)

    arrays = {"word_index": word_index, "parent_first": parent_first, "parent_mid": parent_mid,
              "heads": np.asarray(tree.heads)}
    for offset in (0, 1):
        struct = build_struct([arrays], {"dist", "parent_first", "word_index"}, [n], offset, n + 2)
        d = struct["dist"][0].numpy()
        assert np.array_equal(d, d.T) and not np.diag(d).any()
        block = d[offset:offset + n, offset:offset + n]
        np.testing.assert_array_equal(block, dist[np.ix_(word_index, word_index)])
        assert struct["valid"][0].sum() == n
        pf = struct["parent_first"][0].numpy()
        assert np.all((offset <= pf[offset:offset + n]) & (pf[offset:offset + n] < offset + n))


@FAST
@given(heads=st.lists(st.integers(-3, 14), min_size=1, max_size=12))
def test_arbitrary_heads_are_checked_not_crashed_on(heads: list[int]) -> None:
    """Any list of heads (cycles, several roots, out of range) is a tree or a DataError."""
    n = len(heads)
    text = " ".join("w" for _ in heads)
    tree = DepTree(text, ["w"] * n, [(2 * i, 2 * i + 1) for i in range(n)], heads, ["dep"] * n)
    try:
        tree.check("t.conllu", 3)
    except DataError as err:
        assert (err.path, err.line) == ("t.conllu", 3)
        in_range = all(0 <= h < n for h in heads)
        if in_range:  # in range but unusable: tree_distances must refuse cycles too, never loop forever
            try:
                tree_distances(heads)
            except DataError:
                pass
        return
    dist = tree_distances(heads)
    assert np.array_equal(dist, dist.T) and not np.diag(dist).any()
    assert dist.max(initial=0) <= n - 1


def test_reader_of_an_existing_tree_written_by_hand(tmp_path: Path) -> None:
    """A control for the fuzzers: a valid sentence really is read (the properties are not vacuous)."""
    path = tmp_path / "ok.conllu"
    path.write_text("1\ta\t_\t_\t_\t_\t0\troot\t_\t_\n2\tb\t_\t_\t_\t_\t1\tdep\t_\t_\n\n", encoding="utf-8")
    (tree,) = ConlluParser(path).parse(["a b"])
    assert tree.heads == [0, 0] and tree.spans == [(0, 1), (2, 3)]
