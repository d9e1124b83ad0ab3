"""Localness modelling (Yang et al. 2018, "Modeling Localness for Self-Attention Networks").

A baseline of deps-san-peng's Table 1. Each configured head adds a learned Gaussian bias to
its scores, so that query ``i`` favours a window around a predicted central position:

    G_ij = −(j − P_i)² / (2σ_i²),   σ_i = D_i / 2,   softmax(S + G)

    P_i = I · sigmoid(v_pᵀ tanh(W_p q_i))                 central position (every variant)
    D   = window                                          ``variant: fixed``
    D   = I · sigmoid(v_dᵀ tanh(W_d k̄))                   ``variant: layer``  (k̄: mean key)
    D_i = I · sigmoid(v_dᵀ tanh(W_p q_i))                 ``variant: query``  (W_p shared)

``I`` is the sentence length without padding (EOS counted, as every position is).
``W_p, W_d ∈ R^{d_head×d_head}`` and ``v_p, v_d ∈ R^{d_head}`` act on one head's query /
key; the configured heads of a layer share them (each head still predicts its own window
from its own query), and each layer has its own. That sizing matches the parameter counts
deps-san-peng reports for its reproduction (+0.02M/+0.03M/+0.02M on a 4-head d = 512
model, i.e. one d_head² matrix or two), see docs/baselines.md.

The bias is additive, so the fused attention kernel stays. Localness is positional: like
the local-window baseline it reads no structure field and applies to every row, EOS
included. ``G`` is clipped at −10⁴ so that a vanishing window never turns a row into
``−inf`` everywhere (in half precision); exp(−10⁴) is 0 either way.
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
from structnmt.model.methods.shared import check_site, head_mask

#: lowest value of the Gaussian bias (finite in every precision, far below any real score)
MIN_BIAS = -1.0e4


def real_lengths(key_padding: Tensor | None, n_keys: int, batch: int, device: torch.device) -> Tensor:
    """(B,) float: ``I``, the number of non-padding positions of each sentence."""
    if key_padding is None:
        return torch.full((batch,), float(n_keys), device=device)
    return (~key_padding).sum(-1).to(torch.float32)


def mean_keys(k: Tensor, key_padding: Tensor | None) -> Tensor:
    """(B, H, d_head): the mean key of each head over the real positions (the layer's summary)."""
    if key_padding is None:
        return k.mean(dim=2)
    keep = (~key_padding)[:, None, :, None].to(k.dtype)
    return (k * keep).sum(dim=2) / keep.sum(dim=2).clamp(min=1.0)


def gaussian_bias(center: Tensor, window: Tensor, n_keys: int) -> Tensor:
    """(B, H, I, J): −(j − P_i)² / (2σ_i²) with σ_i = D_i / 2; ``window`` broadcasts to ``center``."""
    keys = torch.arange(n_keys, device=center.device, dtype=center.dtype)
    sigma = window / 2.0
    g = -(keys - center[..., None]).square() / (2.0 * sigma[..., None].square())
    return g.clamp(min=MIN_BIAS)


class LocalnessPlugin(AttentionPlugin):
    effect = Effect.ADDITIVE  # the fused kernel stays

    def __init__(self, heads: list[int], n_heads: int, d_head: int, variant: str, window: float) -> None:
        super().__init__(heads)
        self.variant = variant
        self.window = window
        self.register_buffer("mask", head_mask(heads, n_heads, torch.device("cpu")), persistent=False)
        self.w_p = nn.Linear(d_head, d_head, bias=False)
        self.v_p = nn.Linear(d_head, 1, bias=False)
        if variant == "layer":
            self.w_d = nn.Linear(d_head, d_head, bias=False)
        if variant in ("layer", "query"):
            self.v_d = nn.Linear(d_head, 1, bias=False)

    def term(self, ctx: AttentionContext) -> Tensor:
        center, window = self._center_window(ctx)
        assert ctx.k is not None
        g = gaussian_bias(center, window, ctx.k.size(2))
        return torch.where(self.mask, g, torch.zeros((), dtype=g.dtype, device=g.device))

    def _center_window(self, ctx: AttentionContext) -> tuple[Tensor, Tensor]:
        """P and D (B, H, I) of every head (the plug-in's heads are picked by the caller)."""
        assert ctx.q is not None and ctx.k is not None
        q, k = ctx.q, ctx.k
        n = real_lengths(ctx.key_padding, k.size(2), q.size(0), q.device).to(q.dtype)[:, None, None]  # (B,1,1)
        hidden = torch.tanh(self.w_p(q))  # (B, H, I, d_head)
        center = n * torch.sigmoid(self.v_p(hidden).squeeze(-1))  # (B, H, I)
        if self.variant == "fixed":
            window = torch.full_like(center, self.window)
        elif self.variant == "query":
            window = n * torch.sigmoid(self.v_d(hidden).squeeze(-1))
        else:  # layer: one window per sentence and head, from the mean key
            summary = torch.tanh(self.w_d(mean_keys(k, ctx.key_padding)))  # (B, H, d_head)
            window = (n * torch.sigmoid(self.v_d(summary)))  # (B, H, 1): broadcasts over queries
        return center, window.expand_as(center)


@dataclass
class LocalnessParams(MethodParams):
    """Defaults: encoder layer 1, all heads, fixed window D = 10.

    Yang et al. (2018) find localness helps most in the lower layers; deps-san-peng's
    parameter counts fit one layer's worth of parameters, so the default is the bottom
    layer (layers 1–3 of 6 in the paper are layers 1–2 of 3 here: set ``layers`` to try).
    """

    layers: list[int] = field(default_factory=lambda: [1])
    heads: list[int] | int | str = "all"
    variant: Literal["fixed", "layer", "query"] = "fixed"
    window: float = 10.0  # D of the fixed variant, in tokens (σ = D/2)

    def validate(self, where: str) -> None:
        super().validate(where)
        check_site(self, "encoder", "self", where)
        if self.window <= 0:
            raise ConfigError(f"must be positive, got {self.window}", f"{where}.window")


@register("localness")
class Localness(Method[LocalnessParams]):
    """Learned Gaussian bias around a predicted central position (Yang et al. 2018)."""

    Params = LocalnessParams
    adds_parameters = True

    def make_plugin(self, site: Site) -> AttentionPlugin:
        p = self.p
        cfg = self.model_cfg
        return LocalnessPlugin(self.head_list(), cfg.n_heads, cfg.d_model // cfg.n_heads, p.variant, p.window)
