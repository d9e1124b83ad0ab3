"""DBSA, SISA, SyncAttn, LPSI (+ SynchMSE/Rank), local windows and the inspect helpers.

Every loss is checked against a direct computation on small hand-built tensors.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch

from structnmt.config import ModelConfig, load_config
from structnmt.data.batch import Batch
from structnmt.errors import ConfigError
from structnmt.evaluation.inspect import cross_attention_alignments, dbsa_trees, lpsi_trees
from structnmt.evaluation.trees import is_tree
from structnmt.model.methods import build_methods
from structnmt.model.methods.base import Effect
from structnmt.model.methods.local_window import window_mask
from structnmt.model.methods.lpsi import synch_loss, syntactic_gate_log
from structnmt.model.methods.syncattn import sync_loss
from structnmt.model.transformer import Transformer

ROOT = Path(__file__).resolve().parents[1]
D_MODEL, N_HEADS = 32, 4
D_HEAD = D_MODEL // N_HEADS
VOCAB = 20


def make_model(methods: list[dict], **kw) -> Transformer:
    cfg = ModelConfig(enc_layers=3, dec_layers=3, d_model=D_MODEL, n_heads=N_HEADS, d_ff=64, dropout=0.0,
                      methods=methods, **kw)
    return Transformer(cfg, VOCAB, VOCAB)


def make_batch() -> Batch:
    """Two sentences. Source 1: words [0 1 1 2] (word 1 split in two), tree 0<-1->2, root = word 1.

    Target 1 (tgt_in = BOS + 3 sub-words): words [0 1 2], root word 2, word 1 -> word 0; word 0's
    parent is word 2, which lies in its future (position 3 > 1), so the causal decoder head skips it.
    """
    src = torch.tensor([[5, 6, 7, 8, 3], [5, 6, 3, 0, 0]])
    tgt_in = torch.tensor([[2, 9, 10, 11], [2, 9, 12, 0]])
    tgt_out = torch.tensor([[9, 10, 11, 3], [9, 12, 3, 0]])
    src_struct = {
        "valid": src.gt(3),
        "parent_first": torch.tensor([[1, 1, 1, 1, 4], [1, 1, 2, 3, 4]]),  # 0->1, root 1, 2 in-word, 3->1
        "word_index": torch.tensor([[0, 1, 1, 2, -1], [0, 1, -1, -1, -1]]),
    }
    tgt_struct = {
        "valid": tgt_in.gt(3),
        "parent_first": torch.tensor([[0, 3, 1, 3], [0, 1, 1, 3]]),  # 1->3 (future), 2->1, 3 root
        "word_index": torch.tensor([[-1, 0, 1, 2], [-1, 0, 1, -1]]),
    }
    return Batch(src, tgt_in, tgt_out, {"src": src_struct, "tgt": tgt_struct}, index=torch.tensor([1, 0]))


# ---------------------------------------------------------------------------
# DBSA / SISA


def test_dbsa_loss_is_negative_log_likelihood_of_parents():
    model = make_model([{"name": "dbsa", "sides": ["src", "tgt"], "heads": [1], "lambda_dep": 0.5}])
    batch = make_batch()
    out = model(batch, record={("encoder", 0, "self", "probs"), ("decoder", 0, "self", "probs")})
    for side, stack in (("src", "encoder"), ("tgt", "decoder")):
        a = out.records[(stack, 0, "self", "probs")][:, 1].detach()
        pf, valid = batch.struct[side]["parent_first"], batch.struct[side]["valid"]
        expected, counted = 0.0, 0
        for b in range(a.size(0)):
            for t in range(a.size(1)):
                if valid[b, t] and not (side == "tgt" and pf[b, t] > t):
                    expected -= math.log(float(a[b, t, pf[b, t]]))
                    counted += 1
        assert out.losses[f"dbsa_{side}"].item() == pytest.approx(0.5 * expected, rel=1e-5)
        # source: all 4 + 2 real sub-words; target: 3 + 2 minus the one whose parent is ahead
        assert counted == {"src": 6, "tgt": 4}[side]


def test_dbsa_head_starts_as_dot_product_and_changes_only_its_head():
    torch.manual_seed(3)
    vanilla = make_model([])
    dbsa = make_model([{"name": "dbsa", "sides": ["src"], "heads": [2]}])
    missing = dbsa.load_state_dict(vanilla.state_dict(), strict=False).missing_keys
    assert all(".plugins." in k for k in missing) and missing
    batch = make_batch()
    key = ("encoder", 0, "self", "probs")
    ref = vanilla(batch, record={key}).records[key]
    assert torch.allclose(dbsa(batch, record={key}).records[key], ref, atol=1e-6)  # U = I at start
    plugin = dbsa.encoder[0].self_attn.plugins[0]
    with torch.no_grad():
        plugin.U.copy_(torch.randn_like(plugin.U))
    changed = dbsa(batch, record={key}).records[key]
    assert torch.allclose(changed[:, [0, 1, 3]], ref[:, [0, 1, 3]], atol=1e-6)
    assert not torch.allclose(changed[:, 2], ref[:, 2], atol=1e-3)


def test_learned_methods_add_exactly_their_parameters():
    base = make_model([]).num_parameters()
    conv = (5 + 1) * D_HEAD + 1
    expected = {
        "dbsa": ({"name": "dbsa"}, 2 * D_HEAD ** 2),  # encoder + decoder site, one head each
        "dbsa2": ({"name": "dbsa", "sides": ["src"], "heads": 2, "layers": [1, 2]}, 2 * 2 * D_HEAD ** 2),
        "sisa": ({"name": "sisa"}, D_HEAD ** 2),
        "syncattn": ({"name": "syncattn"}, 2 * D_HEAD ** 2),
        "lpsi": ({"name": "lpsi"}, 4 * conv),  # 2 layers x 2 sides
        "local_window": ({"name": "local_window"}, 0),
    }
    for entry, extra in expected.values():
        assert make_model([entry]).num_parameters() - base == extra, entry
    methods = build_methods(ModelConfig(methods=[{"name": "lpsi"}, {"name": "local_window"}]))
    assert [m.adds_parameters for m in methods] == [True, False]


def test_supervised_heads_need_no_structure_at_translation_time():
    model = make_model([{"name": "syncattn"}])
    assert model.structure_needs() == {"src": {"valid", "parent_first"}, "tgt": {"valid", "parent_first"}}
    assert model.structure_needs(inference=True) == {"src": set(), "tgt": set()}
    model.eval()
    batch = make_batch()
    with torch.no_grad():
        enc = model.encode(batch.src)  # no struct at all
        cache = model.new_cache()
        logits = model.decode(batch.tgt_in[:, :1], enc, cache=cache)
        logits = model.decode(batch.tgt_in[:, 1:2], enc, cache=cache)
    assert torch.isfinite(logits).all()


def test_config_checks_where_methods_act():
    with pytest.raises(ConfigError, match="sides"):
        make_model([{"name": "sisa", "sides": ["tgt"]}])
    with pytest.raises(ConfigError, match="sides"):
        make_model([{"name": "syncattn", "sides": ["src"]}])
    with pytest.raises(ConfigError, match="window"):
        make_model([{"name": "local_window", "window": -1}])
    with pytest.raises(ConfigError, match="synch_layers"):
        make_model([{"name": "lpsi", "synch": "mse", "synch_layers": [3]}])


# ---------------------------------------------------------------------------
# SyncAttn


def numpy_sync_loss(e: np.ndarray, d: np.ndarray, c: np.ndarray, tgt_len: int) -> float:
    """One sentence: C E Cᵀ, causal + padding mask, softmax, squared error over seen cells."""
    c, d = c[:tgt_len], d[:tgt_len, :tgt_len]
    mapped = c @ e @ c.T
    total = 0.0
    for t in range(tgt_len):
        row = mapped[t, : t + 1]
        p = np.exp(row - row.max())
        p /= p.sum()
        total += float(((p - d[t, : t + 1]) ** 2).sum())
    return total


def test_syncattn_loss_equals_direct_computation():
    model = make_model([{"name": "syncattn", "lambda_sync": 2.0}])
    batch = make_batch()
    out = model(batch)
    e = out.records[("encoder", 0, "self", "dbsa")].mean(1).detach().numpy()
    d = out.records[("decoder", 0, "self", "dbsa")].mean(1).detach().numpy()
    c = out.records[("decoder", 1, "cross", "probs")].mean(1).detach().numpy()  # penultimate of 3
    tgt_lens = batch.tgt_in.ne(0).sum(1).tolist()
    expected = sum(numpy_sync_loss(e[b], d[b], c[b], tgt_lens[b]) for b in range(2))
    assert out.losses["syncattn"].item() == pytest.approx(2.0 * expected, rel=1e-5)
    assert {"dbsa_src", "dbsa_tgt", "syncattn"} <= set(out.losses)
    out.losses["syncattn"].backward()
    assert model.encoder[0].self_attn.plugins[0].U.grad.abs().sum() > 0  # gradient reaches E


def test_sync_loss_ignores_padding_cells():
    e = torch.softmax(torch.randn(1, 3, 3), -1)
    c = torch.softmax(torch.randn(1, 4, 3), -1)
    d = torch.softmax(torch.randn(1, 4, 4), -1)
    pad = torch.tensor([[False, False, True, True]])
    d2 = d.clone()
    d2[:, 2:, :] = 5.0
    d2[:, :, 2:] = 7.0
    assert torch.allclose(sync_loss(e, d, c, pad), sync_loss(e, d2, c, pad))


# ---------------------------------------------------------------------------
# LPSI


def naive_gate(dist: np.ndarray, tau: float) -> np.ndarray:
    n = len(dist)
    g = np.ones((n, n))
    for t in range(n):
        for i in range(n):
            lo, hi = min(i, t), max(i, t)
            for j in range(lo + 1, hi):
                g[t, i] *= (np.clip((dist[t] - dist[j]) * tau, -1, 1) + 1) / 2
    return g


@pytest.mark.parametrize("tau", [1.0, 3.0])
def test_lpsi_gate_equals_naive_product(tau):
    dist = torch.tanh(torch.randn(2, 3, 7))
    rows = torch.arange(7)
    fast = syntactic_gate_log(dist, rows, tau).exp()
    for b in range(2):
        for h in range(3):
            assert np.allclose(fast[b, h].numpy(), naive_gate(dist[b, h].numpy(), tau), atol=1e-5)
    # query rows of an incremental step see the same gate as the full matrix's rows
    step = syntactic_gate_log(dist, torch.tensor([4, 5]), tau)
    assert torch.allclose(step, syntactic_gate_log(dist, rows, tau)[..., 4:6, :])


def test_lpsi_gate_is_applied_to_scores():
    model = make_model([{"name": "lpsi", "sides": ["src"], "layers": [1], "heads": [0, 3]}])
    vanilla = make_model([])
    vanilla.load_state_dict(model.state_dict(), strict=False)
    batch = make_batch()
    key, dkey = ("encoder", 0, "self", "probs"), ("encoder", 0, "self", "distance")
    out = model(batch, record={key, dkey})
    ref = vanilla(batch, record={key}).records[key]
    assert torch.allclose(out.records[key][:, [1, 2]], ref[:, [1, 2]], atol=1e-6)
    log_g = syntactic_gate_log(out.records[dkey], torch.arange(5), 1.0)  # (B, 2, I, J)
    expected = torch.softmax(ref[:, [0, 3]].clamp_min(1e-30).log() + log_g, -1)
    expected = expected.masked_fill(batch.src_pad[:, None, None, :], 0.0)
    expected = expected / expected.sum(-1, keepdim=True)
    assert torch.allclose(out.records[key][:, [0, 3]], expected, atol=1e-5)


def test_lpsi_incremental_decoding_matches_full_pass():
    model = make_model([{"name": "lpsi", "synch": "rank"}]).eval()
    src = torch.tensor([[5, 6, 7, 8, 3]])
    tgt_in = torch.tensor([[2, 9, 10, 11, 12, 13, 14, 15]])
    with torch.no_grad():
        enc = model.encode(src)
        full = model.decode(tgt_in, enc)
        cache = model.new_cache()
        steps = [model.decode(tgt_in[:, t: t + 1], enc, cache=cache) for t in range(tgt_in.size(1))]
    assert torch.allclose(torch.cat(steps, 1), full, atol=1e-5)


def test_synch_mse_and_rank_equal_naive_loops():
    torch.manual_seed(1)
    d = torch.randn(2, 5)
    d_tilde = torch.randn(2, 5)
    pad = torch.tensor([[False] * 5, [False, False, False, True, True]])
    mse = rank = 0.0
    for b in range(2):
        n = int((~pad[b]).sum())
        for i in range(n):
            mse += float((d[b, i] - d_tilde[b, i]) ** 2)
            for j in range(i + 1, n):
                sign = float(np.sign(float(d[b, i] - d[b, j])))
                rank += max(0.0, 1.0 - sign * float(d_tilde[b, i] - d_tilde[b, j]))
    assert float(synch_loss(d, d_tilde, pad, "mse")) == pytest.approx(mse, rel=1e-5)
    assert float(synch_loss(d, d_tilde, pad, "rank")) == pytest.approx(rank, rel=1e-5)


def test_lpsi_synch_pairs_layers_in_order():
    model = make_model([{"name": "lpsi", "synch": "mse", "lambda_synch": 0.5}])
    method = model.methods[0]
    assert method.pairs == [(1, 2), (2, 3)]  # bottom distance layers with the top cross layers
    batch = make_batch()
    out = model(batch)
    pads = {"src": batch.src_pad, "tgt": batch.tgt_pad}
    expected = 0.0
    for dist_layer, cross_layer in method.pairs:
        e = out.records[("encoder", dist_layer - 1, "self", "distance")].mean(1).detach()
        d = out.records[("decoder", dist_layer - 1, "self", "distance")].mean(1).detach()
        c = out.records[("decoder", cross_layer - 1, "cross", "probs")].mean(1).detach()
        for b in range(2):
            for i in range(int((~pads["tgt"][b]).sum())):
                proj = sum(float(c[b, i, k] * e[b, k]) for k in range(int((~pads["src"][b]).sum())))
                expected += (float(d[b, i]) - proj) ** 2
    assert out.losses["lpsi_synch"].item() == pytest.approx(0.5 * expected, rel=1e-4)


# ---------------------------------------------------------------------------
# local windows


def test_window_mask_is_exactly_outside_the_window():
    mask = window_mask(torch.arange(6), 6, 2)
    expected = torch.tensor([[abs(i - j) > 2 for j in range(6)] for i in range(6)])
    assert torch.equal(mask, expected)
    one_row = torch.tensor([[True, True, True, False, False, False]])
    assert torch.equal(window_mask(torch.tensor([4]), 6, 1), one_row)


def test_local_window_keeps_fused_kernel_and_masks_probs():
    model = make_model([{"name": "local_window", "layers": [1], "heads": [1], "window": 1}])
    assert model.encoder[0].self_attn.plugins[0].effect is Effect.ADDITIVE
    batch = make_batch()
    key = ("encoder", 0, "self", "probs")
    a = model(batch, record={key}).records[key]
    outside = window_mask(torch.arange(5), 5, 1)
    assert (a[0, 1][outside] == 0).all() and (a[0, 1][~outside] > 0).all()
    assert (a[0, 0][outside] > 0).all()  # other heads untouched
    assert torch.isfinite(model(batch).logits).all()  # padding rows whose window is all padding: no NaN


def test_local_window_nopos_recipe_removes_positions():
    cfg = load_config(ROOT / "configs" / "multi30k_en_de_local_window_nopos.yaml")
    assert cfg.model.positional == "none"
    assert cfg.model.methods[0].name == "local_window"


# ---------------------------------------------------------------------------
# inspect


def test_dbsa_trees_read_first_subwords_and_return_trees_in_example_order():
    model = make_model([{"name": "dbsa", "sides": ["src"], "heads": [0]}])
    batch = make_batch()
    trees = dbsa_trees(model, [batch])
    assert [len(t) for t in trees] == [2, 3]  # index order: sentence 1 (2 words) first
    assert all(is_tree(t) for t in trees)
    # push every row of the head to the first sub-word of word 1: every word then hangs off word 1
    plugin = model.encoder[0].self_attn.plugins[0]
    plugin.scores = lambda s, ctx: s.index_copy(  # type: ignore[method-assign]
        1, torch.tensor([0]), torch.full_like(s[:, :1], -10.0).index_fill(-1, torch.tensor([1]), 10.0))
    assert dbsa_trees(model, [batch]) == [[1, 1], [1, 1, 1]]


def test_lpsi_trees_read_word_boundaries_from_first_or_last_subwords():
    model = make_model([{"name": "lpsi", "sides": ["src"]}])
    batch = make_batch()
    before = lpsi_trees(model, [batch])  # auto: the encoder reads boundaries before its tokens
    after = lpsi_trees(model, [batch], boundary="after")
    assert before == lpsi_trees(model, [batch], boundary="before")
    model.eval()
    with torch.no_grad():
        dist = model(batch, record={("encoder", 0, "self", "distance")}).records[
            ("encoder", 0, "self", "distance")].mean(1)
    # example 1 is batch row 0: words at positions [0], [1, 2], [3]
    # before: the boundary w-1|w is the distance at word w's first sub-word -> positions 1, 3
    assert before[1].distances == pytest.approx(dist[0, [1, 3]].tolist())
    # after: the boundary w|w+1 is the distance at word w's last sub-word -> positions 0, 2
    assert after[1].distances == pytest.approx(dist[0, [0, 2]].tolist())
    for trees, row in ((before, [1, 3]), (after, [0, 2])):
        d = dist[0, row]
        inner = (0, 2) if d[1] > d[0] else (1, 3)  # split at the larger boundary first, the rest is binary
        assert trees[1].words == 3 and trees[1].brackets == [(0, 3), inner]
        assert trees[0].brackets == [(0, 2)] and trees[0].words == 2
    both = make_model([{"name": "lpsi", "sides": ["src", "tgt"]}])
    target = lpsi_trees(both, [batch], side="tgt")  # auto: the decoder reads boundaries after its tokens
    assert target == lpsi_trees(both, [batch], side="tgt", boundary="after")
    assert target != lpsi_trees(both, [batch], side="tgt", boundary="before")


def test_cross_attention_alignments_are_word_level_links():
    model = make_model([])
    batch = make_batch()
    out = cross_attention_alignments(model, [batch])
    first = out[1]  # batch row 0: 3 source words, 3 target words
    assert len(first.tgt2src) == 3 and {j for _, j in first.tgt2src} == {0, 1, 2}
    assert len(first.src2tgt) == 3 and {i for i, _ in first.src2tgt} == {0, 1, 2}
    assert first.tgt2src & first.src2tgt <= first.symmetrised <= first.tgt2src | first.src2tgt
    # with a "reverse model" fed the same batch, the second direction is its flipped tgt2src
    rev = cross_attention_alignments(model, [batch], reverse_model=model, reverse_batches=[batch])
    assert rev[1].tgt2src == first.tgt2src


def test_head_parent_scores_read_words_as_row_means_and_column_sums():
    from structnmt.evaluation.inspect import sentence_parent_scores

    word_index = np.array([0, 1, 1, 2, -1])  # word 1 is two sub-words; EOS last
    parents = [-1, 0, 1]  # word 0 is the root
    attn = np.zeros((2, 5, 5))
    attn[:, 0] = 0.2  # the root's row is not scored
    attn[0, 1, [0, 3]] = [0.8, 0.2]
    attn[0, 2, [0, 3]] = [0.4, 0.6]  # word 1's row: mean of its pieces -> word 0 0.6, word 2 0.4: hit
    attn[0, 3, [1, 2, 3]] = [0.25, 0.25, 0.5]  # word 2: its own column is skipped; parent gets 0.25+0.25: hit
    attn[1, 1, [1, 2, 3]] = [0.5, 0.3, 0.2]
    attn[1, 2, 2] = 1.0  # word 1 looks at itself, then at word 2: miss
    attn[1, 3, [0, 4]] = [0.9, 0.1]  # word 2 looks at word 0 (and EOS): miss
    hits, mass, words = sentence_parent_scores(attn, word_index, parents)
    assert words == 2
    assert hits.tolist() == [2.0, 0.0]
    assert mass == pytest.approx([0.6 + 0.5, 0.0])
    with pytest.raises(Exception, match="2 heads for a sentence of 3 words"):
        sentence_parent_scores(attn, word_index, [1, -1])


def test_best_offset_baseline_counts_non_root_words():
    from structnmt.evaluation.inspect import best_offset_accuracy

    assert best_offset_accuracy([[-1, 0, 1], [1, 1]]) == (-1, round(2 / 3, 4))  # roots: -1 or themselves


def test_head_parent_attention_covers_every_encoder_head_of_any_model():
    from structnmt.evaluation.inspect import head_parent_attention

    model = make_model([])  # vanilla
    found = head_parent_attention(model, [make_batch()], [[1, -1], [1, -1, 1]])  # by example index
    assert found["words"] == 3  # 1 + 2 non-root words
    assert np.array(found["accuracy"]).shape == np.array(found["mass"]).shape == (3, N_HEADS)
    assert all(0.0 <= v <= 1.0 for row in found["accuracy"] + found["mass"] for v in row)
    with pytest.raises(Exception, match="heads for a sentence"):  # trees read in the wrong order
        head_parent_attention(model, [make_batch()], [[1, -1, 1], [1, -1]])
