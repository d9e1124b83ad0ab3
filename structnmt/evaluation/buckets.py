"""BLEU by source-sentence length, the analysis of Bahdanau et al. (2015) and deps-san-peng §4.2.

Sentences are grouped by the number of whitespace-separated words of the *raw source*
(so every system is bucketed identically, whatever its sub-words) and each group is scored
as a corpus of its own. The default edges are deps-san-peng's nine groups:
``[0,10], (10,20], …, (70,80], (80,∞)``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass

from structnmt.errors import DataError
from structnmt.evaluation.scores import corpus_scores

DEFAULT_EDGES: tuple[int, ...] = (10, 20, 30, 40, 50, 60, 70, 80)


@dataclass
class Bucket:
    low: float  # exclusive, except the first bucket, which starts at 0 inclusive
    high: float  # inclusive; math.inf for the last bucket
    n: int  # sentences in the bucket
    bleu: float | None  # None for an empty bucket
    chrf: float | None

    @property
    def label(self) -> str:
        return f"{self.low:g}+" if math.isinf(self.high) else f"{self.low:g}-{self.high:g}"

    def as_dict(self) -> dict:
        return {**asdict(self), "high": None if math.isinf(self.high) else self.high, "label": self.label}


def bucket_index(length: int, edges: Sequence[float] = DEFAULT_EDGES) -> int:
    """Bucket of a sentence of ``length`` words: 0 for ``[0, edges[0]]``, k for ``(edges[k-1], edges[k]]``."""
    for k, edge in enumerate(edges):
        if length <= edge:
            return k
    return len(edges)


def bleu_by_length(
    src: Sequence[str],
    hyps: Sequence[str],
    refs: Sequence[Sequence[str]],
    edges: Sequence[float] = DEFAULT_EDGES,
    tokenize: str | None = None,
) -> list[Bucket]:
    """Score each source-length bucket separately; ``refs`` in sacreBLEU's layout (streams)."""
    if list(edges) != sorted(edges) or len(set(edges)) != len(edges) or any(e <= 0 for e in edges):
        raise ValueError(f"bucket edges must be positive and strictly increasing, got {list(edges)}")
    if len(src) != len(hyps) or any(len(r) != len(hyps) for r in refs):
        raise DataError(f"{len(src)} source lines, {len(hyps)} hypotheses and "
                        f"{[len(r) for r in refs]} reference lines: they must match")
    members: list[list[int]] = [[] for _ in range(len(edges) + 1)]
    for n, line in enumerate(src):
        members[bucket_index(len(line.split()), edges)].append(n)
    lows = [0.0, *map(float, edges)]
    highs = [*map(float, edges), math.inf]
    buckets = []
    for k, idx in enumerate(members):
        bleu = chrf = None
        if idx:
            scores = corpus_scores([hyps[i] for i in idx], [[r[i] for i in idx] for r in refs],
                                   metrics=("bleu", "chrf"), tokenize=tokenize)
            bleu, chrf = scores["bleu"], scores["chrf"]
        buckets.append(Bucket(lows[k], highs[k], len(idx), bleu, chrf))
    return buckets
