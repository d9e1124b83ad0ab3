"""Multi-head attention that runs structure-aware plug-ins.

A layer computes its attention by one of three routes, which give the same function (tests
check it): PyTorch's ``scaled_dot_product_attention`` with the plug-ins' additive terms in a
float mask (``"sdpa"``), FlexAttention with the plug-ins' ``score_mod`` callables (``"flex"``),
or step by step with the explicit (B, H, I, J) score and weight matrices (``"explicit"``).

* Explicit whenever someone records the layer's ``"probs"`` (a loss, an analysis), a plug-in
  declares ``explicit = True`` (it reads or replaces scores or weights: DBSA's heads, relative
  positions on values), or ``model.attention_kernel`` asks for it. Under ``auto`` that is bf16/fp16
  on a CPU, where PyTorch's CPU kernel is slower than three plain ops at NMT shapes (in fp32
  and on CUDA the fused kernel is the faster one; figures in docs/benchmarks.md).
* A layer whose plug-ins only change queries/keys or add a ``bias`` takes SDPA, as before.
* A layer with *structural* plug-ins (a ``scores`` or ``probs`` hook that has a fused form:
  ``additive``, ``score_mod``, ``prob_scale``, see ``AttentionPlugin``) takes a fused route where
  one can run: SDPA with a float mask on CUDA (and on the CPU under ``fused``) where every plug-in
  has an ``additive`` or ``prob_scale`` form, else the explicit route. FlexAttention is
  taken only where a layer's ``fused_kernel`` asks for it: its compiled kernel for Deps-SAN's
  Wink mask can ask for more shared memory than a GPU has (docs/benchmarks.md, GPU smoke test),
  and it cannot compile heads narrower than 16, so it is not a
  default until a GPU run shows every method through it. Under ``auto`` such a layer stays
  explicit on the CPU: SDPA with a mask that needs gradients is no faster there at Multi30k's
  lengths (docs/benchmarks.md), and FlexAttention has no backward on the CPU, so the CPU keeps
  today's numerics; ``fused`` takes the fused route on the CPU too.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from structnmt.model.methods.base import AttentionContext, AttentionPlugin, RecordKey, ScoreMod, Site

try:  # FlexAttention: torch >= 2.5
    from torch.nn.attention.flex_attention import flex_attention as _flex_attention
except ImportError:  # pragma: no cover - older torch
    _flex_attention = None

#: FlexAttention compiled once per process (CUDA): the eager version materialises the scores
_compiled_flex: Callable[..., Tensor] | None = None

ROUTES = ("explicit", "sdpa", "flex")
#: compiled FlexAttention refuses narrower heads ("NYI: embedding dimension ... at least 16", torch 2.11)
FLEX_MIN_HEAD_DIM = 16


def flex_available() -> bool:
    """True if the installed torch has FlexAttention."""
    return _flex_attention is not None


def _overrides(plugin: AttentionPlugin, hook: str) -> bool:
    return getattr(type(plugin), hook) is not getattr(AttentionPlugin, hook)


def structural(plugin: AttentionPlugin) -> bool:
    """True if the plug-in changes scores or weights by a hook that needs a fused form."""
    return _overrides(plugin, "scores") or _overrides(plugin, "probs")


def sdpa_form(plugin: AttentionPlugin) -> bool:
    """True if SDPA with a float mask can run the plug-in (its hooks' additive / prob_scale forms)."""
    if plugin.explicit:
        return False
    if _overrides(plugin, "scores") and not _overrides(plugin, "additive"):
        return False
    return not _overrides(plugin, "probs") or _overrides(plugin, "prob_scale")


def flex_form(plugin: AttentionPlugin) -> bool:
    """True if FlexAttention can run the plug-in (a score_mod, or an additive term it gathers)."""
    if plugin.explicit or _overrides(plugin, "probs"):
        return False
    return not _overrides(plugin, "scores") or _overrides(plugin, "score_mod") or _overrides(plugin, "additive")


def _cell(t: Tensor) -> Callable[[Tensor, Tensor, Tensor, Tensor], Tensor]:
    """``t[b, h, q, kv]`` of a tensor broadcastable to (B, H, I, J) (index 0 on its size-1 dims)."""
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
        self.kernel = kernel
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
        self._structural, self._all_flex, self._all_sdpa = False, True, True  # see add_plugin
        #: the fused kernel for structural plug-ins: None takes SDPA; "flex" asks for FlexAttention
        #: where it can run (tests, benchmarks), "sdpa" forces SDPA
        self.fused_kernel: str | None = None

    def add_plugin(self, plugin: AttentionPlugin) -> None:
        self.plugins.append(plugin)
        # which fused forms the layer's plug-ins offer depends on their classes alone: decided
        # here once, not in every call (the decoder step runs ``route`` per layer and token)
        self._structural = self._structural or structural(plugin)
        self._all_flex = self._all_flex and flex_form(plugin)
        self._all_sdpa = self._all_sdpa and sdpa_form(plugin)

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
        key_input = x if self.is_self else memory
        q_offset = 0
        ctx = AttentionContext(
            self.site, struct or {}, key_padding, causal, self.training,
            records=records, requested=requested, losses=losses,
            key_input=key_input, key_proj=self.project_keys,
            state=cache.setdefault("plugin_state", {}) if cache is not None else None,
        )
        if self.is_self:
            q, k, v = self.qkv_proj(x).chunk(3, dim=-1)
            q, k, v = self._split(q), self._split(k), self._split(v)
            for plugin in self.plugins:
                k = plugin.keys(k, ctx)
            if cache is not None:
                if "k" in cache:
                    q_offset = cache["k"].size(2)
                    k = torch.cat([cache["k"], k], dim=2)
                    v = torch.cat([cache["v"], v], dim=2)
                cache["k"], cache["v"] = k, v
                causal = causal and x.size(1) > 1  # one new query sees every cached key
        else:
            q = self._split(self.q_proj(x))
            if cache is not None and "k" in cache:
                k, v = cache["k"], cache["v"]
            else:
                k, v = self.kv_proj(memory).chunk(2, dim=-1)
                k, v = self._split(k), self._split(v)
                for plugin in self.plugins:
                    k = plugin.keys(k, ctx)
                if cache is not None:
                    cache["k"], cache["v"] = k, v
        beams = 1
        if not self.is_self and k.size(0) != q.size(0):  # beam search: a sentence's beams share its source
            if q.size(0) % k.size(0):
                raise ValueError(f"cross-attention got {q.size(0)} target rows for {k.size(0)} sources: "
                                 "expected the same number, or a whole number of beams per source")
            beams = q.size(0) // k.size(0)
        if beams > 1:  # the beams become extra queries of their sentence's one copy of the source
            n, heads, length, d_head = k.size(0), q.size(1), q.size(2), q.size(3)
            q = q.view(n, beams, heads, length, d_head).transpose(1, 2).reshape(n, heads, beams * length, d_head)
        ctx.q_offset = q_offset
        ctx.causal = causal
        for plugin in self.plugins:
            q = plugin.queries(q, ctx)
        ctx.q, ctx.k, ctx.v = q, k, v

        route = self.route(q, k, v, ctx)
        if route == "flex":
            out = self._flex(q, k, v, key_padding, causal, ctx)
        else:
            bias = None
            for plugin in self.plugins:
                extra = plugin.bias(ctx)
                if extra is not None:
                    bias = extra if bias is None else bias + extra
            if route == "explicit":
                out = self._explicit(q, k, v, key_padding, causal, bias, ctx)
            else:
                scale = None
                for plugin in self.plugins:  # the fused forms of the scores and probs hooks
                    if _overrides(plugin, "scores"):
                        extra = plugin.additive(ctx)
                        if extra is not None:
                            bias = extra if bias is None else bias + extra
                    if _overrides(plugin, "probs"):
                        factor = plugin.prob_scale(ctx)
                        if factor is not None:
                            scale = factor if scale is None else scale * factor
                out = self._fused(q, k, v, key_padding, causal, bias, scale)
        b, _, length, _ = out.shape
        out = out.transpose(1, 2).reshape(b * beams, length // beams, self.d_model)
        return self.out_proj(out)

    # -- the routes ---------------------------------------------------------------------
    def route(self, q: Tensor, k: Tensor, v: Tensor, ctx: AttentionContext) -> str:
        """Which route this call takes: ``"explicit"``, ``"sdpa"`` or ``"flex"`` (module docstring)."""
        if ctx.wants("probs") or self.prefers_explicit(q) or any(p.explicit for p in self.plugins):
            return "explicit"
        device = q.device.type
        if self.fused_kernel == "flex" and self._flex_runs(q, k, v, device):
            return "flex"
        if not self._structural:
            return "sdpa"  # queries/keys hooks and biases: the fused kernel as it always was
        if self.kernel == "auto" and device == "cpu" and self.fused_kernel is None:
            return "explicit"  # no faster on the CPU at NMT lengths: today's numerics stay
        return "sdpa" if self._all_sdpa else "explicit"

    def _flex_runs(self, q: Tensor, k: Tensor, v: Tensor, device: str) -> bool:
        """Whether FlexAttention, asked for, can run this call (asked only then: the gradient scan
        below would otherwise cost every call, the decoder's steps included)."""
        if not (flex_available() and self._all_flex) or (self.training and self.dropout > 0.0):
            return False  # FlexAttention has no dropout
        if device == "cuda":
            return self.d_head >= FLEX_MIN_HEAD_DIM  # the compiled kernel's limit
        grad = torch.is_grad_enabled() and (any(t.requires_grad for t in (q, k, v))
                                            or any(p.requires_grad for p in self.plugins.parameters()))
        return device == "cpu" and not grad  # no backward on the CPU

    def prefers_explicit(self, q: Tensor) -> bool:
        if self.kernel == "auto":
            return q.device.type == "cpu" and q.dtype in (torch.bfloat16, torch.float16)
        return self.kernel == "explicit"

    def _allowed(self, key_padding: Tensor | None, causal: bool, i: int, j: int, device) -> Tensor | None:
        """Boolean mask (B|1, 1, I, J), True where a query may look at a key."""
        mask = None
        if key_padding is not None:
            mask = ~key_padding[:, None, None, :]
        if causal:
            tri = torch.ones(i, j, dtype=torch.bool, device=device).tril(j - i)
            mask = tri[None, None] if mask is None else mask & tri
        return mask

    def _fused(self, q: Tensor, k: Tensor, v: Tensor, key_padding: Tensor | None, causal: bool,
               bias: Tensor | None, scale: Tensor | None = None) -> Tensor:
        """SDPA; ``bias`` goes into the float mask. ``scale`` (M, 0 ≤ M ≤ 1) multiplies the weights
        without renormalising them: every key is seen twice, with ``log M`` and its value, and with
        ``log(1 − M)`` and a zero value, so that ``softmax`` keeps the unscaled weights' denominator
        and the output is ``Σ_j A_ij M_ij v_j``."""
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
        """FlexAttention: the plug-ins' score_mods (or their additive terms, gathered) in the order of
        the explicit path (every ``scores`` hook in plug-in order, then the biases), then the mask."""
        mods: list[ScoreMod] = []
        for phase in ("scores", "bias"):
            for plugin in self.plugins:
                if _overrides(plugin, "scores") != (phase == "scores"):
                    continue
                mod = plugin.score_mod(ctx)
                if mod is None:
                    term = plugin.additive(ctx) if phase == "scores" else plugin.bias(ctx)
                    mod = None if term is None else gathered(term)
                if mod is not None:
                    mods.append(mod)
        allowed = self._allowed(key_padding, causal, q.size(2), k.size(2), q.device)
        if allowed is not None:
            mods.append(_masked(allowed))

        def score_mod(score: Tensor, b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
            for mod in mods:
                score = mod(score, b, h, q_idx, kv_idx)
            return score

        return _flex_kernel(q.device)(q, k, v, score_mod=score_mod if mods else None)

    def _explicit(self, q: Tensor, k: Tensor, v: Tensor, key_padding: Tensor | None, causal: bool,
                  bias: Tensor | None, ctx: AttentionContext) -> Tensor:
        s = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(self.d_head)
        for plugin in self.plugins:
            s = plugin.scores(s, ctx)
        if bias is not None:
            s = s + bias
        allowed = self._allowed(key_padding, causal, q.size(2), k.size(2), q.device)
        if allowed is not None:
            s = s.masked_fill(~allowed, float("-inf"))
        a = torch.softmax(s.to(torch.promote_types(s.dtype, torch.float32)), dim=-1).to(q.dtype)
        for plugin in self.plugins:
            a = plugin.probs(a, ctx)
        ctx.record("probs", a)
        out = torch.matmul(F.dropout(a, self.dropout, self.training), v)
        for plugin in self.plugins:
            extra = plugin.extra_output(a, ctx)
            if extra is not None:
                out = out + extra
        return out
