"""Moses round trips and SentencePiece pieces with character spans into the encoded text."""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pytest

from structnmt.data.tokenisation import MosesTokeniser, SubwordModel, train_sentencepiece

WORDS = "the a dog cat saw big small sun flower pot runs über café near".split()


def corpus(n: int = 200, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 9))) for _ in range(n)]


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> SubwordModel:
    prefix = tmp_path_factory.mktemp("spm") / "spm"
    # user-defined symbols are always cut out whole: a deterministic split for the tests
    path, _ = train_sentencepiece(corpus(), prefix, 40, "unigram", 1.0, ["sun", "flower", "pot"])
    return SubwordModel(path)


def test_moses_round_trip() -> None:
    moses = MosesTokeniser("en")
    raw = 'A dog, a cat & "two" birds: they\'re running (fast)!'
    tokenised = moses.tokenise(raw)
    assert tokenised == 'A dog , a cat & " two " birds : they \'re running ( fast ) !'
    assert moses.detokenise(tokenised) == raw


def test_special_ids_and_vocab(model: SubwordModel) -> None:
    assert [model.piece(i) for i in range(4)] == ["<pad>", "<unk>", "<s>", "</s>"]
    assert model.vocab_size >= 16


def test_vocab_too_large_is_shrunk(tmp_path: Path) -> None:
    path, size = train_sentencepiece(corpus(50), tmp_path / "big", 5000)
    assert size < 5000 and SubwordModel(path).vocab_size == size


def test_word_split_into_three_pieces_with_spans(model: SubwordModel) -> None:
    text = "the sunflowerpot runs"
    ids, spans = model.encode(text)
    pieces = [model.piece(i) for i in ids]
    assert pieces == ["▁the", "▁", "sun", "flower", "pot", "▁runs"]
    # the bare "▁" covers only the space; the three pieces tile the word exactly
    assert spans == [(0, 3), (3, 4), (4, 7), (7, 13), (13, 16), (16, 21)]
    assert ids.dtype == np.int32


def test_spans_cover_the_text_in_order(model: SubwordModel) -> None:
    for text in ["  café über the dog ", "a big cat near the pot", "über"]:
        ids, spans = model.encode(text)
        assert len(spans) == len(ids)
        covered = "".join(text[s:e] for s, e in spans)
        # every non-space character exactly once, in order; spans never go backwards
        assert covered.replace(" ", "") == text.replace(" ", "")
        assert all(e1 <= s2 for (_, e1), (s2, _) in zip(spans, spans[1:]))
        assert model.decode(ids) == " ".join(text.split())


def test_unknown_character_keeps_its_span(model: SubwordModel) -> None:
    text = "dog ☃ cat"
    ids, spans = model.encode(text)
    unk = [k for k, i in enumerate(ids) if i == 1]
    assert unk and text[slice(*spans[unk[0]])].strip() == "☃"
