"""``structnmt inspect``: read a trained model's structure out on a prepared split and score it.

* ``trees``: DBSA/SISA/SyncAttn heads -> dependency trees, UAS against the split's stored
  trees (the parser's, or gold CoNLL-U), beside a right-branching baseline;
* ``phrases``: LPSI distances -> binary trees, unlabeled F1 against gold brackets, beside a
  right-branching baseline;
* ``align``: cross-attention -> word alignments (grow-diag-final), AER against gold
  alignments, beside a diagonal baseline;
* ``heads``: every encoder self-attention head of any model -> how often it attends most to a
  word's parent in the split's stored trees, and the attention the parent gets, beside the
  best fixed-offset baseline.

Outputs are written next to the scores: heads one sentence a line, bracketed trees, Pharaoh
``i-j`` alignments.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from structnmt.data.batch import Batch
from structnmt.data.batching import collate
from structnmt.data.dataset import ParallelDataset
from structnmt.data.structures import can_build
from structnmt.decoding.translate import length_batches
from structnmt.errors import ConfigError, DataError
from structnmt.evaluation.alignment import GoldFormat, corpus_aer, diagonal_links, read_alignments, write_pharaoh
from structnmt.evaluation.inspect import (
    best_offset_accuracy,
    cross_attention_alignments,
    dbsa_trees,
    head_parent_attention,
    lpsi_trees,
    resolve_boundary,
)
from structnmt.evaluation.scores import read_text
from structnmt.evaluation.trees import (
    bracket_string,
    corpus_uas,
    corpus_unlabeled_f1,
    left_branching_heads,
    right_branching_brackets,
    right_branching_heads,
)
from structnmt.io import atomic_write_text, check_output_path
from structnmt.model.transformer import Transformer


def _require_words(data: ParallelDataset, sides: tuple[str, ...]) -> None:
    for side in sides:
        if not data.has(side, "word_index"):
            raise DataError(f"the split has no {side} word structure (prepare it with a parser on the {side} side)",
                            data.path)


def _batches(model: Transformer, data: ParallelDataset, sides: tuple[str, ...], max_tokens: int) -> Iterator[Batch]:
    fields = model.structure_needs(inference=False)
    for side in ("src", "tgt"):
        fields[side] = {f for f in fields[side] if can_build(f, data.fields(side))}
    _require_words(data, sides)
    for side in sides:
        fields[side].add("word_index")
    for indices in length_batches(np.maximum(data.src_lengths, data.tgt_lengths), max_tokens):
        yield collate(data, np.sort(indices), fields)


def _right_branching(words: list[str], n: int) -> list[tuple[int, int]]:
    """Right-branching brackets; a sentence-final punctuation mark attaches at the top, as
    unsupervised-parsing evaluations usually treat punctuation (else no bracket could match)."""
    if n > 2 and len(words) == n and not any(ch.isalnum() for ch in words[-1]):
        return [(0, n)] + right_branching_brackets(n - 1)
    return right_branching_brackets(n)


def _read_brackets(path: str) -> list[list[tuple[int, ...]]]:
    golds = []
    for number, line in enumerate(read_text(path), start=1):
        try:
            golds.append([tuple(span) for span in json.loads(line)])
        except (ValueError, TypeError):
            raise DataError("not a JSON list of [start, end] spans", path, number) from None
    return golds


def _read_gold(gold: str | None, n: int, what: str, missing: str, read) -> list:
    """One gold entry per sentence of the split, or a clear error."""
    if gold is None:
        raise DataError(missing)
    entries = read(gold)
    if len(entries) != n:
        raise DataError(f"{len(entries)} lines of {what} for {n} sentences", gold)
    return entries


def _trees_scores(model: Transformer, data: ParallelDataset, out_dir: Path, side: str, layer: int | None,
                  max_tokens: int) -> dict:
    pred = dbsa_trees(model, _batches(model, data, (side,), max_tokens), side=side, layer=layer)
    golds = [data.side_arrays(i, side)["heads"].tolist() for i in range(len(data))]
    atomic_write_text(out_dir / f"{data.split}.{side}.heads", "".join(" ".join(map(str, h)) + "\n" for h in pred))
    return {"uas": corpus_uas(pred, golds),
            "right_branching_uas": corpus_uas([right_branching_heads(len(g)) for g in golds], golds),
            "left_branching_uas": corpus_uas([left_branching_heads(len(g)) for g in golds], golds),
            "sentences": len(data), "against": "the split's stored trees"}


def _phrases_scores(model: Transformer, data: ParallelDataset, out_dir: Path, side: str, layer: int | None,
                    max_tokens: int, gold: str | None, boundary: str) -> dict:
    n = len(data)
    golds = _read_gold(gold, n, "gold brackets", "phrase trees are scored against gold brackets: "
                       "give --gold FILE (one JSON list a line)", _read_brackets)
    trees = lpsi_trees(model, _batches(model, data, (side,), max_tokens), side=side, layer=layer,
                       boundary=boundary)  # type: ignore[arg-type]
    words = [line.split() for line in data.raw(side)]  # raw() reads the file: once, not per sentence
    sizes = [t.words for t in trees]
    pred = [t.brackets for t in trees]
    atomic_write_text(out_dir / f"{data.split}.{side}.trees",
                      "".join(bracket_string(w if len(w) == t.words else [str(k) for k in range(t.words)],
                                             t.brackets) + "\n"
                              for w, t in zip(words, trees)))
    baseline = [_right_branching(w, k) for w, k in zip(words, sizes)]
    return {"uf": corpus_unlabeled_f1(pred, golds, n_words=sizes),
            "right_branching_uf": corpus_unlabeled_f1(baseline, golds, n_words=sizes),
            "boundary": resolve_boundary(boundary, side),
            "sentences": n}


def _align_scores(model: Transformer, data: ParallelDataset, out_dir: Path, layer: int | None, max_tokens: int,
                  gold: str | None, gold_format: GoldFormat) -> dict:
    n = len(data)
    _require_words(data, ("src", "tgt"))
    n_words = []
    for i in range(n):
        src, tgt = data.side_arrays(i, "src")["word_index"], data.side_arrays(i, "tgt")["word_index"]
        n_words.append((int(src.max()) + 1 if len(src) else 0, int(tgt.max()) + 1 if len(tgt) else 0))
    gold_links = _read_gold(gold, n, "gold alignments", "alignments are scored against gold links: "
                            "give --gold FILE (Pharaoh i-j / i?j, or talp i-j / ipj)",
                            lambda path: read_alignments(path, gold_format, n_words))
    found = cross_attention_alignments(model, _batches(model, data, ("src", "tgt"), max_tokens), layer=layer)
    sure = [s for s, _ in gold_links]
    possible = [p for _, p in gold_links]
    atomic_write_text(out_dir / f"{data.split}.align", write_pharaoh([a.symmetrised for a in found]))
    diagonal = [diagonal_links(s, t) for s, t in n_words]
    return {
        "tgt2src": corpus_aer(sure, possible, [a.tgt2src for a in found]),
        "src2tgt": corpus_aer(sure, possible, [a.src2tgt for a in found]),
        "grow_diag_final": corpus_aer(sure, possible, [a.symmetrised for a in found]),
        "diagonal": corpus_aer(sure, possible, diagonal),
        "sentences": n,
    }


def _heads_scores(model: Transformer, data: ParallelDataset, side: str, max_tokens: int) -> dict:
    n = len(data)
    if side != "src":
        raise ConfigError("heads reads the encoder's self-attention: the side is src", "--side")
    if not data.has("src", "heads"):
        raise DataError("the split has no source trees to score heads against (prepare it with a parser)",
                        data.path)
    golds = [data.side_arrays(i, "src")["heads"].tolist() for i in range(n)]
    found = head_parent_attention(model, _batches(model, data, ("src",), max_tokens), golds)
    offset, offset_accuracy = best_offset_accuracy(golds)
    best = [max(range(len(row)), key=row.__getitem__) for row in found["accuracy"]]
    return {**found, "best_head_per_layer": [{"layer": k + 1, "head": h + 1, "accuracy": found["accuracy"][k][h],
                                              "mass": found["mass"][k][h]} for k, h in enumerate(best)],
            "best_offset": offset, "best_offset_accuracy": offset_accuracy,
            "sentences": n, "against": "the split's stored trees"}


def inspect_split(model: Transformer, data: ParallelDataset, what: str, out_dir: Path, side: str = "src",
                  layer: int | None = None, gold: str | None = None, max_tokens: int = 4000,
                  boundary: str = "auto", gold_format: GoldFormat = "auto") -> dict:
    """Read structure out of ``model`` on ``data``, write it to ``out_dir`` and return the scores.

    ``gold_format`` says how the gold alignments of ``align`` are written (Pharaoh, 0-based;
    talp, 1-based; or recognised); a gold link outside its sentence is an error."""
    if what == "trees":
        scores = _trees_scores(model, data, out_dir, side, layer, max_tokens)
    elif what == "phrases":
        scores = _phrases_scores(model, data, out_dir, side, layer, max_tokens, gold, boundary)
    elif what == "align":
        scores = _align_scores(model, data, out_dir, layer, max_tokens, gold, gold_format)
    elif what == "heads":
        scores = _heads_scores(model, data, side, max_tokens)
    else:
        raise ValueError(f"unknown analysis {what!r}")
    atomic_write_text(out_dir / f"{data.split}.{what}.json", json.dumps(scores, indent=2) + "\n")
    return scores


def inspect_out_dir(run: str | Path, out: str | Path | None) -> Path:
    """The directory an inspection writes into (``out``, default ``RUN/inspect``), after
    refusing a ``run`` that is a file (a checkpoint given for its folder) and an ``out`` named
    like a file: ``out`` holds several outputs, and ``heads.json`` would become a directory."""
    run = Path(run)
    if run.is_file():
        raise ConfigError(f"{run} is a file, not a run directory (give the run folder, e.g. {run.parent}; "
                          "--checkpoint names a checkpoint)", "RUN")
    if out is None:
        return run / "inspect"
    out_dir = Path(out)
    if out_dir.suffix in (".json", ".jsonl") and not out_dir.is_dir():
        raise ConfigError(f"{out} is a file name, but --out is the directory the outputs go to (the scores as "
                          f"SPLIT.WHAT.json, beside what was read out); give a directory, e.g. "
                          f"{out_dir.parent / out_dir.stem}", "--out")
    return check_output_path(out_dir, "--out", directory=True)  # before the model is read, not when writing


def inspect_run(run: str | Path, what: str, checkpoint: str | Path | None = None, split: str = "test",
                side: str = "src", layer: int | None = None, gold: str | Path | None = None,
                gold_format: GoldFormat = "auto", boundary: str = "auto", dataset: str | Path | None = None,
                out: str | Path | None = None, device: str | None = "cpu", conllu: str | Path | None = None,
                src: str | Path | None = None, tgt: str | Path | None = None, *, parser_uas: bool = False,
                parser: Any = None, without_src: bool = False) -> dict:
    """:func:`inspect_split` on a run's checkpoint (``best.pt``, else ``last.pt``); ``layer`` is
    1-based here (default: the method's first layer, the penultimate decoder layer for
    ``align``); results go to ``out`` (default ``RUN/inspect``).

    Against a gold file instead of a prepared split (:mod:`structnmt.evaluation.inspect_gold`):
    ``trees`` with ``conllu`` (and ``src`` or ``without_src`` for the target side; ``parser_uas``
    and ``parser`` score the dataset's parser on the same sentences), ``align`` with ``src``,
    ``tgt`` and ``gold``."""
    from structnmt.decoding.translator import load_translator
    from structnmt.evaluation.run_eval import run_checkpoint

    if what not in ("trees", "phrases", "align", "heads"):
        raise ConfigError(f"unknown analysis {what!r} (trees, phrases, align or heads)", "what")
    out_dir = inspect_out_dir(run, out)
    run = Path(run)
    translator = load_translator(run_checkpoint(run, checkpoint), device, dataset)
    model = translator.model
    stack = "decoder" if what == "align" or side == "tgt" else "encoder"
    depth = model.cfg.dec_layers if stack == "decoder" else model.cfg.enc_layers
    if layer is not None and not 1 <= layer <= depth:
        raise ConfigError(f"{layer} is outside the {stack}'s layers 1..{depth}", "--layer")
    layer0 = None if layer is None else layer - 1
    if what == "trees" and conllu is not None:
        from structnmt.evaluation.inspect_gold import inspect_trees_gold

        return inspect_trees_gold(translator, conllu, out_dir, side, layer0, src, tgt, parser_uas=parser_uas,
                                  parser=parser, without_src=without_src)
    if what == "align" and (src is not None or tgt is not None):
        from structnmt.evaluation.inspect_gold import inspect_align_gold

        if src is None or tgt is None or gold is None:
            raise DataError("alignments against a gold file need --src, --tgt and --gold")
        return inspect_align_gold(translator, src, tgt, gold, out_dir, layer0, gold_format)
    if conllu is not None or src is not None or tgt is not None:
        raise ConfigError("--conllu goes with trees, --src/--tgt with align (and trees on the target side)", what)
    if parser_uas or parser is not None or without_src:
        raise ConfigError("--parser-uas, --parser and --without-src go with trees --conllu GOLD", what)
    data = ParallelDataset(translator.dataset_dir, split)
    return inspect_split(model, data, what, out_dir, side=side,
                         layer=None if layer is None else layer - 1, gold=None if gold is None else str(gold),
                         boundary=boundary, gold_format=gold_format)
