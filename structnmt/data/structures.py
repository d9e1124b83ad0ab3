"""From word-level trees to the sub-word structures the attention plug-ins read.

A parser sees words, the model sees sub-words. docs/structures.md describes what is built
here and why: sub-words are aligned to words by character offsets, every
sub-word inherits its word's structure, and the dense (B, L) / (B, L, L) batch fields of
``structnmt/data/batch.py`` are built from small word-level matrices indexed by
``word_index``, so the cost per token is numpy indexing rather than Python loops.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

import numpy as np
import torch

from structnmt.data.example import DepTree
from structnmt.errors import DataError

#: every field ``build_struct`` knows; ``valid`` is always built
STRUCT_FIELDS = frozenset(
    {"valid", "word_index", "parent_mid", "parent_first", "dist", "scene_mask", "scene_dist", "labels"}
)
#: stored arrays each batch field is computed from
_NEEDS: dict[str, tuple[str, ...]] = {
    "word_index": ("word_index",),
    "parent_mid": ("parent_mid",),
    "parent_first": ("parent_first",),
    "dist": ("word_index", "heads"),
    "scene_mask": ("word_index", "scene_members", "scene_parent"),
    "scene_dist": ("word_index", "scene_members", "scene_parent"),
    "labels": ("word_index", "labels"),
}



def stored_arrays_for(fields: Iterable[str]) -> set[str]:
    """The stored arrays ``build_struct`` reads for ``fields`` (ids aside): the scene fields also
    count a sentence's words from its word-level arrays (``_n_words``)."""
    names = {need for field in fields if field != "valid" for need in _NEEDS.get(field, (field,))}
    if names & {"scene_members"}:
        names |= {"heads", "word_spans"}
    return names


def can_build(field: str, stored: Iterable[str]) -> bool:
    """True if the batch field ``field`` can be built from a side's stored arrays ``stored``
    (``dist`` and the scene fields are computed at collate time and never stored themselves)."""
    return field == "valid" or set(_NEEDS.get(field, (field,))) <= set(stored)

# ---------------------------------------------------------------------------
# sub-word <-> word alignment


def align_pieces_to_words(
    piece_spans: Sequence[tuple[int, int]],
    word_spans: Sequence[tuple[int, int]],
    path: str | Path | None = None,
    line: int | None = None,
) -> np.ndarray:
    """The word (0-based) of each sub-word, from character offsets in the same raw sentence.

    A piece belongs to the word it overlaps most (ties: the earlier word). A piece that
    overlaps no word (a lone "▁", a whitespace piece, the empty piece SentencePiece leaves where
    it normalised away a zero-width character) joins the word it lies in, else the next word,
    or the previous one at the end of the sentence. Every word must receive at least one piece, else the
    tokenisation and the parse disagree and the sentence cannot be used.
    """
    n_pieces, n_words = len(piece_spans), len(word_spans)
    if n_words == 0:
        raise DataError("cannot align sub-words to a sentence with no words", path, line)
    if n_pieces == 0:
        raise DataError("cannot align a sentence with no sub-words to its words", path, line)
    pieces = np.asarray(piece_spans, dtype=np.int64).reshape(n_pieces, 2)
    words = np.asarray(word_spans, dtype=np.int64).reshape(n_words, 2)
    ends = np.minimum(pieces[:, None, 1], words[None, :, 1])
    starts = np.maximum(pieces[:, None, 0], words[None, :, 0])
    overlap = np.clip(ends - starts, 0, None)
    index = overlap.argmax(axis=1)
    orphan = overlap.max(axis=1) == 0
    if orphan.any():
        # the first word that ends after the piece starts (the word it lies in, else the next
        # one); past the last word: the last word
        following = np.searchsorted(words[:, 1], pieces[orphan, 0], side="right")
        index[orphan] = np.minimum(following, n_words - 1)
    if np.any(np.diff(index) < 0):
        bad = int(np.flatnonzero(np.diff(index) < 0)[0]) + 1
        raise DataError(f"sub-word {bad + 1} aligns to a word before the previous sub-word's word "
                        "(pieces or words are out of order)", path, line)
    missing = np.setdiff1d(np.arange(n_words), index)
    if missing.size:
        w = int(missing[0])
        raise DataError(f"word {w + 1} (characters {words[w, 0]}..{words[w, 1]}) received no sub-word: "
                        "tokenisation and parse disagree", path, line)
    return index.astype(np.int32)


def merge_words_sharing_pieces(tree: DepTree, piece_spans: Sequence[tuple[int, int]]) -> DepTree:
    """Merge words that a single sub-word spans into one tree node.

    A parser may cut a string finer than the sub-word model does (spaCy reads "id" as
    "i" + "d"; one piece "▁id" covers both). Every sub-word has one word (docs/structures.md), so
    such words become one node: it takes the head and label of its member closest to the
    root (contracting there cannot create a cycle: no ancestor of the shallowest member is in
    the group), and every arc into a member points to the node. Trees whose words each get a
    piece come back unchanged.
    """
    n = len(tree.words)
    if n < 2 or not piece_spans:
        return tree
    words = np.asarray(tree.spans, dtype=np.int64).reshape(n, 2)
    pieces = np.asarray(piece_spans, dtype=np.int64).reshape(-1, 2)
    overlap = (np.minimum(pieces[:, None, 1], words[None, :, 1]) - np.maximum(pieces[:, None, 0], words[None, :, 0]))
    touches = overlap > 0
    group = np.arange(n)
    for row in touches:
        members = np.flatnonzero(row)
        if members.size > 1:  # pieces and words are in order, so members are consecutive
            group[members[0]: members[-1] + 1] = group[members[0]]
    if np.all(group == np.arange(n)):
        return tree
    depth = np.zeros(n, dtype=np.int64)
    for i in range(n):
        j, d = i, 0
        while tree.heads[j] != j and d <= n:
            j, d = tree.heads[j], d + 1
        depth[i] = d
    firsts = sorted(set(group.tolist()))
    new_id = {g: k for k, g in enumerate(firsts)}
    node_of = np.array([new_id[g] for g in group])
    heads, labels, spans, texts = [], [], [], []
    for g in firsts:
        members = np.flatnonzero(group == g)
        top = int(members[np.argmin(depth[members])])
        head = tree.heads[top]
        heads.append(int(node_of[head]) if head != top else new_id[g])
        labels.append(tree.labels[top])
        start, end = int(words[members[0], 0]), int(words[members[-1], 1])
        spans.append((start, end))
        texts.append(tree.text[start:end])
    return DepTree(tree.text, texts, spans, heads, labels, parser=tree.parser)


def project(tree: DepTree, word_index: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``parent_first`` (int32) and ``parent_mid`` (float32) of every sub-word (docs/structures.md, "The fields").

    Positions are 0-based sub-word positions within the sentence (no BOS/EOS); the batch
    shifts them. The root's parent is the root itself, so its sub-words point at their own
    word's middle, and its first sub-word at itself.
    """
    word_index = np.asarray(word_index, dtype=np.int64)
    n_words = len(tree)
    if word_index.size and (word_index.min() < 0 or word_index.max() >= n_words):
        raise DataError(f"word_index refers to words outside 0..{n_words - 1}")
    counts = np.bincount(word_index, minlength=n_words)
    if (counts == 0).any():
        w = int(np.flatnonzero(counts == 0)[0])
        raise DataError(f"word {w + 1} ({tree.words[w]!r}) has no sub-word")
    pos = np.arange(word_index.size, dtype=np.int64)
    middle = np.bincount(word_index, weights=pos, minlength=n_words) / counts
    first = np.full(n_words, word_index.size, dtype=np.int64)
    np.minimum.at(first, word_index, pos)
    heads = np.asarray(tree.heads, dtype=np.int64)
    parent_word = heads[word_index]
    parent_mid = middle[parent_word].astype(np.float32)
    is_first = pos == first[word_index]
    parent_first = np.where(is_first, first[parent_word], first[word_index]).astype(np.int32)
    return parent_first, parent_mid


# ---------------------------------------------------------------------------
# tree distances


def _ancestors(parents: np.ndarray) -> np.ndarray:
    """(n, n) bool, ``anc[i, j]`` iff j is i or an ancestor of i; a node with parent -1 or
    itself is a top node. Pointer chasing is vectorised over nodes, so the Python loop runs
    only as often as the tree is deep."""
    n = parents.size
    parents = np.where(parents < 0, np.arange(n), parents)
    anc = np.eye(n, dtype=bool)
    cur = np.arange(n)
    for _ in range(n):
        nxt = parents[cur]
        if np.array_equal(nxt, cur):
            return anc
        anc[np.arange(n), nxt] = True
        cur = nxt
    raise DataError("the tree has a cycle")


def tree_distances(heads: Sequence[int] | np.ndarray) -> np.ndarray:
    """Undirected path lengths between all words of a tree (int32, n x n).

    The ancestors of a node form a chain up to the root, so the ancestors two nodes share
    are the chain above their lowest common ancestor: ``depth(lca) = shared - 1`` and
    ``d(i, j) = depth(i) + depth(j) - 2 depth(lca)``. One matrix product, no pair loop.
    A forest (several tops, ``-1`` heads) behaves as if its tops hung from one virtual root.
    """
    parents = np.asarray(heads, dtype=np.int64)
    n = parents.size
    if n == 0:
        return np.zeros((0, 0), dtype=np.int32)
    tops = (parents < 0) | (parents == np.arange(n))
    if tops.sum() > 1:  # join the tops under a virtual node n, then drop it
        joined = np.where(tops, n, parents)
        return tree_distances(np.append(joined, n))[:n, :n]
    anc = _ancestors(parents).astype(np.float32)
    depth = anc.sum(axis=1) - 1.0
    shared = anc @ anc.T
    dist = depth[:, None] + depth[None, :] - 2.0 * (shared - 1.0)
    return np.rint(dist).astype(np.int32)


def ragged_cells(counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(row, column) of every item of ragged rows holding ``counts`` items each: where a flat
    concatenation of the rows lands in a padded (rows, longest) array, in one scatter."""
    counts = np.asarray(counts, dtype=np.int64)
    rows = np.repeat(np.arange(counts.size), counts)
    return rows, np.arange(rows.size) - np.repeat(np.cumsum(counts) - counts, counts)


def tree_distances_batch(heads: Sequence[np.ndarray]) -> np.ndarray:
    """``tree_distances`` of many trees at once: (B, W, W) int32, W the most words, each tree's
    distances in its top-left block (zeros elsewhere). Every tree hangs from one virtual root at
    index W (a forest's tops as ``tree_distances`` joins them; a single top one level lower, which
    changes no path), padding nodes too, so the pointer chase and the ancestor product run once
    for the batch: the Python loop runs as often as the deepest tree is deep."""
    B = len(heads)
    sizes = np.asarray([len(h) for h in heads], dtype=np.int64)
    W = int(sizes.max(initial=0))
    if B == 0 or W == 0:
        return np.zeros((B, W, W), dtype=np.int32)
    root = W
    parents = np.full((B, W + 1), root, dtype=np.int64)
    rows, cols = ragged_cells(sizes)
    flat = np.concatenate([np.asarray(h, dtype=np.int64) for h in heads])
    if (flat >= np.repeat(sizes, sizes)).any():
        b = int(rows[np.argmax(flat >= np.repeat(sizes, sizes))])
        raise DataError(f"a stored head points past its sentence's {sizes[b]} words (sentence {b} of the batch): "
                        "the dataset is damaged")
    flat = np.where((flat < 0) | (flat == cols), root, flat)  # tops hang from the virtual root
    parents[rows, cols] = flat
    anc = np.zeros((B, W + 1, W + 1), dtype=bool)
    b_idx, node = np.arange(B)[:, None], np.arange(W + 1)[None, :]
    anc[b_idx, node, node] = True
    cur = np.broadcast_to(node, (B, W + 1))
    for _ in range(W + 1):
        nxt = np.take_along_axis(parents, cur, axis=1)
        if np.array_equal(nxt, cur):
            break
        anc[b_idx, node, nxt] = True
        cur = nxt
    else:
        raise DataError("the tree has a cycle")
    anc_f = anc.astype(np.float32)
    depth = anc_f.sum(axis=2) - 1.0
    shared = anc_f @ anc_f.transpose(0, 2, 1)
    dist = depth[:, :, None] + depth[:, None, :] - 2.0 * (shared - 1.0)
    real = node[:, :W] < sizes[:, None]
    return np.where(real[:, :, None] & real[:, None, :], np.rint(dist[:, :W, :W]), 0).astype(np.int32)


# ---------------------------------------------------------------------------
# scenes at word level


def scene_matrices(n_words: int, members: np.ndarray, parents: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Word-level ``scene_mask`` (bool) and ``scene_dist`` (float32), both (n_words, n_words).

    Two words share a scene iff some scene holds both; a word in no scene keeps an all-True
    row (SASA leaves it unmodified), while other words' rows keep it masked (they share no
    scene with it). ``scene_dist`` is the distance in the scene tree between the words'
    nearest scenes (minimum over the scenes each is in); 0 where a word has no scene.
    """
    members = np.asarray(members, dtype=np.int64).reshape(-1, 2)
    n_scenes = int(np.asarray(parents).size)
    member = np.zeros((n_words, max(n_scenes, 1)), dtype=bool)
    if members.size:
        member[members[:, 0], members[:, 1]] = True
    member = member[:, :n_scenes]
    in_none = ~member.any(axis=1)
    mask = (member.astype(np.float32) @ member.T.astype(np.float32)) > 0
    mask[in_none, :] = True
    np.fill_diagonal(mask, True)
    if n_scenes == 0:
        return mask, np.zeros((n_words, n_words), dtype=np.float32)
    sdist = tree_distances(np.asarray(parents)).astype(np.float32)
    inf = np.float32(np.inf)
    # nearest scene of word a to each scene t, then to each word b's scenes
    to_scene = np.where(member[:, :, None], sdist[None, :, :], inf).min(axis=1)  # (words, scenes)
    dist = np.where(member[None, :, :], to_scene[:, None, :], inf).min(axis=2)  # (words, words)
    dist[~np.isfinite(dist)] = 0.0
    return mask, dist.astype(np.float32)


def scene_matrices_batch(n_words: Sequence[int], members: Sequence[np.ndarray],
                         parents: Sequence[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """``scene_matrices`` of many sentences at once: ``scene_mask`` (B, W, W) bool and
    ``scene_dist`` (B, W, W) float32, W the most words, each sentence's matrices in its top-left
    block (True and 0 elsewhere)."""
    B = len(n_words)
    sizes = np.asarray(n_words, dtype=np.int64)
    W = int(sizes.max(initial=0))
    n_scenes = [int(np.asarray(p).size) for p in parents]
    S = max(max(n_scenes, default=0), 1)
    member = np.zeros((B, W, S), dtype=bool)
    # every sentence's (word, scene) pairs in one array, checked and scattered at once
    pairs = [np.asarray(m, dtype=np.int64).reshape(-1, 2) for m in members]
    per = np.fromiter((len(m) for m in pairs), dtype=np.int64, count=B)
    if per.sum():
        flat = np.concatenate(pairs)
        owner, _ = ragged_cells(per)
        bad = (flat < 0).any(axis=1) | (flat[:, 0] >= sizes[owner]) | (flat[:, 1] >= np.asarray(n_scenes)[owner])
        if bad.any():
            b = int(owner[bad.argmax()])
            raise DataError(f"a stored scene membership (word, scene) lies outside sentence {b} of the batch "
                            f"({sizes[b]} words, {n_scenes[b]} scenes): the dataset is damaged")
        member[owner, flat[:, 0], flat[:, 1]] = True
    member_f = member.astype(np.float32)
    mask = (member_f @ member_f.transpose(0, 2, 1)) > 0
    mask |= ~member.any(axis=2)[:, :, None]  # a word in no scene: its row all True
    mask[:, np.arange(W), np.arange(W)] = True
    sdist = tree_distances_batch([np.asarray(p, dtype=np.int64) for p in parents]).astype(np.float32)
    sdist = np.pad(sdist, ((0, 0), (0, S - sdist.shape[1]), (0, S - sdist.shape[2])))
    inf = np.float32(np.inf)
    # the nearest-scene minima, one scene at a time: (B, W, W) cells at once, never (B, W, W, S),
    # and S running minima over whole arrays (6x faster than a min over a short last axis)
    to_scene = np.full((B, W, S), inf, dtype=np.float32)  # word a's nearest scene to each scene t
    for s in range(S):
        np.minimum(to_scene, np.where(member[:, :, s, None], sdist[:, None, s, :], inf), out=to_scene)
    dist = np.full((B, W, W), inf, dtype=np.float32)  # ... then to each word b's scenes
    for t in range(S):
        np.minimum(dist, np.where(member[:, None, :, t], to_scene[:, :, None, t], inf), out=dist)
    dist[~np.isfinite(dist)] = 0.0
    real = np.arange(W)[None, :] < sizes[:, None]
    block = real[:, :, None] & real[:, None, :]
    return mask | ~block, np.where(block, dist, 0.0).astype(np.float32)


# ---------------------------------------------------------------------------
# dense batch fields


def _n_words(ex: Mapping[str, np.ndarray], word_index: np.ndarray) -> int:
    """Word count of a stored sentence, whichever word-level arrays it has."""
    for name in ("heads", "word_spans"):
        if name in ex:
            return len(ex[name])
    members = np.asarray(ex.get("scene_members", np.zeros((0, 2))), dtype=np.int64).reshape(-1, 2)
    return int(max(word_index.max(initial=-1), members[:, 0].max(initial=-1))) + 1


def build_struct(
    examples_side: Sequence[Mapping[str, np.ndarray]],
    fields: set[str] | frozenset[str],
    lengths: Sequence[int] | np.ndarray,
    offset: int,
    max_len: int,
) -> dict[str, torch.Tensor]:
    """The padded structure fields of one side of a batch (see ``batch.py`` for meanings).

    ``examples_side[b]`` holds one sentence's stored arrays (``ids``, ``word_index``,
    ``parent_first``, ``parent_mid``, ``heads``, ``labels``, ``scene_members``,
    ``scene_parent``); ``lengths[b]`` is its sub-word count. Sub-word ``m`` sits at batch
    position ``m + offset``: 0 for the source (EOS follows), 1 for the target (BOS first).
    Only ``fields`` (plus ``valid``) are built; the O(L^2) ones come from word-level
    matrices gathered with ``word_index``.
    """
    unknown = set(fields) - STRUCT_FIELDS
    if unknown:
        raise ValueError(f"unknown structure fields: {sorted(unknown)}")
    B, L = len(examples_side), max_len
    lengths = [int(n) for n in lengths]
    if any(n + offset > L for n in lengths):
        raise ValueError(f"max_len {L} is too short for {max(lengths)} sub-words at offset {offset}")
    for name in fields - {"valid"}:
        for need in _NEEDS[name]:
            if any(need not in ex for ex in examples_side):
                raise DataError(f"structure field {name!r} needs the stored {need!r}, which this dataset "
                                "lacks (prepare it with a parser / scenes on this side)")
    pos = np.arange(L)
    valid = (pos >= offset) & (pos < offset + np.asarray(lengths, dtype=np.int64).reshape(B, 1))
    out: dict[str, torch.Tensor] = {"valid": torch.from_numpy(valid)}

    # each sentence's sub-words, flattened: batch row and column of every one, so that a per-token
    # field is one concatenation and one scatter, not a loop of row copies
    counts = np.asarray(lengths, dtype=np.int64)
    at_row, at_col = ragged_cells(counts)
    at_col = at_col + offset

    def flat(name: str, dtype: type) -> np.ndarray:
        if not len(at_row):
            return np.zeros(0, dtype=dtype)
        return np.concatenate([ex[name][:n] for ex, n in zip(examples_side, lengths)]).astype(dtype, copy=False)

    def per_token(name: str, default: np.ndarray, dtype: type, values) -> None:
        if name not in fields:
            return
        arr = np.array(np.broadcast_to(default, (B, L)), dtype=dtype)
        arr[at_row, at_col] = values()
        out[name] = torch.from_numpy(arr)

    def labels() -> np.ndarray:  # each sub-word's word's label: word_index into the sentence's labels
        words = np.asarray([len(ex["labels"]) for ex in examples_side], dtype=np.int64)
        stored = np.concatenate([np.asarray(ex["labels"], dtype=np.int64) for ex in examples_side]) if B else words
        index = flat("word_index", np.int64)
        if ((index < 0) | (index >= np.repeat(words, counts))).any():
            raise DataError("a stored word index lies outside its sentence's labelled words: the dataset is damaged")
        return stored[np.repeat(np.cumsum(words) - words, counts) + index]

    per_token("word_index", np.int64(-1), np.int64, lambda: flat("word_index", np.int64))
    per_token("parent_first", pos, np.int64, lambda: flat("parent_first", np.int64) + offset)
    per_token("parent_mid", pos, np.float32, lambda: flat("parent_mid", np.float32) + offset)
    per_token("labels", np.int64(0), np.int64, labels)

    pair_fields = fields & {"dist", "scene_mask", "scene_dist"}
    if pair_fields:
        # word-level matrices of the whole batch, then one gather to sub-words through word_index
        wi = np.zeros((B, L), dtype=np.int64)
        wi[at_row, at_col] = flat("word_index", np.int64)
        rows = np.arange(B)[:, None, None]
        block = valid[:, :, None] & valid[:, None, :]

        def to_subwords(words: np.ndarray, default: float | bool) -> torch.Tensor:
            cells = words[rows, wi[:, :, None], wi[:, None, :]] if words.size else np.zeros((B, L, L), words.dtype)
            return torch.from_numpy(np.where(block, cells, default).astype(words.dtype))

        if "dist" in fields:
            words = tree_distances_batch([np.asarray(ex["heads"]) for ex in examples_side]).astype(np.float32)
            out["dist"] = to_subwords(words, 0.0)
        if fields & {"scene_mask", "scene_dist"}:
            n_words = [_n_words(ex, np.asarray(ex["word_index"][:n])) for ex, n in zip(examples_side, lengths)]
            mask, sdist = scene_matrices_batch(n_words, [ex["scene_members"] for ex in examples_side],
                                               [ex["scene_parent"] for ex in examples_side])
            if "scene_mask" in fields:
                out["scene_mask"] = to_subwords(mask, True)
            if "scene_dist" in fields:
                out["scene_dist"] = to_subwords(sdist, 0.0)
    return out
