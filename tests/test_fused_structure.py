"""Structure inside fused kernels: every route computes the same function from each plug-in's one effect.

A layer runs its plug-ins explicitly (the (B, H, I, J) scores and weights), through SDPA with a
float mask, or through FlexAttention (``structnmt/model/attention.py``), each route derived from
the :class:`~structnmt.model.methods.base.Effect` a plug-in declares. For every case of the
registry (``tests/registry_cases.py``, plus the variants below whose routes differ), the same
model and batch run through the explicit route and the fused one, in float32 with dropout 0:

* SDPA with a float mask: the logits and every parameter's gradient agree (rtol 1e-4), for every
  method whose effects SDPA takes (query/key changes, additive terms, probability scales ≤ 1);
* FlexAttention: the logits agree, forward only: torch 2.13 has no FlexAttention backward on the
  CPU ("FlexAttention does not support backward on CPU"), so the gradients of score functions are
  checked where a GPU runs ``benchmarks/gpu_smoke.py``, not here;
* cached decoding steps (queries at ``q_offset > 0``) agree on both routes;
* methods that read or replace weights (DBSA, SISA, SyncAttn, relative positions on values) stay
  explicit, and so does a layer whose probabilities are recorded; under ``auto`` the CPU keeps the
  explicit route for scalings and for bf16 (today's numerics).

Checked by mutation: a route deriving LPSI's term with its sign flipped fails the comparison
(``test_a_route_that_derives_a_term_wrongly_is_caught``).
"""

from __future__ import annotations

import warnings
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from structnmt.data.batch import BOS_ID
from structnmt.method_config import Site
from structnmt.model import attention as attention_module
from structnmt.model.attention import MultiHeadAttention, flex_available, runs_on, scales
from structnmt.model.losses import label_smoothed_nll
from structnmt.model.methods.base import AttentionPlugin, Effect, check_declaration
from structnmt.model.transformer import Transformer
from tests.registry_cases import (
    all_cases,
    batches,
    model_config,
    prepare_synthetic,
    registered_methods,
    vocab_size,
)

pytestmark = pytest.mark.usefixtures("one_thread")

#: variants whose routes differ from the registry cases' (values off, the other masks and windows)
EXTRA: dict[str, list[dict]] = {
    "relative_position_scores": [{"name": "relative_position", "layers": [1, 2], "values": False},
                                 {"name": "relative_position", "stack": "decoder", "layers": [1, 2],
                                  "values": False}],
    "deps_san_plain": [{"name": "deps_san", "layers": [1, 2]}],
    "deps_san_wink_only": [{"name": "deps_san", "layers": [1], "scaling": False, "wink_sparsing": True,
                            "wink_k": 2.0}],
    "sasa_binary": [{"name": "sasa", "layers": [1, 2], "heads": [0, 2]}],
    "sasa_scaled": [{"name": "sasa", "layers": [2], "mask": "scaled"}],
    "udiscal_all_heads": [{"name": "udiscal", "layers": [1, 2], "heads": "all"}],
    "localness_fixed": [{"name": "localness", "window": 3.0}],
    "localness_layer": [{"name": "localness", "variant": "layer", "layers": [1, 2], "heads": [1, 3]}],
    "local_window_decoder": [{"name": "local_window", "layers": [1, 2], "window": 1},
                             {"name": "local_window", "stack": "decoder", "layers": [1, 2], "heads": [0, 1]}],
    "lpsi_two_heads": [{"name": "lpsi", "heads": [1, 2], "layers": [1]}],
    "lpsi_and_window": [{"name": "lpsi", "layers": [1]}, {"name": "local_window", "layers": [1], "heads": [3]}],
    "pascal_and_wink": [{"name": "pascal"}, {"name": "deps_san", "layers": [1], "scaling": False,
                                             "wink_sparsing": True}],
    "pascal_and_localness": [{"name": "pascal"}, {"name": "localness", "window": 2.0}],  # order: S·N + G
}

#: how each registered method runs in a fused layer: SDPA and FlexAttention ("both"), FlexAttention
#: only (a scaling of the scores), SDPA only (a scaling of the weights), or neither ("explicit")
EXPECTED = {
    "context_aware": "both", "sacra": "both", "local_window": "both", "localness": "both", "lpsi": "both",
    "sh_labels": "both",  # no attention plug-in
    "deps_san": "flex", "pascal": "flex",  # the Wink mask alone: both (deps_san_wink_only)
    "sasa": "sdpa", "udiscal": "sdpa",
    "relative_position": "explicit",  # values: true (the default); values: false runs on both
    "dbsa": "explicit", "sisa": "explicit", "syncattn": "explicit",
}

CASES = {**all_cases(), **EXTRA}


@pytest.fixture(scope="module")
def dataset(tmp_path_factory) -> Path:
    return prepare_synthetic(tmp_path_factory.mktemp("fused"), train=40, test=12)


def attention_modules(model) -> list[MultiHeadAttention]:
    return [m for m in model.modules() if isinstance(m, MultiHeadAttention)]


def set_route(model, kernel: str) -> None:
    for attn in attention_modules(model):
        attn.kernel = kernel


@pytest.fixture
def routes(monkeypatch):
    """Every call's route, by attention module."""
    seen: dict[int, set[str]] = {}
    original = MultiHeadAttention.route

    def recording(self, q, k, v, ctx):
        route = original(self, q, k, v, ctx)
        seen.setdefault(id(self), set()).add(route)
        return route

    monkeypatch.setattr(MultiHeadAttention, "route", recording)
    return seen


def plugin_layers(model) -> list[MultiHeadAttention]:
    return [m for m in attention_modules(model) if len(m.plugins)]


def run(model, batch) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Logits and every parameter's gradient of the translation loss plus the method's own losses."""
    model.zero_grad(set_to_none=True)
    out = model(batch)
    loss, _ = label_smoothed_nll(out.logits, batch.tgt_out, 0.1)
    (loss + sum(out.losses.values())).backward()
    grads = {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}
    return out.logits.detach(), grads


def build(case: str, dataset: Path):
    torch.manual_seed(0)
    vocab = vocab_size(dataset)
    model = Transformer(model_config("vanilla", dropout=0.0, attention_dropout=0.0, methods=CASES[case]), vocab, vocab)
    model.eval()  # no RS-Sparsing / parent-ignoring draws: both routes see the same function
    for p in model.parameters():  # move every parameter off its initial value (U = I, zero biases, ...)
        p.data.add_(0.05 * torch.randn_like(p))
    return model, batches(dataset, "train", model, max_tokens=200)[0]


def case_runs_on(case: str, dataset: Path, route: str) -> bool:
    model, _ = build(case, dataset)
    layers = plugin_layers(model)
    return bool(layers) and all(runs_on(p, route) for m in layers for p in m.plugins)


def test_the_expected_routes_name_registered_methods():
    # a new method needs no line here: the equivalence tests below run it on whatever fused route
    # its plug-ins offer; EXPECTED pins the routes of the methods the papers define
    assert set(EXPECTED) <= registered_methods()


@pytest.mark.parametrize("case", sorted(CASES))
def test_classification_matches_the_plugins(dataset, case):
    model, _ = build(case, dataset)
    plugins = [p for m in plugin_layers(model) for p in m.plugins]
    if not plugins or len({e["name"] for e in CASES[case]}) > 1 or case in EXTRA:
        return  # combinations and variants: their own tests below
    if CASES[case][0]["name"] not in EXPECTED:
        return  # a method without a pinned route: checked by the equivalence tests alone
    kind = EXPECTED[CASES[case][0]["name"]]
    assert all(runs_on(p, "sdpa") for p in plugins) == (kind in ("both", "sdpa")), case
    assert all(runs_on(p, "flex") for p in plugins) == (kind in ("both", "flex")), case


@pytest.mark.parametrize("case", sorted(CASES))
def test_sdpa_route_gives_the_explicit_outputs_and_gradients(dataset, case, routes):
    if not case_runs_on(case, dataset, "sdpa"):
        pytest.skip("no SDPA form: stays explicit (test_non_additive_methods_stay_explicit)")
    model, batch = build(case, dataset)
    set_route(model, "explicit")
    logits, grads = run(model, batch)
    set_route(model, "sdpa")
    routes.clear()
    fused_logits, fused_grads = run(model, batch)
    assert all(routes[id(m)] == {"sdpa"} for m in plugin_layers(model))
    torch.testing.assert_close(fused_logits, logits, rtol=1e-4, atol=1e-5)
    assert fused_grads.keys() == grads.keys()
    for name, grad in grads.items():
        # float32 sums in another order in the fused kernel (AMX and AVX-512 machines differ from
        # AVX2 ones): the absolute tolerance scales with the gradient, a wrong bias moves it by far more
        atol = max(1e-6, 1e-4 * grad.abs().max().item())
        torch.testing.assert_close(fused_grads[name], grad, rtol=1e-4, atol=atol, msg=lambda m, n=name: f"{n}: {m}")


@pytest.mark.skipif(not flex_available(), reason="this torch has no torch.nn.attention.flex_attention")
@pytest.mark.parametrize("case", sorted(CASES))
def test_flex_route_gives_the_explicit_outputs(dataset, case, routes):
    if not case_runs_on(case, dataset, "flex"):
        pytest.skip("no FlexAttention form (a scaling of the weights, or explicit)")
    model, batch = build(case, dataset)
    set_route(model, "explicit")
    with torch.no_grad():  # FlexAttention's CPU kernel has no backward in torch 2.13
        logits = model(batch).logits
        set_route(model, "flex")
        routes.clear()
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*without torch.compile.*")
            flex_logits = model(batch).logits
    assert all(routes[id(m)] == {"flex"} for m in plugin_layers(model))
    torch.testing.assert_close(flex_logits, logits, rtol=1e-4, atol=1e-5)


def test_flex_on_the_cpu_refuses_gradients_so_the_route_avoids_it(dataset, routes):
    """What the installed torch supports: FlexAttention forward on the CPU, no backward; with
    gradients a forced flex layer falls back to SDPA where it can, explicit where it cannot."""
    model, batch = build("pascal_and_wink", dataset)
    set_route(model, "flex")
    routes.clear()
    run(model, batch)
    assert {r for m in plugin_layers(model) for r in routes[id(m)]} == {"explicit"}  # PASCAL: no SDPA form
    if flex_available():
        q = torch.randn(1, 1, 4, 8, requires_grad=True)
        with pytest.raises(NotImplementedError, match="backward on CPU"):
            attention_module._flex_attention(q, q, q)


@pytest.mark.parametrize("case", ["lpsi_mse", "relative_position_scores", "local_window_decoder", "udiscal",
                                  "sasa_binary", "localness_query"])
@pytest.mark.parametrize("fused_kernel", ["sdpa", "flex"])
def test_cached_decoding_steps_agree(dataset, case, fused_kernel):
    """Queries at ``q_offset > 0``: the decoder's cached steps on both routes."""
    if fused_kernel == "flex" and not flex_available():
        pytest.skip("this torch has no FlexAttention")
    model, _ = build(case, dataset)
    source = batches(dataset, "test", model, inference=True)[0]
    steps = {}
    for route in ("explicit", fused_kernel):
        set_route(model, route)
        with torch.no_grad(), warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*without torch.compile.*")
            enc = model.encode(source.src, {"src": source.struct["src"], "tgt": {}})
            cache = model.new_cache()
            tokens = torch.full((source.size, 1), BOS_ID, dtype=torch.long)
            out = []
            for _ in range(3):
                logits = model.decode(tokens[:, -1:], enc, cache=cache)[:, -1]
                out.append(logits)
                tokens = torch.cat([tokens, logits.argmax(-1, keepdim=True)], 1)
        steps[route] = torch.stack(out)
    torch.testing.assert_close(steps[fused_kernel], steps["explicit"], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("case", sorted(CASES))
def test_cached_decoding_computes_what_one_pass_over_the_prefix_computes(dataset, case):
    """For every registered method (a user's too, when STRUCTNMT_METHODS names it): decoding step
    by step from the cache, queries at ``q_offset > 0``, gives the logits of one causal pass over
    the whole prefix. A decoder plug-in that read its rows as starting at 0 would differ."""
    model, _ = build(case, dataset)
    source = batches(dataset, "test", model, inference=True)[0]
    generator = torch.Generator().manual_seed(1)
    prefix = torch.cat([torch.full((source.size, 1), BOS_ID, dtype=torch.long),
                        torch.randint(4, vocab_size(dataset), (source.size, 4), generator=generator)], 1)
    with torch.no_grad():
        enc = model.encode(source.src, {"src": source.struct["src"], "tgt": {}})
        full = model.decode(prefix, enc)
        cache = model.new_cache()
        steps = torch.cat([model.decode(prefix[:, t: t + 1], enc, cache=cache) for t in range(prefix.size(1))], 1)
    torch.testing.assert_close(steps, full, rtol=1e-4, atol=1e-5)


def test_a_term_of_fewer_dims_is_read_as_broadcasting_reads_it():
    """``term`` may return any shape broadcastable to (B, H, I, J), (I, J) included: FlexAttention's
    cell-by-cell reading gives what the explicit route's sum gives."""
    from structnmt.model.attention import gathered, on_grid

    scores = torch.randn(2, 3, 4, 5)
    for term in (torch.randn(4, 5), torch.randn(5), torch.randn(3, 1, 5), torch.randn(2, 1, 4, 1)):
        torch.testing.assert_close(on_grid(gathered(term), scores), scores + term)


def test_a_probability_scale_runs_on_sdpa_only_when_its_plugin_promises_m_at_most_one():
    """SDPA's form of A·M needs log(1 - M): a user's PROB_SCALE plug-in that does not promise
    0 <= M <= 1 stays on the explicit route (an M above 1 there would be NaN, not an error)."""
    from structnmt.model.methods.sasa import SasaPlugin
    from structnmt.model.methods.udiscal import UdiscalPlugin

    class Doubling(AttentionPlugin):
        effect = Effect.PROB_SCALE

        def scale(self, ctx):
            return torch.full((1,), 2.0)

    assert not runs_on(Doubling([0]), "sdpa") and runs_on(Doubling([0]), "explicit")
    assert runs_on(SasaPlugin([0], "binary", 1.0), "sdpa")
    assert runs_on(UdiscalPlugin([0], 1.0), "sdpa") and not runs_on(UdiscalPlugin([0], 0.1), "sdpa")


@pytest.mark.parametrize("case", ["dbsa", "sisa", "syncattn", "relative_position", "pascal", "deps_san_rs"])
def test_non_additive_methods_stay_explicit(dataset, case, routes):
    """Methods that read or replace the weights stay explicit on every route; a scaling of the scores
    (PASCAL, Deps-SAN) has no SDPA form, so it stays explicit wherever FlexAttention cannot run."""
    model, batch = build(case, dataset)
    set_route(model, "sdpa")
    routes.clear()
    run(model, batch)
    assert all(routes[id(m)] == {"explicit"} for m in plugin_layers(model))
    if case in ("pascal", "deps_san_rs"):
        assert all(runs_on(p, "flex") for m in plugin_layers(model) for p in m.plugins)
    else:
        assert not any(runs_on(p, "flex") or runs_on(p, "sdpa") for m in plugin_layers(model) for p in m.plugins)


def test_recorded_probabilities_and_auto_on_the_cpu_keep_the_explicit_route(dataset, routes):
    model, batch = build("lpsi_and_window", dataset)
    first = plugin_layers(model)[0]
    set_route(model, "sdpa")
    routes.clear()
    with torch.no_grad():
        model(batch, record={("encoder", 0, "self", "probs")})
    assert routes[id(first)] == {"explicit"}  # a record of the weights needs them
    set_route(model, "auto")
    routes.clear()
    with torch.no_grad():
        model(batch)
        assert routes[id(first)] == {"sdpa"}  # auto on the CPU in fp32: additive terms go fused
        routes.clear()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            model(batch)
        assert routes[id(first)] == {"explicit"}  # bf16 on the CPU: explicit is faster
    scaled, batch = build("sasa_binary", dataset)
    set_route(scaled, "auto")
    routes.clear()
    with torch.no_grad():
        scaled(batch)
    layers = plugin_layers(scaled)
    assert all(scales(p) for m in layers for p in m.plugins)
    assert all(routes[id(m)] == {"explicit"} for m in layers)  # a scaling on the CPU: today's numerics


def test_a_route_that_derives_a_term_wrongly_is_caught(dataset, monkeypatch):
    """The comparison above would fail if a route derived a plug-in's effect wrongly (here: SDPA
    taking LPSI's term with its sign flipped)."""
    from structnmt.model.methods.lpsi import SyntacticGatePlugin

    model, batch = build("lpsi_two_heads", dataset)
    set_route(model, "explicit")
    logits, _ = run(model, batch)
    right, sdpa = SyntacticGatePlugin.term, MultiHeadAttention._sdpa

    def wrong_sdpa(self, *args):
        with monkeypatch.context() as patch:
            patch.setattr(SyntacticGatePlugin, "term", lambda plugin, ctx: -right(plugin, ctx))
            return sdpa(self, *args)

    monkeypatch.setattr(MultiHeadAttention, "_sdpa", wrong_sdpa)
    set_route(model, "sdpa")
    wrong_logits, _ = run(model, batch)
    assert not torch.allclose(wrong_logits, logits, rtol=1e-4, atol=1e-5)


def test_every_registered_plugin_declares_one_effect_and_writes_only_its_hooks(dataset):
    for case in sorted(CASES):
        model, _ = build(case, dataset)  # building attaches the plug-ins, which checks each declaration
        for layer in plugin_layers(model):
            for plugin in layer.plugins:
                assert isinstance(plugin.effect, Effect), (case, type(plugin).__name__)


def test_a_plugin_writing_two_effects_or_none_is_refused():
    class TwoEffects(AttentionPlugin):
        effect = Effect.ADDITIVE

        def term(self, ctx):
            return torch.zeros(())

        def probs(self, a, ctx):
            return a

    class Silent(AttentionPlugin):
        effect = Effect.SCORE_FN

    with pytest.raises(TypeError, match=r"TwoEffects declares ADDITIVE but writes \['probs'\]"):
        check_declaration(TwoEffects([0]))
    with pytest.raises(TypeError, match="Silent declares SCORE_FN but writes none"):
        check_declaration(Silent([0]))
    layer = MultiHeadAttention(8, 2, 0.0, Site("encoder", "self", 0))
    with pytest.raises(TypeError):
        layer.add_plugin(TwoEffects([0]))
    assert len(layer.plugins) == 0


@pytest.mark.parametrize("effect,routes_allowed", [
    (Effect.QUERY_KEY, {"explicit", "sdpa", "flex"}),
    (Effect.ADDITIVE, {"explicit", "sdpa", "flex"}),
    (Effect.SCORE_FN, {"explicit", "flex"}),
    (Effect.PROB_SCALE, {"explicit", "sdpa"}),
    (Effect.EXPLICIT, {"explicit"}),
])
def test_the_routes_follow_from_the_declared_effect(effect, routes_allowed):
    plugin = SimpleNamespace(effect=effect, scale_at_most_one=True)
    assert {r for r in ("explicit", "sdpa", "flex") if runs_on(plugin, r)} == routes_allowed
    if effect is Effect.PROB_SCALE:  # a scale above 1 has no SDPA form (log(1 - M) is undefined)
        plugin.scale_at_most_one = False
        assert not runs_on(plugin, "sdpa")


@pytest.mark.parametrize("d_model,kernel,expected", [
    (64, "auto", "sdpa"),  # the default on CUDA: SDPA with the float mask, never FlexAttention
    (64, "flex", "flex"),  # asked for, with heads of 16
    (32, "flex", "sdpa"),  # heads of 8: compiled FlexAttention cannot run them (H100, torch 2.11)
    (64, "explicit", "explicit"),
])
def test_the_route_on_cuda_takes_flex_only_when_asked_and_heads_allow(d_model, kernel, expected, monkeypatch):
    """The route reads only the device type, dtype and gradients of its inputs: a CUDA tensor's
    stand-in checks the GPU's choice on a machine without one."""
    monkeypatch.setattr(attention_module, "flex_available", lambda: True)
    model = Transformer(model_config("vanilla", d_model=d_model, n_heads=4, dropout=0.0, attention_dropout=0.0,
                                     methods=[{"name": "local_window", "layers": [1]}]), 20, 20)
    layer = plugin_layers(model)[0]
    layer.kernel = kernel
    q = SimpleNamespace(device=torch.device("cuda"), dtype=torch.bfloat16, requires_grad=True)
    ctx = SimpleNamespace(wants=lambda what: False)
    assert layer.route(q, q, q, ctx) == expected
