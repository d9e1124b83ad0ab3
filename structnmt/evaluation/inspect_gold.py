"""``structnmt inspect`` against any gold file, without a prepared dataset.

* ``trees --conllu GOLD.conllu``: the gold trees are projected onto the run's own sub-words
  (the same character-offset alignment ``prepare`` uses, words that share a piece merged), the
  model's supervised head is read as in :func:`~structnmt.evaluation.inspect.dbsa_trees`, and
  its trees are scored (UAS) against the gold ones, beside right- and left-branching chains.
  On the target side the parallel sources come from ``--src`` (or none, ``--without-src``, for
  a head that provably does not read them: checked on every call); on the source side the
  target is ``--tgt`` when given (the encoder does not read it), else empty. A method that
  reads source trees gets the gold tree on the gold side, and the run's parser's elsewhere.
  A sentence that cannot be projected is left out and counted by reason (``dropped``).
  ``--parser-uas`` scores the parser the run's dataset was prepared with (or ``--parser``)
  on the very same sentences and words: its trees over the gold words are projected exactly
  as the gold trees are, so the head and the parser differ in their heads alone.
* ``align --src S --tgt T --gold G``: cross-attention alignments between the whitespace words
  of the two files (what a standard alignment test set indexes), scored (AER) against ``G``
  (Pharaoh or talp), beside the diagonal baseline.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from structnmt.data.batch import Batch
from structnmt.data.batching import collate_examples
from structnmt.data.example import Example, Side
from structnmt.data.parsing.conllu_backend import ConlluParser
from structnmt.decoding.translate import length_batches
from structnmt.decoding.translator import Translator
from structnmt.errors import DataError
from structnmt.evaluation.alignment import GoldFormat, corpus_aer, diagonal_links, read_alignments, write_pharaoh
from structnmt.evaluation.inspect import _readable, cross_attention_alignments, dbsa_trees
from structnmt.evaluation.scores import read_text
from structnmt.evaluation.trees import corpus_uas, left_branching_heads, right_branching_heads
from structnmt.io import atomic_write_text
from structnmt.wording import counted


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


#: why a sentence of a gold file is left out of a read-out (keys of the scores' ``dropped``); the
#: head, the parser and the baselines are always scored on the same sentences
DROP_REASONS = {
    "gold_text": "its gold words are not where its own `# text` has them",
    "unaligned": "its sub-words do not align to its words (SentencePiece's normalisation rewrote or removed "
                 "characters so that a word received no sub-word, or pieces fell out of order)",
    "too_long": "more sub-words than the model reads (model.max_positions)",
    "parser": "the parser's tree over its words could not be projected onto the sub-words as the gold one was",
}


@dataclass
class GoldSet:
    """The sentences of a CoNLL-U file as one side of a run reads them.

    Every sentence of the file has its first ``lines`` entry, ``blocks`` and ``texts``; those
    that can be scored have an entry in ``kept`` (position -> the gold side: sub-words, word
    index, and the gold tree after the words sharing a piece were merged). ``dropped`` holds
    ``(line, reason, message)`` of every other one, reason a key of :data:`DROP_REASONS`.
    """

    reader: ConlluParser
    lines: list[int] = field(default_factory=list)
    blocks: list[str] = field(default_factory=list)
    texts: list[str] = field(default_factory=list)
    kept: dict[int, Side] = field(default_factory=dict)
    units: dict[int, int] = field(default_factory=dict)  # position -> tree words before the piece merge
    dropped: list[tuple[int, str, str]] = field(default_factory=list)

    @property
    def path(self) -> Path:
        return self.reader.path

    def positions(self) -> list[int]:
        return sorted(self.kept)

    def drop(self, position: int, reason: str, message: str) -> None:
        self.kept.pop(position, None)
        self.dropped.append((self.lines[position], reason, message))

    def summary(self, first: int = 3) -> dict:
        """How many sentences were left out, by reason: their lines, and the first messages."""
        reasons: dict[str, dict] = {}
        for line, reason, message in sorted(self.dropped):
            entry = reasons.setdefault(reason, {"sentences": 0, "why": DROP_REASONS[reason], "lines": [],
                                                "first": []})
            entry["sentences"] += 1
            entry["lines"].append(line)
            if len(entry["first"]) < first:
                entry["first"].append(message)
        return {"sentences": len(self.dropped), "reasons": reasons}


def _has_words(block: str) -> bool:
    return any(row.strip() and not row.startswith("#") for row in block.splitlines())


def read_gold(translator: Translator, conllu: str | Path, side: str) -> GoldSet:
    """Every sentence of ``conllu`` projected onto the run's ``side`` sub-words exactly as
    ``prepare`` projects a parser's tree (words that share a piece merged); a sentence that
    cannot be projected is dropped with its reason, never the whole file."""
    pre = translator.preprocessor
    limit = translator.model.cfg.max_positions - 1
    gold = GoldSet(ConlluParser(conllu))
    for start, block in gold.reader.blocks:
        if not _has_words(block):
            continue  # a block of comments only is no sentence
        position = len(gold.lines)
        text = _gold_text(block, moses=bool(pre.moses))
        gold.lines.append(start)
        gold.blocks.append(block)
        gold.texts.append(text)
        try:
            tree = gold.reader.sentence_tree(block, text, start)
        except DataError as err:
            if "does not match the text" not in str(err):
                raise  # a malformed file is an error, not a dropped sentence
            gold.dropped.append((start, "gold_text", str(err)))
            continue
        try:
            encoded = pre.encode_with_tree(side, text, tree, str(conllu), start)
        except DataError as err:
            if "sub-word" not in str(err):
                raise
            gold.dropped.append((start, "unaligned", str(err)))
            continue
        if len(encoded.ids) > limit:
            gold.dropped.append((start, "too_long", f"{conllu}:{start}: {len(encoded.ids)} sub-words; the model "
                                                    f"reads at most {limit} (model.max_positions)"))
            continue
        gold.kept[position] = encoded
        gold.units[position] = len(tree)
    if not gold.lines:
        raise DataError("no sentence in the file", conllu)
    if not gold.kept:
        raise DataError(f"none of its {len(gold.lines)} sentences can be read on the {side} side; the first: "
                        f"{gold.dropped[0][2]}", conllu)
    return gold


def _with_heads(block: str, heads: list[int]) -> str:
    """The CoNLL-U block with the HEAD of each syntactic word replaced by ``heads`` (0-based,
    the root itself): the same words, multi-word tokens and text, another tree."""
    rows, word = [], 0
    for row in block.splitlines():
        cells = row.split("\t")
        if not row.startswith("#") and len(cells) == 10 and cells[0].isdigit():
            cells[6] = "0" if heads[word] == word else str(heads[word] + 1)
            word += 1
            row = "\t".join(cells)
        rows.append(row)
    if word != len(heads):
        raise DataError(f"{len(heads)} heads for a sentence of {word} words")
    return "\n".join(rows) + "\n"


def parser_trees(translator: Translator, gold: GoldSet, side: str, nlp: Any,
                 batch_size: int = 256) -> dict[int, list[int]]:
    """The parser's trees of the kept sentences, on the same units as their gold trees.

    ``nlp`` parses each sentence's gold syntactic words (as ``structnmt parser evaluate`` does:
    the gold tokenisation and sentence, so the parser is scored on its trees alone); its heads
    then replace the gold heads in the sentence's CoNLL-U block, which goes through the very
    projection the gold block went through (multi-word tokens merged, sub-words aligned, words
    sharing a piece merged). A sentence whose parse cannot be projected is dropped from ``gold``
    (reason ``parser``), so that the head is scored on the same sentences.
    """
    from structnmt.parsers.ud_eval import parse_gold_words
    from structnmt.parsers.ud_train import conllu_block_sentence

    pre = translator.preprocessor
    positions, sentences = [], []
    for k in gold.positions():
        try:
            sentence = conllu_block_sentence(gold.path, gold.lines[k], gold.blocks[k])
        except DataError as err:
            gold.drop(k, "parser", f"its words cannot be given to the parser: {err}")
            continue
        assert sentence is not None  # blocks without words were skipped when read
        positions.append(k)
        sentences.append(sentence)
    out = {}
    for k, heads in zip(positions, parse_gold_words(nlp, sentences, batch_size)):
        try:
            tree = gold.reader.sentence_tree(_with_heads(gold.blocks[k], heads), gold.texts[k], gold.lines[k])
            projected = pre.encode_with_tree(side, gold.texts[k], tree, str(gold.path), gold.lines[k]).tree
        except DataError as err:
            gold.drop(k, "parser", str(err))
            continue
        assert projected is not None
        if len(projected) != len(gold.kept[k].tree):  # type: ignore[arg-type]
            gold.drop(k, "parser", f"{gold.path}:{gold.lines[k]}: the parser's tree has {len(projected)} units "
                                   f"after projection, the gold one {len(gold.kept[k].tree)}")  # type: ignore[arg-type]
            continue
        out[k] = list(projected.heads)
    return out


def _recipe_matches(model: str, recorded: dict | None) -> bool:
    from structnmt.data.identity import parser_recipe_identity

    if not recorded:
        return False
    now = parser_recipe_identity(model) or {}
    return all(now.get(key) == value for key, value in recorded.items())


def run_parser(translator: Translator, side: str, parser: Any = None) -> tuple[Any, dict]:
    """The spaCy pipeline that parsed the run's dataset on ``side`` (its ``meta.json``), or
    ``parser`` (a model path or name, or a loaded pipeline) instead, and who it is.

    ``match`` says how it stands to the parser the dataset records: ``exact`` (the same model
    files, by digest), ``same recipe`` (a structnmt UD parser retrained from the recorded recipe:
    same training files, size, steps and seed, other weights), ``other``, or ``unknown`` (a
    loaded pipeline, which has no files to compare).
    """
    from structnmt.config import ParserConfig
    from structnmt.data.dataset import read_meta
    from structnmt.data.identity import parser_identity
    from structnmt.errors import ConfigError, ParserError
    from structnmt.parsers.ud_eval import load_pipeline

    cfg = translator.preprocessor.side_cfg(side).parser
    meta = read_meta(translator.dataset_dir)
    recorded = ((meta.get("inputs") or {}).get("parsers") or {}).get(side) or \
        (meta.get("parsers") or {}).get(side)
    if parser is None:
        if cfg.backend != "spacy":
            what = "no parser" if cfg.backend == "none" else f"the {cfg.backend} back end"
            raise ConfigError(f"the run's dataset has {what} on the {side} side: give the parser to score "
                              "(--parser MODEL)", f"data.{side}.parser")
        parser = cfg.model
    about: dict[str, Any] = {"recorded": {"model": cfg.model, "digest": (recorded or {}).get("digest"),
                                          "recipe": (recorded or {}).get("recipe")}}
    if isinstance(parser, (str, Path)):
        parser = str(parser)
        identity = parser_identity(ParserConfig(backend="spacy", model=parser))
        if identity is None or identity["digest"] is None:
            hint = " (`structnmt parser train --preset en_ud` retrains it from its recipe)" \
                if parser.rstrip("/").endswith("en_ud/model-best") else ""
            raise ParserError(f"the {side} parser {parser!r} is not on this machine (a path is read from the current "
                              f"directory, as prepare read it){hint}; or give another with --parser MODEL")
        about.update(identity)
        if identity["digest"] == about["recorded"]["digest"]:
            about["match"] = "exact"
        elif _recipe_matches(parser, about["recorded"]["recipe"]):
            about["match"] = "same recipe"
        else:
            about["match"] = "other"
    else:
        about.update({"model": f"<{type(parser).__name__}>", "match": "unknown"})
    return load_pipeline(parser), about


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


def _read_heads(translator: Translator, sides: list[Side], side: str, layer: int | None,
                others: list[Side] | None, needs: dict[str, set[str]]) -> list[list[int]]:
    """The head's word-level trees of the gold ``sides``; ``others`` are the other side of each
    example (the sources when ``side`` is tgt, the targets when src)."""
    if side == "src":
        examples = [Example(src=s, tgt=o if o is not None else _target(translator, ""))
                    for s, o in zip(sides, others or [None] * len(sides))]
        fields = {"src": needs["src"] | {"word_index"}, "tgt": set()}
    else:
        examples = [Example(src=o, tgt=s) for s, o in zip(sides, others or [])]
        fields = {"src": translator.source_fields()["src"], "tgt": needs["tgt"] | {"word_index"}}
    return dbsa_trees(translator.model, _batches(translator, examples, fields), side=side,  # type: ignore[arg-type]
                      layer=layer)


def _encoded_sources(translator: Translator, texts: list[str]) -> list[Side]:
    return [example.src for example in translator.encode_sources(texts)]


def causal_reach(golds: list[list[int]]) -> float:
    """The share of words whose gold head a causally masked (decoder) head can attend to: the
    word itself (the root) or a word before it. A target-side head cannot score above it, but
    for the few arcs the tree decoding forces."""
    total = sum(len(g) for g in golds)
    return sum(h <= w for g in golds for w, h in enumerate(g)) / total if total else 0.0


def inspect_trees_gold(translator: Translator, conllu: str | Path, out_dir: Path, side: str = "src",
                       layer: int | None = None, src: str | Path | None = None,
                       tgt: str | Path | None = None, parser_uas: bool = False, parser: Any = None,
                       without_src: bool = False) -> dict:
    """UAS of the model's supervised head against the trees of ``conllu`` (see the module).

    Sentences that cannot be projected onto the run's sub-words are left out and counted by
    reason (``dropped``). With ``parser_uas``, the parser the run's dataset was prepared with on
    ``side`` (or ``parser``) parses the same sentences' gold words, and its trees, projected as
    the gold ones were, are scored on exactly the words the head is scored on (``parser_uas``;
    who the parser is: ``parser``). ``without_src`` reads target-side trees with empty sources,
    after checking that they do not change with the source (true of a head in decoder layer 1,
    whose self-attention comes before any cross-attention).
    """
    from structnmt.errors import ConfigError

    if side == "tgt" and src is None and not without_src:
        raise DataError("target-side trees are read with their sources: give --src FILE (one sentence a line, "
                        "parallel to the CoNLL-U file), or --without-src for a head that does not read the source")
    if without_src and (side != "tgt" or src is not None):
        raise ConfigError("--without-src reads target-side trees without --src", "without_src")
    model = translator.model
    gold = read_gold(translator, conllu, side)
    n = len(gold.lines)
    targets = _lines(tgt, n, "targets") if side == "src" and tgt is not None else None
    sources = _lines(src, n, "sources") if side == "tgt" and src is not None else None
    if sources is not None:
        _drop_long_sources(translator, gold, sources, src)
    about_parser, parsed = None, None
    if parser_uas:
        nlp, about_parser = run_parser(translator, side, parser)
        parsed = parser_trees(translator, gold, side, nlp)
    if not gold.kept:
        raise DataError(f"none of its {n} sentences is left to score; the first dropped: {gold.dropped[0][2]}", conllu)
    positions = gold.positions()
    sides = [gold.kept[k] for k in positions]
    pred, reads = _predicted_heads(translator, gold, sides, side, layer, targets, sources, tgt, src)
    golds = [s.tree.heads for s in sides]  # type: ignore[union-attr]  # after merging words sharing a piece
    words = sum(len(g) for g in golds)
    merged = sum(gold.units[k] - len(g) for k, g in zip(positions, golds))
    syntactic = sum(1 for k in positions for row in gold.blocks[k].splitlines()
                    if not row.startswith("#") and row.split("\t", 1)[0].isdigit())
    name = Path(conllu).stem
    out_dir.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out_dir / f"{name}.heads", "".join(" ".join(map(str, h)) + "\n" for h in pred))
    atomic_write_text(out_dir / f"{name}.lines", "".join(f"{gold.lines[k]}\n" for k in positions))
    scores: dict[str, Any] = {
        "uas": corpus_uas(pred, golds),
        "right_branching_uas": corpus_uas([right_branching_heads(len(g)) for g in golds], golds),
        "left_branching_uas": corpus_uas([left_branching_heads(len(g)) for g in golds], golds),
    }
    if parsed is not None:
        trees = [parsed[k] for k in positions]
        scores["parser_uas"] = corpus_uas(trees, golds)
        scores["parser"] = about_parser
        atomic_write_text(out_dir / f"{name}.parser.heads", "".join(" ".join(map(str, h)) + "\n" for h in trees))
    if side == "tgt":
        scores["causal_reach"] = causal_reach(golds)
    layer_read = _readable(model, "dependency_tree", side, layer)[1]
    scores.update({"side": side, "layer": layer_read + 1, "sentences": len(golds), "words": words,
                   "syntactic_words": syntactic, "merged_words": merged, "file_sentences": n,
                   "dropped": gold.summary(), "reads": reads, "against": str(conllu)})
    atomic_write_text(out_dir / f"{name}.trees.json", json.dumps(scores, indent=2) + "\n")
    return scores


def _drop_long_sources(translator: Translator, gold: GoldSet, sources: list[str], src: str | Path | None) -> None:
    """A source the model cannot read drops its sentence, as a gold sentence too long would."""
    limit = translator.model.cfg.max_positions - 1
    for k in gold.positions():
        length = len(translator.preprocessor.subwords["src"].encode(translator.preprocessor.tokenise(
            "src", sources[k]))[0])
        if length > limit:
            gold.drop(k, "too_long", f"{src}:{k + 1}: the source has {length} sub-words; the model reads at "
                                     f"most {limit} (model.max_positions)")


def _predicted_heads(translator: Translator, gold: GoldSet, sides: list[Side], side: str, layer: int | None,
                     targets: list[str] | None, sources: list[str] | None, tgt: str | Path | None,
                     src: str | Path | None) -> tuple[list[list[int]], str]:
    """The head's trees of the kept sentences, and what it read beside them (for the report).

    Without sources, target-side trees are read twice, with empty sources and with the
    sentences themselves as sources, and refused if they differ: such a head reads the source.
    """
    positions = gold.positions()
    needs = translator.model.structure_needs(inference=False)
    if side == "src":
        others = [_target(translator, targets[k]) for k in positions] if targets is not None else None
        pred = _read_heads(translator, sides, side, layer, others, needs)
        return pred, f"targets from {tgt}" if tgt is not None else "empty targets (the encoder does not read them)"
    if sources is not None:
        given = _encoded_sources(translator, [sources[k] for k in positions])
        return _read_heads(translator, sides, side, layer, given, needs), f"sources from {src}"
    pred = _read_heads(translator, sides, side, layer, _encoded_sources(translator, [""] * len(positions)), needs)
    check = _read_heads(translator, sides, side, layer,
                        _encoded_sources(translator, [gold.texts[k] for k in positions]), needs)
    changed = sum(a != b for p, q in zip(pred, check) for a, b in zip(p, q))
    if changed:
        raise DataError(f"the {side} head reads the source: {changed} of {sum(map(len, pred))} heads change "
                        "between empty sources and the sentences themselves as sources; give --src FILE")
    return pred, "empty sources (checked: the same trees with the sentences themselves as sources)"


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
        raise DataError(f"{counted(len(links), 'line')} of gold alignments for {counted(len(sources), 'sentence')}",
                        gold)
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
