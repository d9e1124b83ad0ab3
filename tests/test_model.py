"""The Transformer and its decoding: the invariants every method relies on."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from structnmt.config import ModelConfig
from structnmt.data.batch import BOS_ID, EOS_ID, PAD_ID, Batch
from structnmt.model.losses import label_smoothed_nll
from structnmt.model.search import beam_search, greedy_search, length_penalty
from structnmt.model.transformer import Transformer

V = 40


def tiny(norm: str = "pre", **kw) -> Transformer:
    cfg = ModelConfig(enc_layers=2, dec_layers=2, d_model=32, n_heads=4, d_ff=64, dropout=0.0, norm=norm, **kw)
    return Transformer(cfg, V, V)


def toy_batch() -> Batch:
    g = torch.Generator().manual_seed(1)
    src = torch.randint(4, V, (3, 7), generator=g)
    src[:, -1] = EOS_ID
    src[2, 4] = EOS_ID
    src[2, 5:] = PAD_ID
    tgt = torch.randint(4, V, (3, 6), generator=g)
    tgt[1, 4:] = PAD_ID
    lengths = tgt.ne(PAD_ID).sum(1)
    tgt_in = torch.cat([torch.full((3, 1), BOS_ID), tgt], 1)
    tgt_out = torch.cat([tgt, torch.zeros(3, 1, dtype=torch.long)], 1)
    tgt_out[torch.arange(3), lengths] = EOS_ID
    return Batch(src, tgt_in, tgt_out)


def overfit(model: Transformer, batch: Batch, steps: int = 120) -> None:
    opt = torch.optim.Adam(model.parameters(), 1e-2)
    model.train()
    for _ in range(steps):
        loss, _ = label_smoothed_nll(model(batch).logits, batch.tgt_out, 0.0)
        opt.zero_grad()
        (loss / batch.n_tgt_tokens).backward()
        opt.step()


@pytest.mark.parametrize("norm", ["pre", "post"])
def test_padding_does_not_change_outputs(norm):
    model = tiny(norm).eval()
    batch = toy_batch()
    full = model(batch).logits
    # sentence 2 alone, without the padding columns, gives the same logits
    alone = Batch(batch.src[2:, :5], batch.tgt_in[2:], batch.tgt_out[2:])
    torch.testing.assert_close(model(alone).logits[0], full[2], atol=1e-5, rtol=1e-5)


def test_fused_and_explicit_attention_agree():
    model = tiny().eval()
    batch = toy_batch()
    fused = model(batch).logits
    every = {(s, l, a, "probs") for s, a in [("encoder", "self"), ("decoder", "self"), ("decoder", "cross")]
             for l in range(2)}
    out = model(batch, record=every)
    torch.testing.assert_close(out.logits, fused, atol=1e-5, rtol=1e-5)
    probs = out.records[("encoder", 0, "self", "probs")]
    assert probs.shape == (3, 4, 7, 7)
    torch.testing.assert_close(probs.sum(-1), torch.ones(3, 4, 7))
    assert float(probs[2, :, :, 5:].detach().abs().max()) == 0.0  # padded keys get no weight
    dec = out.records[("decoder", 1, "self", "probs")]
    assert float(dec.detach().triu(1).abs().max()) == 0.0  # causal


def test_attention_kernel_choice_changes_the_path_not_the_function():
    torch.manual_seed(0)
    fused = tiny(attention_kernel="sdpa").eval()
    torch.manual_seed(0)
    explicit = tiny(attention_kernel="explicit").eval()
    batch = toy_batch()
    torch.testing.assert_close(explicit(batch).logits, fused(batch).logits, atol=1e-5, rtol=1e-5)
    attn = tiny().encoder[0].self_attn  # auto
    q32 = torch.zeros(1, 4, 2, 8)
    ctx = SimpleNamespace(wants=lambda what: False)

    def route(layer, q):
        return layer.route(q, q, q, ctx)

    assert route(attn, q32) == "sdpa"  # fp32: fused kernel
    assert route(attn, q32.bfloat16()) == "explicit"  # bf16 on a CPU: explicit is faster
    assert route(attn, q32.half()) == "explicit"
    assert route(explicit.encoder[0].self_attn, q32) == "explicit"
    assert route(fused.encoder[0].self_attn, q32.bfloat16()) == "sdpa"
    assert tiny(attention_kernel="fused").encoder[0].self_attn.kernel == "sdpa"  # the older name


def test_cached_decoding_equals_full_decoding():
    model = tiny().eval()
    batch = toy_batch()
    enc = model.encode(batch.src)
    full = model.decode(batch.tgt_in, enc)
    cache = model.new_cache()
    steps = [model.decode(batch.tgt_in[:, t: t + 1], enc, cache=cache) for t in range(batch.tgt_in.size(1))]
    real = batch.tgt_in.ne(PAD_ID)  # padded query positions are never read
    torch.testing.assert_close(torch.cat(steps, 1)[real], full[real], atol=1e-5, rtol=1e-5)


def test_beam_one_equals_greedy_and_beam_finds_the_memorised_targets():
    model = tiny()
    batch = toy_batch()
    overfit(model, batch, 60)
    src_only = Batch(batch.src)
    greedy = greedy_search(model, src_only, 0.0)
    beam1 = beam_search(model, src_only, beam=1, length_penalty_alpha=0.0)
    assert [h[0].tokens for h in greedy] == [h[0].tokens for h in beam1]
    for a, b in zip(greedy, beam1):
        assert a[0].logprob == pytest.approx(b[0].logprob, abs=1e-4)
    beam5 = beam_search(model, src_only, beam=5, length_penalty_alpha=0.0, nbest=3)
    for g, hyps in zip(greedy, beam5):
        assert len(hyps) == 3
        assert hyps[0].score >= hyps[1].score >= hyps[2].score
        assert hyps[0].score >= g[0].score - 1e-5  # a wider beam finds at least the greedy path here


def test_beams_sharing_one_copy_of_the_source_search_as_beams_with_their_own(monkeypatch):
    """Beam search keeps one copy of each source's cross-attention keys and values for all its
    beams (the beams are extra queries); copying the source per beam gives the same search.
    The half-memorised targets have 6, 4 and 6 words: the second sentence finishes first and
    the sources are cut down to the other two mid-search (taking the wrong rows fails this)."""
    model = tiny()
    batch = toy_batch()
    overfit(model, batch, 60)
    assert model.shares_source_across_beams()
    runs = []
    for shared in (True, False):
        monkeypatch.setattr(Transformer, "shares_source_across_beams", lambda self, s=shared: s)
        runs.append(beam_search(model, Batch(batch.src), beam=2, length_penalty_alpha=1.0, nbest=2))
    for one, many in zip(*runs):
        assert [h.tokens for h in one] == [h.tokens for h in many]
        assert [h.logprob for h in one] == pytest.approx([h.logprob for h in many], abs=1e-5)
    assert len(runs[0][1][0].tokens) < min(len(runs[0][0][0].tokens), len(runs[0][2][0].tokens))


def test_beam_scores_are_length_normalised_log_probabilities():
    model = tiny()
    batch = toy_batch()
    overfit(model, batch, 40)
    hyp = beam_search(model, Batch(batch.src[:1]), beam=4, length_penalty_alpha=1.0)[0][0]
    # rescore the hypothesis with teacher forcing
    tokens = torch.tensor([[BOS_ID] + hyp.tokens])
    model.eval()
    lprobs = torch.log_softmax(model.decode(tokens, model.encode(batch.src[:1])), -1)[0]
    gold = hyp.tokens + [EOS_ID]
    logprob = sum(float(lprobs[t, w].detach()) for t, w in enumerate(gold))
    assert hyp.logprob == pytest.approx(logprob, abs=1e-3)
    assert hyp.score == pytest.approx(logprob / length_penalty(len(gold), 1.0), abs=1e-3)


def test_maximum_length_is_respected():
    model = tiny().eval()
    batch = toy_batch()
    hyps = beam_search(model, Batch(batch.src), beam=3, max_len_a=0.0, max_len_b=2)
    assert all(len(h[0].tokens) <= 2 for h in hyps)
    assert all(len(h[0].tokens) <= 2 for h in greedy_search(model, Batch(batch.src), 0.0, 0.0, 2))


def test_label_smoothing_matches_its_definition():
    logits = torch.randn(2, 3, 5)
    target = torch.tensor([[1, 2, 0], [4, 0, 0]])
    loss, nll = label_smoothed_nll(logits, target, 0.2, ignore_index=0)
    lp = torch.log_softmax(logits, -1)
    rows = [(0, 0, 1), (0, 1, 2), (1, 0, 4)]
    want_nll = -sum(float(lp[b, t, w]) for b, t, w in rows)
    want = sum(0.8 * -float(lp[b, t, w]) + 0.2 * -float(lp[b, t].mean()) for b, t, w in rows)
    assert float(nll) == pytest.approx(want_nll, rel=1e-5)
    assert float(loss) == pytest.approx(want, rel=1e-5)


def test_shared_and_tied_embeddings():
    shared = tiny()
    assert shared.src_embed is shared.tgt_embed and shared.output is None
    separate = tiny(share_embeddings=False, tie_output=False)
    assert separate.num_parameters() == shared.num_parameters() + V * 32 * 2


def test_beam_search_reads_the_device_a_few_times_a_step_whatever_the_batch(monkeypatch):
    """Each read of a tensor into Python (``tolist``, ``int``, ``bool``, ``nonzero``...) waits for
    the device on a GPU. Beam search once read the history and the origin of every ended
    candidate and the sentence number of every group one by one: 13,528 reads for one batch of
    533 Multi30k sentences, against 90 now (the old code reads 331 times for 24 sentences here).
    Here 3 sentences and 24 (8 copies of them), beam 4, every one ended by step 3 at the latest
    (forced): the reads do not grow with the batch and stay under 8 a step."""
    model = tiny().eval()
    batch = toy_batch()
    reads = []

    def counting(real):
        def counted(self, *args, **kwargs):
            reads.append(1)
            return real(self, *args, **kwargs)
        return counted

    for name in ("tolist", "item", "__int__", "__float__", "__bool__", "nonzero"):
        monkeypatch.setattr(torch.Tensor, name, counting(getattr(torch.Tensor, name)))
    steps = []
    decode = Transformer.decode
    monkeypatch.setattr(Transformer, "decode", lambda self, *a, **k: steps.append(1) or decode(self, *a, **k))
    counts = {}
    for copies in (1, 8):  # the same 3 sentences, and 8 copies of them: the same steps, the same reads
        reads.clear()
        steps.clear()
        hyps = beam_search(model, Batch(batch.src.repeat(copies, 1)), beam=4, max_len_a=0.0, max_len_b=3, nbest=4)
        assert len(hyps) == 3 * copies and all(len(h) == 4 for h in hyps)
        counts[copies] = (len(steps), len(reads))
    assert counts[1] == counts[8] and counts[8][0] == 4 and counts[8][1] < 8 * 4, counts
