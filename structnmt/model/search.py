"""Greedy and batched beam search with cached keys and values.

Beam search follows the usual NMT recipe (as in fairseq and Marian): at each step every
live hypothesis is extended by every word, the best ``2 * beam`` candidates per sentence
are kept, end-of-sentence candidates among the best ``beam`` are finished with a GNMT
length penalty, and a sentence stops once it has ``beam`` finished hypotheses or reaches
its maximum length. Finished sentences leave the batch, so the cost falls as the batch
empties.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from structnmt.config import DecodingConfig
from structnmt.data.batch import BOS_ID, EOS_ID, PAD_ID, Batch
from structnmt.model.transformer import EncoderOutput, Transformer

#: the defaults of every search function are the config's (``decoding:``), written once
_DEFAULTS = DecodingConfig


@dataclass
class Hypothesis:
    tokens: list[int]  # without BOS and EOS
    score: float  # log-probability divided by the length penalty
    logprob: float


def length_penalty(length: int | Tensor, alpha: float) -> float | Tensor:
    """GNMT length penalty ((5 + |Y|) / 6)^alpha (Wu et al. 2016); |Y| counts the EOS."""
    return ((5.0 + length) / 6.0) ** alpha


def target_vocab_size(model: Transformer) -> int:
    """Words the decoder chooses from at each step (a beam is cut to this)."""
    return int(model.tgt_embed.num_embeddings)


def _max_lengths(enc: EncoderOutput, a: float, b: int, limit: int) -> Tensor:
    src_len = (~enc.src_pad).sum(dim=1).float()
    return (a * src_len + b).long().clamp(min=1, max=limit)


def _encode(model: Transformer, batch: Batch) -> EncoderOutput:
    struct = {"src": batch.struct.get("src", {}), "tgt": {}}
    return model.encode(batch.src, struct)


@torch.no_grad()
def greedy_search(model: Transformer, batch: Batch, length_penalty_alpha: float = 0.0,
                  max_len_a: float = _DEFAULTS.max_len_a,
                  max_len_b: int = _DEFAULTS.max_len_b) -> list[list[Hypothesis]]:
    model.eval()
    enc = _encode(model, batch)
    n = batch.src.size(0)
    max_len = _max_lengths(enc, max_len_a, max_len_b, model.cfg.max_positions - 2)
    cache = model.new_cache()
    tokens = torch.full((n, 1), BOS_ID, dtype=torch.long, device=batch.src.device)
    logprob = torch.zeros(n, device=batch.src.device)
    done = torch.zeros(n, dtype=torch.bool, device=batch.src.device)
    out_tokens: list[Tensor] = []
    for step in range(int(max_len.max()) + 1):
        lprobs = torch.log_softmax(model.decode(tokens, enc, cache=cache)[:, -1].float(), dim=-1)
        lprobs[:, PAD_ID] = float("-inf")
        lprobs[:, BOS_ID] = float("-inf")
        best, word = lprobs.max(dim=-1)
        force = step >= max_len  # out of length: end the sentence here
        word = torch.where(force, torch.full_like(word, EOS_ID), word)
        best = torch.where(force, lprobs[:, EOS_ID], best)
        word = word.masked_fill(done, PAD_ID)
        logprob = logprob + best.masked_fill(done, 0.0)
        out_tokens.append(word)
        done = done | word.eq(EOS_ID)
        if bool(done.all()):
            break
        tokens = word[:, None]
    seq = torch.stack(out_tokens, dim=1).tolist()
    logprobs = logprob.tolist()  # one copy, not a device read per sentence
    results = []
    for i, row in enumerate(seq):
        words = []
        for t in row:
            if t in (EOS_ID, PAD_ID):
                break
            words.append(t)
        lp = length_penalty(len(words) + 1, length_penalty_alpha)
        results.append([Hypothesis(words, logprobs[i] / lp, logprobs[i])])
    return results


def _only_eos_where(out_of_length: list[bool], lprobs: Tensor, beam: int) -> Tensor:
    """Leaves only end-of-sentence to the hypotheses of sentences at their length limit (masks:
    boolean indexing would read the device)."""
    if not any(out_of_length):
        return lprobs
    force = torch.tensor(out_of_length, dtype=torch.bool, device=lprobs.device).repeat_interleave(beam)
    keep_eos = lprobs[:, EOS_ID].clone()
    lprobs = lprobs.masked_fill(force[:, None], float("-inf"))
    lprobs[:, EOS_ID] = torch.where(force, keep_eos, lprobs[:, EOS_ID])
    return lprobs


def _finish_ended(finished: list[list[Hypothesis]], live: list[int], is_eos: Tensor, history: Tensor,
                  origin: Tensor, top_scores: Tensor, beam: int, alpha: float) -> None:
    """Finishes the end-of-sentence candidates among each live sentence's best ``beam``, up to
    ``beam`` hypotheses a sentence; what the host needs of them comes over in a few copies a
    step, not one device read per candidate."""
    eos_rows = is_eos[:, :beam].nonzero()
    if not eos_rows.numel():
        return
    g, k = eos_rows[:, 0], eos_rows[:, 1]
    ended = history.view(len(live), beam, -1)[g, origin[g, k], 1:].tolist()
    logprobs = top_scores[g, k].tolist()
    for group, toks, logprob in zip(g.tolist(), ended, logprobs):
        hyps = finished[live[group]]
        if len(hyps) < beam:
            lp = length_penalty(len(toks) + 1, alpha)
            hyps.append(Hypothesis(toks, logprob / lp, logprob))


@torch.no_grad()
def beam_search(model: Transformer, batch: Batch, beam: int = _DEFAULTS.beam,
                length_penalty_alpha: float = _DEFAULTS.length_penalty,
                max_len_a: float = _DEFAULTS.max_len_a, max_len_b: int = _DEFAULTS.max_len_b,
                nbest: int = _DEFAULTS.nbest) -> list[list[Hypothesis]]:
    """Each sentence's ``nbest`` best hypotheses, best first (the recipe: the module's docstring)."""
    model.eval()
    device = batch.src.device
    enc = _encode(model, batch)
    n_sent = batch.src.size(0)
    max_len = _max_lengths(enc, max_len_a, max_len_b, model.cfg.max_positions - 2)
    shared = model.shares_source_across_beams()  # one copy of each source, not one per beam
    if not shared:
        enc = enc.index_select(torch.arange(n_sent, device=device).repeat_interleave(beam))
    cache = model.new_cache()
    finished: list[list[Hypothesis]] = [[] for _ in range(n_sent)]
    # which sentences are live, and their length limits, are kept on the host, so that deciding
    # what ends reads nothing from the device (on a GPU each read waits for it)
    live = list(range(n_sent))  # original sentence number of each live group
    limits = max_len.tolist()
    scores = torch.zeros(n_sent, beam, device=device)
    scores[:, 1:] = float("-inf")  # at the start only one hypothesis per sentence is live
    history = torch.full((n_sent * beam, 1), BOS_ID, dtype=torch.long, device=device)
    step = 0
    while live:
        n = len(live)
        logits = model.decode(history[:, -1:], enc, cache=cache)[:, -1]
        lprobs = torch.log_softmax(logits.float(), dim=-1)
        lprobs[:, PAD_ID] = float("-inf")
        lprobs[:, BOS_ID] = float("-inf")
        vocab = lprobs.size(-1)
        out_of_length = [step >= limits[sent] for sent in live]
        lprobs = _only_eos_where(out_of_length, lprobs, beam)
        cand = (scores.view(n, beam, 1) + lprobs.view(n, beam, vocab)).view(n, beam * vocab)
        top_scores, top_index = cand.topk(min(2 * beam, beam * vocab), dim=1)
        origin = torch.div(top_index, vocab, rounding_mode="floor")
        word = top_index % vocab
        is_eos = word.eq(EOS_ID) & torch.isfinite(top_scores)

        _finish_ended(finished, live, is_eos, history, origin, top_scores, beam, length_penalty_alpha)
        done = [over or len(finished[sent]) >= beam for over, sent in zip(out_of_length, live)]

        # the next live hypotheses: the best `beam` candidates that are not end-of-sentence
        order = torch.sort(is_eos.to(torch.int8), dim=1, stable=True).indices[:, :beam]
        next_scores = top_scores.gather(1, order)
        next_origin = origin.gather(1, order)
        next_word = word.gather(1, order)
        rows = (torch.arange(n, device=device)[:, None] * beam + next_origin).view(-1)
        history = torch.cat([history.index_select(0, rows), next_word.view(-1, 1)], dim=1)
        Transformer.reorder_cache(cache, rows)
        scores = next_scores

        if any(done):
            kept = [i for i, ended_here in enumerate(done) if not ended_here]
            keep = torch.tensor(kept, dtype=torch.long, device=device)
            groups = (keep[:, None] * beam + torch.arange(beam, device=device)).view(-1)
            history = history.index_select(0, groups)
            scores = scores.index_select(0, keep)
            sources = keep if shared else groups  # the rows of each source kept
            Transformer.reorder_cache(cache, groups, sources)
            enc = enc.index_select(sources)
            live = [live[i] for i in kept]
        step += 1

    return [sorted(hyps, key=lambda h: -h.score)[:nbest] for hyps in finished]


def translate_batch(model: Transformer, batch: Batch, beam: int = _DEFAULTS.beam,
                    length_penalty: float = _DEFAULTS.length_penalty,
                    max_len_a: float = _DEFAULTS.max_len_a, max_len_b: int = _DEFAULTS.max_len_b,
                    nbest: int = _DEFAULTS.nbest) -> list[list[Hypothesis]]:
    """Beam search for ``beam > 1``, greedy decoding for ``beam == 1``; the model's mode is restored.

    ``beam`` (and ``nbest`` with it) is cut to the size of the target vocabulary, the number of
    candidates a first step has; config checks refuse beams over :data:`structnmt.config.MAX_BEAM`."""
    beam = min(beam, target_vocab_size(model))
    nbest = min(nbest, beam)
    was_training = model.training
    try:
        if beam == 1:
            return greedy_search(model, batch, length_penalty, max_len_a, max_len_b)
        return beam_search(model, batch, beam, length_penalty, max_len_a, max_len_b, nbest)
    finally:
        model.train(was_training)
