"""The baselines of the papers' tables: localness, context-aware SAN, RPE, S&H labels, C&H recipe.

Every formula is checked against a direct computation on a small hand-built batch, every
parameter count against its closed form, and every method trains a step and translates
with only the fields it has at translation time. The batch: sentence A has 5 sub-words +
EOS; sentence B has 3 sub-words + EOS + 2 padding.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from structnmt.config import ModelConfig, load_config
from structnmt.data.batch import BOS_ID, EOS_ID, PAD_ID, Batch
from structnmt.errors import ConfigError, DataError
from structnmt.model.losses import label_smoothed_nll
from structnmt.model.methods import AttentionContext, Site, build_methods
from structnmt.model.methods.localness import LocalnessPlugin
from structnmt.model.methods.relative_position import RelativeKeysValuesPlugin
from structnmt.model.search import greedy_search
from structnmt.model.transformer import Transformer

ROOT = Path(__file__).resolve().parents[1]
V, L, H, D = 30, 6, 4, 32
DH = D // H
LENGTHS = [6, 4]  # real positions (sub-words + EOS) of A and B
LABELS = [[3, 1, 4, 1, 5], [2, 6, 2]]


def make_batch(with_target: bool = True) -> Batch:
    g = torch.Generator().manual_seed(7)
    src = torch.full((2, L), PAD_ID, dtype=torch.long)
    valid = torch.zeros(2, L, dtype=torch.bool)
    labels = torch.zeros(2, L, dtype=torch.long)
    for b, n in enumerate(LENGTHS):
        src[b, : n - 1] = torch.randint(4, V, (n - 1,), generator=g)
        src[b, n - 1] = EOS_ID
        valid[b, : n - 1] = True
        labels[b, : n - 1] = torch.tensor(LABELS[b])
    struct = {"src": {"valid": valid, "labels": labels}, "tgt": {}}
    if not with_target:
        return Batch(src, struct=struct)
    tgt = torch.randint(4, V, (2, 4), generator=g)
    tgt[1, 2:] = PAD_ID
    tgt_in = torch.cat([torch.full((2, 1), BOS_ID), tgt], 1)
    tgt_out = torch.cat([tgt, torch.zeros(2, 1, dtype=torch.long)], 1)
    tgt_out[torch.arange(2), tgt.ne(PAD_ID).sum(1)] = EOS_ID
    return Batch(src, tgt_in, tgt_out, struct)


def model_cfg(methods: list[dict]) -> ModelConfig:
    return ModelConfig(enc_layers=3, dec_layers=2, d_model=D, n_heads=H, d_ff=64, dropout=0.0, methods=methods)


def twin_models(methods: list[dict]) -> tuple[Transformer, Transformer]:
    """A vanilla model and one with ``methods`` that shares every vanilla weight."""
    vanilla = Transformer(model_cfg([]), V, V).eval()
    model = Transformer(model_cfg(methods), V, V).eval()
    missing, unexpected = model.load_state_dict(vanilla.state_dict(), strict=False)
    assert not unexpected and missing  # only the method's own parameters are new
    return vanilla, model


def added_parameters(methods: list[dict]) -> int:
    vanilla, model = twin_models(methods)
    return model.num_parameters() - vanilla.num_parameters()


def layer_inputs(model: Transformer, batch: Batch) -> list[torch.Tensor]:
    """What each encoder self-attention really receives, from one forward pass."""
    seen: dict[int, torch.Tensor] = {}
    handles = [layer.self_attn.register_forward_pre_hook(lambda mod, args, i=i: seen.__setitem__(i, args[0]))
               for i, layer in enumerate(model.encoder)]
    model(batch)
    for handle in handles:
        handle.remove()
    return [seen[i] for i in range(len(model.encoder))]


def split(x: torch.Tensor) -> torch.Tensor:
    return x.view(x.size(0), x.size(1), H, DH).transpose(1, 2)


def qkv(model: Transformer, layer: int, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
    q, k, v = model.encoder[layer].self_attn.qkv_proj(x).chunk(3, dim=-1)
    return split(q), split(k), split(v)


def probs(model: Transformer, batch: Batch, layer: int) -> torch.Tensor:
    key = ("encoder", layer, "self", "probs")
    return model(batch, record={key}).records[key]


def masked_softmax(s: torch.Tensor, batch: Batch) -> torch.Tensor:
    return torch.softmax(s.masked_fill(batch.src_pad[:, None, None, :], float("-inf")), -1)


def heads_mask(heads: list[int]) -> torch.Tensor:
    return torch.tensor([h in heads for h in range(H)]).view(1, H, 1, 1)


# ---------------------------------------------------------------------------
# localness


def test_localness_bias_with_zero_weights_is_a_gaussian_around_the_middle():
    plugin = LocalnessPlugin([0, 2], H, DH, "fixed", window=2.0)
    torch.nn.init.zeros_(plugin.w_p.weight)  # tanh(0) = 0 -> sigmoid(0) = 1/2 -> P = I/2
    batch = make_batch()
    ctx = AttentionContext(Site("encoder", "self", 0), batch.struct, batch.src_pad, False, False)
    ctx.q, ctx.k = torch.randn(2, H, L, DH), torch.randn(2, H, L, DH)
    g = plugin.term(ctx)
    j = torch.arange(L, dtype=torch.float)
    for b, n in enumerate(LENGTHS):  # sigma = D/2 = 1: G = -(j - n/2)^2 / 2
        torch.testing.assert_close(g[b, 0], (-(j - n / 2) ** 2 / 2).expand(L, L))
        torch.testing.assert_close(g[b, 2], g[b, 0])
    assert (g[:, [1, 3]] == 0).all()  # other heads untouched
    assert g[0, 0, 0].argmax() == 3 and g[1, 0, 0].argmax() == 2


@pytest.mark.parametrize("variant", ["fixed", "layer", "query"])
def test_localness_in_the_model_equals_the_formula(variant):
    vanilla, model = twin_models([{"name": "localness", "variant": variant, "window": 3.0, "heads": [1, 2]}])
    batch = make_batch()
    q, k, _ = qkv(model, 0, layer_inputs(model, batch)[0])
    plugin = model.encoder[0].self_attn.plugins[0]
    n = torch.tensor(LENGTHS, dtype=torch.float).view(2, 1, 1)
    hidden = torch.tanh(q @ plugin.w_p.weight.T)
    center = n * torch.sigmoid(hidden @ plugin.v_p.weight[0])  # (B, H, I)
    if variant == "fixed":
        window = torch.full_like(center, 3.0)
    elif variant == "query":
        window = n * torch.sigmoid(hidden @ plugin.v_d.weight[0])
    else:
        real = (~batch.src_pad)[:, None, :, None].float()
        k_mean = (k * real).sum(2) / real.sum(2)  # (B, H, d_head)
        window = (n[:, :, 0] * torch.sigmoid(torch.tanh(k_mean @ plugin.w_d.weight.T) @ plugin.v_d.weight[0]))
        window = window[:, :, None].expand_as(center)
    j = torch.arange(L, dtype=torch.float)
    gauss = -((j - center[..., None]) ** 2) / (2 * (window[..., None] / 2) ** 2)
    s = q @ k.transpose(-1, -2) / math.sqrt(DH)
    expected = masked_softmax(torch.where(heads_mask([1, 2]), s + gauss, s), batch)
    torch.testing.assert_close(probs(model, batch, 0), expected, atol=1e-5, rtol=1e-5)
    # the fused path (no weights recorded) computes the same model
    explicit = model(batch, record={("encoder", 0, "self", "probs")}).logits
    torch.testing.assert_close(model(batch).logits, explicit, atol=1e-5, rtol=1e-5)


def test_localness_parameter_counts():
    per_layer = {"fixed": DH * DH + DH, "layer": 2 * (DH * DH + DH), "query": DH * DH + 2 * DH}
    for variant, count in per_layer.items():
        assert added_parameters([{"name": "localness", "variant": variant, "layers": [1, 2]}]) == 2 * count


# ---------------------------------------------------------------------------
# context-aware self-attention


def expected_context_probs(model: Transformer, batch: Batch, variant: str, layer: int,
                           heads: list[int]) -> torch.Tensor:
    xs = layer_inputs(model, batch)
    real = (~batch.src_pad)[:, :, None].float()

    def mean(x: torch.Tensor) -> torch.Tensor:
        return ((x * real).sum(1, keepdim=True) / real.sum(1, keepdim=True)).expand_as(x)

    if variant == "global":
        c = mean(xs[layer])
    elif variant == "deep":
        c = torch.cat(xs[: layer + 1], -1)
    else:
        c = torch.cat([mean(x) for x in xs[: layer + 1]], -1)
    plugin = model.encoder[layer].self_attn.plugins[0]
    q, k, _ = qkv(model, layer, xs[layer])

    def mix(x: torch.Tensor, u: torch.Tensor, v_x: torch.Tensor, v_c: torch.Tensor) -> torch.Tensor:
        out = x.clone()
        for slot, h in enumerate(heads):
            c_hat = (c @ u.T)[..., slot * DH: (slot + 1) * DH]  # (B, I, d_head)
            lam = torch.sigmoid(x[:, h] @ v_x[slot] + c_hat @ v_c[slot])[..., None]
            out[:, h] = (1 - lam) * x[:, h] + lam * c_hat
        return out

    q_hat = mix(q, plugin.u_q.weight, plugin.v["q_h"], plugin.v["q_c"])
    k_hat = mix(k, plugin.u_k.weight, plugin.v["k_h"], plugin.v["k_c"])
    return masked_softmax(q_hat @ k_hat.transpose(-1, -2) / math.sqrt(DH), batch)


@pytest.mark.parametrize("variant", ["global", "deep", "deep_global"])
def test_context_aware_in_the_model_equals_the_formula(variant):
    heads = [0, 3]
    _, model = twin_models([{"name": "context_aware", "variant": variant, "layers": [1, 2], "heads": heads}])
    batch = make_batch()
    for layer in (0, 1):  # layer 2 (index 1) of the deep variants stacks layers 1 and 2
        expected = expected_context_probs(model, batch, variant, layer, heads)
        torch.testing.assert_close(probs(model, batch, layer), expected, atol=1e-5, rtol=1e-5)
    assert not model.methods[0].stash  # no activations kept after the pass


def test_context_aware_parameter_counts_and_layer_check():
    for variant in ("global", "deep", "deep_global"):
        d_c = [D, D, D] if variant == "global" else [D, 2 * D, 3 * D]
        expected = sum(2 * dc * 2 * DH + 4 * 2 * DH for dc in d_c)  # heads [0, 1]: 2 heads
        got = added_parameters([{"name": "context_aware", "variant": variant, "layers": [1, 2, 3], "heads": 2}])
        assert got == expected
    with pytest.raises(ConfigError, match="layers"):
        build_methods(model_cfg([{"name": "context_aware", "variant": "deep", "layers": [2, 3]}]))
    build_methods(model_cfg([{"name": "context_aware", "variant": "global", "layers": [2, 3]}]))  # fine
    with pytest.raises(ConfigError, match="encoder"):
        build_methods(model_cfg([{"name": "context_aware", "stack": "decoder"}]))


# ---------------------------------------------------------------------------
# relative position representations


def test_relative_position_scores_and_output_equal_the_pairwise_formula():
    clip, heads = 2, [1, 3]
    plugin = RelativeKeysValuesPlugin(heads, DH, clip)
    b, i, j, offset = 2, 3, 7, 4  # three query rows at positions 4..6 of a 7-key sequence
    ctx = AttentionContext(Site("decoder", "self", 0), {}, None, True, False, q_offset=offset)
    ctx.q, ctx.k = torch.randn(b, H, i, DH), torch.randn(b, H, j, DH)
    s = torch.randn(b, H, i, j)
    a = torch.softmax(torch.randn(b, H, i, j), -1)
    got_s, got_z = plugin.scores(s, ctx), plugin.extra_output(a, ctx)
    want_s, want_z = s.clone(), torch.zeros(b, H, i, DH)
    for h in heads:
        for row in range(i):
            for col in range(j):
                r = max(-clip, min(clip, col - (row + offset))) + clip
                want_s[:, h, row, col] += ctx.q[:, h, row] @ plugin.rel_k.weight[r] / math.sqrt(DH)
                want_z[:, h, row] += a[:, h, row, col, None] * plugin.rel_v.weight[r]
    torch.testing.assert_close(got_s, want_s)
    torch.testing.assert_close(got_z, want_z)


def test_relative_position_incremental_decoding_matches_teacher_forcing():
    _, model = twin_models([{"name": "relative_position", "stack": "decoder", "layers": [1, 2], "clip": 2}])
    batch = make_batch()
    enc = model.encode(batch.src, batch.struct)
    full = model.decode(batch.tgt_in[:1], enc.index_select(torch.tensor([0])))
    cache = model.new_cache()
    enc0 = enc.index_select(torch.tensor([0]))
    steps = [model.decode(batch.tgt_in[:1, t: t + 1], enc0, cache=cache) for t in range(batch.tgt_in.size(1))]
    torch.testing.assert_close(torch.cat(steps, 1), full, atol=1e-5, rtol=1e-5)


def test_relative_position_parameter_counts():
    k = 3
    both = added_parameters([{"name": "relative_position", "layers": [1, 2, 3], "clip": k},
                             {"name": "relative_position", "stack": "decoder", "layers": [2], "clip": k}])
    assert both == 4 * (2 * k + 1) * DH * 2
    keys_only = added_parameters([{"name": "relative_position", "layers": [1], "clip": k, "values": False}])
    assert keys_only == (2 * k + 1) * DH
    with pytest.raises(ConfigError, match="self-attention"):
        build_methods(model_cfg([{"name": "relative_position", "stack": "decoder", "attention": "cross"}]))


# ---------------------------------------------------------------------------
# S&H label embeddings


def test_sh_labels_replace_the_last_dims_of_real_source_tokens_only():
    d_label = 5
    vanilla, model = twin_models([{"name": "sh_labels", "n_labels": 8, "d_label": d_label}])
    batch = make_batch()
    method = model.methods[0]
    x = vanilla.src_embed(batch.src) * math.sqrt(D)
    got = method.embed(x, "src", batch.struct["src"])
    valid = batch.struct["src"]["valid"]
    torch.testing.assert_close(got[..., : D - d_label], x[..., : D - d_label])
    for b, labels in enumerate(LABELS):
        for t, lab in enumerate(labels):
            torch.testing.assert_close(got[b, t, D - d_label:], method.table.weight[lab] * math.sqrt(D))
    torch.testing.assert_close(got[~valid], x[~valid])  # EOS and padding keep their embedding
    assert method.embed(x, "tgt", batch.struct["src"]) is x  # target side untouched
    assert added_parameters([{"name": "sh_labels", "n_labels": 8, "d_label": d_label}]) == 8 * d_label


def test_sh_labels_refuse_unknown_ids_and_impossible_sizes():
    _, model = twin_models([{"name": "sh_labels", "n_labels": 6}])  # LABELS hold id 6
    with pytest.raises(ConfigError, match="n_labels"):
        model(make_batch())
    batch = make_batch()
    del batch.struct["src"]["labels"]
    _, ok = twin_models([{"name": "sh_labels"}])
    with pytest.raises(DataError, match="labels"):
        ok(batch)
    with pytest.raises(ConfigError, match="d_label"):
        build_methods(model_cfg([{"name": "sh_labels", "d_label": D}]))
    with pytest.raises(ConfigError, match="encoder"):
        build_methods(model_cfg([{"name": "sh_labels", "stack": "decoder"}]))


def test_sh_labels_refuse_a_dataset_with_more_labels_before_training(tmp_path):
    """The check that lets the per-batch one be skipped under torch.compile."""
    import json

    from structnmt.training.checks import check_methods_against_dataset

    _, model = twin_models([{"name": "sh_labels", "n_labels": 6}])
    (tmp_path / "meta.json").write_text(json.dumps({"labels": [f"l{i}" for i in range(6)]}))
    check_methods_against_dataset(model, tmp_path)  # six labels fit a table of six
    (tmp_path / "meta.json").write_text(json.dumps({"labels": [f"l{i}" for i in range(7)]}))
    with pytest.raises(ConfigError, match="7 dependency labels.*at least 7"):
        check_methods_against_dataset(model, tmp_path)


# ---------------------------------------------------------------------------
# every baseline trains and translates with its inference fields only

ALL = [
    [{"name": "localness", "variant": "fixed"}],
    [{"name": "localness", "variant": "layer", "layers": [1, 2]}],
    [{"name": "localness", "variant": "query"}],
    [{"name": "context_aware", "variant": "global"}],
    [{"name": "context_aware", "variant": "deep"}],
    [{"name": "context_aware", "variant": "deep_global", "layers": [1, 2]}],
    [{"name": "relative_position"}, {"name": "relative_position", "stack": "decoder", "layers": [1, 2]}],
    [{"name": "sh_labels", "n_labels": 16}],
]


@pytest.mark.parametrize("methods", ALL, ids=lambda m: "+".join(e["name"] + e.get("variant", "") for e in m))
def test_trains_a_step_and_decodes_greedily(methods):
    model = Transformer(model_cfg(methods), V, V).train()
    batch = make_batch()
    out = model(batch)
    loss, _ = label_smoothed_nll(out.logits, batch.tgt_out, 0.1)
    loss.backward()
    own = [p for name, p in model.named_parameters() if "plugins" in name or "method_modules" in name]
    assert own and all(p.grad is not None and p.grad.abs().sum() > 0 for p in own)
    needs = model.structure_needs(inference=True)["src"]
    src = make_batch(with_target=False)
    src.struct = {"src": {f: v for f, v in src.struct["src"].items() if f in needs | {"valid"}}, "tgt": {}}
    hyps = greedy_search(model, src, max_len_a=0.0, max_len_b=4)
    assert len(hyps) == 2 and all(len(h[0].tokens) <= 4 for h in hyps)


# ---------------------------------------------------------------------------
# recipes


RECIPES = ["localness", "localness_layer", "localness_query", "context_global", "context_deep",
           "context_deep_global", "rpe", "sh_labels", "ch_multitask"]


@pytest.mark.parametrize("name", RECIPES)
def test_recipes_validate(name):
    cfg = load_config(ROOT / "configs" / f"multi30k_en_de_{name}.yaml")
    assert cfg.training.out_dir == f"runs/multi30k_en_de_{name}"
    methods = build_methods(cfg.model)
    if name == "ch_multitask":
        assert cfg.data.multitask_parse and cfg.data.dir != "data/multi30k_en_de" and not methods
    else:
        assert methods and not cfg.data.multitask_parse
