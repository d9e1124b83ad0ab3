"""Multi-head attention that runs structure-aware plug-ins.

A layer computes its attention by one of three routes, which give the same function (tests
check it): PyTorch's ``scaled_dot_product_attention`` with the plug-ins' terms in a float mask
(``"sdpa"``), FlexAttention with their score functions (``"flex"``), or step by step with the
explicit (B, H, I, J) score and weight matrices (``"explicit"``). Each plug-in declares one
:class:`~structnmt.model.methods.base.Effect`; which routes a layer can take follows from its
plug-ins' effects, decided once when the plug-ins are attached:

==============  ========  =====  ====
effect          explicit  sdpa   flex
==============  ========  =====  ====
QUERY_KEY       yes       yes    yes
ADDITIVE        yes       yes    yes (the term gathered cell by cell)
SCORE_FN        yes       no     yes
PROB_SCALE      yes       yes    no  (SDPA only where the plug-in sets ``scale_at_most_one``)
EXPLICIT        yes       no     no
==============  ========  =====  ====

``model.attention_kernel`` says which route a layer prefers; a layer that cannot take it falls
back along ``flex -> sdpa -> explicit``:

* ``explicit``: always the explicit route.
* ``sdpa``: SDPA wherever the layer's effects allow it.
* ``flex``: FlexAttention where it can run (not in training with attention dropout, which it
  lacks; heads of at least 16 dimensions on CUDA; forward only on the CPU), else as ``sdpa``.
* ``auto``: as ``sdpa``, except on a CPU, which takes the explicit route for bf16/fp16 (PyTorch's
  CPU kernel is slower there than three plain ops at NMT shapes) and for layers that scale scores
  or weights (no faster fused there at Multi30k's lengths: docs/benchmarks.md), so that CPU
  training keeps its numerics. FlexAttention is never the default: its compiled kernel for a
  Wink mask can ask for more shared memory than a GPU has (docs/benchmarks.md, GPU smoke test).

Whatever the preference, a layer whose ``"probs"`` someone records (a loss, an analysis) runs
explicitly for that call.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from structnmt.model.methods.base import (
    AttentionContext,
    AttentionPlugin,
    Effect,
    RecordKey,
    ScoreMod,
    Site,
    check_declaration,
)

try:  # FlexAttention: torch >= 2.5
    from torch.nn.attention.flex_attention import flex_attention as _flex_attention
except ImportError:  # pragma: no cover - older torch
    _flex_attention = None

#: FlexAttention compiled once per process (CUDA): the eager version materialises the scores
_compiled_flex: Callable[..., Tensor] | None = None

ROUTES = ("explicit", "sdpa", "flex")
KERNELS = ("auto", "explicit", "sdpa", "flex")
#: compiled FlexAttention refuses narrower heads ("NYI: embedding dimension ... at least 16", torch 2.11)
FLEX_MIN_HEAD_DIM = 16


def flex_available() -> bool:
    """True if the installed torch has FlexAttention."""
    return _flex_attention is not None


def runs_on(plugin: AttentionPlugin, route: str) -> bool:
    """Whether ``route`` can compute ``plugin``'s effect (the table in the module docstring)."""
    effect = plugin.effect
    if route == "explicit" or effect is Effect.QUERY_KEY or effect is Effect.ADDITIVE:
        return True
    if route == "sdpa":
        return effect is Effect.PROB_SCALE and plugin.scale_at_most_one
    return effect is Effect.SCORE_FN


def scales(plugin: AttentionPlugin) -> bool:
    """A plug-in that scales scores or weights, or reads the matrices: explicit on the CPU under auto."""
    return plugin.effect in (Effect.SCORE_FN, Effect.PROB_SCALE, Effect.EXPLICIT)


def on_scores(plugin: AttentionPlugin, s: Tensor, ctx: AttentionContext) -> Tensor:
    """The scores ``s`` (B, H, I, J) after ``plugin``'s effect, as the explicit route applies it."""
    if plugin.effect is Effect.ADDITIVE:
        return s + plugin.term(ctx)
    if plugin.effect is Effect.SCORE_FN:
        return on_grid(plugin.score_fn(ctx), s)
    if plugin.effect is Effect.EXPLICIT:
        return plugin.scores(s, ctx)
    return s


def on_probs(plugin: AttentionPlugin, a: Tensor, ctx: AttentionContext) -> Tensor:
    """The weights ``a`` (B, H, I, J) after ``plugin``'s effect, as the explicit route applies it."""
    if plugin.effect is Effect.PROB_SCALE:
        return a * plugin.scale(ctx)
    if plugin.effect is Effect.EXPLICIT:
        return plugin.probs(a, ctx)
    return a


def on_grid(fn: ScoreMod, s: Tensor) -> Tensor:
    """A score function evaluated on every cell of ``s`` (B, H, I, J) at once: its 0-d indices
    become broadcast index grids, so one function serves FlexAttention and the explicit route."""
    b, h, i, j = s.shape
    dev = s.device
    return fn(s, torch.arange(b, device=dev).view(b, 1, 1, 1), torch.arange(h, device=dev).view(1, h, 1, 1),
              torch.arange(i, device=dev).view(1, 1, i, 1), torch.arange(j, device=dev).view(1, 1, 1, j))


def _cell(t: Tensor) -> Callable[[Tensor, Tensor, Tensor, Tensor], Tensor]:
    """``t[b, h, q, kv]`` of a tensor broadcastable to (B, H, I, J) (index 0 on its size-1 dims;
    fewer dims are the trailing ones, as broadcasting reads them)."""
    if t.dim() < 4:
        t = t.reshape((1,) * (4 - t.dim()) + tuple(t.shape))
    by_b, by_h, by_i, by_j = (size > 1 for size in t.shape)

    def cell(b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
        return t[b if by_b else 0, h if by_h else 0, q_idx if by_i else 0, kv_idx if by_j else 0]

    return cell


def gathered(term: Tensor) -> ScoreMod:
    """A score_mod that adds ``term`` (broadcastable to (B, H, I, J)) cell by cell."""
    cell = _cell(term)

    def mod(score: Tensor, b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
        return score + cell(b, h, q_idx, kv_idx)

    return mod


def _masked(allowed: Tensor) -> ScoreMod:
    """A score_mod that puts −inf where ``allowed`` (B|1, 1, I|1, J) is False (padding, causal)."""
    cell = _cell(allowed)

    def mod(score: Tensor, b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
        return torch.where(cell(b, h, q_idx, kv_idx), score, -float("inf"))

    return mod


def _flex_kernel(device: torch.device) -> Callable[..., Tensor]:
    """Compiled FlexAttention on CUDA; the eager one elsewhere (forward only: tests, analyses)."""
    global _compiled_flex
    assert _flex_attention is not None
    if device.type != "cuda" or torch.compiler.is_compiling():  # inside training.compile: traced as it is
        return _flex_attention
    if _compiled_flex is None:
        _compiled_flex = torch.compile(_flex_attention, dynamic=True)
    return _compiled_flex


class MultiHeadAttention(nn.Module):
    def __init__(self, d_model: int, n_heads: int, dropout: float, site: Site, kernel: str = "auto") -> None:
        super().__init__()
        if kernel not in KERNELS and kernel != "fused":
            raise ValueError(f"attention kernel must be one of {KERNELS}, got {kernel!r}")
        #: the route this layer prefers (``model.attention_kernel``; "fused" is the older name of "sdpa")
        self.kernel = "sdpa" if kernel == "fused" else kernel
        self.d_model = d_model
        self.n_heads = n_heads
        self.d_head = d_model // n_heads
        self.site = site
        self.dropout = dropout
        self.is_self = site.attention == "self"
        if self.is_self:
            self.qkv_proj = nn.Linear(d_model, 3 * d_model)
        else:
            self.q_proj = nn.Linear(d_model, d_model)
            self.kv_proj = nn.Linear(d_model, 2 * d_model)
        self.out_proj = nn.Linear(d_model, d_model)
        self.plugins = nn.ModuleList()
        self._qk: list[AttentionPlugin] = []  # the QUERY_KEY plug-ins, in order
        #: the routes the plug-ins' effects allow, and whether one scales (see add_plugin)
        self.allowed = set(ROUTES)
        self._scales = False

    def add_plugin(self, plugin: AttentionPlugin) -> None:
        """Attach a plug-in; which routes the layer can take follows from its effect, here, once
        (not in every call: the decoder step picks a route per layer and token)."""
        check_declaration(plugin)
        self.plugins.append(plugin)
        if plugin.effect is Effect.QUERY_KEY:
            self._qk.append(plugin)
        self.allowed = {route for route in self.allowed if runs_on(plugin, route)}
        self._scales = self._scales or scales(plugin)

    # -- projections ------------------------------------------------------------
    def _split(self, x: Tensor) -> Tensor:
        b, length, _ = x.shape
        return x.view(b, length, self.n_heads, self.d_head).transpose(1, 2)

    def project_keys(self, x: Tensor) -> Tensor:
        """Keys (B, H, J, d_head) of an input: what SACrA re-projects from scene-averaged states."""
        if self.is_self:
            w = self.qkv_proj.weight[self.d_model: 2 * self.d_model]
            b = self.qkv_proj.bias[self.d_model: 2 * self.d_model]
        else:
            w = self.kv_proj.weight[: self.d_model]
            b = self.kv_proj.bias[: self.d_model]
        return self._split(F.linear(x, w, b))

    def forward(
        self,
        x: Tensor,
        memory: Tensor | None = None,
        key_padding: Tensor | None = None,
        causal: bool = False,
        struct: dict[str, dict[str, Tensor]] | None = None,
        cache: dict[str, Any] | None = None,
        records: dict[RecordKey, Tensor] | None = None,
        requested: set[RecordKey] | frozenset = frozenset(),
        losses: dict[str, Tensor] | None = None,
    ) -> Tensor:
        """``x`` (B, I, d) queries; ``memory`` (B, J, d) for cross-attention.

        ``cache`` (incremental decoding) holds this layer's keys and values: for
        self-attention they grow by one position a step, for cross-attention they are
        computed once from the encoder output.
        """
        ctx = AttentionContext(
            self.site, struct or {}, key_padding, causal, self.training,
            records=records, requested=requested, losses=losses,
            key_input=x if self.is_self else memory, key_proj=self.project_keys,
            state=cache.setdefault("plugin_state", {}) if cache is not None else None,
        )
        q, k, v = self._project(x, memory, cache, ctx)
        if cache is not None and self.is_self:
            ctx.causal = causal and x.size(1) > 1  # one new query sees every cached key
        q, beams = self._fold_beams(q, k)
        for plugin in self._qk:
            q = plugin.queries(q, ctx)
        ctx.q, ctx.k, ctx.v = q, k, v

        route = self.route(q, k, v, ctx)
        if route == "flex":
            out = self._flex(q, k, v, key_padding, ctx.causal, ctx)
        elif route == "sdpa":
            out = self._sdpa(q, k, v, key_padding, ctx.causal, ctx)
        else:
            out = self._explicit(q, k, v, key_padding, ctx.causal, ctx)
        b, _, length, _ = out.shape
        out = out.transpose(1, 2).reshape(b * beams, length // beams, self.d_model)
        return self.out_proj(out)

    def _project(self, x: Tensor, memory: Tensor | None, cache: dict[str, Any] | None,
                 ctx: AttentionContext) -> tuple[Tensor, Tensor, Tensor]:
        """Queries, keys and values (B, H, ·, d_head); keys through the QUERY_KEY plug-ins, and the
        decoding cache read and extended (``ctx.q_offset`` set to the cached positions)."""
        if self.is_self:
            q, k, v = self.qkv_proj(x).chunk(3, dim=-1)
            q, k, v = self._split(q), self._split(k), self._split(v)
            for plugin in self._qk:
                k = plugin.keys(k, ctx)
            if cache is not None:
                if "k" in cache:
                    ctx.q_offset = cache["k"].size(2)
                    k = torch.cat([cache["k"], k], dim=2)
                    v = torch.cat([cache["v"], v], dim=2)
                cache["k"], cache["v"] = k, v
            return q, k, v
        q = self._split(self.q_proj(x))
        if cache is not None and "k" in cache:
            return q, cache["k"], cache["v"]
        k, v = self.kv_proj(memory).chunk(2, dim=-1)
        k, v = self._split(k), self._split(v)
        for plugin in self._qk:
            k = plugin.keys(k, ctx)
        if cache is not None:
            cache["k"], cache["v"] = k, v
        return q, k, v

    def _fold_beams(self, q: Tensor, k: Tensor) -> tuple[Tensor, int]:
        """Beam search's cross-attention: a sentence's beams become extra queries of its one copy
        of the source (B·beams, H, I, d) -> (B, H, beams·I, d). Returns the queries and the beams."""
        if self.is_self or k.size(0) == q.size(0):
            return q, 1
        if q.size(0) % k.size(0):
            raise ValueError(f"cross-attention got {q.size(0)} target rows for {k.size(0)} sources: "
                             "expected the same number, or a whole number of beams per source")
        beams = q.size(0) // k.size(0)
        n, heads, length, d_head = k.size(0), q.size(1), q.size(2), q.size(3)
        return q.view(n, beams, heads, length, d_head).transpose(1, 2).reshape(n, heads, beams * length, d_head), beams

    # -- the routes ---------------------------------------------------------------------
    def route(self, q: Tensor, k: Tensor, v: Tensor, ctx: AttentionContext) -> str:
        """Which route this call takes: ``"explicit"``, ``"sdpa"`` or ``"flex"`` (module docstring)."""
        if self.kernel == "explicit" or ctx.wants("probs"):
            return "explicit"
        if self.kernel == "flex" and "flex" in self.allowed and self._flex_runs(q, k, v):
            return "flex"
        if self.kernel == "auto" and q.device.type == "cpu" and (
                self._scales or q.dtype in (torch.bfloat16, torch.float16)):
            return "explicit"
        return "sdpa" if "sdpa" in self.allowed else "explicit"

    def _flex_runs(self, q: Tensor, k: Tensor, v: Tensor) -> bool:
        """Whether FlexAttention, asked for, can run this call (asked only then: the gradient scan
        below would otherwise cost every call, the decoder's steps included)."""
        if not flex_available() or (self.training and self.dropout > 0.0):
            return False  # FlexAttention has no dropout
        if q.device.type == "cuda":
            return self.d_head >= FLEX_MIN_HEAD_DIM  # the compiled kernel's limit
        grad = torch.is_grad_enabled() and (any(t.requires_grad for t in (q, k, v))
                                            or any(p.requires_grad for p in self.plugins.parameters()))
        return q.device.type == "cpu" and not grad  # no backward on the CPU

    def _allowed(self, key_padding: Tensor | None, causal: bool, i: int, j: int, device) -> Tensor | None:
        """Boolean mask (B|1, 1, I, J), True where a query may look at a key."""
        mask = None
        if key_padding is not None:
            mask = ~key_padding[:, None, None, :]
        if causal:
            tri = torch.ones(i, j, dtype=torch.bool, device=device).tril(j - i)
            mask = tri[None, None] if mask is None else mask & tri
        return mask

    def _sdpa(self, q: Tensor, k: Tensor, v: Tensor, key_padding: Tensor | None, causal: bool,
              ctx: AttentionContext) -> Tensor:
        """SDPA; the ADDITIVE terms go into the float mask. The PROB_SCALE factors M (0 ≤ M ≤ 1:
        plug-ins that set ``scale_at_most_one``) multiply the weights without renormalising them:
        every key is seen twice, with ``log M`` and its value, and with ``log(1 − M)`` and a zero
        value, so that ``softmax`` keeps the unscaled weights' denominator and the output is
        ``Σ_j A_ij M_ij v_j``."""
        bias = scale = None
        for plugin in self.plugins:
            if plugin.effect is Effect.ADDITIVE:
                term = plugin.term(ctx)
                bias = term if bias is None else bias + term
            elif plugin.effect is Effect.PROB_SCALE:
                factor = plugin.scale(ctx)
                scale = factor if scale is None else scale * factor
        p = self.dropout if self.training else 0.0
        if bias is None and key_padding is None and scale is None:
            # is_causal aligns the mask top-left: right only when queries and keys start together
            if not causal or q.size(2) == 1 or q.size(2) == k.size(2):
                return F.scaled_dot_product_attention(q, k, v, dropout_p=p, is_causal=causal and q.size(2) > 1)
            return F.scaled_dot_product_attention(
                q, k, v, attn_mask=self._allowed(None, True, q.size(2), k.size(2), q.device), dropout_p=p)
        allowed = self._allowed(key_padding, causal, q.size(2), k.size(2), q.device)
        if scale is not None:
            base = torch.zeros((), dtype=torch.float32, device=q.device) if bias is None else bias.float()
            if allowed is not None:
                base = base.masked_fill(~allowed, float("-inf"))
            scale = scale.float()
            kept, dropped = torch.broadcast_tensors(base + scale.log(), base + torch.log1p(-scale))
            shape = (q.size(0), q.size(1), q.size(2), k.size(2))
            mask = torch.cat([kept.expand(shape), dropped.expand(shape)], dim=-1).to(q.dtype)
            k2, v2 = torch.cat([k, k], dim=2), torch.cat([v, torch.zeros_like(v)], dim=2)
            return F.scaled_dot_product_attention(q, k2, v2, attn_mask=mask, dropout_p=p)
        if bias is None:
            mask: Tensor | None = allowed
        else:
            mask = bias.to(q.dtype)
            if allowed is not None:
                mask = mask.masked_fill(~allowed, float("-inf"))
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=p)

    def _flex(self, q: Tensor, k: Tensor, v: Tensor, key_padding: Tensor | None, causal: bool,
              ctx: AttentionContext) -> Tensor:
        """FlexAttention: the plug-ins' score functions and gathered terms in plug-in order, then the mask."""
        mods: list[ScoreMod] = []
        for plugin in self.plugins:
            if plugin.effect is Effect.SCORE_FN:
                mods.append(plugin.score_fn(ctx))
            elif plugin.effect is Effect.ADDITIVE:
                mods.append(gathered(plugin.term(ctx)))
        allowed = self._allowed(key_padding, causal, q.size(2), k.size(2), q.device)
        if allowed is not None:
            mods.append(_masked(allowed))

        def score_mod(score: Tensor, b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
            for mod in mods:
                score = mod(score, b, h, q_idx, kv_idx)
            return score

        return _flex_kernel(q.device)(q, k, v, score_mod=score_mod if mods else None)

    def _explicit(self, q: Tensor, k: Tensor, v: Tensor, key_padding: Tensor | None, causal: bool,
                  ctx: AttentionContext) -> Tensor:
        """Every effect on the full matrices, in plug-in order: terms added, score functions on
        the whole grid, weights scaled, explicit hooks called."""
        s = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(self.d_head)
        for plugin in self.plugins:
            s = on_scores(plugin, s, ctx)
        allowed = self._allowed(key_padding, causal, q.size(2), k.size(2), q.device)
        if allowed is not None:
            s = s.masked_fill(~allowed, float("-inf"))
        a = torch.softmax(s.to(torch.promote_types(s.dtype, torch.float32)), dim=-1).to(q.dtype)
        for plugin in self.plugins:
            a = on_probs(plugin, a, ctx)
        ctx.record("probs", a)
        out = torch.matmul(F.dropout(a, self.dropout, self.training), v)
        for plugin in self.plugins:
            if plugin.effect is Effect.EXPLICIT:
                extra = plugin.extra_output(a, ctx)
                if extra is not None:
                    out = out + extra
        return out
