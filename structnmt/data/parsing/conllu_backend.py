"""Stored parses read from a CoNLL-U file (``data.<side>.parser.backend: conllu``).

The file holds one sentence per line of the split's text file, in order (sentence n
parses line n), so gold or externally produced trees can be used. A file with one sentence
per non-blank line, as a parser run over a text with blank lines writes it, is read so:
sentence n then parses the n-th non-blank line (:meth:`ConlluParser.follow`). The tree's words are
the file's syntactic words; their character spans are found by locating each word, in
order, in the raw line while ignoring whitespace. A multi-word token ("du" = "de le")
is located by its surface form. By default it becomes one tree word (the surface form,
attached where its word with a head outside the token attaches), because the sub-word
alignment needs every tree word to own at least one sub-word; with
``merge_multiword=False`` its syntactic words are kept and share its span. Empty nodes (ids like
``8.1``, enhanced-graph only) are not part of the basic tree and are skipped. A word that
is not where the text says it should be, a head out of range, several roots or a cycle
stops with the CoNLL-U file and the line the sentence starts on.
"""

from __future__ import annotations

import bisect
from pathlib import Path

import conllu

from structnmt.data.example import DepTree
from structnmt.data.parsing.base import Convention
from structnmt.errors import DataError
from structnmt.io import sha256_file


def read_blocks(path: Path) -> list[tuple[int, str]]:
    """Sentence blocks of a CoNLL-U file with the 1-based line each starts on."""
    try:
        text = path.read_text(encoding="utf-8-sig")  # -sig: a byte-order mark is dropped, not read as text
    except UnicodeDecodeError as err:
        raise DataError(f"invalid UTF-8 at byte {err.start}", path) from None
    except OSError as err:
        raise DataError(f"cannot read the file: {err}", path) from None
    blocks: list[tuple[int, str]] = []
    current: list[str] = []
    start = 0
    for number, line in enumerate(text.splitlines(), start=1):
        if line.strip():
            if not current:
                start = number
            current.append(line)
        elif current:
            blocks.append((start, "\n".join(current) + "\n"))
            current = []
    if current:
        blocks.append((start, "\n".join(current) + "\n"))
    return blocks


def locate(form: str, text: str, cursor: int) -> tuple[int, int] | None:
    """Span of ``form`` in ``text`` at or after ``cursor``, skipping whitespace on both sides."""
    chars = [c for c in form if not c.isspace()]
    if not chars:
        return None
    i = cursor
    while i < len(text) and text[i].isspace():
        i += 1
    start = i
    for c in chars:
        while i < len(text) and text[i].isspace():
            i += 1
        if i >= len(text) or text[i] != c:
            return None
        i += 1
    return start, i


# one word of the tree: its form, its span in the text and the ids of its syntactic words
# (several for a merged multi-word token)
Unit = tuple[str, tuple[int, int], list[int]]


class ConlluParser:
    """Trees of one split from its CoNLL-U file; ``parse`` looks sentences up by line number."""

    def __init__(self, path: str | Path, convention: Convention | None = None,
                 merge_multiword: bool = True) -> None:
        self.path = Path(path)
        self.merge_multiword = merge_multiword
        self._mwt_span = (0, 0)
        if not self.path.is_file():
            raise DataError("CoNLL-U file not found", self.path)
        self.blocks = read_blocks(self.path)
        self.name = f"conllu:{self.path.name}"
        self.version = sha256_file(self.path)[:16]
        self.convention: Convention = convention or "ud"
        self._blank: list[int] = []  # the text's blank lines, when sentences follow its non-blank lines
        self._text_blank = 0  # how many blank lines the text has

    def follow(self, text_file: str | Path) -> None:
        """Match sentences to the lines of ``text_file``: one per line (blank ones included), or,
        where the file has exactly one per non-blank line, one per non-blank line."""
        blank, lines = [], 0
        with open(text_file, "rb") as handle:
            for lines, raw in enumerate(handle, start=1):
                if not raw.decode("utf-8", "replace").split():
                    blank.append(lines)
        self._blank = blank if blank and len(self.blocks) == lines - len(blank) else []
        self._text_blank = len(blank)

    def parse(self, texts: list[str], lines: list[int] | None = None) -> list[DepTree]:
        numbers = lines if lines is not None else list(range(1, len(texts) + 1))
        trees = []
        for text, number in zip(texts, numbers):
            index = number - bisect.bisect_left(self._blank, number)  # 1-based, past the blank lines before
            if not 1 <= index <= len(self.blocks):
                raise DataError(f"the text has a sentence on line {number} but the file has only "
                                f"{len(self.blocks)} sentences", self.path)
            start, block = self.blocks[index - 1]
            trees.append(self.sentence_tree(block, text, start))
        return trees

    def extra_sentences(self, lines: int, text_file: str | Path) -> DataError | None:
        """The error for sentences past the text's ``lines`` lines (``parse`` never reads them,
        and they mean the parses and the lines do not match), or None when there are none."""
        if len(self.blocks) <= lines - len(self._blank):
            return None
        other = f", or one per non-blank line ({lines - self._text_blank})" if self._text_blank else ""
        return DataError(f"sentence {lines + 1} starts here, but the text {text_file} has only {lines} lines "
                         f"(the file has {len(self.blocks)} sentences, one per line is expected{other})",
                         self.path, self.blocks[lines][0])

    def sentence_tree(self, block: str, text: str, line: int) -> DepTree:
        sentence = self._parse_block(block, line)
        units, head_of, label_of, form_of = self._units(sentence, text, line)
        heads, labels = self._unit_heads(units, head_of, label_of, form_of, line)
        tree = DepTree(text=text, words=[u[0] for u in units], spans=[u[1] for u in units], heads=heads,
                       labels=labels, parser=f"{self.name} {self.version}")
        tree.check(str(self.path), line)
        return tree

    def _parse_block(self, block: str, line: int) -> conllu.TokenList:
        # the conllu library reads short rows leniently (missing columns become missing keys),
        # so count the columns first and name the very line
        for number, row in enumerate(block.splitlines(), start=line):
            columns = len(row.split("\t"))
            if not row.startswith("#") and columns != 10:
                raise DataError(f"a word line needs 10 tab-separated columns, this one has {columns}",
                                self.path, number)
        try:
            sentences = conllu.parse(block)
        except Exception as err:  # conllu raises ParseException and ValueError subclasses
            raise DataError(f"malformed CoNLL-U: {err}", self.path, line) from None
        if len(sentences) != 1:
            raise DataError("expected one sentence", self.path, line)
        return sentences[0]

    def _units(self, sentence: conllu.TokenList, text: str,
               line: int) -> tuple[list[Unit], dict[int, int | None], dict[int, str], dict[int, str]]:
        """The tree's words, each ``(form, span in text, syntactic word ids)``, and each word id's
        head, label and form: a merged multi-word token is one unit of several syntactic words."""
        units: list[Unit] = []
        head_of: dict[int, int | None] = {}
        label_of: dict[int, str] = {}
        form_of: dict[int, str] = {}
        cursor = 0
        mwt: tuple[int, int] | None = None  # id range of the current multi-word token
        mwt_unit: list[int] = []
        for token in sentence:
            tid = token["id"]
            if isinstance(tid, tuple):
                if len(tid) == 3 and tid[1] == "-":
                    span = self._locate(token["form"], text, cursor, line)
                    cursor = span[1]
                    mwt = (tid[0], tid[2])
                    if self.merge_multiword:
                        mwt_unit = []
                        units.append((token["form"], span, mwt_unit))
                    else:
                        mwt_unit = []
                        self._mwt_span = span
                continue  # empty nodes ("8.1") have no place in the basic tree
            head_of[tid] = token["head"]
            label_of[tid] = token["deprel"] or "_"
            form_of[tid] = token["form"]
            if mwt is not None and mwt[0] <= tid <= mwt[1]:
                if self.merge_multiword:
                    mwt_unit.append(tid)
                else:
                    units.append((token["form"], self._mwt_span, [tid]))
                continue
            span = self._locate(token["form"], text, cursor, line)
            cursor = span[1]
            units.append((token["form"], span, [tid]))
        if not units:
            raise DataError("sentence has no words", self.path, line)
        return units, head_of, label_of, form_of

    def _unit_heads(self, units: list[Unit], head_of: dict[int, int | None],
                    label_of: dict[int, str], form_of: dict[int, str], line: int) -> tuple[list[int], list[str]]:
        """Each unit's head unit (0-based, the root its own) and label, with a bad head named."""
        unit_of = {tid: k for k, (_, _, members) in enumerate(units) for tid in members}
        heads: list[int] = []
        labels: list[str] = []
        for k, (_, _, members) in enumerate(units):
            for tid in members:
                head = head_of[tid]
                if head is None:
                    raise DataError(f"word {tid} ({form_of[tid]!r}) has no head", self.path, line)
                if head != 0 and head not in unit_of:
                    raise DataError(f"word {tid} ({form_of[tid]!r}) has head {head} "
                                    f"outside 0..{len(head_of)}", self.path, line)
                if head == tid:
                    raise DataError(f"word {tid} ({form_of[tid]!r}) is its own head", self.path, line)
            # the unit attaches where its first word with a head outside the unit attaches
            outside = [tid for tid in members if head_of[tid] not in members]
            if not outside:
                raise DataError(f"the words of {units[k][0]!r} only depend on each other", self.path, line)
            tid = outside[0]
            heads.append(k if head_of[tid] == 0 else unit_of[head_of[tid]])
            labels.append(label_of[tid])
        return heads, labels

    def _locate(self, form: str, text: str, cursor: int, line: int) -> tuple[int, int]:
        span = locate(form, text, cursor)
        if span is None:
            rest = text[cursor:cursor + 30]
            raise DataError(f"word {form!r} does not match the text here: ...{rest!r}", self.path, line)
        return span
