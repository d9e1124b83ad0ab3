"""Translate raw text or a prepared split with a trained model.

Raw input goes through the same :class:`~structnmt.data.pipeline.Preprocessor` as the
training data (Moses, SentencePiece, and the parser when a method needs source trees at
test time), sentences are sorted by length into batches of at most ``max_tokens`` source
tokens, and the output comes back in input order, detokenised.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np
import torch

from structnmt.config import DecodingConfig
from structnmt.data.batch import Batch
from structnmt.data.batching import collate, collate_examples
from structnmt.data.dataset import ParallelDataset
from structnmt.data.pipeline import Preprocessor
from structnmt.errors import DataError
from structnmt.model.search import Hypothesis, target_vocab_size, translate_batch
from structnmt.model.transformer import Transformer
from structnmt.wording import counted

#: float32 numbers one step of a beam search may hold in a tensor of scores (1 GiB): a batch whose
#: sentences x beam x target vocabulary would pass it is cut into smaller ones
SEARCH_ELEMENTS = 1 << 28


def search_sentences(model: Transformer, beam: int) -> int:
    """Sentences one beam search may take at once: each holds ``beam`` rows of vocabulary scores."""
    return max(1, SEARCH_ELEMENTS // (min(beam, target_vocab_size(model)) * target_vocab_size(model)))


def length_batches(lengths: Sequence[int], max_tokens: int, max_sentences: int = 0) -> list[np.ndarray]:
    """Indices sorted by length (longest first), cut into batches of at most ``max_tokens``
    (and of at most ``max_sentences`` sentences, when that is > 0)."""
    order = np.argsort(-np.asarray(lengths, dtype=np.int64), kind="stable")
    batches, current, longest = [], [], 0
    for i in order:
        n = int(lengths[i]) + 1
        if current and (max(longest, n) * (len(current) + 1) > max_tokens or len(current) == max_sentences):
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


def shorten_to_fit(pre: Preprocessor, text: str, limit: int) -> str:
    """The longest prefix of whole words of ``text`` whose source encoding has at most
    ``limit`` pieces; when even the first word is too long (a URL, a script written without
    spaces), that word's longest character prefix that fits."""
    from structnmt.data.pipeline import tag

    def fits(prefix: str) -> bool:
        tokens = pre.tokenise("src", prefix)
        if pre.task_tag is not None:
            tokens = tag(tokens, pre.task_tag)
        return len(pre.subwords["src"].encode(tokens)[0]) <= limit

    def longest(n: int, cut) -> int:  # the largest k in 0..n with fits(cut(k)), by bisection
        low, high = 0, n
        while low < high:
            mid = (low + high + 1) // 2
            if fits(cut(mid)):
                low = mid
            else:
                high = mid - 1
        return low

    words = text.split(" ")
    k = longest(len(words), lambda k: " ".join(words[:k]))
    if k > 0:
        return " ".join(words[:k])
    return words[0][:max(longest(len(words[0]), lambda k: words[0][:k]), 1)]


def _warn_truncated(source: str | Path, truncated: list[int], limit: int, note: str = "") -> None:
    if not truncated:
        return
    shown = ", ".join(str(n) for n in truncated[:10]) + (" ..." if len(truncated) > 10 else "")
    print(f"warning: {source}: {counted(len(truncated), 'line')} longer than the model's {limit} source positions "
          f"{'was' if len(truncated) == 1 else 'were'} translated from {'its' if len(truncated) == 1 else 'their'} "
          "first words only "
          f"(line{'s' if len(truncated) > 1 else ''} {shown}){note}", file=sys.stderr)


def translate_lines(model: Transformer, pre: Preprocessor, lines: list[str], cfg: DecodingConfig,
                    device: torch.device | str = "cpu", labels: Sequence[str] | None = None,
                    source: str = "<input>", truncated: list[int] | None = None) -> list[list[str]]:
    """The ``nbest`` detokenised translations of every line, in input order (``source`` names the
    input in error messages).

    A line longer than the model's positions is translated from its longest prefix of whole
    words that fits, with a warning naming it (its 1-based number is appended to ``truncated``):
    dropping it would shift every later line, and refusing the whole input would waste the rest.
    An empty (or blank) line gets an empty translation, whether or not the model reads source trees.
    """
    device = torch.device(device)
    fields = model.structure_needs(inference=True)
    full = [k for k, line in enumerate(lines) if line.strip()]  # indices of the lines to translate
    if not full:
        return [[""] for _ in lines]
    examples = pre.encode_sources([lines[k] for k in full], with_structure=bool(fields["src"]),
                                  numbers=[k + 1 for k in full], path=source)
    limit = model.cfg.max_positions - 1  # one position is the EOS
    long = [j for j, ex in enumerate(examples) if len(ex.src.ids) > limit]
    if long:
        short = pre.encode_sources([shorten_to_fit(pre, lines[full[j]], limit) for j in long],
                                   with_structure=bool(fields["src"]), numbers=[full[j] + 1 for j in long],
                                   path=source)
        for j, ex in zip(long, short):
            examples[j] = ex
        _warn_truncated(source, [full[j] + 1 for j in long], limit)
        if truncated is not None:
            truncated.extend(full[j] + 1 for j in long)
    lengths = [len(ex.src.ids) for ex in examples]

    def batches() -> Iterator[tuple[np.ndarray, Batch]]:
        for idx in length_batches(lengths, cfg.max_tokens, search_sentences(model, cfg.beam)):
            yield idx, collate_examples([examples[i] for i in idx], fields, labels)

    hyps = _search(model, batches(), len(full), cfg, device)
    out: list[list[str]] = [[""] for _ in lines]
    for k, sent in zip(full, hyps):
        out[k] = [pre.decode(h.tokens) for h in sent]
    return out


def translate_split(model: Transformer, dataset: ParallelDataset, pre: Preprocessor, cfg: DecodingConfig,
                    device: torch.device | str = "cpu", labels: Sequence[str] | None = None,
                    truncated: list[int] | None = None) -> list[str]:
    """Best translations of a prepared split (its stored ids and structures), in order.

    Sentences longer than the model's positions are translated from a prefix, as in
    :func:`translate_lines`, and never dropped: every line of a test set is scored.
    """
    device = torch.device(device)
    fields = model.structure_needs(inference=True)
    fields = {"src": fields["src"], "tgt": set()}
    limit = model.cfg.max_positions - 1
    lengths = np.asarray(dataset.src_lengths)
    long = np.flatnonzero(lengths > limit)
    fitting = np.flatnonzero(lengths <= limit)
    examples = []
    if len(long):
        # re-encoded from a prefix of their raw text; stored structures cannot be cut (a parent may
        # lie past the cut), so the prefix is parsed again, which needs a parser that reads new text
        needs_trees = bool(fields["src"])
        if needs_trees and pre.side_cfg("src").parser.backend in ("conllu", "none"):
            raise DataError(f"{counted(len(long), 'sentence')} {'has' if len(long) == 1 else 'have'} more than "
                            f"{limit} sub-words (first: line "
                            f"{int(long[0]) + 1}) and this model needs source trees that the dataset's parser "
                            "cannot make for a shortened sentence; raise model.max_positions", dataset.path,
                            int(long[0]) + 1)
        raw = dataset.raw("src")
        examples = pre.encode_sources([shorten_to_fit(pre, raw[i], limit) for i in long.tolist()],
                                      with_structure=needs_trees, numbers=[int(i) + 1 for i in long],
                                      path=str(dataset.path))
        _warn_truncated(dataset.path, [int(i) + 1 for i in long], limit, "; they are still scored")
        if truncated is not None:
            truncated.extend(int(i) + 1 for i in long)

    def batches() -> Iterator[tuple[np.ndarray, Batch]]:
        for part in length_batches(lengths[fitting], cfg.max_tokens, search_sentences(model, cfg.beam)):
            idx = fitting[part]
            batch = collate(dataset, idx, fields)
            yield idx, Batch(batch.src, struct={"src": batch.struct["src"], "tgt": {}}, index=batch.index)
        if examples:
            for part in length_batches([len(ex.src.ids) for ex in examples], cfg.max_tokens,
                                       search_sentences(model, cfg.beam)):
                yield long[part], collate_examples([examples[i] for i in part], fields, labels)

    hyps = _search(model, batches(), len(dataset), cfg, device)
    return [pre.decode(sent[0].tokens) for sent in hyps]


def dataset_dir_of(cfg, override: str | Path | None = None) -> Path:
    return Path(override) if override is not None else Path(cfg.data.dir)
