"""UDISCAL: UD-distance-scaled attention weights (Slobodkin et al., the SASA paper's syntactic variant).

PASCAL looks only at the parent; UDISCAL weighs every token by its tree distance. Unlike
PASCAL and Deps-SAN it acts *after* the softmax and does not renormalise, so a row's
weights sum to less than 1 (the head passes on less of the far context):

    Ã_ij = A_ij · N(dist[i, j]; σ²),   σ² = 1
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
from torch import Tensor

from structnmt.model.methods.base import (
    AttentionContext,
    AttentionPlugin,
    Effect,
    Method,
    MethodParams,
    Site,
    register,
)
from structnmt.model.methods.shared import check_range, check_site, head_mask, normal_density


@dataclass
class UdiscalParams(MethodParams):
    """Defaults: the paper's one head of encoder layer 1, σ² = 1."""

    layers: list[int] = field(default_factory=lambda: [1])
    heads: list[int] | int | str = field(default_factory=lambda: [0])
    variance: float = 1.0

    def validate(self, where: str) -> None:
        super().validate(where)
        check_site(self, "encoder", "self", where)
        check_range(self.variance, 0.0, math.inf, f"{where}.variance", low_open=True)


class UdiscalPlugin(AttentionPlugin):
    """A·N(dist; σ²) without renormalising: a probability scale, which SDPA runs while N <= 1,
    i.e. σ² >= 1/2π."""

    effect = Effect.PROB_SCALE

    def __init__(self, heads: list[int], variance: float) -> None:
        super().__init__(heads)
        self.variance = variance
        self.scale_at_most_one = variance >= 1.0 / (2.0 * math.pi)

    def scale(self, ctx: AttentionContext) -> Tensor:
        """N(dist; σ²) on the rows of real tokens of the owned heads (over every key: special keys
        have distance 0, like PASCAL and Deps-SAN), 1 elsewhere."""
        assert ctx.q is not None
        src = ctx.side("src")
        weight = normal_density(src["dist"][:, None].to(ctx.q.dtype), self.variance)  # (B, 1, I, J)
        apply = src["valid"][:, None, :, None] & head_mask(self.heads, ctx.q.size(1), weight.device)
        return torch.where(apply, weight, 1.0)


@register("udiscal")
class Udiscal(Method[UdiscalParams]):
    """Attention weights scaled by a Gaussian of the tree distance, not renormalised (Slobodkin et al.)."""

    Params = UdiscalParams
    needs = {"src": ("dist",)}
    needs_at_inference = {"src": ("dist",)}

    def make_plugin(self, site: Site) -> AttentionPlugin:
        p = self.p
        return UdiscalPlugin(self.head_list(), p.variance)
