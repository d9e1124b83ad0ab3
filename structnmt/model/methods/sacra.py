"""SACrA: scene-aware cross-attention (Slobodkin et al.).

In the chosen cross-attention heads the keys are projected not from each encoder state but
from the average of the states of the source tokens that share a scene with it:

    K̃ = W_K · (M · X_enc) / L     (queries and values as usual)

Tokens in the same set of scenes get the same key, so the decoder's query weighs a whole
scene rather than single tokens. ``M`` is the scene membership matrix restricted to real
source sub-words; rows of EOS and padding keep their own encoder state.

What ``L`` is: the paper divides by "the source length L_src" (``normalise: sentence``, the
default, with ``L`` = the number of real source sub-words, EOS and padding not counted).
``normalise: scene`` divides by the number of tokens in the row of ``M`` instead, a masked
mean that keeps the averaged states at the scale of the encoder states the shared key
projection was trained on (a token in a 2-token scene of a 40-token sentence otherwise gets
a key 20 times smaller than its neighbours in the other heads); it is an ablation, not the
paper's method.

The keys are computed once per sentence: the decoder caches cross-attention keys, so
incremental decoding pays nothing per step.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

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
from structnmt.model.methods.shared import check_site, head_mask


@dataclass
class SacraParams(MethodParams):
    """Defaults: the paper's one head of the cross-attention of decoder layers 2 and 3."""

    stack: Literal["encoder", "decoder"] = "decoder"
    attention: Literal["self", "cross"] = "cross"
    layers: list[int] = field(default_factory=lambda: [2, 3])
    heads: list[int] | int | str = field(default_factory=lambda: [0])
    normalise: Literal["scene", "sentence"] = "sentence"

    def validate(self, where: str) -> None:
        super().validate(where)
        check_site(self, "decoder", "cross", where)


def scene_average(x: Tensor, scene_mask: Tensor, valid: Tensor, normalise: str) -> Tensor:
    """(M · X) / L for real tokens; EOS and padding rows keep their own state."""
    member = (scene_mask & valid[:, :, None] & valid[:, None, :]).to(x.dtype)  # (B, J, J)
    if normalise == "scene":
        length = member.sum(-1, keepdim=True)  # (B, J, 1); ≥ 1 on real rows (the diagonal)
    else:
        length = valid.sum(-1).to(x.dtype).view(-1, 1, 1)
    avg = torch.bmm(member, x) / length.clamp(min=1.0)
    return torch.where(valid[:, :, None], avg, x)


class SacraPlugin(AttentionPlugin):
    effect = Effect.QUERY_KEY  # only the keys change: the fused kernel stays usable

    def __init__(self, heads: list[int], normalise: str) -> None:
        super().__init__(heads)
        self.normalise = normalise

    def keys(self, k: Tensor, ctx: AttentionContext) -> Tensor:
        src = ctx.side("src")
        assert ctx.key_input is not None and ctx.key_proj is not None
        avg = scene_average(ctx.key_input, src["scene_mask"], src["valid"], self.normalise)
        return torch.where(head_mask(self.heads, k.size(1), k.device), ctx.key_proj(avg), k)


@register("sacra")
class Sacra(Method[SacraParams]):
    """Cross-attention keys averaged over the tokens of each source scene (SACrA, Slobodkin et al.)."""

    Params = SacraParams
    needs = {"src": ("scene_mask",)}
    needs_at_inference = {"src": ("scene_mask",)}

    def make_plugin(self, site: Site) -> AttentionPlugin:
        p = self.p
        return SacraPlugin(self.head_list(), p.normalise)
