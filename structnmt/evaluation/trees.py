"""Trees read off a model, and how close they are to gold: UAS and unlabeled bracket F1.

Dependency trees use the project's convention: ``heads[t]`` is the 0-based head word of
word ``t`` and the root points to itself. Constituency brackets are half-open word spans
``(start, end)``: ``(0, 2)`` covers words 0 and 1.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np

Span = tuple[int, int]

# ---------------------------------------------------------------------------
# dependency trees


def _find_cycle(heads: np.ndarray, root: int) -> list[int] | None:
    """A cycle of the head function (root excluded), or None when it is already a tree."""
    state = np.zeros(len(heads), dtype=np.int8)  # 0 unseen, 1 on the current path, 2 done
    for start in range(len(heads)):
        path = []
        v = start
        while state[v] == 0 and v != root:
            state[v] = 1
            path.append(v)
            v = int(heads[v])
        if v != root and state[v] == 1:
            return path[path.index(v):]
        state[path] = 2
    return None


def _max_arborescence(weights: np.ndarray, root: int) -> np.ndarray:
    """Chu-Liu/Edmonds: the maximum spanning arborescence; ``weights[h, d]`` scores arc h -> d.

    Pick every node's best head; if that has a cycle, contract the cycle into one node whose
    incoming arcs are scored by how much they gain over the cycle arc they replace, solve the
    smaller problem recursively, and expand: the arc entering the contracted node breaks the
    cycle at the node it enters.
    """
    n = len(weights)
    w = weights.astype(np.float64).copy()
    np.fill_diagonal(w, -np.inf)
    w[:, root] = -np.inf
    heads = w.argmax(axis=0)
    heads[root] = root
    cycle = _find_cycle(heads, root)
    if cycle is None:
        return heads
    cyc = np.array(cycle)
    in_cycle = np.zeros(n, dtype=bool)
    in_cycle[cyc] = True
    others = np.flatnonzero(~in_cycle)  # always holds the root
    c = len(others)  # the contracted node's index in the smaller graph
    small = np.full((c + 1, c + 1), -np.inf)
    small[:c, :c] = w[np.ix_(others, others)]
    enter = w[np.ix_(others, cyc)] - w[heads[cyc], cyc][None, :]
    small[:c, c] = enter.max(axis=1)
    leave = w[np.ix_(cyc, others)]
    small[c, :c] = leave.max(axis=0)
    new_root = int(np.flatnonzero(others == root)[0])
    sub = _max_arborescence(small, new_root)

    result = heads.copy()  # cycle nodes keep their cycle heads, but for one
    for b_new, b in enumerate(others):
        if b != root:
            h_new = sub[b_new]
            result[b] = cyc[leave[:, b_new].argmax()] if h_new == c else others[h_new]
    u_new = sub[c]
    result[cyc[enter[u_new].argmax()]] = others[u_new]
    result[root] = root
    return result


def decode_tree_from_scores(scores: np.ndarray) -> list[int]:
    """The best dependency tree of an (n × n) head-score matrix, as root-self heads.

    ``scores[t, h]`` scores word ``h`` as the head of word ``t`` (the rows of a DBSA head's
    attention); the diagonal ``scores[t, t]`` scores ``t`` as the root. The root is the word
    with the highest root score (exactly one root); every other word gets the head that
    maximises the *sum* of arc scores over well-formed trees (Chu-Liu/Edmonds), which is each
    word's best head whenever those already form a tree. Pass log-probabilities to get the
    most probable tree.
    """
    scores = np.asarray(scores, dtype=np.float64)
    if scores.ndim != 2 or scores.shape[0] != scores.shape[1] or len(scores) == 0:
        raise ValueError(f"scores must be a non-empty square matrix, got shape {scores.shape}")
    if not np.isfinite(scores).all():
        raise ValueError("scores must be finite (use log-probabilities with a floor, not -inf)")
    root = int(np.diag(scores).argmax())
    return [int(h) for h in _max_arborescence(scores.T, root)]


def is_tree(heads: Sequence[int]) -> bool:
    """True iff ``heads`` has exactly one root (self-head) and no cycle."""
    heads_arr = np.asarray(heads)
    n = len(heads_arr)
    if n == 0 or heads_arr.min() < 0 or heads_arr.max() >= n:
        return False
    roots = np.flatnonzero(heads_arr == np.arange(n))
    return len(roots) == 1 and _find_cycle(heads_arr, int(roots[0])) is None


def uas(pred_heads: Sequence[int], gold_heads: Sequence[int], mask: Sequence[bool] | None = None) -> float:
    """Unlabeled attachment score: the fraction of (unmasked) words with the gold head.

    ``mask`` selects the words to count (e.g. leave out punctuation). For a corpus, concatenate
    the sentences' heads (they are compared position by position) or use :func:`corpus_uas`.
    """
    pred, gold = np.asarray(pred_heads), np.asarray(gold_heads)
    if pred.shape != gold.shape:
        raise ValueError(f"{len(pred)} predicted heads but {len(gold)} gold heads")
    keep = np.ones(len(gold), dtype=bool) if mask is None else np.asarray(mask, dtype=bool)
    total = int(keep.sum())
    return float((pred[keep] == gold[keep]).sum() / total) if total else 0.0


def corpus_uas(
    preds: Sequence[Sequence[int]], golds: Sequence[Sequence[int]],
    masks: Sequence[Sequence[bool]] | None = None,
) -> float:
    """UAS over all words of all sentences (micro-average)."""
    if len(preds) != len(golds):
        raise ValueError(f"{len(preds)} predicted sentences but {len(golds)} gold sentences")
    correct = total = 0
    for n, (pred, gold) in enumerate(zip(preds, golds)):
        if len(pred) != len(gold):
            raise ValueError(f"sentence {n + 1}: {len(pred)} predicted heads but {len(gold)} gold heads")
        keep = np.ones(len(gold), dtype=bool) if masks is None else np.asarray(masks[n], dtype=bool)
        correct += int((np.asarray(pred)[keep] == np.asarray(gold)[keep]).sum())
        total += int(keep.sum())
    return correct / total if total else 0.0


def right_branching_heads(n: int) -> list[int]:
    """The chain baseline: word 0 is the root and each later word depends on the word before."""
    return [0] + list(range(n - 1)) if n > 0 else []


def left_branching_heads(n: int) -> list[int]:
    """The other chain: each word depends on the word after it, and the last word is the root."""
    return [i + 1 for i in range(n - 1)] + [n - 1] if n > 0 else []


# ---------------------------------------------------------------------------
# constituency brackets


def tree_from_distances(distances: Sequence[float]) -> list[Span]:
    """Binary tree of ``len(distances) + 1`` words by top-down splitting (Shen et al. 2018).

    ``distances[i]`` is the syntactic distance of the boundary between word ``i`` and word
    ``i + 1`` (so ``n`` words have ``n − 1`` distances; for LPSI's per-token distances, pass
    the first ``n − 1``). A span is split at its largest boundary distance (the leftmost one
    on ties), and both halves are split the same way until single words remain. Returns
    every constituent of two or more words, in pre-order, the whole sentence first.
    """
    d = np.asarray(distances, dtype=np.float64)
    n = len(d) + 1
    spans: list[Span] = []
    stack = [(0, n)]
    while stack:
        start, end = stack.pop()
        if end - start < 2:
            continue
        spans.append((start, end))
        split = start + int(d[start:end - 1].argmax()) + 1  # first word of the right half
        stack.append((split, end))
        stack.append((start, split))
    return spans


def right_branching_brackets(n: int) -> list[Span]:
    """The right-branching baseline tree's constituents: ``(i, n)`` for every i < n − 1."""
    return [(i, n) for i in range(n - 1)]


def _filter(spans: Iterable[Span], n_words: int | None, ignore_trivial: bool) -> set[Span]:
    spans = set(spans)
    if not ignore_trivial:
        return spans
    return {(s, e) for s, e in spans if e - s > 1 and (s, e) != (0, n_words)}


def unlabeled_f1(
    pred_brackets: Iterable[Span], gold_brackets: Iterable[Span],
    ignore_trivial: bool = True, n_words: int | None = None,
) -> dict[str, float]:
    """Sentence-level unlabeled bracket precision, recall and F1 (fractions).

    With ``ignore_trivial`` (the usual evaluation), one-word spans and the whole sentence
    ``(0, n_words)`` are left out, since every tree has them; ``n_words`` defaults to the
    largest span end seen. Both sets empty counts as a perfect match.
    """
    pred_brackets, gold_brackets = list(pred_brackets), list(gold_brackets)
    if n_words is None:
        n_words = max((e for _, e in pred_brackets + gold_brackets), default=0)
    pred = _filter(pred_brackets, n_words, ignore_trivial)
    gold = _filter(gold_brackets, n_words, ignore_trivial)
    match = len(pred & gold)
    if not pred and not gold:
        return {"precision": 1.0, "recall": 1.0, "f1": 1.0}
    precision = match / len(pred) if pred else 0.0
    recall = match / len(gold) if gold else 0.0
    f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    return {"precision": precision, "recall": recall, "f1": f1}


def corpus_unlabeled_f1(
    preds: Sequence[Iterable[Span]], golds: Sequence[Iterable[Span]],
    ignore_trivial: bool = True, n_words: Sequence[int] | None = None,
) -> dict[str, float]:
    """Corpus UF two ways: ``sentence_f1``, the mean of sentence F1 over sentences that have
    a (non-trivial) gold bracket, and ``corpus_f1``, F1 of the summed match counts (Evalb)."""
    if len(preds) != len(golds):
        raise ValueError(f"{len(preds)} predicted trees but {len(golds)} gold trees")
    match = n_pred = n_gold = 0
    sentence_f1 = []
    for k, (p, g) in enumerate(zip(preds, golds)):
        p, g = list(p), list(g)
        n = n_words[k] if n_words is not None else max((e for _, e in p + g), default=0)
        pf, gf = _filter(p, n, ignore_trivial), _filter(g, n, ignore_trivial)
        match += len(pf & gf)
        n_pred += len(pf)
        n_gold += len(gf)
        if gf:
            sentence_f1.append(unlabeled_f1(p, g, ignore_trivial, n)["f1"])
    precision = match / n_pred if n_pred else 0.0
    recall = match / n_gold if n_gold else 0.0
    return {
        "precision": precision,
        "recall": recall,
        "corpus_f1": 2 * precision * recall / (precision + recall) if precision + recall else 0.0,
        "sentence_f1": float(np.mean(sentence_f1)) if sentence_f1 else 0.0,
    }


def bracket_string(words: Sequence[str], brackets: Iterable[Span]) -> str:
    """``(the cat) (sat (on (the mat)))``-style text of properly nested brackets."""
    opens = [0] * len(words)
    closes = [0] * len(words)
    for start, end in set(brackets):
        if not 0 <= start < end <= len(words):
            raise ValueError(f"bracket {(start, end)} is outside a sentence of {len(words)} words")
        opens[start] += 1
        closes[end - 1] += 1
    return " ".join("(" * o + w + ")" * c for w, o, c in zip(words, opens, closes))
