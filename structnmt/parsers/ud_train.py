"""Train a Universal Dependencies parser (spaCy tagger + parser) from CoNLL-U treebanks.

The registry has no UD-style parser for every language a recipe needs (English's
``en_core_web_sm`` follows ClearNLP, German has none), so the toolkit trains its own with
spaCy's training loop. The result is an ordinary spaCy pipeline directory: recipes pass
``OUT/model-best`` as ``data.src.parser.model`` with backend ``spacy``.

Tree convention inside this module (and everything it returns): heads are 0-based and the
root points to itself, as in :class:`structnmt.data.example.DepTree`. CoNLL-U's 1-based
heads with 0 for the root are converted on reading.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from conllu.exceptions import ParseException
from conllu.parser import DEFAULT_FIELDS, parse_line

import structnmt
from structnmt.data.example import DepTree
from structnmt.errors import ConfigError, DataError
from structnmt.io import atomic_write_bytes, atomic_write_text, replace_dir, sha256_file

DEV_EVERY = 10  # without a dev file, every 10th sentence is held out for spaCy's model selection


@dataclass
class UDSentence:
    """One gold sentence: its syntactic words (multi-word token ranges and empty nodes dropped)."""

    words: list[str]
    spaces: list[bool]  # whether a space follows the word in the raw text (SpaceAfter=No)
    upos: list[str]
    heads: list[int]  # 0-based, the root points to itself
    deprels: list[str]  # as in the file, subtypes kept ("nsubj:pass", "root")
    line: int  # 1-based line of the sentence's first line in its file

    def __len__(self) -> int:
        return len(self.words)

    @property
    def text(self) -> str:
        return "".join(w + (" " if s else "") for w, s in zip(self.words, self.spaces)).rstrip()


#: the UD parsers the recipes use: name -> (language, training files under the UD directory
#: (../shared/data/ud), held-out file for choosing the checkpoint or None for every 10th training
#: sentence, output directory)
PARSER_PRESETS: dict[str, tuple[str, list[str], str | None, str]] = {
    # EWT's training file plus GUM's dev and test for training, EWT dev to choose the checkpoint
    "en_ud": ("en", ["en_ewt-ud-train.conllu", "en_gum-ud-dev.conllu", "en_gum-ud-test.conllu"],
              "en_ewt-ud-dev.conllu", "parsers/en_ud"),
    "de_ud": ("de", ["de_gsd-ud-dev.conllu"], None, "parsers/de_ud"),
}

#: updates of each preset (docs/parsers.md: what they reach and what they cost)
PRESET_STEPS = {"en_ud": 2500, "de_ud": 1500}


def _blocks(path: Path) -> Iterator[tuple[int, list[tuple[int, str]]]]:
    """Yield (first line, [(line number, line)]) for each blank-line separated block."""
    try:
        handle = open(path, encoding="utf-8-sig")  # -sig: a byte-order mark is dropped, not read as text
    except FileNotFoundError:
        raise DataError("CoNLL-U file not found", path) from None
    except OSError as exc:
        raise DataError(f"cannot read CoNLL-U file: {exc.strerror}", path) from None
    block: list[tuple[int, str]] = []
    with handle:
        lineno = 0
        try:
            for lineno, raw in enumerate(handle, start=1):
                line = raw.rstrip("\r\n")
                if line.strip():
                    block.append((lineno, line))
                elif block:
                    yield block[0][0], block
                    block = []
        except UnicodeDecodeError:
            raise DataError("file is not valid UTF-8", path, lineno + 1) from None
    if block:
        yield block[0][0], block


def _parse_sentence(path: Path, start: int, block: list[tuple[int, str]]) -> UDSentence | None:
    words: list[str] = []
    spaces: list[bool] = []
    upos: list[str] = []
    heads: list[int] = []
    deprels: list[str] = []
    lines: list[int] = []
    range_end = 0  # last word id covered by the current multi-word token
    range_space = True
    for lineno, line in block:
        if line.startswith("#"):
            continue
        columns = line.split("\t")
        if len(columns) != 10:
            raise DataError(f"expected 10 tab-separated columns, found {len(columns)}", path, lineno)
        try:
            token = parse_line(line, DEFAULT_FIELDS)
        except ParseException as exc:
            raise DataError(f"bad CoNLL-U line: {exc}", path, lineno) from None
        space_after = not (token["misc"] and token["misc"].get("SpaceAfter") == "No")
        tid = token["id"]
        if isinstance(tid, tuple):
            if tid[1] == "-":  # multi-word token: its words follow; it only carries the spacing
                range_end, range_space = tid[2], space_after
            continue  # empty nodes ("8.1") belong to enhanced graphs, not to the basic tree
        if tid != len(words) + 1:
            raise DataError(f"word id {tid} out of order, expected {len(words) + 1}", path, lineno)
        if token["head"] is None or token["deprel"] in (None, "_"):
            raise DataError(f"word {tid} ({token['form']!r}) has no head or no deprel", path, lineno)
        if tid <= range_end:
            space_after = range_space if tid == range_end else False
        words.append(token["form"])
        spaces.append(space_after)
        upos.append(token["upos"] if token["upos"] not in (None, "_") else "")
        heads.append(token["head"] - 1 if token["head"] > 0 else tid - 1)
        deprels.append(token["deprel"])
        lines.append(lineno)
    if not words:
        return None  # a block of comments only
    for i, head in enumerate(heads):
        if not 0 <= head < len(words):
            raise DataError(f"word {i + 1} has head {head + 1} outside 0..{len(words)}", path, lines[i])
    sentence = UDSentence(words, spaces, upos, heads, deprels, start)
    # The same check the toolkit applies to every parsed tree: one root, no cycles.
    text = " ".join(words)
    offsets = [0]
    for word in words[:-1]:
        offsets.append(offsets[-1] + len(word) + 1)
    DepTree(text, words, [(o, o + len(w)) for o, w in zip(offsets, words)], heads, deprels).check(
        str(path), start
    )
    return sentence


def conllu_block_sentence(path: str | Path, start: int, block: str) -> UDSentence | None:
    """One sentence block of a CoNLL-U file (its text, first line ``start``), read exactly as
    :func:`read_conllu` reads it; None for a block of comments only."""
    return _parse_sentence(Path(path), start, [(start + k, line) for k, line in enumerate(block.splitlines())])


def read_conllu(path: str | Path) -> list[UDSentence]:
    """Read a CoNLL-U file's basic trees; bad input raises DataError naming file and line."""
    path = Path(path)
    sentences = []
    for start, block in _blocks(path):
        sentence = _parse_sentence(path, start, block)
        if sentence is not None:
            sentences.append(sentence)
    if not sentences:
        raise DataError("no sentences in CoNLL-U file", path)
    return sentences


def _docbin(sentences: Sequence[UDSentence], vocab) -> bytes:
    """Gold Docs for spaCy: words, spacing, UPOS as the tagger's tags, heads and deprels."""
    from spacy.tokens import Doc, DocBin

    docbin = DocBin(attrs=["ORTH", "SPACY", "TAG", "HEAD", "DEP", "SENT_START"])
    for s in sentences:
        # spaCy's parser knows the root by the label "ROOT" (its own CoNLL-U converter does the same).
        deps = ["ROOT" if h == i else d for i, (h, d) in enumerate(zip(s.heads, s.deprels))]
        doc = Doc(vocab, words=s.words, spaces=s.spaces, tags=s.upos, heads=s.heads, deps=deps)
        docbin.add(doc)
    return docbin.to_bytes()


@dataclass(frozen=True)
class ParserSize:
    """The knobs of the CNN tok2vec + transition parser that matter for accuracy and CPU cost.

    The defaults are spaCy's "efficiency" scale, right for a few thousand sentences; the
    ``en_ud`` preset (12k+ sentences) uses :data:`EN_UD_SIZE`, tuned in docs/parsers.md.
    """

    width: int = 96  # tok2vec width
    depth: int = 4  # CNN layers (each sees one more word on either side)
    rows: tuple[int, int, int, int] = (5000, 1000, 2500, 2500)  # hash rows of NORM, PREFIX, SUFFIX, SHAPE
    hidden_width: int = 128  # parser's state layer
    extra_state_tokens: bool = False  # 13 instead of 8 tokens describe a parser state
    dropout: float = 0.1
    batch_words: int = 1000  # the batch size the compounding schedule grows to (words)
    learn_rate: float = 0.001


#: the tuned size of the English UD parser (docs/parsers.md: what it reaches and what it costs)
EN_UD_SIZE = ParserSize(width=192, depth=6, rows=(10000, 2500, 5000, 2500), hidden_width=192,
                        extra_state_tokens=True, dropout=0.15)


def training_config(lang: str, max_steps: int, eval_frequency: int, seed: int,
                    size: ParserSize | None = None) -> str:
    """The spaCy config: a CNN tok2vec shared by a tagger and a transition parser.

    The tokenizer is ``spacy.blank(lang)``'s, so raw text is split by the language's own
    rules when the model is used on new sentences.
    """
    z = size or ParserSize()
    return f"""\
[paths]
train = null
dev = null

[system]
seed = {seed}
gpu_allocator = null

[nlp]
lang = "{lang}"
pipeline = ["tok2vec","tagger","parser"]
batch_size = 256

[components]

[components.tok2vec]
factory = "tok2vec"

[components.tok2vec.model]
@architectures = "spacy.Tok2Vec.v2"

[components.tok2vec.model.embed]
@architectures = "spacy.MultiHashEmbed.v2"
width = ${{components.tok2vec.model.encode.width}}
attrs = ["NORM","PREFIX","SUFFIX","SHAPE"]
rows = [{",".join(str(r) for r in z.rows)}]
include_static_vectors = false

[components.tok2vec.model.encode]
@architectures = "spacy.MaxoutWindowEncoder.v2"
width = {z.width}
depth = {z.depth}
window_size = 1
maxout_pieces = 3

[components.tagger]
factory = "tagger"

[components.tagger.model]
@architectures = "spacy.Tagger.v2"
nO = null

[components.tagger.model.tok2vec]
@architectures = "spacy.Tok2VecListener.v1"
width = ${{components.tok2vec.model.encode.width}}
upstream = "*"

[components.parser]
factory = "parser"
learn_tokens = false
min_action_freq = 30
update_with_oracle_cut_size = 100

[components.parser.model]
@architectures = "spacy.TransitionBasedParser.v2"
state_type = "parser"
extra_state_tokens = {str(z.extra_state_tokens).lower()}
hidden_width = {z.hidden_width}
maxout_pieces = 3
use_upper = true
nO = null

[components.parser.model.tok2vec]
@architectures = "spacy.Tok2VecListener.v1"
width = ${{components.tok2vec.model.encode.width}}
upstream = "*"

[corpora]

[corpora.train]
@readers = "spacy.Corpus.v1"
path = ${{paths.train}}
max_length = 0

[corpora.dev]
@readers = "spacy.Corpus.v1"
path = ${{paths.dev}}
max_length = 0

[training]
seed = ${{system.seed}}
gpu_allocator = ${{system.gpu_allocator}}
dropout = {z.dropout}
accumulate_gradient = 1
patience = 0
max_epochs = 0
max_steps = {max_steps}
eval_frequency = {eval_frequency}

[training.batcher]
@batchers = "spacy.batch_by_words.v1"
discard_oversize = false
tolerance = 0.2

[training.batcher.size]
@schedules = "compounding.v1"
start = 100
stop = {z.batch_words}
compound = 1.001

[training.logger]
@loggers = "spacy.ConsoleLogger.v1"
progress_bar = false

[training.optimizer]
@optimizers = "Adam.v1"
learn_rate = {z.learn_rate}

[training.score_weights]
tag_acc = 0.2
dep_uas = 0.0
dep_las = 0.8
dep_las_per_type = null
sents_p = null
sents_r = null
sents_f = 0.0
"""


def _check_arguments(lang: str, max_steps: int, eval_frequency: int, threads: int) -> None:
    from spacy.util import get_lang_class

    for name, value in (("max_steps", max_steps), ("eval_frequency", eval_frequency), ("threads", threads)):
        if value < 1:
            raise ConfigError("must be at least 1", field=name)
    try:
        get_lang_class(lang)
    except ImportError:
        raise ConfigError(f"spaCy has no language {lang!r}", field="lang") from None


def _train_and_dev(conllu_files: list[Path], dev: Path | None) -> tuple[list[UDSentence], list[UDSentence]]:
    """The training sentences and spaCy's model-selection set: ``dev``, or every 10th sentence."""
    train_sents = [s for path in conllu_files for s in read_conllu(path)]
    if dev is not None:
        return train_sents, read_conllu(dev)
    if len(train_sents) < 2:
        raise DataError("need at least 2 sentences to split off a dev set", conllu_files[0])
    dev_sents = train_sents[DEV_EVERY - 1 :: DEV_EVERY] or train_sents[-1:]
    held = {id(s) for s in dev_sents}
    return [s for s in train_sents if id(s) not in held], dev_sents


def _set_threads(threads: int) -> None:
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "BLIS_NUM_THREADS"):
        os.environ[var] = str(threads)
    try:
        import torch

        torch.set_num_threads(threads)
    except ImportError:  # torch is a toolkit dependency, but training a parser does not need it
        pass


def _model_meta(
    conllu_files: list[Path],
    dev: Path | None,
    n_train: int,
    n_dev: int,
    max_steps: int,
    seed: int,
    size: ParserSize | None,
) -> dict:
    """spaCy's ``meta.json`` fields, with what the model was trained on under ``structnmt``."""
    sources = [{"name": p.name, "sha256": sha256_file(p)} for p in conllu_files]
    return {
        "name": "ud",  # spaCy shows it as f"{lang}_ud", like "en_core_web_sm"
        "version": structnmt.__version__,
        "description": f"UD tagger + dependency parser trained by structnmt on {n_train} "
        f"sentences ({', '.join(p.name for p in conllu_files)}).",
        "convention": "UD",
        "sources": sources,
        "structnmt": {
            "convention": "UD",
            "train_files": sources,
            "dev_file": str(dev) if dev is not None else None,
            "train_sentences": n_train,
            "dev_sentences": n_dev,
            "max_steps": max_steps,
            "seed": seed,
            "size": asdict(size or ParserSize()),
        },
    }


def train_ud_parser(
    lang: str,
    conllu_files: list[Path],
    dev: Path | None,
    out: Path,
    max_steps: int = 1000,
    eval_frequency: int = 500,
    seed: int = 0,
    threads: int = 1,
    size: ParserSize | None = None,
) -> Path:
    """Train a UD tagger + parser on ``conllu_files``; return ``out/model-best``.

    ``dev`` is the held-out file spaCy scores every ``eval_frequency`` steps to pick
    ``model-best``; with ``dev=None`` every 10th training sentence is held out instead.
    ``threads`` sets torch's pool and the BLAS/OpenMP thread variables for libraries loaded
    after the call; spaCy's CPU kernels (blis) run single-threaded, so 1 costs little.
    ``out`` also receives the DocBins, the config and ``model-last``.
    """
    from spacy.training.initialize import init_nlp
    from spacy.training.loop import train as spacy_train
    from spacy.util import get_lang_class, load_config_from_str

    _check_arguments(lang, max_steps, eval_frequency, threads)
    conllu_files = [Path(p) for p in conllu_files]
    if not conllu_files:
        raise DataError("no CoNLL-U training files given")
    out = Path(out)
    train_sents, dev_sents = _train_and_dev(conllu_files, dev)
    _set_threads(threads)

    vocab = get_lang_class(lang)().vocab
    corpus = out / "corpus"
    atomic_write_bytes(corpus / "train.spacy", _docbin(train_sents, vocab))
    atomic_write_bytes(corpus / "dev.spacy", _docbin(dev_sents, vocab))
    # spaCy evaluates at step 0 and then every eval_frequency steps; never let a short run skip it.
    text = training_config(lang, max_steps, min(eval_frequency, max_steps), seed, size)
    atomic_write_text(out / "config.cfg", text)
    config = load_config_from_str(
        text, overrides={"paths.train": str(corpus / "train.spacy"), "paths.dev": str(corpus / "dev.spacy")}
    )

    nlp = init_nlp(config, use_gpu=-1)
    nlp.meta.update(
        _model_meta(conllu_files, dev, len(train_sents), len(dev_sents), max_steps, seed, size)
    )
    work = Path(tempfile.mkdtemp(prefix=".train-", dir=out))
    try:
        started, cpu_started = time.monotonic(), time.process_time()
        spacy_train(nlp, work, use_gpu=-1, stdout=sys.stdout, stderr=sys.stderr)
        seconds, cpu_seconds = time.monotonic() - started, time.process_time() - cpu_started
        for name in ("model-best", "model-last"):
            _record_time(work / name, seconds, cpu_seconds)
            replace_dir(work / name, out / name)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return out / "model-best"


def _record_time(model_dir: Path, seconds: float, cpu_seconds: float) -> None:
    meta_path = model_dir / "meta.json"
    meta = json.loads(meta_path.read_text(encoding="utf-8"))
    meta.setdefault("structnmt", {}).update(
        {"train_seconds": round(seconds, 1), "train_cpu_seconds": round(cpu_seconds, 1)}
    )
    atomic_write_text(meta_path, json.dumps(meta, indent=2, ensure_ascii=False) + "\n")
