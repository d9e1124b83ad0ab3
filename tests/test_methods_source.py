"""The parameter-free source-side methods: PASCAL, Deps-SAN (+ RS/Wink-Sparsing), UDISCAL, SASA, SACrA.

Every check compares the model's attention with a direct computation of the paper's formula
on a small hand-built batch of two sentences:

* A: 5 words, words 1 and 3 split into two sub-words, + EOS (8 positions). Tree: w2 is the
  root, w1 -> w2, w0 -> w1, w3 -> w2, w4 -> w3. Scenes {w0, w1, w2} and {w2, w3, w4} (w2 in
  both, like the noun a relative clause modifies); scene 1 hangs under scene 0.
* B: 4 one-piece words + EOS + 3 padding. Tree: w1 root, w0 -> w1, w2 -> w1, w3 -> w2.
  One scene {w0, w1, w2}; w3 is in no scene.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from structnmt.config import ModelConfig
from structnmt.data.batch import BOS_ID, EOS_ID, PAD_ID, Batch
from structnmt.errors import ConfigError
from structnmt.model.attention import MultiHeadAttention, on_probs, on_scores
from structnmt.model.methods import AttentionContext, Site, build_methods
from structnmt.model.methods.base import Effect
from structnmt.model.methods.deps_san import DependencyScalePlugin, WinkMaskPlugin
from structnmt.model.methods.pascal import PascalPlugin
from structnmt.model.methods.sacra import SacraPlugin
from structnmt.model.transformer import Transformer

ROOT = Path(__file__).resolve().parents[1]
V = 30
L = 8
H = 4

# (word parents, sub-words per word, scenes as word sets, scene parents)
SENTENCES = [
    ([1, 2, 2, 2, 3], [1, 2, 1, 2, 1], [{0, 1, 2}, {2, 3, 4}], [-1, 0]),
    ([1, 1, 1, 2], [1, 1, 1, 1], [{0, 1, 2}], [-1]),
]




@pytest.fixture(autouse=True)
def _one_thread():
    """Tiny tensors: one thread is faster than two fighting over a shared machine."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


# ---------------------------------------------------------------------------
# the hand-built batch


def word_distances(parents: list[int]) -> list[list[int]]:
    """Undirected tree distances by breadth-first search (tiny trees: clarity over speed)."""
    n = len(parents)
    nbrs: list[set[int]] = [set() for _ in range(n)]
    for w, p in enumerate(parents):
        if p != w:
            nbrs[w].add(p)
            nbrs[p].add(w)
    out = []
    for start in range(n):
        dist = {start: 0}
        frontier = [start]
        while frontier:
            nxt = []
            for u in frontier:
                for v in nbrs[u]:
                    if v not in dist:
                        dist[v] = dist[u] + 1
                        nxt.append(v)
            frontier = nxt
        out.append([dist[w] for w in range(n)])
    return out


def make_batch(with_target: bool = True) -> Batch:
    B = len(SENTENCES)
    valid = torch.zeros(B, L, dtype=torch.bool)
    word_index = torch.full((B, L), -1, dtype=torch.long)
    parent_mid = torch.arange(L, dtype=torch.float).repeat(B, 1)
    dist = torch.zeros(B, L, L)
    scene_mask = torch.ones(B, L, L, dtype=torch.bool)
    scene_dist = torch.zeros(B, L, L)
    src = torch.full((B, L), PAD_ID, dtype=torch.long)
    g = torch.Generator().manual_seed(3)
    for b, (parents, pieces, scenes, scene_parents) in enumerate(SENTENCES):
        n_tok = sum(pieces)
        words = [w for w, k in enumerate(pieces) for _ in range(k)]
        positions = {w: [t for t, x in enumerate(words) if x == w] for w in range(len(pieces))}
        wdist = word_distances(parents)
        sdist = word_distances([p if p >= 0 else s for s, p in enumerate(scene_parents)])
        member = [{s for s, ws in enumerate(scenes) if w in ws} for w in range(len(pieces))]
        for t, w in enumerate(words):
            valid[b, t] = True
            word_index[b, t] = w
            parent_mid[b, t] = sum(positions[parents[w]]) / len(positions[parents[w]])
            for u, x in enumerate(words):
                dist[b, t, u] = wdist[w][x]
                if member[w]:  # a word in no scene keeps an all-True row
                    scene_mask[b, t, u] = bool(member[w] & member[x]) or t == u
                if member[w] and member[x]:
                    scene_dist[b, t, u] = min(sdist[s][r] for s in member[w] for r in member[x])
        src[b, :n_tok] = torch.randint(4, V, (n_tok,), generator=g)
        src[b, n_tok] = EOS_ID
    struct = {"src": {"valid": valid, "word_index": word_index, "parent_mid": parent_mid, "dist": dist,
                      "scene_mask": scene_mask, "scene_dist": scene_dist}, "tgt": {}}
    if not with_target:
        return Batch(src, struct=struct)
    tgt = torch.randint(4, V, (B, 5), generator=g)
    tgt[1, 3:] = PAD_ID
    tgt_in = torch.cat([torch.full((B, 1), BOS_ID), tgt], 1)
    tgt_out = torch.cat([tgt, torch.zeros(B, 1, dtype=torch.long)], 1)
    tgt_out[torch.arange(B), tgt.ne(PAD_ID).sum(1)] = EOS_ID
    return Batch(src, tgt_in, tgt_out, struct)


def test_hand_built_batch_is_what_the_docstring_says():
    s = make_batch().struct["src"]
    assert s["parent_mid"][0, :7].tolist() == [1.5, 3, 3, 3, 3, 3, 4.5]
    assert s["dist"][0, 0].tolist() == [0, 1, 1, 2, 3, 3, 4, 0]  # w0 to every token, EOS: 0
    assert s["scene_mask"][0, 0].tolist() == [True, True, True, True, False, False, False, True]
    assert s["scene_mask"][1, 3].all() and not s["scene_mask"][1, 0, 3]  # w3 in no scene
    assert s["scene_dist"][0, 0, 4] == 1 and s["scene_dist"][0, 3, 4] == 0


# ---------------------------------------------------------------------------
# helpers


def model_cfg(methods: list[dict], **kw) -> ModelConfig:
    base = dict(enc_layers=3, dec_layers=3, d_model=32, n_heads=H, d_ff=64, dropout=0.0)
    base.update(kw)
    return ModelConfig(methods=methods, **base)


def twin_models(methods: list[dict]) -> tuple[Transformer, Transformer]:
    """A vanilla model and the same weights with ``methods``: the method adds no parameters."""
    vanilla = Transformer(model_cfg([]), V, V).eval()
    method = Transformer(model_cfg(methods), V, V).eval()
    method.load_state_dict(vanilla.state_dict())
    return vanilla, method


def probs(model: Transformer, batch: Batch, layer: int) -> torch.Tensor:
    key = ("encoder", layer, "self", "probs")
    return model(batch, record={key}).records[key]


def encoder_scores(model: Transformer, batch: Batch, layer: int) -> torch.Tensor:
    """The raw scores QK^T/sqrt(d) of an encoder layer, from the input the layer really receives."""
    attn = model.encoder[layer].self_attn
    seen: list[torch.Tensor] = []
    handle = attn.register_forward_pre_hook(lambda mod, args: seen.append(args[0]))
    model(batch)
    handle.remove()
    q, k, _ = attn.qkv_proj(seen[0]).chunk(3, dim=-1)
    q, k = attn._split(q), attn._split(k)
    return q @ k.transpose(-1, -2) / math.sqrt(attn.d_head)


def gauss(x: torch.Tensor, var: float) -> torch.Tensor:
    return torch.exp(-x ** 2 / (2 * var)) / math.sqrt(2 * math.pi * var)


def softmax_masked(s: torch.Tensor, batch: Batch) -> torch.Tensor:
    return torch.softmax(s.masked_fill(batch.src_pad[:, None, None, :], float("-inf")), -1)


def pairs(batch: Batch) -> torch.Tensor:
    v = batch.struct["src"]["valid"]
    return (v[:, :, None] & v[:, None, :])[:, None]


def rows(batch: Batch) -> torch.Tensor:
    """(B, 1, I, J): rows of real tokens, every key (special keys have distance 0 there)."""
    v = batch.struct["src"]["valid"]
    return v[:, None, :, None].expand(-1, 1, -1, v.size(1))


def context(batch: Batch, training: bool = False) -> AttentionContext:
    ctx = AttentionContext(Site("encoder", "self", 0), batch.struct, batch.src_pad, False, training)
    ctx.q = torch.zeros(batch.size, H, L, 8)
    ctx.k = torch.zeros(batch.size, H, L, 8)
    return ctx


# ---------------------------------------------------------------------------
# PASCAL


def test_pascal_weights_peak_at_the_parent_middle_with_equal_raw_scores():
    batch = make_batch()
    s = torch.full((2, H, L, L), 3.0)  # equal raw scores: only the Gaussian decides
    out = on_scores(PascalPlugin([0, 1], variance=1.0, parent_ignoring=0.0), s, context(batch))
    pm = batch.struct["src"]["parent_mid"]
    expected = 3.0 * gauss(torch.arange(L)[None, None, :] - pm[:, :, None], 1.0)
    ok = batch.struct["src"]["valid"][:, :, None].expand(-1, -1, L)  # rows of real sub-words, every key
    for h in (0, 1):
        torch.testing.assert_close(out[:, h][ok], expected[ok])
        assert (out[:, h][~ok] == 3.0).all()  # rows of EOS / padding untouched
    assert (out[:, 2:] == 3.0).all()  # other heads untouched
    a = softmax_masked(out, batch)[0, 0].masked_fill(~ok[0], -1.0)  # among real sub-words
    assert a[0].argmax() in (1, 2) and torch.isclose(a[0, 1], a[0, 2])  # parent w1 = positions 1-2: mid 1.5
    assert a[1].argmax() == 3 and a[6, 4] == a[6, 5] and a[6, 4] > a[6, 3]  # parent w2 at 3; w3 at 4-5


def test_pascal_in_the_model_equals_the_formula_and_leaves_other_heads():
    vanilla, model = twin_models([{"name": "pascal", "layers": [1], "heads": [1, 3], "variance": 1.0}])
    batch = make_batch()
    s = encoder_scores(vanilla, batch, 0)
    pm = batch.struct["src"]["parent_mid"]
    w = gauss(torch.arange(L)[None, None, :] - pm[:, :, None], 1.0)[:, None]
    heads = torch.tensor([False, True, False, True]).view(1, H, 1, 1)
    rows = batch.struct["src"]["valid"][:, None, :, None]
    expected = softmax_masked(torch.where(heads & rows, s * w, s), batch)
    got = probs(model, batch, 0)
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(got[:, [0, 2]], probs(vanilla, batch, 0)[:, [0, 2]])


def test_parent_ignoring_leaves_whole_rows_unscaled_in_training_only():
    batch = make_batch()
    s = torch.randn(2, H, L, L)
    always = PascalPlugin([0, 1, 2, 3], 1.0, parent_ignoring=1.0)
    torch.testing.assert_close(on_scores(always, s, context(batch, training=True)), s)  # q = 1: nothing scaled
    assert not torch.equal(on_scores(always, s, context(batch, training=False)), s)  # off at translation time
    torch.manual_seed(5)
    half = on_scores(PascalPlugin([0, 1, 2, 3], 1.0, parent_ignoring=0.5), s, context(batch, training=True))
    unchanged = (half == s)[0, :, :7, :7].all(-1)  # rows of real tokens of sentence A
    changed = (half != s)[0, :, :7, :7].all(-1)
    assert bool((unchanged | changed).all())  # each row is all or nothing
    assert 0 < int(unchanged.sum()) < unchanged.numel()


# ---------------------------------------------------------------------------
# Deps-SAN


def test_deps_san_in_all_heads_of_three_layers_equals_the_formula():
    vanilla, model = twin_models([{"name": "deps_san", "layers": [1], "variance": 1.0}])
    batch = make_batch()
    s = encoder_scores(vanilla, batch, 0)
    w = gauss(batch.struct["src"]["dist"], 1.0)[:, None]
    expected = softmax_masked(torch.where(rows(batch), s * w, s), batch)
    torch.testing.assert_close(probs(model, batch, 0), expected, atol=1e-5, rtol=1e-5)
    assert float(batch.struct["src"]["dist"][0, 0, 7]) == 0.0  # EOS key: distance 0, scaled by N(0)
    default = build_methods(model_cfg([{"name": "deps_san"}]))[0]
    assert [site.layer for site in default.sites()] == [0, 1, 2] and default.head_list() == [0, 1, 2, 3]


def test_rs_sparsing_with_q_one_sets_every_distance_to_k():
    batch = make_batch()
    s = torch.randn(2, H, L, L)
    plugin = DependencyScalePlugin([0, 1, 2, 3], variance=1.0, rs_q=1.0, rs_k=6.0)
    out = on_scores(plugin, s, context(batch, training=True))
    dist = batch.struct["src"]["dist"][:, None]
    expected = torch.where(rows(batch), s * gauss(torch.where(pairs(batch), torch.tensor(6.0), dist), 1.0), s)
    torch.testing.assert_close(out, expected)
    exact = on_scores(plugin, s, context(batch, training=False))  # translation: the true distances
    true_w = gauss(batch.struct["src"]["dist"], 1.0)[:, None]
    torch.testing.assert_close(exact, torch.where(rows(batch), s * true_w, s))


def test_wink_sparsing_masks_exactly_the_keys_farther_than_k():
    batch = make_batch()
    bias = WinkMaskPlugin([0, 2], k=2.0).term(context(batch))
    far = (batch.struct["src"]["dist"] > 2)[:, None] & pairs(batch)
    assert int(far.sum()) > 0
    for h in (0, 2):
        assert torch.equal(torch.isinf(bias[:, h]), far[:, 0])
    assert (bias[:, [1, 3]] == 0).all() and not torch.isinf(bias[:, :, :, 7]).any()  # EOS column kept


def test_wink_alone_keeps_the_fused_kernel_and_gives_the_same_result_as_the_explicit_path():
    entry = {"name": "deps_san", "layers": [1], "heads": [0], "scaling": False, "wink_sparsing": True, "wink_k": 2}
    _, model = twin_models([entry])
    assert all(p.effect is Effect.ADDITIVE for p in model.encoder[0].self_attn.plugins)
    batch = make_batch()
    fused = model(batch).logits
    a = probs(model, batch, 0)  # recording forces the explicit path
    far = (batch.struct["src"]["dist"] > 2) & pairs(batch)[:, 0]
    assert (a[:, 0][far] == 0).all() and (a[:, 1][far] > 0).all()
    torch.testing.assert_close(model(batch, record={("encoder", 0, "self", "probs")}).logits, fused,
                               atol=1e-5, rtol=1e-5)


# ---------------------------------------------------------------------------
# UDISCAL and SASA (after the softmax, no renormalisation)


def test_udiscal_equals_a_times_n_in_its_head_only():
    vanilla, model = twin_models([{"name": "udiscal", "layers": [1], "heads": [2]}])
    batch = make_batch()
    a = probs(vanilla, batch, 0)
    w = gauss(batch.struct["src"]["dist"], 1.0)[:, None]
    heads = torch.tensor([False, False, True, False]).view(1, H, 1, 1)
    got = probs(model, batch, 0)
    torch.testing.assert_close(got, torch.where(heads & rows(batch), a * w, a))
    torch.testing.assert_close(got[1, :, 4:], a[1, :, 4:])  # EOS and padding rows untouched
    assert float(got[1, :, :, 5:].detach().abs().max()) == 0.0  # padded keys stay masked


def test_udiscal_row_sums_on_a_real_sentence():
    """The row-sum range docs/methods_source.md states: at most N(0) = 0.399 (own word, EOS);
    0.2-0.35 for a head that attends to the syntactic neighbourhood, 0.24 for one that looks
    only at the parent, about 0.1 for diffuse (untrained) attention."""
    from structnmt.data.structures import tree_distances
    from structnmt.model.methods.udiscal import UdiscalPlugin

    # UD parse of "A man and a woman sitting on a bench ." (one sub-word per word) + EOS
    heads = [1, 1, 4, 4, 1, 1, 8, 8, 5, 1]
    n = len(heads)
    dist = torch.zeros(1, n + 1, n + 1)
    dist[0, :n, :n] = torch.from_numpy(tree_distances(heads)).float()
    valid = torch.tensor([[True] * n + [False]])
    struct = {"src": {"valid": valid, "dist": dist}, "tgt": {}}
    ctx = AttentionContext(Site("encoder", "self", 0), struct, torch.zeros(1, n + 1, dtype=torch.bool), False, False)
    ctx.q = torch.zeros(1, 1, n + 1, 8)
    plugin = UdiscalPlugin([0], 1.0)

    def row_sums(a: torch.Tensor) -> torch.Tensor:
        return on_probs(plugin, a[None, None], ctx)[0, 0, :n].sum(-1)  # rows of the real words

    uniform = row_sums(torch.full((n + 1, n + 1), 1.0 / (n + 1)))
    neighbourhood = row_sums(torch.softmax(-dist[0], -1))  # weight falling with tree distance
    parent = torch.zeros(n + 1, n + 1)
    parent[torch.arange(n), torch.tensor(heads)] = 1.0
    parent[1, 1] = 1.0  # the root's parent is itself (distance 0)
    parent_sums = row_sums(parent)
    n0, n1 = 1 / math.sqrt(2 * math.pi), math.exp(-0.5) / math.sqrt(2 * math.pi)
    for sums in (uniform, neighbourhood, parent_sums):
        assert float(sums.max()) <= n0 + 1e-6
    assert 0.2 < float(neighbourhood.mean()) < 0.35 and float(neighbourhood.min()) > 0.2
    assert parent_sums[[0, 2, 3, 4, 5, 6, 7, 8, 9]].tolist() == pytest.approx([n1] * 9)
    assert parent_sums[1] == pytest.approx(n0)
    assert 0.05 < float(uniform.mean()) < 0.2
    # the EOS key is scaled by N(0), like the token's own word
    a = torch.softmax(-dist[0], -1)
    assert on_probs(plugin, a[None, None], ctx)[0, 0, 0, n] == pytest.approx(float(a[0, n]) * n0)


@pytest.mark.parametrize("mask", ["binary", "scaled", "normal"])
def test_sasa_equals_a_times_the_scene_mask(mask):
    vanilla, model = twin_models([{"name": "sasa", "layers": [3], "heads": [1], "mask": mask}])
    batch = make_batch()
    a = probs(vanilla, batch, 2)
    st = batch.struct["src"]
    inside = st["scene_mask"]
    if mask == "binary":
        m = inside.float()
    elif mask == "scaled":
        m = torch.where(inside, 1.0, 0.1)
    else:  # f_norm(c·d) with sigma = 1/sqrt(2 pi): 1 at distance 0
        sigma = 1 / math.sqrt(2 * math.pi)
        m = torch.where(inside, 1.0, gauss(math.sqrt(0.5) * st["scene_dist"], sigma ** 2))
    expected = a.clone()
    expected[:, 1] = a[:, 1] * m
    got = probs(model, batch, 2)
    torch.testing.assert_close(got, expected)
    torch.testing.assert_close(got[1, 1, 3], a[1, 1, 3])  # w3 of B is in no scene: its row is untouched
    if mask == "binary":
        assert (got[0, 1, 0, 4:7] == 0).all()  # w0 shares no scene with w3, w4
        assert got[0, 1, 0, 7] == a[0, 1, 0, 7]  # the EOS column is untouched
    assert build_methods(model_cfg([{"name": "sasa", "layers": [1], "mask": mask}]))[0].needs["src"] == (
        ("scene_mask", "scene_dist") if mask == "normal" else ("scene_mask",))


def test_two_methods_in_different_heads_of_one_layer_each_change_only_their_head():
    vanilla, model = twin_models([{"name": "udiscal", "layers": [1], "heads": [0]},
                                  {"name": "sasa", "layers": [1], "heads": [2]}])
    batch = make_batch()
    a = probs(vanilla, batch, 0)
    got = probs(model, batch, 0)
    st = batch.struct["src"]
    ok = rows(batch)[:, 0]
    torch.testing.assert_close(got[:, 0], torch.where(ok, a[:, 0] * gauss(st["dist"], 1.0), a[:, 0]))
    torch.testing.assert_close(got[:, 2], a[:, 2] * st["scene_mask"].float())
    torch.testing.assert_close(got[:, [1, 3]], a[:, [1, 3]])


# ---------------------------------------------------------------------------
# SACrA


@pytest.mark.parametrize("normalise", ["scene", "sentence"])
def test_sacra_keys_are_the_projection_of_the_masked_mean(normalise):
    batch = make_batch()
    attn = MultiHeadAttention(32, H, 0.0, Site("decoder", "cross", 1))
    x = torch.randn(2, L, 32)
    k = attn.project_keys(x)
    ctx = AttentionContext(attn.site, batch.struct, batch.src_pad, False, False, key_input=x,
                           key_proj=attn.project_keys)
    got = SacraPlugin([1], normalise).keys(k, ctx)
    st = batch.struct["src"]
    avg = x.clone()
    for b in range(2):
        real = [j for j in range(L) if st["valid"][b, j]]
        for i in real:
            members = [j for j in real if st["scene_mask"][b, i, j]]
            denom = len(members) if normalise == "scene" else len(real)
            avg[b, i] = sum(x[b, j] for j in members) / denom
    torch.testing.assert_close(got[:, 1], attn.project_keys(avg)[:, 1])
    torch.testing.assert_close(got[:, [0, 2, 3]], k[:, [0, 2, 3]])
    torch.testing.assert_close(got[:, 1, 7], k[:, 1, 7])  # EOS (A) and padding (B) keep their own state
    # A's w0 and w1 share exactly the scene set {0}: the same key; w0 and w3 do not
    torch.testing.assert_close(got[0, 1, 0], got[0, 1, 1])
    assert not torch.allclose(got[0, 1, 0], got[0, 1, 4])


def test_sacra_cached_decoding_equals_full_decoding():
    _, model = twin_models([{"name": "sacra"}])
    batch = make_batch()
    enc = model.encode(batch.src, batch.struct)
    full = model.decode(batch.tgt_in, enc)
    cache = model.new_cache()
    steps = [model.decode(batch.tgt_in[:, t: t + 1], enc, cache=cache) for t in range(batch.tgt_in.size(1))]
    real = ~batch.tgt_pad  # incremental decoding never masks padding: compare real positions
    torch.testing.assert_close(torch.cat(steps, 1)[real], full[real], atol=1e-5, rtol=1e-5)
    vanilla_logits = Transformer(model_cfg([]), V, V).eval()
    vanilla_logits.load_state_dict(model.state_dict())
    assert not torch.allclose(vanilla_logits(batch).logits, model(batch).logits)


# ---------------------------------------------------------------------------
# configs


@pytest.mark.parametrize("entry, field", [
    ({"name": "pascal", "stack": "decoder"}, "stack"),
    ({"name": "pascal", "parent_ignoring": 1.5}, "parent_ignoring"),
    ({"name": "pascal", "variance": 0}, "variance"),
    ({"name": "deps_san", "scaling": False}, "scaling"),
    ({"name": "deps_san", "scaling": False, "wink_sparsing": True, "rs_sparsing": True}, "rs_sparsing"),
    ({"name": "deps_san", "sigma": 1.0}, "sigma"),
    ({"name": "sasa", "layers": [1], "c": 0.1}, "c"),
    ({"name": "sasa", "layers": [1], "mask": "scaled", "c": 2.0}, "c"),
    ({"name": "sasa"}, "layers"),  # the paper's layer 4 does not exist in a 3-layer encoder
    ({"name": "sacra", "attention": "self"}, "attention"),
    ({"name": "udiscal", "heads": [4]}, "heads"),
])
def test_bad_method_fields_are_refused_by_name(entry, field):
    with pytest.raises(ConfigError) as err:
        build_methods(model_cfg([entry]))
    assert err.value.field is not None and err.value.field.endswith(field)
