"""What a trained model's structure-aware heads say, at word level (``structnmt inspect``).

* :func:`dbsa_trees`: the dependency tree a DBSA/SISA/SyncAttn head induces (UAS against the
  parser with :func:`structnmt.evaluation.trees.uas`);
* :func:`lpsi_trees`: the binary phrase structure of LPSI's syntactic distances (UF with
  :func:`structnmt.evaluation.trees.unlabeled_f1`);
* :func:`cross_attention_alignments`: word alignments from cross-attention (AER with
  :func:`structnmt.evaluation.alignment.aer`);
* :func:`head_parent_attention`: for every encoder self-attention head of any model, vanilla
  included, how often the word it attends to most is the word's parent, and how much
  attention the parent gets (did the heads learn the trees a method was given, or did a plain
  Transformer find them anyway?).

Every function runs teacher-forced passes (the gold target is fed, as the papers do for
analyses), in eval mode and without gradients, over batches whose structure dicts carry
``word_index`` for the sides read (sub-word models are analysed at word level). Results come
in example order: sorted by ``Batch.index`` when every batch has one, else in the order read.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

import numpy as np
import torch
from torch import Tensor

from structnmt.data.batch import Batch
from structnmt.errors import ConfigError, DataError
from structnmt.evaluation.alignment import (
    Link,
    alignments_from_attention,
    grow_diag_final,
    word_level_attention,
)
from structnmt.evaluation.trees import Span, decode_tree_from_scores, tree_from_distances
from structnmt.model.methods.base import RecordKey
from structnmt.model.transformer import Transformer

LOG_FLOOR = 1e-9
STACKS = {"src": "encoder", "tgt": "decoder"}


def _readable(model: Transformer, reading: str, side: str, layer: int | None) -> RecordKey:
    """The record that holds ``reading`` (a method's ``readouts``) in self-attention ``layer`` of
    ``side`` (0-based; default the first layer a method offers it in)."""
    from structnmt.model.methods import METHODS

    stack = STACKS[side]
    at = {site.layer: m.readouts[reading] for m in model.methods if reading in m.readouts
          for site in m.sites() if site.stack == stack and site.attention == "self"}
    what = reading.replace("_", " ")
    if not at:
        known = "/".join(sorted(name for name, cls in METHODS.items() if reading in cls.readouts))
        raise ConfigError(f"the model has no {known} layer on the {side} side to read a {what} from")
    if layer is not None and layer not in at:
        raise ConfigError(f"the model reads no {what} in {stack} layer {layer + 1} (only in "
                          f"{', '.join(str(k + 1) for k in sorted(at))})", "layer")
    layer = min(at) if layer is None else layer
    return (stack, layer, "self", at[layer])


def _run(model: Transformer, batches: Iterable[Batch], record: set[RecordKey]):
    """Yield (batch, records) of teacher-forced passes, in eval mode without gradients."""
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    try:
        with torch.no_grad():
            for batch in batches:
                batch = batch.to(device)
                yield batch, model(batch, record=record).records
    finally:
        model.train(was_training)


def _word_index(batch: Batch, side: str) -> Tensor:
    fields = batch.struct.get(side, {})
    if "word_index" not in fields:
        raise DataError(f"the batches carry no {side} word_index: build them with the word_index field")
    return fields["word_index"]


def _in_order(items: list[tuple[int | None, object]]) -> list:
    if items and all(index is not None for index, _ in items):
        items = sorted(items, key=lambda pair: pair[0])  # type: ignore[arg-type, return-value]
    return [value for _, value in items]


def _indices(batch: Batch) -> list[int | None]:
    return batch.index.tolist() if batch.index is not None else [None] * batch.size


def _words(word_index: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """First and last sub-word position of each word (words numbered 0..n−1)."""
    n = int(word_index.max()) + 1 if (word_index >= 0).any() else 0
    first = np.full(n, -1)
    last = np.full(n, -1)
    for pos, w in enumerate(word_index):
        if w >= 0:
            if first[w] < 0:
                first[w] = pos
            last[w] = pos
    if (first < 0).any():
        raise DataError("a word has no sub-word in word_index (words must be numbered 0..n-1)")
    return first, last


def dbsa_trees(model: Transformer, batches: Iterable[Batch], side: Literal["src", "tgt"] = "src",
               layer: int | None = None) -> list[list[int]]:
    """Per sentence, the word-level heads (root: itself) induced by a supervised head.

    The recorded ``"dbsa"`` weights (mean over the method's heads) are read between the first
    sub-words of words (what ``parent_first`` trained them on): ``scores[w, h] = log A[first(w),
    first(h)]``, decoded into a well-formed tree by
    :func:`~structnmt.evaluation.trees.decode_tree_from_scores` (each word's best parent
    whenever those already form a tree). ``layer`` is 0-based; default the method's first.
    """
    key = _readable(model, "dependency_tree", side, layer)
    out: list[tuple[int | None, object]] = []
    for batch, records in _run(model, batches, {key}):
        attn = records[key].float().mean(1).cpu().numpy()  # (B, L, L)
        word_index = _word_index(batch, side).cpu().numpy()
        for b, index in enumerate(_indices(batch)):
            first, _ = _words(word_index[b])
            if len(first) == 0:
                out.append((index, []))
                continue
            scores = np.log(np.maximum(attn[b][np.ix_(first, first)], LOG_FLOOR))
            out.append((index, decode_tree_from_scores(scores)))
    return _in_order(out)


def sentence_parent_scores(attn: np.ndarray, word_index: np.ndarray,
                           parents: list[int] | np.ndarray) -> tuple[np.ndarray, np.ndarray, int]:
    """Per head, summed over one sentence's non-root words: (argmax-is-parent hits, attention
    mass on the parent), and the number of those words.

    ``attn`` is (H, L, L) sub-word self-attention. It is read at word level: a word's row is the
    mean of its sub-words' rows, a word's column the sum of its sub-words' columns (so each row
    stays a share of the attention); EOS and padding (negative ``word_index``) are dropped. A
    word's own column is left out of its argmax (a word is never its own parent). Roots are
    marked by a negative parent or by pointing to themselves.
    """
    index = np.asarray(word_index)
    first, _ = _words(index)
    n = len(first)
    parents = np.asarray(parents, dtype=np.int64)
    if parents.size != n:
        raise DataError(f"{parents.size} heads for a sentence of {n} words")
    if n == 0:
        return np.zeros(attn.shape[0]), np.zeros(attn.shape[0]), 0
    onehot = np.zeros((index.size, n))
    onehot[np.flatnonzero(index >= 0), index[index >= 0]] = 1.0
    words = np.einsum("li,hlm,mj->hij", onehot, attn[:, :index.size, :index.size].astype(np.float64), onehot)
    words /= onehot.sum(0)[None, :, None]  # rows: mean over the word's sub-words
    own = np.arange(n)
    child = own[(parents >= 0) & (parents != own)]
    if child.size == 0:
        return np.zeros(attn.shape[0]), np.zeros(attn.shape[0]), 0
    rows = words[:, child, :].copy()  # (H, C, n)
    mass = rows[:, np.arange(child.size), parents[child]].sum(1)
    rows[:, np.arange(child.size), child] = -np.inf
    hits = (rows.argmax(-1) == parents[child][None, :]).sum(1).astype(np.float64)
    return hits, mass, int(child.size)


def head_parent_attention(model: Transformer, batches: Iterable[Batch], parents: list[list[int]]) -> dict:
    """For every encoder self-attention head: the share of non-root source words whose most
    attended other word is their parent (``accuracy``, as in analyses of which heads are
    syntactic) and the mean attention their parent gets (``mass``), teacher-forced.

    ``parents`` holds each example's word-level heads (by ``Batch.index``; in reading order when
    batches carry no index). Returns ``{"accuracy": [[per head] per layer], "mass": ..., "words": N}``.
    """
    layers = model.cfg.enc_layers
    keys = {("encoder", layer, "self", "probs") for layer in range(layers)}
    hits = mass = None
    words = seen = 0
    for batch, records in _run(model, batches, keys):
        probs = [records[("encoder", layer, "self", "probs")].float().cpu().numpy() for layer in range(layers)]
        word_index = _word_index(batch, "src").cpu().numpy()
        for b, index in enumerate(_indices(batch)):
            tree = parents[index if index is not None else seen]
            seen += 1
            scores = [sentence_parent_scores(p[b], word_index[b], tree) for p in probs]
            h = np.stack([s[0] for s in scores])
            m = np.stack([s[1] for s in scores])
            hits, mass = (h, m) if hits is None else (hits + h, mass + m)
            words += scores[0][2]
    if hits is None or words == 0:
        raise DataError("no word with a parent in the batches: nothing to score heads against")
    return {"accuracy": (hits / words).round(4).tolist(), "mass": (mass / words).round(4).tolist(), "words": words}


def best_offset_accuracy(parents: list[list[int]], offsets: range = range(-3, 4)) -> tuple[int, float]:
    """The positional baseline of head analyses: the share of non-root words whose parent is the
    word at one fixed relative offset, for the best offset (a head that always looks one word to
    the left scores this much without knowing any syntax)."""
    counts = dict.fromkeys((k for k in offsets if k != 0), 0)
    total = 0
    for tree in parents:
        for w, p in enumerate(tree):
            if p >= 0 and p != w:
                total += 1
                if p - w in counts:
                    counts[p - w] += 1
    if total == 0:
        return 0, 0.0
    best = max(counts, key=lambda k: counts[k])
    return best, round(counts[best] / total, 4)


@dataclass
class InducedTree:
    distances: list[float]  # the n−1 boundary distances between consecutive words
    brackets: list[Span]
    words: int


def resolve_boundary(boundary: str, side: str) -> str:
    """The reading ``auto`` stands for on ``side`` (see :func:`lpsi_trees`)."""
    if boundary == "auto":
        return "before" if side == "src" else "after"
    return boundary


def lpsi_trees(model: Transformer, batches: Iterable[Batch], side: Literal["src", "tgt"] = "src",
               layer: int | None = None,
               boundary: Literal["auto", "before", "after"] = "auto") -> list[InducedTree]:
    """Per sentence, the phrase structure of LPSI's distances (``layer`` 0-based; default the first).

    Which word boundary a token's distance marks is not fixed by the model: the convolution
    and the gate are the same either way, and each side learns its own reading.

    * ``before``: ``d_i`` is the boundary between tokens i−1 and i (PRPN's reading: the gate
      lets query t see back to the nearest j with ``d_j > d_t``, j included, so a large ``d_j``
      opens a constituent at j). A word's distance is the one at its *first* sub-word; words
      1..n−1 give the n−1 boundaries.
    * ``after``: the paper's wording, ``d_i`` belongs to the span (i, i+1). A word's distance is
      the one at its *last* sub-word; words 0..n−2 give the boundaries. A decoder position
      predicts the next token, so its distance can anticipate the boundary that follows.
    * ``auto``: ``before`` for the encoder, ``after`` for the decoder (the paper scores trees
      on the decoder side). Chosen on the demo task's validation split, where the other
      reading scores far below a right-branching tree on each side (docs/results.md).

    The tree splits top-down at the largest boundary distance (Shen et al. 2018). Distances
    are the mean over the layer's gated heads. ``InducedTree.distances`` holds the n−1
    boundary distances that were split.
    """
    boundary = resolve_boundary(boundary, side)
    key = _readable(model, "phrase_structure", side, layer)
    out: list[tuple[int | None, object]] = []
    for batch, records in _run(model, batches, {key}):
        dist = records[key].float().mean(1).cpu().numpy()  # (B, L)
        word_index = _word_index(batch, side).cpu().numpy()
        for b, index in enumerate(_indices(batch)):
            first, last = _words(word_index[b])
            if boundary == "before":
                bounds = [float(x) for x in dist[b][first[1:]]]
            else:
                bounds = [float(x) for x in dist[b][last[:-1]]]
            out.append((index, InducedTree(bounds, tree_from_distances(bounds) if len(first) else [], len(first))))
    return _in_order(out)


@dataclass
class SentenceAlignment:
    tgt2src: set[Link]  # each target word's most-attended source word
    src2tgt: set[Link]  # each source word's most-attending target word
    symmetrised: set[Link]  # grow-diag-final of the two


def _attention_rows(tgt_word_index: np.ndarray, rows: str) -> np.ndarray:
    """The target word of every decoder row: the word it predicts (Garg et al.) or the one it reads."""
    if rows == "read":
        return tgt_word_index
    return np.concatenate([tgt_word_index[1:], [-1]])  # row r predicts the token at tgt_in position r + 1


def _word_attention(model: Transformer, batches: Iterable[Batch], layer: int | None,
                    rows: str) -> list[tuple[int | None, np.ndarray]]:
    layer = model.cfg.dec_layers - 2 if layer is None else layer
    layer = max(layer, 0)
    key = ("decoder", layer, "cross", "probs")
    out = []
    for batch, records in _run(model, batches, {key}):
        attn = records[key].float().mean(1).cpu().numpy()  # (B, J, I)
        src_wi = _word_index(batch, "src").cpu().numpy()
        tgt_wi = _word_index(batch, "tgt").cpu().numpy()
        for b, index in enumerate(_indices(batch)):
            out.append((index, word_level_attention(attn[b], src_wi[b], _attention_rows(tgt_wi[b], rows))))
    return out


def cross_attention_alignments(
    model: Transformer, batches: Iterable[Batch], layer: int | None = None,
    reverse_model: Transformer | None = None, reverse_batches: Iterable[Batch] | None = None,
    rows: Literal["predict", "read"] = "predict",
) -> list[SentenceAlignment]:
    """Word alignments (source word, target word) from the cross-attention of decoder ``layer``.

    ``layer`` is 0-based; default the penultimate one (Garg et al. 2019). Attention is averaged
    over heads and reduced to words (mean over sub-word cells). Target→source links are each
    target word's argmax over source words, read from the decoder row that *predicts* the word
    (Garg et al.; ``rows="read"``: the row that reads it, Chen et al. 2020's shift).

    The LPSI paper's second direction and its symmetrisation come from a second model trained
    in the reverse direction: pass it as ``reverse_model`` with ``reverse_batches`` (the same
    sentences in the same order, sides swapped); its target→source links, flipped, are the
    source→target ones. With one model, source→target is each source word's argmax over the
    target rows of the same matrix. Either way ``symmetrised`` is grow-diag-final.
    """
    forward = _word_attention(model, batches, layer, rows)
    if reverse_model is not None:
        if reverse_batches is None:
            raise ValueError("reverse_model needs reverse_batches (the same sentences with sides swapped)")
        backward = _word_attention(reverse_model, reverse_batches, layer, rows)
        if len(backward) != len(forward):
            raise DataError(f"{len(forward)} sentences forwards but {len(backward)} in reverse")
    out: list[tuple[int | None, object]] = []
    for n, (index, attn) in enumerate(forward):
        t2s = alignments_from_attention(attn, "tgt2src") if attn.size else set()
        if reverse_model is None:
            s2t = alignments_from_attention(attn, "src2tgt") if attn.size else set()
        else:
            rev = backward[n][1]  # (I_w, J_w): rows are this model's source words
            s2t = {(j, i) for i, j in alignments_from_attention(rev, "tgt2src")} if rev.size else set()
        out.append((index, SentenceAlignment(t2s, s2t, grow_diag_final(s2t, t2s))))
    return _in_order(out)
