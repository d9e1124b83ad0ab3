"""Context-aware self-attention (Yang et al. 2019, "Context-Aware Self-Attention Networks").

A baseline of deps-san-peng's Table 1. Queries and keys of the configured heads are pulled
towards a projection of a context ``C`` through learned scalar gates:

    Ĉ_Q = C U_Q,   λ_Q = sigmoid(Q v_Q^H + Ĉ_Q v_Q^C),   Q̂ = (1 − λ_Q) Q + λ_Q Ĉ_Q
    Ĉ_K = C U_K,   λ_K = sigmoid(K v_K^H + Ĉ_K v_K^C),   K̂ = (1 − λ_K) K + λ_K Ĉ_K

Values are unchanged. What ``C`` is for encoder layer ``l`` (1-based) with input ``H^{l−1}``
(``H^0``: the embeddings; in a pre-norm model the normalised input the attention sees):

* ``global``:      c = mean of H^{l−1} over real positions, the same vector at every position;
* ``deep``:        C = [H^0; H^1; …; H^{l−1}], each position's states of all layers so far
                   concatenated (d_c = l·d);
* ``deep_global``: c = [mean H^0; …; mean H^{l−1}], the global vectors of all layers so far.

The paper's deep context stacks the earlier layers' representations; we include the layer's
own input so that layer 1 has a context too. The earlier layers' inputs are what the same
method's plug-ins at those layers saw, so the deep variants must run in layers 1..n
without gaps (checked when the config is loaded).

Multi-head: ``U_Q, U_K ∈ R^{d_c × (h·d_head)}`` project the context into the ``h``
configured heads; each head has its own gate (its slice of the gate vectors) where the paper
has one gate for the whole d-dimensional query. Parameters per layer:
``2·d_c·h·d_head + 4·h·d_head`` (no biases, as in the paper's formulas).
Positions of EOS and padding are treated like the others (the method is not structural);
padding never enters a mean.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import torch
from torch import Tensor, nn

from structnmt.errors import ConfigError
from structnmt.model.methods.base import (
    AttentionContext,
    AttentionPlugin,
    Effect,
    Method,
    MethodParams,
    Site,
    register,
)
from structnmt.model.methods.shared import check_site

Variant = Literal["global", "deep", "deep_global"]


def masked_mean(x: Tensor, padding: Tensor | None) -> Tensor:
    """(B, 1, d): mean of ``x`` (B, L, d) over non-padding positions."""
    if padding is None:
        return x.mean(dim=1, keepdim=True)
    keep = (~padding)[:, :, None].to(x.dtype)
    return (x * keep).sum(dim=1, keepdim=True) / keep.sum(dim=1, keepdim=True).clamp(min=1.0)


def context_dim(variant: str, layer: int, d_model: int) -> int:
    """d_c of 0-based ``layer``: d for the global context, (layer + 1)·d for the deep ones."""
    return d_model if variant == "global" else (layer + 1) * d_model


def gated(x: Tensor, c: Tensor, v_x: Tensor, v_c: Tensor) -> Tensor:
    """(1 − λ) x + λ c with λ = sigmoid(x·v_x + c·v_c) per head and position.

    ``x`` (B, h, L, d_head); ``c`` broadcastable to it; ``v_x``/``v_c`` (h, d_head)."""
    lam = torch.sigmoid(torch.matmul(x, v_x[:, :, None].to(x.dtype)) + torch.matmul(c, v_c[:, :, None].to(c.dtype)))
    # (1 − λ) x + λ c in one pass; lerp wants one dtype (autocast may return bf16 products)
    return torch.lerp(x, c.to(x.dtype).expand_as(x), lam.to(x.dtype))


class ContextAwarePlugin(AttentionPlugin):
    effect = Effect.QUERY_KEY  # only Q and K change: the fused kernel stays

    def __init__(self, heads: list[int], d_model: int, d_head: int, variant: str, layer: int,
                 stash: dict[int, Tensor], last: bool) -> None:
        super().__init__(heads)
        self.variant = variant
        self.layer = layer
        self.d_head = d_head
        self.stash = stash  # shared by the method's plug-ins: layer -> that layer's input
        self.last = last  # the top plug-in empties the stash once it is done
        d_c = context_dim(variant, layer, d_model)
        d_sel = len(heads) * d_head
        self.u_q = nn.Linear(d_c, d_sel, bias=False)
        self.u_k = nn.Linear(d_c, d_sel, bias=False)
        bound = d_head ** -0.5
        self.v = nn.ParameterDict({
            name: nn.Parameter(torch.empty(len(heads), d_head).uniform_(-bound, bound))
            for name in ("q_h", "q_c", "k_h", "k_c")
        })

    def context(self, ctx: AttentionContext) -> Tensor:
        """C (B, J|1, d_c) of this layer."""
        assert ctx.key_input is not None
        x = ctx.key_input
        if self.variant == "global":
            return masked_mean(x, ctx.key_padding)
        self.stash[self.layer] = x
        states = [self.stash[layer] for layer in range(self.layer + 1)]
        if self.variant == "deep":
            return torch.cat(states, dim=-1)
        return torch.cat([masked_mean(h, ctx.key_padding) for h in states], dim=-1)

    def _project(self, c: Tensor, proj: nn.Linear) -> Tensor:
        """C U (B, L, h·d_head) -> (B, h, L, d_head)."""
        b, length, _ = c.shape
        return proj(c).view(b, length, len(self.heads), self.d_head).transpose(1, 2)

    def _mix(self, x: Tensor, c_hat: Tensor, v_x: Tensor, v_c: Tensor) -> Tensor:
        if self.heads == list(range(x.size(1))):  # every head, in order: no gather/scatter copies
            return gated(x, c_hat, v_x, v_c)
        idx = self.head_index(x.device)
        mixed = gated(x.index_select(1, idx), c_hat, v_x, v_c)
        return x.index_copy(1, idx, mixed)  # out of place: other heads pass through untouched

    def keys(self, k: Tensor, ctx: AttentionContext) -> Tensor:
        c_hat = self._project(self.context(ctx), self.u_k)
        return self._mix(k, c_hat, self.v["k_h"], self.v["k_c"])

    def queries(self, q: Tensor, ctx: AttentionContext) -> Tensor:
        c_hat = self._project(self.context(ctx), self.u_q)
        if self.last:
            self.stash.clear()  # keep no activations alive between batches
        return self._mix(q, c_hat, self.v["q_h"], self.v["q_c"])


@dataclass
class ContextAwareParams(MethodParams):
    """Defaults: every encoder layer, all heads (the paper contextualises the encoder's SANs).

    The paper's 6 encoder layers map to all 3 of this project's base model.
    """

    layers: list[int] = field(default_factory=lambda: [1, 2, 3])
    heads: list[int] | int | str = "all"
    variant: Variant = "global"

    def validate(self, where: str) -> None:
        super().validate(where)
        check_site(self, "encoder", "self", where)
        if self.variant != "global" and sorted(self.layers) != list(range(1, len(self.layers) + 1)):
            raise ConfigError(f"the {self.variant} context stacks every earlier layer's input: layers must be "
                              f"1..n without gaps, got {self.layers}", f"{where}.layers")
        if len(set(self.layers)) != len(self.layers):
            raise ConfigError(f"a layer is named twice in {self.layers}", f"{where}.layers")


@register("context_aware")
class ContextAware(Method[ContextAwareParams]):
    """Q and K gated towards a global or deep context (Yang et al. 2019)."""

    Params = ContextAwareParams
    adds_parameters = True

    def __init__(self, params: ContextAwareParams, model_cfg) -> None:
        super().__init__(params, model_cfg)
        self.stash: dict[int, Tensor] = {}

    def make_plugin(self, site: Site) -> AttentionPlugin:
        p = self.p
        cfg = self.model_cfg
        last = site.layer == max(p.layers) - 1
        return ContextAwarePlugin(self.head_list(), cfg.d_model, cfg.d_model // cfg.n_heads, p.variant,
                                  site.layer, self.stash, last)
