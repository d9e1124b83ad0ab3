"""Word alignments from cross-attention, symmetrisation and alignment error rate.

Links are ``(i, j)`` pairs, ``i`` a 0-based source word and ``j`` a 0-based target word,
in both directions (the Pharaoh ``i-j`` order). Attention matrices are (J × I): one row per
target word, one column per source word, as the decoder's cross-attention records them.

Following Garg et al. (2019), alignments are read from the cross-attention of one layer
(usually the penultimate one), averaged over heads, by taking for every target word the
source word it attends to most. Which decoder row belongs to which target word (the row that
*reads* the word or the one that *predicts* it) is the caller's choice; pass the rows in target
word order.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from itertools import product
from pathlib import Path
from typing import Literal

import numpy as np

from structnmt.errors import DataError
from structnmt.evaluation.scores import read_text

Link = tuple[int, int]

_NEIGHBOURS = ((-1, 0), (0, -1), (1, 0), (0, 1), (-1, -1), (-1, 1), (1, -1), (1, 1))


def grow_diag_final(src2tgt: set[Link], tgt2src: set[Link], final: bool = True) -> set[Link]:
    """Koehn et al.'s grow-diag(-final) symmetrisation of two directional alignments.

    Start from the intersection; repeatedly add union links that neighbour (including
    diagonally) an existing link and align a so-far unaligned source *or* target word, until
    nothing changes (grow-diag). With ``final``, then add any remaining link of ``src2tgt``,
    then of ``tgt2src``, whose source or target word is still unaligned. Cells are visited
    in (source, target) order, which makes the result deterministic.
    """
    union = src2tgt | tgt2src
    alignment = set(src2tgt & tgt2src)
    aligned_src = {i for i, _ in alignment}
    aligned_tgt = {j for _, j in alignment}

    def add(i: int, j: int) -> None:
        alignment.add((i, j))
        aligned_src.add(i)
        aligned_tgt.add(j)

    n_src = max((i for i, _ in union), default=-1) + 1
    n_tgt = max((j for _, j in union), default=-1) + 1
    changed = True
    while changed:
        changed = False
        for i, j in product(range(n_src), range(n_tgt)):  # a link added now is grown from in this pass
            if (i, j) not in alignment:
                continue
            for di, dj in _NEIGHBOURS:
                cand = (i + di, j + dj)
                if cand in union and cand not in alignment and (
                    cand[0] not in aligned_src or cand[1] not in aligned_tgt
                ):
                    add(*cand)
                    changed = True
    if final:
        for direction in (src2tgt, tgt2src):
            for i, j in sorted(direction):
                if (i, j) not in alignment and (i not in aligned_src or j not in aligned_tgt):
                    add(i, j)
    return alignment


def alignments_from_attention(
    attn: np.ndarray, direction: Literal["tgt2src", "src2tgt"] = "tgt2src"
) -> set[Link]:
    """Hard links from a (J × I) attention matrix by argmax.

    ``tgt2src``: each target word ``j`` links to ``argmax_i attn[j, i]`` (Garg et al.).
    ``src2tgt``: each source word ``i`` links to ``argmax_j attn[j, i]``. For a proper second
    direction, use a reverse (target→source) model's attention, transposed to (J × I), with
    ``tgt2src`` semantics swapped accordingly: see :func:`symmetrised_alignments`.
    """
    attn = np.asarray(attn)
    if attn.ndim != 2:
        raise ValueError(f"attention must be a (target x source) matrix, got shape {attn.shape}")
    if direction == "tgt2src":
        return {(int(i), j) for j, i in enumerate(attn.argmax(axis=1))}
    if direction == "src2tgt":
        return {(i, int(j)) for i, j in enumerate(attn.argmax(axis=0))}
    raise ValueError(f"direction must be 'tgt2src' or 'src2tgt', got {direction!r}")


def symmetrised_alignments(
    attn: np.ndarray, attn_reverse: np.ndarray | None = None, final: bool = True
) -> set[Link]:
    """grow-diag(-final) of the two directions of one attention matrix (J × I).

    With ``attn_reverse`` (a target→source model's cross-attention, (I × J): one row per
    source word), its per-source-word argmax gives the second direction; without it, the
    column-wise argmax of ``attn`` does.
    """
    forward = alignments_from_attention(attn, "tgt2src")
    if attn_reverse is None:
        backward = alignments_from_attention(attn, "src2tgt")
    else:
        backward = alignments_from_attention(np.asarray(attn_reverse).T, "src2tgt")
    return grow_diag_final(backward, forward, final=final)


def word_level_attention(
    attn_subword: np.ndarray,
    src_word_index: Sequence[int],
    tgt_word_index: Sequence[int],
    source_reduce: Literal["mean", "sum"] = "mean",
) -> np.ndarray:
    """Sub-word attention (J_sub × I_sub) to word attention (J_w × I_w).

    Each word cell is the *mean* of its sub-word cells (over the target word's rows and the
    source word's columns), so a word split into many pieces is not favoured by argmax just
    for having more columns. ``source_reduce="sum"`` sums over the source pieces instead
    (keeps each row a distribution). Positions with a negative word index (EOS, BOS,
    padding) are dropped.
    """
    attn = np.asarray(attn_subword, dtype=np.float64)
    src_idx = np.asarray(src_word_index)
    tgt_idx = np.asarray(tgt_word_index)
    if attn.shape != (len(tgt_idx), len(src_idx)):
        raise ValueError(f"attention shape {attn.shape} does not match {len(tgt_idx)} target and "
                         f"{len(src_idx)} source word indices")
    n_src = int(src_idx.max()) + 1 if (src_idx >= 0).any() else 0
    n_tgt = int(tgt_idx.max()) + 1 if (tgt_idx >= 0).any() else 0
    src_onehot = np.zeros((len(src_idx), n_src))
    src_onehot[np.flatnonzero(src_idx >= 0), src_idx[src_idx >= 0]] = 1.0
    tgt_onehot = np.zeros((len(tgt_idx), n_tgt))
    tgt_onehot[np.flatnonzero(tgt_idx >= 0), tgt_idx[tgt_idx >= 0]] = 1.0
    summed = tgt_onehot.T @ attn @ src_onehot  # (J_w, I_w)
    tgt_counts = np.maximum(tgt_onehot.sum(0), 1.0)[:, None]
    src_counts = np.maximum(src_onehot.sum(0), 1.0)[None, :]
    out = summed / tgt_counts
    return out / src_counts if source_reduce == "mean" else out


def aer(sure: Iterable[Link], possible: Iterable[Link], predicted: Iterable[Link]) -> dict[str, float]:
    """Alignment error rate (Och & Ney 2003) with precision and recall, as fractions.

    ``AER = 1 − (|A∩S| + |A∩P|) / (|A| + |S|)``, precision ``|A∩P|/|A|``, recall ``|A∩S|/|S|``;
    sure links count as possible too (P ⊇ S). For a corpus, pass links as
    ``(sentence, i, j)`` triples so the counts are summed over sentences. An empty side gives
    0 precision/recall rather than a division by zero; AER is 0 when A and S are both empty.
    """
    s, a = set(sure), set(predicted)
    p = set(possible) | s
    a_s, a_p = len(a & s), len(a & p)
    return {
        "aer": 1.0 - (a_s + a_p) / (len(a) + len(s)) if a or s else 0.0,
        "precision": a_p / len(a) if a else 0.0,
        "recall": a_s / len(s) if s else 0.0,
    }


def corpus_aer(
    sure: Sequence[Iterable[Link]], possible: Sequence[Iterable[Link]], predicted: Sequence[Iterable[Link]]
) -> dict[str, float]:
    """:func:`aer` over sentences (per-sentence link sets, counts summed)."""
    if not len(sure) == len(possible) == len(predicted):
        raise DataError(f"{len(sure)} gold sentences, {len(possible)} possible-link sentences and "
                        f"{len(predicted)} predicted sentences")

    def tag(sets: Sequence[Iterable[Link]]) -> set[tuple[int, int, int]]:
        return {(n, i, j) for n, links in enumerate(sets) for i, j in links}

    return aer(tag(sure), tag(possible), tag(predicted))


#: how a gold alignment file numbers its words: ``pharaoh`` (0-based; ``i-j`` sure, ``i?j`` or
#: ``i-j-P`` possible), ``talp`` (1-based; ``i-j`` sure, ``ipj`` possible: the format the standard
#: word-alignment test sets are distributed in), or ``auto`` (recognised from the file)
GoldFormat = Literal["auto", "pharaoh", "talp"]

#: one link as read: (source index, target index, sure?, the token as written)
_RawLink = tuple[int, int, bool, str]


def _parse_link(token: str, fmt: str) -> tuple[int, int, bool] | None:
    """``(i, j, sure)`` as written (not yet 0-based), or None if ``token`` is not a link of ``fmt``."""
    sure = True
    if fmt == "talp":
        if "p" in token:
            parts, sure = token.split("p"), False
        else:
            parts = token.split("-")
    elif "?" in token:
        parts, sure = token.split("?"), False
    else:
        parts = token.split("-")
        if len(parts) == 3 and parts[2] in ("S", "P"):
            sure = parts.pop() == "S"
    if len(parts) != 2 or not all(p.isdigit() for p in parts):
        return None
    return int(parts[0]), int(parts[1]), sure


def _recognise(path: str | Path, lines: list[list[str]], n_words: Sequence[tuple[int, int]] | None) -> str:
    """``pharaoh`` or ``talp``, from the notation or the numbering; an error when the file cannot tell."""
    tokens = [t for line in lines for t in line]
    if any("p" in t for t in tokens):
        return "talp"
    if any("?" in t or t.endswith(("-S", "-P")) for t in tokens):
        return "pharaoh"
    links = [[_parse_link(t, "pharaoh") for t in line] for line in lines]
    if any(link is not None and 0 in link[:2] for line in links for link in line):
        return "pharaoh"  # a word 0 exists only in 0-based numbering
    if n_words is not None:  # a word numbered as long as its sentence exists only in 1-based numbering
        for line, (n_src, n_tgt) in zip(links, n_words):
            if any(link is not None and (link[0] == n_src or link[1] == n_tgt) for link in line):
                return "talp"
    if not tokens:
        return "pharaoh"
    raise DataError("cannot tell whether the links count words from 0 (Pharaoh) or from 1 (talp): no link "
                    "names word 0, none names a sentence's last word + 1 and none is written ipj; say which "
                    "(--gold-format pharaoh or talp)", path)


def read_alignments(path: str | Path, fmt: GoldFormat = "auto",
                    n_words: Sequence[tuple[int, int]] | None = None) -> list[tuple[set[Link], set[Link]]]:
    """Read a gold alignment file: one line per sentence, whitespace-separated links.

    ``fmt`` says how it is written (:data:`GoldFormat`); ``auto`` recognises it from the
    notation (``ipj`` is talp; ``i?j``, ``i-j-S`` and ``i-j-P`` are Pharaoh) or from the
    numbering (a word 0 is Pharaoh's; a word numbered as long as its sentence is talp's).
    With ``n_words`` (source and target word counts per line) every link must lie inside
    its sentence. Returns ``(sure, possible)`` per line with 0-based ``(source, target)``
    links, ``possible`` including the sure links.
    """
    lines = [line.split() for line in read_text(path)]
    if fmt == "auto":
        fmt = _recognise(path, lines, n_words)  # type: ignore[assignment]
    base = 1 if fmt == "talp" else 0
    expected = "i-j or ipj, counted from 1" if fmt == "talp" else "i-j, i?j, i-j-S or i-j-P, counted from 0"
    result = []
    for number, tokens in enumerate(lines, start=1):
        sure: set[Link] = set()
        possible: set[Link] = set()
        for token in tokens:
            parsed = _parse_link(token, fmt)
            if parsed is None:
                raise DataError(f"bad alignment link {token!r} (expected {expected})", path, number)
            i, j, is_sure = parsed[0] - base, parsed[1] - base, parsed[2]
            outside = i < 0 or j < 0
            if n_words is not None and number <= len(n_words):
                n_src, n_tgt = n_words[number - 1]
                outside = outside or i >= n_src or j >= n_tgt
            if outside:
                size = f" of {n_words[number - 1][0]} source and {n_words[number - 1][1]} target words" \
                    if n_words is not None and number <= len(n_words) else ""
                raise DataError(f"link {token!r} is outside the sentence{size} ({fmt} links count words "
                                f"from {base})", path, number)
            possible.add((i, j))
            if is_sure:
                sure.add((i, j))
        result.append((sure, possible))
    return result


def read_pharaoh(path: str | Path) -> list[tuple[set[Link], set[Link]]]:
    """Read a Pharaoh alignment file (0-based; ``i-j`` sure, ``i?j`` possible, ``i-j-S`` / ``i-j-P``)."""
    return read_alignments(path, "pharaoh")


def read_talp(path: str | Path) -> list[tuple[set[Link], set[Link]]]:
    """Read a talp alignment file (1-based; ``i-j`` sure, ``ipj`` possible) into 0-based links."""
    return read_alignments(path, "talp")


def write_pharaoh(alignments: Iterable[set[Link]]) -> str:
    """Pharaoh text (``i-j`` links sorted, one sentence a line) of predicted alignments."""
    return "".join(" ".join(f"{i}-{j}" for i, j in sorted(links)) + "\n" for links in alignments)


def diagonal_links(n_src: int, n_tgt: int) -> set[tuple[int, int]]:
    """The diagonal baseline: each target word linked to the source word at the same relative position."""
    if n_src == 0 or n_tgt == 0:
        return set()
    return {(min(n_src - 1, round(j * n_src / n_tgt)), j) for j in range(n_tgt)}
