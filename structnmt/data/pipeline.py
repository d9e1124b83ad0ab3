"""The one path from raw text to :class:`Example`, shared by ``prepare`` and ``translate``.

For each side: (Moses-tokenise) -> parse -> SentencePiece -> align pieces to words by
character offsets -> (scenes). With Moses on, the parser and SentencePiece both read the
Moses-tokenised string, so word spans and piece spans index the same text (see
``tokenisation.py``); the raw sentence is kept in ``Example.meta`` for references.

UCCA scenes (``scenes: ucca``) are read from ``data.<side>.ucca[split]``, a directory with
one UCCA XML passage per sentence, named by the sentence's 1-based line number in the
split's file: ``000001.xml`` (six digits, zero-padded) or ``1.xml``.

With ``multitask_parse`` (the C&H baseline) every source is wrapped in a task tag,
``<translate> ... <translate>`` (Currey & Heafield 2019 prepend and append it), and no
structures are kept: that baseline is a plain Transformer.
"""

from __future__ import annotations

from pathlib import Path

from structnmt.config import DataConfig, SideConfig, from_dict
from structnmt.data.example import DepTree, Example, Scenes, Side
from structnmt.data.identity import parser_identity
from structnmt.data.parsing import Parser, make_parser
from structnmt.data.parsing.cache import CachedParser, PinnedTrees, pin_of
from structnmt.data.tokenisation import MosesTokeniser, SubwordModel
from structnmt.errors import ConfigError, DataError

SIDES = ("src", "tgt")
TRANSLATE_TAG = "<translate>"
PARSE_TAG = "<parse>"


def tag(text: str, task_tag: str) -> str:
    return f"{task_tag} {text} {task_tag}"


def linearise(tree: DepTree) -> str:
    """The C&H parse target for a dependency tree: a lexicalised bracketing of its subtrees.

    Each word opens a bracket named by its relation, holding its left dependents, the
    word, its right dependents: "(root (nsubj He ) saw (obj (det the ) dog ) )". Currey &
    Heafield linearise constituency trees the same way (open label, words, close bracket).
    """
    children: list[list[int]] = [[] for _ in tree.words]
    for i, h in enumerate(tree.heads):
        if h != i:
            children[h].append(i)
    out: list[str] = []
    # an explicit stack, so deep trees cannot hit the recursion limit; items are
    # ("open", node): expand a subtree, ("word", node): emit a word, ("close", -1): emit ")"
    stack: list[tuple[str, int]] = [("open", tree.root)]
    while stack:
        kind, node = stack.pop()
        if kind == "close":
            out.append(")")
        elif kind == "word":
            out.append("".join(tree.words[node].split()))
        else:
            out.append("(" + "_".join(tree.labels[node].split()))
            ordered = [("open", c) for c in children[node] if c < node] + [("word", node)]
            ordered += [("open", c) for c in children[node] if c > node] + [("close", -1)]
            stack.extend(reversed(ordered))
    return " ".join(out)


def ucca_file(directory: Path, line: int) -> Path:
    for name in (f"{line:06d}.xml", f"{line}.xml"):
        if (directory / name).is_file():
            return directory / name
    raise DataError(f"no UCCA passage for line {line} (expected {line:06d}.xml or {line}.xml)", directory)


class Preprocessor:
    """Holds the tokenisers, sub-word models, parsers and scene settings of a dataset."""

    def __init__(self, data: DataConfig, subwords: dict[str, SubwordModel],
                 cache_dir: str | Path | None = None, task_tag: str | None = None,
                 parsers: dict[str, Parser] | None = None) -> None:
        """``parsers``: a dict the side parsers (all but CoNLL-U's) are kept in, to hand them from
        one Preprocessor to the next (a one-shot prepare's plan and encode stages load them once)."""
        self.data = data
        self.subwords = subwords
        self.cache_dir = Path(cache_dir) if cache_dir is not None else None
        self.task_tag = task_tag
        self.moses = {side: MosesTokeniser(self.side_cfg(side).lang) for side in SIDES} if data.moses else {}
        self._parsers: dict[tuple[str, str], Parser] = {}
        self._shared: dict[str, Parser] = parsers if parsers is not None else {}
        self._identity: dict[str, dict | None] = {}
        for side in SIDES:
            cfg = self.side_cfg(side)
            if cfg.scenes != "none" and cfg.parser.backend == "none":
                raise ConfigError("scenes need a parser for this side", f"data.{side}.scenes")

    @classmethod
    def from_dataset(cls, dir: str | Path) -> Preprocessor:
        """Rebuild the preprocessing of a prepared dataset from its ``meta.json``."""
        dir = Path(dir)
        from structnmt.data.dataset import check_meta, read_meta

        meta = check_meta(read_meta(dir), dir)  # `{}` or `subwords: null`: one line naming meta.json
        data = from_dict(DataConfig, meta["data"], "data")
        models: dict[str, SubwordModel] = {}
        for side in SIDES:
            file = dir / meta["subwords"][side]["file"]
            models[side] = next((m for m in models.values() if m.path == file), None) or SubwordModel(file)
        return cls(data, models, cache_dir=None, task_tag=meta.get("task_tag"))

    # -- parts ---------------------------------------------------------------
    def side_cfg(self, side: str) -> SideConfig:
        return self.data.src if side == "src" else self.data.tgt

    def tokenise(self, side: str, text: str) -> str:
        return self.moses[side].tokenise(text) if side in self.moses else text

    def parser(self, side: str, split: str) -> Parser | None:
        """The side's parser for a split (CoNLL-U parses are per split; others are shared and cached)."""
        cfg = self.side_cfg(side).parser
        if cfg.backend == "none":
            return None
        key = (side, split)
        if key not in self._parsers:
            where = f"data.{side}.parser"
            if cfg.backend == "conllu":
                parser = make_parser(cfg, split, self.data.processes, where)
                files = self.data.splits.get(split)
                text = getattr(files, side, None) if files is not None and files.tsv is None else None
                if text is not None and Path(text).is_file():
                    parser.follow(text)  # type: ignore[union-attr]  # one sentence per (non-blank) line
            else:
                if side not in self._shared:
                    # a pinned cache whose file names its convention needs no parser (a fresh
                    # machine need not train or install it): every tree comes from the file
                    pin = self.pin(side)
                    self._shared[side] = PinnedTrees(pin, cfg.convention) if pin else \
                        make_parser(cfg, split, self.data.processes, where)  # type: ignore
                parser = self._shared[side]
                if self.cache_dir is not None:
                    parser = CachedParser(parser, self.cache_dir / side, (self.identity(side) or {}).get("digest"))
            assert parser is not None
            self._parsers[key] = parser
        return self._parsers[key]

    def pin(self, side: str) -> dict | None:
        """The trees file the side's parse cache is pinned to (:func:`~structnmt.data.parsing.cache.pin_of`),
        when its header names the label convention: then the file stands for the parser. (Files
        written before headers named it need the parser on the machine, and name it themselves.)"""
        pin = pin_of(self.cache_dir / side) if self.cache_dir is not None else None
        return pin if pin and pin.get("convention") else None

    def identity(self, side: str) -> dict | None:
        """The side's parser identity (model digest included), computed once from the files; for a
        pinned cache, the parser its trees file names, whatever parser this machine has."""
        if side not in self._identity:
            cfg, pin = self.side_cfg(side).parser, self.pin(side)
            self._identity[side] = parser_identity(cfg) if pin is None or cfg.backend in ("none", "conllu") else \
                {"backend": cfg.backend, "model": cfg.model,
                 **{k: (pin.get("parser") or {}).get(k) for k in ("name", "version", "digest")},
                 **({"recipe": pin["recipe"]} if pin.get("recipe") else {})}  # records read it from meta.json
        return self._identity[side]

    def parse(self, side: str, split: str, texts: list[str], lines: list[int]) -> list[DepTree] | None:
        parser = self.parser(side, split)
        return None if parser is None else parser.parse(texts, lines)

    def parser_info(self, side: str) -> dict | None:
        cfg = self.side_cfg(side).parser
        if cfg.backend == "none":
            return None
        parser = next((p for (s, _), p in self._parsers.items() if s == side), None)
        if parser is None:
            return {"backend": cfg.backend, "model": cfg.model, "convention": cfg.convention}
        return {"backend": cfg.backend, "name": parser.name, "version": parser.version,
                "convention": parser.convention, "model": cfg.model,
                "digest": (self.identity(side) or {}).get("digest")}

    @property
    def keeps_structure(self) -> bool:
        """False for the C&H baseline, whose tagged sources do not match their trees."""
        return self.task_tag is None

    def _side(self, side: str, text: str, tree: DepTree | None, split: str, line: int,
              path: str | None) -> Side:
        model = self.subwords[side]
        if tree is None or not self.keeps_structure:
            return Side(ids=model.encode_ids(text))  # no alignment: SentencePiece's fast path
        ids, spans = model.encode(text)
        from structnmt.data.structures import align_pieces_to_words, merge_words_sharing_pieces

        tree = merge_words_sharing_pieces(tree, spans)
        word_index = align_pieces_to_words(spans, tree.spans, path, line)
        return Side(ids=ids, word_index=word_index, tree=tree, scenes=self._scenes(side, tree, split, line))

    def encode_with_tree(self, side: str, text: str, tree: DepTree, path: str | None = None,
                         line: int = 0) -> Side:
        """One side of a sentence with a given tree (a gold one, say), built exactly as
        ``prepare`` builds a parsed side: sub-words aligned to the tree's words, words that share
        a piece merged, scenes when the side derives them from the tree."""
        if self.side_cfg(side).scenes == "ucca":
            raise ConfigError("the run reads UCCA scenes on this side, which a gold tree does not give",
                              f"data.{side}.scenes")
        return self._side(side, text, tree, "gold", line, path)

    def _scenes(self, side: str, tree: DepTree, split: str, line: int) -> Scenes | None:
        cfg = self.side_cfg(side)
        if cfg.scenes == "none":
            return None
        if cfg.scenes == "dependency":
            from structnmt.data.scenes import derive_scenes

            return derive_scenes(tree)
        from structnmt.data.scenes import align_ucca_to_tree, read_ucca_passage

        if split not in cfg.ucca:
            raise ConfigError(f"no UCCA directory for split {split!r}", f"data.{side}.ucca")
        file = ucca_file(Path(cfg.ucca[split]), line)
        terminals, scenes = read_ucca_passage(file)
        return align_ucca_to_tree(terminals, scenes, tree, file)

    def scene_source(self, side: str) -> str:
        return self.side_cfg(side).scenes

    # -- the two entry points ------------------------------------------------
    def encode_pairs(self, pairs: list[tuple[int, str, str]], split: str,
                     paths: dict[str, str] | None = None,
                     dropped: list[tuple[str, DataError]] | None = None) -> list[Example]:
        """Examples of cleaned (line, src, tgt) pairs; ``paths`` name the files in errors.

        By default the first sentence whose parse or sub-word alignment is unusable stops
        everything with its file and line. With a ``dropped`` list (``data.clean.drop_bad_lines``)
        such a pair is left out instead and ``(reason, error)`` is appended, reason being
        ``"bad_parse"`` or ``"unaligned"``, so that ``prepare`` can say what it dropped and why.
        """
        paths = paths or {}
        lines = [n for n, _, _ in pairs]
        texts = {"src": [self.tokenise("src", s) for _, s, _ in pairs],
                 "tgt": [self.tokenise("tgt", t) for _, _, t in pairs]}
        trees: dict[str, list[DepTree | None] | None] = {}
        bad: dict[int, tuple[str, DataError]] = {}  # position in pairs -> why it is dropped
        for side in SIDES:
            if dropped is None:
                trees[side] = self.parse(side, split, texts[side], lines)  # type: ignore[assignment]
            else:
                trees[side] = self._parse_dropping(side, split, texts[side], lines, bad)
        examples = []
        for k, (line, src, tgt) in enumerate(pairs):
            if k in bad:
                continue
            src_text = texts["src"][k] if self.task_tag is None else tag(texts["src"][k], self.task_tag)
            try:
                s = self._side("src", src_text, trees["src"][k] if trees["src"] else None, split, line,
                               paths.get("src"))
                t = self._side("tgt", texts["tgt"][k], trees["tgt"][k] if trees["tgt"] else None, split, line,
                               paths.get("tgt"))
            except DataError as err:
                if dropped is None:
                    raise
                bad[k] = ("unaligned", err)
                continue
            examples.append(Example(src=s, tgt=t, meta={"line": line, "path": paths.get("src", split),
                                                         "src_text": src, "tgt_text": tgt}))
        if dropped is not None:
            dropped.extend(bad[k] for k in sorted(bad))
        return examples

    def _parse_dropping(self, side: str, split: str, texts: list[str], lines: list[int],
                        bad: dict[int, tuple[str, DataError]]) -> list[DepTree | None] | None:
        """Parse a batch; if a sentence fails, parse one by one so only the bad ones are lost."""
        try:
            return self.parse(side, split, texts, lines)  # type: ignore[return-value]
        except DataError:
            pass
        out: list[DepTree | None] = []
        for k, (text, line) in enumerate(zip(texts, lines)):
            if k in bad:
                out.append(None)
                continue
            try:
                (tree,) = self.parse(side, split, [text], [line]) or [None]
            except DataError as err:
                bad[k] = ("bad_parse", err)
                tree = None
            out.append(tree)
        return out

    def encode_sources(self, lines: list[str], with_structure: bool, split: str = "translate",
                       numbers: list[int] | None = None, path: str | None = None) -> list[Example]:
        """Source-only examples for translation; parsed only when a method needs the structure.
        ``path`` and ``numbers`` (the 1-based input line of each; default 1, 2, ...) name the
        input in messages."""
        texts = [self.tokenise("src", s) for s in lines]
        numbers = numbers or list(range(1, len(lines) + 1))
        trees = self.parse("src", split, texts, numbers) if with_structure else None
        out = []
        for k, raw in enumerate(lines):
            text = texts[k] if self.task_tag is None else tag(texts[k], self.task_tag)
            side = self._side("src", text, trees[k] if trees else None, split, numbers[k], path)
            out.append(Example(src=side, meta={"line": numbers[k], "src_text": raw}))
        return out

    def decode(self, ids) -> str:
        """Target sub-word ids -> text (Moses-detokenised when the data was Moses-tokenised)."""
        text = self.subwords["tgt"].decode(ids)
        return self.moses["tgt"].detokenise(text) if "tgt" in self.moses else text
