"""Translate raw text or a prepared split with a trained model.

Raw input goes through the same :class:`~structnmt.data.pipeline.Preprocessor` as the
training data (Moses, SentencePiece, and the parser when a method needs source trees at
test time), sentences are sorted by length into batches of at most ``max_tokens`` source
tokens, and the output comes back in input order, detokenised.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np
import torch

from structnmt.config import DecodingConfig
from structnmt.data.batch import Batch
from structnmt.data.batching import collate, collate_examples
from structnmt.data.dataset import ParallelDataset
from structnmt.data.pipeline import Preprocessor
from structnmt.decoding.search import Hypothesis, translate_batch
from structnmt.errors import DataError
from structnmt.model.transformer import Transformer


def length_batches(lengths: Sequence[int], max_tokens: int) -> list[np.ndarray]:
    """Indices sorted by length (longest first), cut into batches of at most ``max_tokens``."""
    order = np.argsort(-np.asarray(lengths, dtype=np.int64), kind="stable")
    batches, current, longest = [], [], 0
    for i in order:
        n = int(lengths[i]) + 1
        if current and max(longest, n) * (len(current) + 1) > max_tokens:
            batches.append(np.asarray(current))
            current, longest = [], 0
        current.append(int(i))
        longest = max(longest, n)
    if current:
        batches.append(np.asarray(current))
    return batches


def _search(model: Transformer, batches: Iterator[tuple[np.ndarray, Batch]], n: int, cfg: DecodingConfig,
            device: torch.device) -> list[list[Hypothesis]]:
    out: list[list[Hypothesis] | None] = [None] * n
    for indices, batch in batches:
        hyps = translate_batch(model, batch.to(device), cfg.beam, cfg.length_penalty, cfg.max_len_a, cfg.max_len_b,
                               cfg.nbest)
        for i, h in zip(indices.tolist(), hyps):
            out[i] = h
    return out  # type: ignore[return-value]


def translate_lines(model: Transformer, pre: Preprocessor, lines: list[str], cfg: DecodingConfig,
                    device: torch.device | str = "cpu", labels: Sequence[str] | None = None,
                    source: str = "<input>") -> list[list[str]]:
    """The ``nbest`` detokenised translations of every line, in input order (``source`` names the
    input in error messages)."""
    device = torch.device(device)
    fields = model.structure_needs(inference=True)
    examples = pre.encode_sources(lines, with_structure=bool(fields["src"]))
    lengths = [len(ex.src.ids) for ex in examples]
    limit = model.cfg.max_positions - 1  # one position is the EOS
    for number, n in enumerate(lengths, start=1):
        if n > limit:
            raise DataError(f"{n} sub-words; the model reads at most {limit} (model.max_positions)", source,
                            number)

    def batches() -> Iterator[tuple[np.ndarray, Batch]]:
        for idx in length_batches(lengths, cfg.max_tokens):
            yield idx, collate_examples([examples[i] for i in idx], fields, labels)

    hyps = _search(model, batches(), len(lines), cfg, device)
    return [[pre.decode(h.tokens) for h in sent] for sent in hyps]


def translate_split(model: Transformer, dataset: ParallelDataset, pre: Preprocessor, cfg: DecodingConfig,
                    device: torch.device | str = "cpu") -> list[str]:
    """Best translations of a prepared split (its stored ids and structures), in order."""
    device = torch.device(device)
    fields = model.structure_needs(inference=True)
    fields = {"src": fields["src"], "tgt": set()}
    limit = model.cfg.max_positions - 1
    if len(dataset) and int(dataset.src_lengths.max()) > limit:
        line = int(dataset.src_lengths.argmax()) + 1
        raise DataError(f"{int(dataset.src_lengths.max())} sub-words; the model reads at most {limit} "
                        "(model.max_positions)", dataset.path, line)

    def batches() -> Iterator[tuple[np.ndarray, Batch]]:
        for idx in length_batches(dataset.src_lengths, cfg.max_tokens):
            batch = collate(dataset, idx, fields)
            yield idx, Batch(batch.src, struct={"src": batch.struct["src"], "tgt": {}}, index=batch.index)

    hyps = _search(model, batches(), len(dataset), cfg, device)
    return [pre.decode(sent[0].tokens) for sent in hyps]


def dataset_dir_of(cfg, override: str | Path | None = None) -> Path:
    return Path(override) if override is not None else Path(cfg.data.dir)
