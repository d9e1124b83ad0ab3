"""Deps-SAN: dependency-scaled self-attention (Peng et al.), with its two sparsing tricks.

Every score is multiplied by a Gaussian of the tree distance between the two tokens'
words, so syntactically close tokens keep large scores and far ones are shrunk:

    S̃_ij = S_ij · N(dist[i, j]; σ²)

* **RS-Sparsing** (training only) dilutes the parse like dropout: each cell's distance is
  replaced by ``k`` with probability ``q`` before the Gaussian is taken. One draw per
  sentence cell and layer, shared by the heads (the paper feeds one matrix to all heads).
* **Wink-Sparsing** (training and translation) masks out every key farther than ``k`` from
  the query in the tree. It is an additive −inf term, so on its own (``scaling: false``) the
  layer keeps PyTorch's fused attention kernel.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
from torch import Tensor

from structnmt.errors import ConfigError
from structnmt.model.methods.base import (
    AttentionContext,
    AttentionPlugin,
    Effect,
    Method,
    MethodParams,
    ScoreMod,
    Site,
    register,
)
from structnmt.model.methods.shared import check_range, check_site, head_mask, normal_density, valid_pairs


@dataclass
class DepsSANParams(MethodParams):
    """Defaults: the paper's all heads of encoder layers 1–3, σ² = 1, k = 6, q = 0.1."""

    layers: list[int] = field(default_factory=lambda: [1, 2, 3])
    heads: list[int] | int | str = "all"
    variance: float = 1.0  # σ² of the Gaussian of the tree distance
    scaling: bool = True  # the dependency-scaled scores themselves (off: Wink-Sparsing alone)
    rs_sparsing: bool = False
    rs_k: float = 6.0  # the distance a sparsed cell gets
    rs_q: float = 0.1  # the probability a cell is sparsed
    wink_sparsing: bool = False
    wink_k: float = 6.0  # keys with dist > wink_k are masked out

    def validate(self, where: str) -> None:
        super().validate(where)
        check_site(self, "encoder", "self", where)
        check_range(self.variance, 0.0, math.inf, f"{where}.variance", low_open=True)
        check_range(self.rs_k, 0.0, math.inf, f"{where}.rs_k")
        check_range(self.rs_q, 0.0, 1.0, f"{where}.rs_q")
        check_range(self.wink_k, 0.0, math.inf, f"{where}.wink_k")
        if not (self.scaling or self.wink_sparsing):
            raise ConfigError("with scaling off, turn wink_sparsing on (or the method does nothing)",
                              f"{where}.scaling")
        if self.rs_sparsing and not self.scaling:
            raise ConfigError("RS-Sparsing changes the scaling matrix: it needs scaling: true",
                              f"{where}.rs_sparsing")


class DependencyScalePlugin(AttentionPlugin):
    """S̃ = S · N(dist; σ²) on the owned heads, with RS-Sparsing in training: a scaling, so a
    score function (FlexAttention and the explicit route; SDPA has no form for it)."""

    effect = Effect.SCORE_FN

    def __init__(self, heads: list[int], variance: float, rs_q: float, rs_k: float) -> None:
        super().__init__(heads)
        self.variance = variance
        self.rs_q = rs_q  # 0: RS-Sparsing off
        self.rs_k = rs_k

    def score_fn(self, ctx: AttentionContext) -> ScoreMod:
        assert ctx.q is not None
        src = ctx.side("src")
        dist = src["dist"].to(ctx.q.dtype)  # (B, I, J), in the scores' dtype as the factor is used
        if ctx.training and self.rs_q > 0.0:
            sparsed = (torch.rand(dist.shape, device=dist.device) < self.rs_q) & valid_pairs(src["valid"])[:, 0]
            dist = dist.masked_fill(sparsed, self.rs_k)
        # rows of real tokens over every key: the batch gives special keys distance 0, so EOS is
        # scaled like the token's own word (an unscaled EOS would out-score every scaled key)
        factor = torch.where(src["valid"][:, :, None], normal_density(dist, self.variance), 1.0)
        owned = head_mask(self.heads, ctx.q.size(1), dist.device).view(-1)

        def scaled(score: Tensor, b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
            return torch.where(owned[h], score * factor[b, q_idx, kv_idx].to(score.dtype), score)

        return scaled


class WinkMaskPlugin(AttentionPlugin):
    """Masks keys farther than ``k`` in the tree: an additive term, so the fused kernel stays usable."""

    effect = Effect.ADDITIVE

    def __init__(self, heads: list[int], k: float) -> None:
        super().__init__(heads)
        self.k = k

    def term(self, ctx: AttentionContext) -> Tensor:
        src = ctx.side("src")
        dist = src["dist"]
        n_heads = ctx.q.size(1)  # type: ignore[union-attr]  # set before any term is asked for
        # the diagonal has distance 0, so no row is ever masked completely
        far = (dist > self.k)[:, None] & valid_pairs(src["valid"])
        far = far & head_mask(self.heads, n_heads, dist.device)
        return torch.zeros(far.shape, device=dist.device).masked_fill(far, float("-inf"))


@register("deps_san")
class DepsSAN(Method[DepsSANParams]):
    """Self-attention scores scaled by a Gaussian of the tokens' dependency-tree distance (Peng et al.)."""

    Params = DepsSANParams
    needs = {"src": ("dist",)}
    needs_at_inference = {"src": ("dist",)}

    def plugins(self) -> list[tuple[Site, AttentionPlugin]]:
        """Up to two plug-ins per layer: the scaling (a score function) and the Wink mask (an additive term)."""
        p = self.p
        heads = self.head_list()
        out: list[tuple[Site, AttentionPlugin]] = []
        for site in self.sites():
            if p.scaling:
                out.append((site, DependencyScalePlugin(heads, p.variance, p.rs_q if p.rs_sparsing else 0.0,
                                                        p.rs_k)))
            if p.wink_sparsing:
                out.append((site, WinkMaskPlugin(heads, p.wink_k)))
        return out
