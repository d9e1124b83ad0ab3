"""``structnmt inspect`` against any gold file, without a prepared dataset.

* ``trees --conllu GOLD.conllu``: the gold trees are projected onto the run's own sub-words
  (the same character-offset alignment ``prepare`` uses, words that share a piece merged), the
  model's supervised head is read as in :func:`~structnmt.evaluation.inspect.dbsa_trees`, and
  its trees are scored (UAS) against the gold ones. On the target side the parallel sources
  come from ``--src``; on the source side the target is ``--tgt`` when given (the encoder does
  not read it), else empty. A method that reads source trees gets the gold tree on the gold
  side, and the run's parser's elsewhere.
* ``align --src S --tgt T --gold G``: cross-attention alignments between the whitespace words
  of the two files (what a standard alignment test set indexes), scored (AER) against ``G``
  (Pharaoh or talp), beside the diagonal baseline.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import torch

from structnmt.data.batch import Batch
from structnmt.data.batching import collate_examples
from structnmt.data.example import DepTree, Example, Side
from structnmt.data.parsing.conllu_backend import ConlluParser
from structnmt.decoding.translate import length_batches
from structnmt.decoding.translator import Translator
from structnmt.errors import DataError
from structnmt.evaluation.alignment import GoldFormat, corpus_aer, diagonal_links, read_alignments, write_pharaoh
from structnmt.evaluation.inspect import cross_attention_alignments, dbsa_trees
from structnmt.evaluation.scores import read_text
from structnmt.evaluation.trees import corpus_uas, right_branching_heads
from structnmt.io import atomic_write_text


def _gold_text(block: str, moses: bool) -> str:
    """The sentence a CoNLL-U block's tree indexes: its ``# text`` (raw, as the run's data was
    read) or, for a run trained on Moses-tokenised text, its surface tokens joined by spaces (a
    multi-word token such as French "au" once, not its syntactic words "à le")."""
    if not moses:
        for row in block.splitlines():
            if row.startswith("# text = "):
                return row.removeprefix("# text = ").strip()
    forms, inside = [], 0  # inside: the last word id of the multi-word token being read
    for row in block.splitlines():
        cells = row.split("\t")
        if row.startswith("#") or len(cells) < 2:
            continue
        first, _, last = cells[0].partition("-")
        if last.isdigit():
            forms.append(cells[1])
            inside = int(last)
        elif first.isdigit() and int(first) > inside:
            forms.append(cells[1])
    return " ".join(forms)


def gold_trees(conllu: str | Path, moses: bool) -> tuple[list[str], list[DepTree], list[int]]:
    """(texts, word-level trees, 1-based line of each sentence) of a CoNLL-U file."""
    parser = ConlluParser(conllu)
    texts, trees, lines = [], [], []
    for start, block in parser.blocks:
        text = _gold_text(block, moses)
        texts.append(text)
        trees.append(parser.sentence_tree(block, text, start))
        lines.append(start)
    if not trees:
        raise DataError("no sentence in the file", conllu)
    return texts, trees, lines


def _lines(path: str | Path, n: int | None, what: str) -> list[str]:
    lines = read_text(str(path))
    if n is not None and len(lines) != n:
        raise DataError(f"{len(lines)} lines of {what} for {n} sentences", path)
    return lines


def _target(translator: Translator, text: str) -> Side:
    return Side(ids=np.asarray(translator.target_ids(text), dtype=np.int32))


def _batches(translator: Translator, examples: list[Example], fields: dict[str, set[str]],
             word_index: dict[str, list[np.ndarray]] | None = None) -> Iterator[Batch]:
    """Batches of in-memory examples, their ``index`` the examples' order; ``word_index``
    replaces each side's sub-word -> word map (whitespace words for alignments)."""
    lengths = [max(len(ex.src.ids), len(ex.tgt.ids)) for ex in examples]  # type: ignore[union-attr]
    for indices in length_batches(lengths, translator.config.decoding.max_tokens):
        indices = np.sort(indices)
        batch = collate_examples([examples[i] for i in indices], fields, translator.labels)
        batch.index = torch.as_tensor(indices, dtype=torch.long)
        for side, offset in (("src", 0), ("tgt", 1)):
            if word_index is not None and side in word_index:
                length = batch.src.size(1) if side == "src" else batch.tgt_in.size(1)  # type: ignore[union-attr]
                table = torch.full((len(indices), length), -1, dtype=torch.long)
                for b, i in enumerate(indices):
                    words = torch.as_tensor(word_index[side][i], dtype=torch.long)
                    table[b, offset:offset + len(words)] = words
                batch.struct[side]["word_index"] = table
        yield batch


def inspect_trees_gold(translator: Translator, conllu: str | Path, out_dir: Path, side: str = "src",
                       layer: int | None = None, src: str | Path | None = None,
                       tgt: str | Path | None = None) -> dict:
    """UAS of the model's supervised head against the trees of ``conllu`` (see the module)."""
    pre, model = translator.preprocessor, translator.model
    texts, trees, lines = gold_trees(conllu, moses=bool(pre.moses))
    gold_sides = [pre.encode_with_tree(side, text, tree, str(conllu), line)
                  for text, tree, line in zip(texts, trees, lines)]
    limit = model.cfg.max_positions - 1
    for gold, line in zip(gold_sides, lines):
        if len(gold.ids) > limit:
            raise DataError(f"{len(gold.ids)} sub-words; the model reads at most {limit} (model.max_positions)",
                            conllu, line)
    needs = model.structure_needs(inference=False)
    if side == "src":
        targets = _lines(tgt, len(texts), "targets") if tgt is not None else [""] * len(texts)
        examples = [Example(src=s, tgt=_target(translator, t)) for s, t in zip(gold_sides, targets)]
        fields = {"src": needs["src"] | {"word_index"}, "tgt": set()}
    else:
        if src is None:
            raise DataError("target-side trees are read with their sources: give --src FILE (one sentence a line, "
                            "parallel to the CoNLL-U file)")
        sources = translator.encode_sources(_lines(src, len(texts), "sources"))
        examples = [Example(src=s.src, tgt=t) for s, t in zip(sources, gold_sides)]
        fields = {"src": translator.source_fields()["src"], "tgt": needs["tgt"] | {"word_index"}}
    pred = dbsa_trees(model, _batches(translator, examples, fields), side=side, layer=layer)  # type: ignore[arg-type]
    golds = [s.tree.heads for s in gold_sides]  # type: ignore[union-attr]  # after merging words sharing a piece
    merged = sum(len(t) - len(s.tree) for t, s in zip(trees, gold_sides))  # type: ignore[arg-type]
    name = Path(conllu).stem
    atomic_write_text(out_dir / f"{name}.heads", "".join(" ".join(map(str, h)) + "\n" for h in pred))
    scores = {"uas": corpus_uas(pred, golds),
              "right_branching_uas": corpus_uas([right_branching_heads(len(g)) for g in golds], golds),
              "sentences": len(golds), "words": sum(len(g) for g in golds), "merged_words": merged,
              "against": str(conllu)}
    atomic_write_text(out_dir / f"{name}.trees.json", json.dumps(scores, indent=2) + "\n")
    return scores


def _whitespace_word_index(translator: Translator, side: str, text: str, path: str | Path,
                           line: int) -> tuple[np.ndarray, int]:
    """Each sub-word's whitespace word in ``text`` (what the gold alignments index), and the
    number of words."""
    pre = translator.preprocessor
    tokenised = pre.tokenise(side, text)
    if len(tokenised.split()) != len(text.split()):
        raise DataError(f"the run's Moses tokenisation splits this line into {len(tokenised.split())} words, "
                        f"the gold alignments index {len(text.split())}: give tokenised text", path, line)
    _, spans = pre.subwords[side].encode(tokenised)
    word_spans, start = [], None
    for k, ch in enumerate(tokenised + " "):
        if ch.isspace() and start is not None:
            word_spans.append((start, k))
            start = None
        elif not ch.isspace() and start is None:
            start = k
    from structnmt.data.structures import align_pieces_to_words

    return align_pieces_to_words(spans, word_spans, str(path), line), len(word_spans)


def inspect_align_gold(translator: Translator, src: str | Path, tgt: str | Path, gold: str | Path,
                       out_dir: Path, layer: int | None = None, gold_format: GoldFormat = "auto") -> dict:
    """AER of the model's cross-attention alignments between the whitespace words of ``src``
    and ``tgt`` against ``gold`` (see the module)."""
    sources = _lines(src, None, "sources")
    if not sources:  # AER over no sentence would print 0.0, which reads as a perfect alignment
        raise DataError("no sentences: nothing to align and score (AER needs at least one sentence)", src)
    targets = _lines(tgt, len(sources), "targets")
    encoded = translator.encode_sources(sources)
    examples = [Example(src=s.src, tgt=_target(translator, t)) for s, t in zip(encoded, targets)]
    index: dict[str, list[np.ndarray]] = {"src": [], "tgt": []}
    n_words = []
    for number, (s, t) in enumerate(zip(sources, targets), start=1):
        src_index, n_src = _whitespace_word_index(translator, "src", s, src, number)
        tgt_index, n_tgt = _whitespace_word_index(translator, "tgt", t, tgt, number)
        index["src"].append(src_index)
        index["tgt"].append(tgt_index)
        n_words.append((n_src, n_tgt))
    links = read_alignments(str(gold), gold_format, n_words)
    if len(links) != len(sources):
        raise DataError(f"{len(links)} lines of gold alignments for {len(sources)} sentences", gold)
    if not any(sure or possible for sure, possible in links):
        raise DataError("no gold link on any line: AER would be 0.0 whatever the model does", gold)
    fields = {"src": translator.source_fields()["src"], "tgt": set()}
    found = cross_attention_alignments(translator.model, _batches(translator, examples, fields, index), layer=layer)
    sure, possible = [s for s, _ in links], [p for _, p in links]
    atomic_write_text(out_dir / f"{Path(src).stem}.align", write_pharaoh([a.symmetrised for a in found]))
    scores = {"tgt2src": corpus_aer(sure, possible, [a.tgt2src for a in found]),
              "src2tgt": corpus_aer(sure, possible, [a.src2tgt for a in found]),
              "grow_diag_final": corpus_aer(sure, possible, [a.symmetrised for a in found]),
              "diagonal": corpus_aer(sure, possible, [diagonal_links(a, b) for a, b in n_words]),
              "sentences": len(sources), "against": str(gold)}
    atomic_write_text(out_dir / f"{Path(src).stem}.align.json", json.dumps(scores, indent=2) + "\n")
    return scores
