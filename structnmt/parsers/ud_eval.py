"""Score dependency trees against UD gold: UAS and LAS, with and without punctuation.

Convention: every head here is 0-based and the root points to itself (the toolkit's
:class:`~structnmt.data.example.DepTree` convention, and spaCy's). Gold CoNLL-U heads
(1-based, 0 = root) are converted by :func:`~structnmt.parsers.ud_train.read_conllu`.
A predicted root is right exactly when the gold root is the same word.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from structnmt.errors import ParserError
from structnmt.parsers.ud_train import UDSentence, read_conllu


def score_trees(
    gold_heads: Sequence[int],
    gold_labels: Sequence[str] | None,
    pred_heads: Sequence[int],
    pred_labels: Sequence[str] | None,
    punct_mask: Sequence[bool] | None = None,
) -> dict[str, Any]:
    """Attachment scores of predicted against gold trees, as fractions in [0, 1].

    Heads are word indices within their sentence, so one sentence or many concatenated
    word by word score the same way. ``punct_mask[i]`` is True for punctuation words, which
    the ``*_no_punct`` figures leave out. Labels are compared exactly as given (callers
    normalise them first); without labels (learned trees) the LAS entries are None.
    A figure over zero words is NaN.
    """
    gold = np.asarray(gold_heads, dtype=np.int64)
    pred = np.asarray(pred_heads, dtype=np.int64)
    if gold.shape != pred.shape or gold.ndim != 1:
        raise ValueError(f"gold and predicted heads differ in shape: {gold.shape} vs {pred.shape}")
    punct = np.zeros(len(gold), bool) if punct_mask is None else np.asarray(punct_mask, dtype=bool)
    if punct.shape != gold.shape:
        raise ValueError(f"punct_mask has {len(punct)} entries for {len(gold)} words")
    head_ok = gold == pred
    label_ok = None
    if gold_labels is not None and pred_labels is not None:
        if not (len(gold_labels) == len(pred_labels) == len(gold)):
            raise ValueError("labels and heads differ in length")
        label_ok = head_ok & (np.asarray(gold_labels, dtype=object) == np.asarray(pred_labels, dtype=object))

    def frac(ok: np.ndarray | None, keep: np.ndarray) -> float | None:
        if ok is None:
            return None
        return float(ok[keep].mean()) if keep.any() else float("nan")

    everything = np.ones(len(gold), bool)
    return {
        "words": int(len(gold)),
        "words_no_punct": int((~punct).sum()),
        "uas": frac(head_ok, everything),
        "las": frac(label_ok, everything),
        "uas_no_punct": frac(head_ok, ~punct),
        "las_no_punct": frac(label_ok, ~punct),
    }


def universal_label(label: str) -> str:
    """The universal relation CoNLL 2018 LAS compares: "nsubj:pass" -> "nsubj", "ROOT" -> "root"."""
    return label.lower().split(":", 1)[0]


def load_pipeline(model: Any):
    """A spaCy pipeline: ``model`` loaded (a path or an installed package's name), or returned
    as it is when it already is a loaded ``spacy.Language``."""
    import spacy
    from spacy.language import Language

    if isinstance(model, Language):
        return model
    try:
        return spacy.load(str(model))
    except OSError as exc:
        raise ParserError(f"cannot load spaCy pipeline {str(model)!r}: {exc}") from None


def parsed_gold_docs(nlp: Any, sentences: Sequence[UDSentence], batch_size: int = 256) -> Iterator[Any]:
    """The Docs ``nlp`` makes of the gold sentences, one per sentence, in order.

    Docs are built from the gold words and spacing and each gold sentence is fixed as one
    sentence, so tokenisation and sentence splitting never differ from the gold; every pipeline
    component then runs on them in order. A pipeline that changes a sentence's words is an error.
    """
    from spacy.tokens import Doc

    docs = (
        Doc(nlp.vocab, words=s.words, spaces=s.spaces, sent_starts=[True] + [False] * (len(s) - 1))
        for s in sentences
    )
    for _name, component in nlp.pipeline:
        if hasattr(component, "pipe"):
            docs = component.pipe(docs, batch_size=batch_size)
        else:  # a plain function component
            docs = map(component, docs)
    for sentence, doc in zip(sentences, docs, strict=True):
        if len(doc) != len(sentence):
            raise ParserError(f"pipeline changed the number of words of the sentence at line {sentence.line}")
        yield doc


def parse_gold_words(nlp: Any, sentences: Sequence[UDSentence], batch_size: int = 256) -> list[list[int]]:
    """Each sentence's heads as ``nlp`` parses its gold words (0-based, the root itself), as
    :func:`evaluate_parser` scores them."""
    return [[token.head.i for token in doc] for doc in parsed_gold_docs(nlp, sentences, batch_size)]


def evaluate_parser(model: Any, gold: Path, *, quiet: bool = False, batch_size: int = 256) -> dict[str, Any]:
    """Parse the gold file's own words with a spaCy pipeline and score it (UAS/LAS, fractions).

    ``model`` is a pipeline path, an installed package name (``fr_core_news_sm``) or a
    loaded ``spacy.Language``. Docs are built from the gold words and spacing and each gold
    sentence is fixed as one sentence, so tokenisation and sentence splitting never differ
    from the gold; every pipeline component then runs on them in order. Punctuation is gold
    UPOS PUNCT; LAS compares universal relations (subtypes dropped, as in CoNLL 2018).
    Prints a short report unless ``quiet``.
    """
    sentences = read_conllu(gold)
    nlp = load_pipeline(model)
    started = time.monotonic()
    gold_heads: list[int] = []
    gold_labels: list[str] = []
    pred_heads: list[int] = []
    pred_labels: list[str] = []
    punct: list[bool] = []
    for sentence, doc in zip(sentences, parsed_gold_docs(nlp, sentences, batch_size), strict=True):
        gold_heads.extend(sentence.heads)
        gold_labels.extend(universal_label(d) for d in sentence.deprels)
        pred_heads.extend(token.head.i for token in doc)
        pred_labels.extend(universal_label(token.dep_) for token in doc)
        punct.extend(u == "PUNCT" for u in sentence.upos)
    seconds = time.monotonic() - started
    scores = score_trees(gold_heads, gold_labels, pred_heads, pred_labels, punct)
    meta = nlp.meta
    scores.update(
        {
            "model": str(model) if not hasattr(model, "pipeline") else meta.get("name", "pipeline"),
            "parser": f"{meta.get('lang', '')}_{meta.get('name', '')}-{meta.get('version', '')}",
            "gold": str(gold),
            "sentences": len(sentences),
            "seconds": round(seconds, 2),
        }
    )
    if not quiet:
        print(format_scores(scores))
    return scores


def format_scores(scores: dict[str, Any]) -> str:
    """A few aligned lines (percentages) for the terminal and the docs."""

    def pct(value: float | None) -> str:
        return "   n/a" if value is None else f"{100 * value:6.2f}"

    return "\n".join(
        [
            f"parser {scores.get('parser', '?')} on {scores.get('gold', '?')} "
            f"({scores.get('sentences', '?')} sentences, {scores['words']} words)",
            f"  with punctuation:    UAS {pct(scores['uas'])}  LAS {pct(scores['las'])}",
            f"  without punctuation: UAS {pct(scores['uas_no_punct'])}  LAS {pct(scores['las_no_punct'])}",
        ]
    )
