"""Moses tokenisation and SentencePiece sub-words that know where each piece sits in the text.

Structures are aligned to sub-words by character offsets (docs/structures.md), so every piece
comes with its ``(start, end)`` span in the string it was encoded from. When Moses
tokenisation is on, that string is the *Moses-tokenised* sentence (tokens separated by
single spaces): the parser and SentencePiece both read it, so word spans and piece spans
point into one and the same string, and the raw sentence is only restored at the very end
(:meth:`MosesTokeniser.detokenise` of a translation).
"""

from __future__ import annotations

import bisect
import io
import logging
import re
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path

import numpy as np
import sentencepiece as spm
from sacremoses import MosesDetokenizer, MosesTokenizer

from structnmt.data.batch import BOS_ID, EOS_ID, PAD_ID, UNK_ID
from structnmt.errors import ConfigError, DataError
from structnmt.io import atomic_write_bytes

log = logging.getLogger(__name__)


class MosesTokeniser:
    """sacremoses with the settings NMT uses: no HTML escaping, so ``&`` stays ``&``."""

    def __init__(self, lang: str) -> None:
        self.lang = lang
        self._tok = MosesTokenizer(lang=lang)
        self._detok = MosesDetokenizer(lang=lang)

    def tokenise(self, text: str) -> str:
        return self._tok.tokenize(text, escape=False, return_str=True)

    def detokenise(self, text: str) -> str:
        return self._detok.detokenize(text.split(), unescape=False)


_TOO_HIGH = re.compile(r"Vocabulary size too high \((\d+)\)\. Please set it to a value <= (\d+)")
_TOO_LOW = re.compile(r"Vocabulary size is smaller than required_chars\. (\d+) vs (\d+)")


def train_sentencepiece(
    texts: Iterable[str],
    model_prefix: str | Path,
    vocab_size: int,
    model_type: str = "unigram",
    character_coverage: float = 1.0,
    user_defined_symbols: list[str] | None = None,
    files: Sequence[Path] = (),
) -> tuple[Path, int]:
    """Train a model with the project's special ids and write ``<model_prefix>.model`` atomically.

    The text is ``texts``, or the lines of ``files`` (read as SentencePiece consumes them, so
    a large sample is held once, by SentencePiece, not also as a Python list). Returns the
    path and the vocabulary size actually used: a small corpus cannot fill a large
    vocabulary, and SentencePiece then refuses to train; we retry once with the largest size
    it accepts and log that, rather than failing a toy experiment.
    """
    sentences = _sentence_source(texts, files)
    if next(sentences(), None) is None:
        raise DataError("no text to train the sub-word model on")
    path = Path(f"{model_prefix}.model")
    size = vocab_size
    for attempt in range(2):
        model = io.BytesIO()
        try:
            spm.SentencePieceTrainer.train(
                sentence_iterator=sentences(),
                model_writer=model,
                vocab_size=size,
                model_type=model_type,
                character_coverage=character_coverage,
                pad_id=PAD_ID, unk_id=UNK_ID, bos_id=BOS_ID, eos_id=EOS_ID,
                user_defined_symbols=user_defined_symbols or [],
                num_threads=1,
                minloglevel=2,
            )
        except RuntimeError as err:
            size = _size_accepted(err, vocab_size, last_try=attempt == 1)
            log.warning("sub-word vocabulary of %d is too large for this corpus; using %d instead",
                        vocab_size, size)
            continue
        atomic_write_bytes(path, model.getvalue())
        return path, size
    raise AssertionError("unreachable")


def _sentence_source(texts: Iterable[str], files: Sequence[Path]) -> Callable[[], Iterator[str]]:
    """A new iterator over the training sentences at each call (SentencePiece may train twice)."""
    if files:
        def sentences() -> Iterator[str]:
            for file in files:
                with open(file, encoding="utf-8") as handle:
                    yield from (line.rstrip("\n") for line in handle if line.strip())
        return sentences
    kept = [t for t in texts if t.strip()]
    return lambda: iter(kept)


def _size_accepted(err: RuntimeError, vocab_size: int, last_try: bool) -> int:
    """The largest vocabulary SentencePiece accepts where ``err`` says the size asked is too high;
    any other refusal (or a second one) is raised as the configuration or data error it is
    (``vocab_size``: the size the config asked for, which the messages name)."""
    too_low = _TOO_LOW.search(str(err))
    if too_low is not None:
        raise ConfigError(
            f"{vocab_size} is smaller than the {too_low.group(2)} characters and special pieces the "
            "training text needs; raise it or lower data.subwords.character_coverage",
            "data.subwords.vocab_size",
        ) from None
    match = _TOO_HIGH.search(str(err))
    if match is None or last_try:
        # the text is the only input here, so any other refusal is a data problem
        raise DataError(f"SentencePiece cannot train on this text: {err}") from None
    return int(match.group(2))


class SubwordModel:
    """A trained SentencePiece model; :meth:`encode` gives ids and character spans."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        if not self.path.is_file():
            raise DataError("sub-word model not found", self.path)
        try:
            self.sp = spm.SentencePieceProcessor(model_file=str(self.path))
        except (RuntimeError, OSError) as err:
            raise DataError(f"not a readable SentencePiece model ({err})", self.path) from None
        if (self.sp.pad_id(), self.sp.unk_id(), self.sp.bos_id(), self.sp.eos_id()) != (
            PAD_ID, UNK_ID, BOS_ID, EOS_ID,
        ):
            raise DataError("the model was not trained with pad/unk/bos/eos ids 0/1/2/3", self.path)

    @property
    def vocab_size(self) -> int:
        return self.sp.get_piece_size()

    def piece(self, i: int) -> str:
        return self.sp.id_to_piece(int(i))

    def piece_id(self, piece: str) -> int:
        return self.sp.piece_to_id(piece)

    def encode(self, text: str) -> tuple[np.ndarray, list[tuple[int, int]]]:
        """Ids (int32) and the ``(start, end)`` character span of each piece in ``text``.

        SentencePiece reports UTF-8 byte offsets into the un-normalised input; we turn them
        into character offsets. A bare ``▁`` piece (a word boundary before a piece of its
        own) may have an empty span.
        """
        proto = self.sp.encode(text, out_type="proto")
        ids = np.fromiter((p.id for p in proto.pieces), dtype=np.int32, count=len(proto.pieces))
        # byte offset at which each character starts; bisect maps a byte offset to a char index
        starts = []
        pos = 0
        for ch in text:
            starts.append(pos)
            pos += len(ch.encode("utf-8"))
        starts.append(pos)
        spans = [
            (bisect.bisect_left(starts, p.begin), bisect.bisect_left(starts, p.end)) for p in proto.pieces
        ]
        return ids, spans

    def encode_ids(self, text: str) -> np.ndarray:
        """The ids of :meth:`encode` without the character spans (several times faster)."""
        return np.asarray(self.sp.encode(text), dtype=np.int32)

    def decode(self, ids: Iterable[int]) -> str:
        keep = [int(i) for i in ids if int(i) not in (PAD_ID, BOS_ID, EOS_ID)]
        return self.sp.decode(keep)
