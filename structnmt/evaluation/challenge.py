"""The long-dependency challenge subset: sentences whose source parse has a long arc.

Structure-aware models should help most where a word's head is far away. A sentence enters
the subset when some arc spans at least ``threshold`` words, measured as
``|position(dependent) − position(head)|`` on the word sequence (the root arc does not
count). The default, 7, keeps arcs that cross six or more words, a common cut-off for
"long-distance dependency" in analyses of NMT; it is a parameter.

Heads follow the project's convention: 0-based head word, root points to itself. Selection is
deterministic (sentence order, no sampling), so the subset is the same on every machine.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import conllu

from structnmt.errors import DataError
from structnmt.evaluation.scores import corpus_scores
from structnmt.io import atomic_write_text

DEFAULT_THRESHOLD = 7


def heads_from_conllu(path: str | Path) -> list[list[int]]:
    """0-based, root-self heads of every sentence of a CoNLL-U file (multi-word tokens and
    empty nodes are skipped: the heads of the syntactic words are kept)."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8-sig")  # -sig: a byte-order mark is dropped, not read as text
    except FileNotFoundError:
        raise DataError("file not found", path) from None
    except UnicodeDecodeError as err:
        raise DataError(f"not valid UTF-8 ({err.reason})", path) from None
    try:
        sentences = conllu.parse(text)
    except Exception as err:  # the conllu library raises several types for malformed input
        raise DataError(f"not valid CoNLL-U: {err}", path) from None
    result = []
    for number, sentence in enumerate(sentences, start=1):
        words = [tok for tok in sentence if isinstance(tok["id"], int)]
        heads = []
        for position, tok in enumerate(words):
            head = tok["head"]
            if not isinstance(head, int) or not 0 <= head <= len(words):
                raise DataError(f"sentence {number}: token {tok['id']} has head {head!r}", path)
            heads.append(position if head == 0 else head - 1)
        result.append(heads)
    return result


def max_arc_length(heads: Sequence[int]) -> int:
    """The longest dependency arc of one sentence, in words (0 for a one-word sentence)."""
    return max((abs(dep - head) for dep, head in enumerate(heads) if dep != head), default=0)


def long_dependency_subset(heads: Sequence[Sequence[int]], threshold: int = DEFAULT_THRESHOLD) -> list[int]:
    """0-based indices, in order, of the sentences with an arc of at least ``threshold`` words."""
    if threshold < 1:
        raise ValueError("threshold must be at least 1")
    return [n for n, sentence in enumerate(heads) if max_arc_length(sentence) >= threshold]


def write_subset(
    indices: Sequence[int],
    out_dir: str | Path,
    name: str = "longdep",
    **files: Sequence[str],
) -> dict[str, Path]:
    """Write ``<name>.idx`` (1-based line numbers) and ``<name>.<key>`` for each given side.

    Call as ``write_subset(idx, out, src=src_lines, ref=ref_lines, hyp=hyp_lines)``. The index
    file makes the subset reproducible from the full test set alone.
    """
    out_dir = Path(out_dir)
    written = {"idx": out_dir / f"{name}.idx"}
    atomic_write_text(written["idx"], "".join(f"{i + 1}\n" for i in indices))
    for key, lines in files.items():
        if indices and max(indices) >= len(lines):
            raise DataError(f"subset index {max(indices) + 1} is past the {len(lines)} lines of {key!r}")
        written[key] = out_dir / f"{name}.{key}"
        atomic_write_text(written[key], "".join(lines[i] + "\n" for i in indices))
    return written


def score_long_dependency(
    heads: Sequence[Sequence[int]],
    hyps: Sequence[str],
    refs: Sequence[Sequence[str]],
    threshold: int = DEFAULT_THRESHOLD,
    tokenize: str | None = None,
) -> dict[str, Any]:
    """BLEU/chrF of the long-dependency subset and of its complement, with the subset's size."""
    if len(heads) != len(hyps):
        raise DataError(f"{len(heads)} parsed source sentences but {len(hyps)} hypotheses")
    inside = long_dependency_subset(heads, threshold)
    chosen = set(inside)
    outside = [n for n in range(len(hyps)) if n not in chosen]
    result: dict[str, Any] = {"threshold": threshold, "n": len(inside), "n_rest": len(outside),
                              "indices": inside}
    for key, idx in (("subset", inside), ("rest", outside)):
        if idx:
            result[key] = corpus_scores([hyps[i] for i in idx], [[r[i] for i in idx] for r in refs],
                                        metrics=("bleu", "chrf"), tokenize=tokenize)
        else:
            result[key] = None
    return result
