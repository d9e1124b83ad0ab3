"""Corpus scores with sacreBLEU (BLEU, chrF, TER) and NLTK (RIBES), plus strict file reading.

Scores are always computed on detokenised text with sacreBLEU's own tokenisation, and each
comes with its sacreBLEU signature so that a figure in a table can be reproduced exactly.
References follow sacreBLEU's layout: ``refs[k][n]`` is line ``n`` of reference stream ``k``
(one stream per reference translation), so ``refs`` for a single reference is ``[ref_lines]``.
"""

from __future__ import annotations

import codecs
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from sacrebleu.metrics import BLEU, CHRF, TER

from structnmt.errors import ConfigError, DataError

METRICS = ("bleu", "chrf", "ter", "ribes")
#: the file name that stands for standard input, as in ``translate --input -``
STDIN = "-"


def _shown(path: str | Path) -> str | Path:
    """A file as errors name it: ``-`` is standard input."""
    return "<stdin>" if str(path) == STDIN else path


def read_text(path: str | Path) -> list[str]:
    """Read a one-sentence-a-line UTF-8 file (``-``: standard input) strictly.

    Lines are split on ``\\n`` only (never on Unicode line separators, which can occur inside
    a sentence and would shift every later line); a trailing ``\\r`` is removed. An undecodable
    line raises :class:`DataError` with its 1-based number instead of being replaced silently.
    """
    path = _shown(path)
    try:
        data = sys.stdin.buffer.read() if path == "<stdin>" else Path(path).read_bytes()
    except FileNotFoundError:
        raise DataError("file not found", path) from None
    except IsADirectoryError:
        raise DataError("is a directory, not a text file", path) from None
    raw_lines = data.removeprefix(codecs.BOM_UTF8).split(b"\n")  # a byte-order mark is no part of line 1
    if raw_lines and raw_lines[-1] == b"":
        raw_lines.pop()
    lines = []
    for number, raw in enumerate(raw_lines, start=1):
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError as err:
            raise DataError(f"not valid UTF-8 (byte {err.start + 1} of the line: {err.reason})",
                            path, number) from None
        lines.append(line.removesuffix("\r"))
    return lines


#: text given as a file (``str`` or ``Path``) or as its sentences
Text = str | Path | Sequence[str]


def _read(text: Text, name: str) -> tuple[list[str], str | Path]:
    """(lines, what to call them in errors)."""
    if isinstance(text, (str, Path)):
        return read_text(text), _shown(text)
    if not _sentences(text):
        raise ConfigError(f"expected a file (str or pathlib.Path) or a list of sentences (str), got "
                          f"{_kind(text)}", name)
    return list(text), name


def _sentences(value: object) -> bool:
    """Whether ``value`` is a list (any sequence but bytes) of str."""
    return (isinstance(value, Sequence) and not isinstance(value, (str, bytes, bytearray))
            and all(isinstance(line, str) for line in value))


def _kind(value: object) -> str:
    """What a wrong argument is, for a one-line error (``None``, ``int``, ``a list holding int``)."""
    if isinstance(value, Sequence) and not isinstance(value, (str, bytes, bytearray)):
        odd = next((v for v in value if not isinstance(v, str)), None)
        return f"a {type(value).__name__} holding {type(odd).__name__}"
    return "None" if value is None else type(value).__name__


def read_parallel(
    hypotheses: Text, references: Text | Sequence[Path | Sequence[str]], allow_empty: bool = False
) -> tuple[list[str], list[list[str]]]:
    """Hypotheses and their references, checked to line up, in sacreBLEU's layout.

    Each is a file (``str`` or ``Path``) or a list of sentences. Several references are a
    list of files as ``Path`` objects, or a list of sentence lists (a list of ``str`` is always
    one reference's sentences). An empty hypothesis line is legal MT output, but in practice it
    nearly always means a decoding failure or a shifted file, which inflates or deflates BLEU
    without any visible sign; so it is an error unless ``allow_empty=True``.
    """
    given = [hypotheses, *(references if isinstance(references, (list, tuple)) else [references])]
    if sum(isinstance(f, (str, Path)) and str(f) == STDIN for f in given) > 1:  # before reading: it may block
        raise ConfigError("standard input ('-') given more than once: only one of the hypotheses and "
                          "references can be read from it", "references")
    hyps, _ = _read(hypotheses, "hypotheses")
    where = _shown(hypotheses) if isinstance(hypotheses, (str, Path)) else None  # errors name the file, if any
    if not isinstance(references, (str, Path)) and (not isinstance(references, Sequence)
                                                    or isinstance(references, (bytes, bytearray))):
        raise ConfigError(f"expected a file (str or pathlib.Path), a list of sentences or a list of either, got "
                          f"{_kind(references)}", "references")
    if isinstance(references, (str, Path)) or (len(references) and all(isinstance(r, str) for r in references)):
        streams = [references]
    else:
        streams = list(references)
    if not streams:
        raise DataError("no reference given", where)
    refs = []
    for k, stream in enumerate(streams, start=1):
        if not isinstance(stream, (str, Path)) and not _sentences(stream):
            raise ConfigError(f"expected a file or a list of sentences (str), got {_kind(stream)}",
                              "references" if len(streams) == 1 else f"references[{k - 1}]")
        ref, name = _read(stream, str(k))  # type: ignore[arg-type]
        if len(ref) != len(hyps):
            hint = ""
            if isinstance(references, (list, tuple)) and all(isinstance(r, str) for r in references) \
                    and len(references) < len(hyps):  # ["a.ref", "b.ref"]: read as two sentences
                hint = (" (a list of str is one reference's sentences: give several reference files as "
                        "pathlib.Path objects)")
            raise DataError(f"{len(hyps)} hypothesis lines but {len(ref)} lines in reference {name}{hint}", where)
        refs.append(ref)
    if not hyps:  # sacreBLEU would fail on hyps[0] (IndexError), with allow_empty or not
        raise DataError("no hypothesis lines: nothing to score (allow_empty accepts empty lines, not an empty "
                        "file)", where or "hypotheses")
    if not allow_empty:
        for number, hyp in enumerate(hyps, start=1):
            if not hyp.strip():
                raise DataError("empty hypothesis line (if that is intended: --allow-empty on the command line, "
                                "allow_empty=True from Python)", where or "hypotheses", number)
    return hyps, refs


def check_parallel(
    hyp_path: str | Path, ref_paths: Sequence[str | Path], allow_empty: bool = False
) -> tuple[list[str], list[list[str]]]:
    """Read a hypothesis file and its reference file(s), checking they line up (:func:`read_parallel`)."""
    if not ref_paths:
        raise DataError("no reference file given", hyp_path)
    return read_parallel(Path(hyp_path), [Path(r) for r in ref_paths], allow_empty=allow_empty)


def check_metrics(metrics: object, where: str = "metrics") -> tuple[str, ...]:
    """``metrics`` as a tuple of known names; one string is one metric, not a sequence of letters."""
    if isinstance(metrics, str):
        metrics = (metrics,)
    if not isinstance(metrics, Sequence) or not all(isinstance(m, str) for m in metrics):
        raise ConfigError(f"expected a metric name or a list of them (known: {', '.join(METRICS)}), "
                          f"got {metrics!r}", where)
    unknown = [m for m in metrics if m not in METRICS]
    if unknown or not metrics:
        what = f"unknown metric{'s' if len(unknown) > 1 else ''} {', '.join(map(repr, unknown))}" if unknown \
            else "no metric given"
        raise ConfigError(f"{what} (known: {', '.join(METRICS)})", where)
    return tuple(metrics)


def references_tokenised(refs: Sequence[Sequence[str]]) -> bool:
    """Whether the first reference ends in a tokenised period (`` .``) on 100 lines or more, as
    sacreBLEU's "forgot to detokenize" check counts the hypotheses. Then hypotheses that do so too
    follow their references, and the check (advice to detokenise them) is withheld: BLEU on such
    data is the data's own convention (a tokenised corpus, the synthetic task), not a mistake."""
    return bool(refs) and sum(1 for line in refs[0] if line.endswith(" .")) >= 100


def _bleu(tokenize: object, trg_lang: str = "", where: str = "tokenize", force: bool = False) -> BLEU:
    """sacreBLEU's BLEU with ``tokenize``; what sacreBLEU raises for a tokeniser it cannot use, as one line.
    ``force`` withholds sacreBLEU's "forgot to detokenize" warning (:func:`references_tokenised`)."""
    known = BLEU.TOKENIZERS
    if tokenize is not None and (not isinstance(tokenize, str) or tokenize not in known):  # a bare KeyError
        raise ConfigError(f"unknown sacreBLEU tokeniser {tokenize!r} (known: {', '.join(known)})", where)
    try:
        return BLEU(tokenize=tokenize, trg_lang=trg_lang, force=force)  # type: ignore[arg-type]
    except RuntimeError as err:  # MeCab and its dictionary are extras: sacreBLEU says how to install them
        install = [line.strip() for line in str(err).splitlines() if line.strip().startswith("pip install")]
        raise ConfigError(f"tokeniser {tokenize!r} needs packages that are not installed"
                          + (f": {install[0]}" if install else f" ({' '.join(str(err).split())})"), where) from None
    except OSError as err:  # the SentencePiece tokenisers download their model on first use
        raise ConfigError(f"tokeniser {tokenize!r}: sacreBLEU could not fetch its SentencePiece model ({err})",
                          where) from None


def check_tokenize(tokenize: object, where: str = "tokenize") -> None:
    """Refuse, before any work, a BLEU tokeniser that sacreBLEU does not know or cannot use here."""
    if tokenize is not None:
        _bleu(tokenize, where=where)


def make_metric(name: str, tokenize: str | None = None, trg_lang: str = "",
                force: bool = False) -> BLEU | CHRF | TER:
    """The sacreBLEU metric object for ``name`` with the project's (sacreBLEU default) settings."""
    if name == "bleu":
        return _bleu(tokenize, trg_lang, force=force)
    if name == "chrf":
        return CHRF()
    if name == "ter":
        return TER()
    raise ConfigError(f"unknown sacreBLEU metric {name!r} (known: bleu, chrf, ter)", "metric")


def _check_refs(hyps: Sequence[str], refs: Sequence[Sequence[str]]) -> None:
    if not hyps:
        raise DataError("no hypotheses: nothing to score")
    if not refs:
        raise DataError("no references given")
    if isinstance(refs[0], str):
        raise TypeError("refs must be a list of reference streams, e.g. [ref_lines]")
    for k, ref in enumerate(refs):
        if len(ref) != len(hyps):
            raise DataError(f"{len(hyps)} hypotheses but {len(ref)} lines in reference stream {k + 1}")


def ribes(hyps: Sequence[str], refs: Sequence[Sequence[str]]) -> float:
    """Corpus RIBES (Isozaki et al. 2010) on whitespace tokens, in 0–100.

    RIBES rewards correct word order and is the usual second metric for Japanese-English
    evaluation (WAT); give it tokenised text (e.g. MeCab output for Japanese), since it splits
    on whitespace only.
    """
    from nltk.translate.ribes_score import corpus_ribes

    _check_refs(hyps, refs)
    references = [[ref[n].split() for ref in refs] for n in range(len(hyps))]
    return 100.0 * float(corpus_ribes(references, [h.split() for h in hyps]))


def corpus_scores(
    hyps: Sequence[str],
    refs: Sequence[Sequence[str]],
    metrics: Sequence[str] = ("bleu", "chrf", "ter"),
    tokenize: str | None = None,
    trg_lang: str = "",
) -> dict[str, Any]:
    """Corpus-level scores, e.g. ``{"bleu": 34.1, "chrf": 60.2, "signature": {"bleu": "nrefs:1|..."}}``.

    ``tokenize`` is BLEU's tokeniser (None: sacreBLEU's default, ``13a``, or the language's
    default when ``trg_lang`` is ``zh``/``ja``/``ko``). Values are on sacreBLEU's 0–100 scale.
    With BLEU comes ``bleu_parts`` (n-gram precisions, brevity penalty, length ratio, lengths:
    what sacreBLEU prints beside the score), because a BLEU gap between short-output models is
    often the brevity penalty, not the words.
    """
    _check_refs(hyps, refs)
    metrics = check_metrics(metrics)
    result: dict[str, Any] = {"signature": {}}
    for name in metrics:
        if name == "ribes":
            result["ribes"] = ribes(hyps, refs)
            result["signature"]["ribes"] = "nltk.corpus_ribes|tok:whitespace|alpha:0.25|beta:0.1"
            continue
        metric = make_metric(name, tokenize, trg_lang, force=references_tokenised(refs))
        score = metric.corpus_score(list(hyps), [list(r) for r in refs])
        result[name] = float(score.score)
        result["signature"][name] = str(metric.get_signature())
        if name == "bleu":
            result["bleu_parts"] = bleu_parts(score)
    return result


def bleu_parts(score: Any) -> dict[str, Any]:
    """The parts of a sacreBLEU ``BLEUScore``: precisions (0–100), brevity penalty, hyp/ref length ratio."""
    return {"precisions": [float(p) for p in score.precisions], "bp": float(score.bp),
            "ratio": score.sys_len / score.ref_len if score.ref_len else None,  # JSON has no NaN
            "hyp_len": int(score.sys_len), "ref_len": int(score.ref_len)}


def length_ratio(hyps: Sequence[str], refs: Sequence[Sequence[str]], tokenize: str | None = None) -> float | None:
    """Hypothesis length over reference length as BLEU counts them (its tokeniser, closest reference)."""
    bleu = make_metric("bleu", tokenize, force=references_tokenised(refs))
    return bleu_parts(bleu.corpus_score(list(hyps), [list(r) for r in refs]))["ratio"]


def score_files(
    hyp_path: str | Path,
    ref_paths: Sequence[str | Path],
    metrics: Sequence[str] = ("bleu", "chrf", "ter"),
    tokenize: str | None = None,
    allow_empty: bool = False,
) -> dict[str, Any]:
    """:func:`check_parallel` then :func:`corpus_scores`: the scores of one system output file."""
    hyps, refs = check_parallel(hyp_path, ref_paths, allow_empty=allow_empty)
    return corpus_scores(hyps, refs, metrics=metrics, tokenize=tokenize)
