"""The parser interface every back end implements, and the one place that picks a back end.

A parser turns raw sentences (one per input line, never split further) into
:class:`~structnmt.data.example.DepTree` objects whose word spans point into exactly the
string it was given; that is what lets ``structures.py`` align words and sub-words by
character offsets. Trees are checked (one root that points to itself, heads in range,
no cycles) before they leave a back end.
"""

from __future__ import annotations

from typing import Literal, Protocol, runtime_checkable

from structnmt.data.example import DepTree

Convention = Literal["ud", "clearnlp", "other"]


@runtime_checkable
class Parser(Protocol):
    """What ``prepare`` and ``translate`` need from a parser.

    ``name`` and ``version`` identify the parses (they key the parse cache and are recorded
    in the dataset); ``convention`` says which annotation scheme the labels follow.
    ``lines`` are the sentences' 1-based line numbers in the split's file, used in error
    messages (and, for stored CoNLL-U parses, to find the sentence).
    """

    name: str
    version: str
    convention: Convention

    def parse(self, texts: list[str], lines: list[int] | None = None) -> list[DepTree]: ...


def finish_tree(
    text: str,
    words: list[str],
    spans: list[tuple[int, int]],
    heads: list[int],
    labels: list[str],
    keep: list[bool] | None = None,
    join_label: str = "parataxis",
    parser: str = "",
) -> DepTree:
    """Build one single-rooted tree from a parser's raw output.

    ``heads`` are 0-based and roots point to themselves. Words with ``keep`` False
    (whitespace tokens) are removed and their dependents climb to the nearest kept
    ancestor. If several roots remain (a parser split the line into sentences), later
    roots are attached to the first one with ``join_label``: a line is one sentence for
    the translation model, so it must be one tree.
    """
    n = len(words)
    keep = keep if keep is not None else [True] * n
    new_index: dict[int, int] = {}
    for i in range(n):
        if keep[i]:
            new_index[i] = len(new_index)

    def kept_ancestor(i: int) -> int | None:
        seen = 0
        while not keep[i]:
            if heads[i] == i or seen > n:
                return None
            i = heads[i]
            seen += 1
        return i

    out_heads: list[int] = []
    out_labels: list[str] = []
    for i in range(n):
        if not keep[i]:
            continue
        if heads[i] == i:
            out_heads.append(new_index[i])
            out_labels.append(labels[i])
            continue
        anc = kept_ancestor(heads[i])
        out_heads.append(new_index[i] if anc is None else new_index[anc])
        out_labels.append(labels[i])
    roots = [i for i, h in enumerate(out_heads) if h == i]
    for r in roots[1:]:
        out_heads[r] = roots[0]
        out_labels[r] = join_label
    return DepTree(
        text=text,
        words=[w for w, k in zip(words, keep) if k],
        spans=[s for s, k in zip(spans, keep) if k],
        heads=out_heads,
        labels=out_labels,
        parser=parser,
    )
