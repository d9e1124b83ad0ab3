"""PASCAL: parent-scaled self-attention (Bugliarello & Okazaki 2020).

In the chosen heads of the first encoder layer every score of query ``i`` is multiplied
by a Gaussian centred on the middle sub-word of ``i``'s dependency parent:

    S̃_ij = S_ij · N(j − parent_mid[i]; ν)

so that, after the softmax, the head looks mostly at the parent and its neighbours while
still letting a very high score elsewhere through (the density is never 0). *Parent
ignoring* regularises against parser noise: in training, each row of each PASCAL head is
left unscaled with probability ``q``.
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
    ScoreMod,
    Site,
    register,
)
from structnmt.model.methods.shared import check_range, check_site, head_mask, normal_density

# ---------------------------------------------------------------------------
# PASCAL


@dataclass
class PascalParams(MethodParams):
    """Defaults: the paper's layer 1 and ν = 1.

    ``heads = 2``: the paper tuned 2–8 PASCAL heads of 8 per task (median 7, but 2 on the
    low-resource NC11 En→De task). In a 4-head model one head is a quarter of the layer, so
    we take the middle of the tuned range, half the heads (4 of 8 ↔ 2 of 4), and leave two
    heads free to learn whatever the parse misses.
    """

    layers: list[int] = field(default_factory=lambda: [1])
    heads: list[int] | int | str = 2
    variance: float = 1.0  # ν of the Gaussian around the parent's middle position
    parent_ignoring: float = 0.0  # q: probability that a row is left unscaled in training

    def validate(self, where: str) -> None:
        super().validate(where)
        check_site(self, "encoder", "self", where)
        check_range(self.variance, 0.0, math.inf, f"{where}.variance", low_open=True)
        check_range(self.parent_ignoring, 0.0, 1.0, f"{where}.parent_ignoring")


class PascalPlugin(AttentionPlugin):
    """S̃_ij = S_ij · N(j − parent_mid[i]; ν) on the owned heads: a scaling, so a score function
    (FlexAttention and the explicit route; SDPA has no form for it)."""

    effect = Effect.SCORE_FN

    def __init__(self, heads: list[int], variance: float, parent_ignoring: float) -> None:
        super().__init__(heads)
        self.variance = variance
        self.parent_ignoring = parent_ignoring

    def score_fn(self, ctx: AttentionContext) -> ScoreMod:
        assert ctx.q is not None and ctx.k is not None
        src = ctx.side("src")
        # positions in float32: bf16 cannot tell 130.5 from 130 (scores may be bf16 under autocast)
        parent = src["parent_mid"].float()  # (B, I)
        keys = torch.arange(ctx.k.size(2), device=parent.device, dtype=torch.float32)
        weight = normal_density(keys[None, None, :] - parent[:, :, None], self.variance)  # (B, I, J)
        # Rows of real sub-words are scaled over every key, EOS included: PASCAL's Gaussian is
        # positional, and an unscaled EOS column would otherwise out-score every scaled key.
        # Rows of EOS/padding stay as they are; padding keys are masked after this hook.
        b, h, i = ctx.q.shape[:3]
        apply = src["valid"][:, None, :] & head_mask(self.heads, h, parent.device).view(1, h, 1)  # (B, H, I)
        if ctx.training and self.parent_ignoring > 0.0:  # parent ignoring: a row left unscaled
            apply = apply & ~(torch.rand(b, h, i, device=parent.device) < self.parent_ignoring)

        def scaled(score: Tensor, b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
            return torch.where(apply[b, h, q_idx], score * weight[b, q_idx, kv_idx].to(score.dtype), score)

        return scaled


@register("pascal")
class Pascal(Method[PascalParams]):
    """Scores scaled by a Gaussian centred on each token's dependency parent (Bugliarello & Okazaki 2020)."""

    Params = PascalParams
    needs = {"src": ("parent_mid",)}
    needs_at_inference = {"src": ("parent_mid",)}

    def make_plugin(self, site: Site) -> AttentionPlugin:
        p = self.p
        return PascalPlugin(self.head_list(), p.variance, p.parent_ignoring)
