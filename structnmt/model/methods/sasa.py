"""SASA: scene-aware self-attention (Slobodkin et al.).

One encoder head is confined to the tokens that share a scene with the query: after the
softmax its weights are multiplied by a scene mask ``M`` and *not* renormalised, so a head
whose query attended outside its scene simply passes on less.

    Ã_ij = A_ij · M_ij

``mask`` picks ``M`` for tokens that share no scene (``M`` is 1 wherever they share one,
on the diagonal, in rows of tokens in no scene and wherever EOS or padding is involved;
``scene_mask`` already encodes all of that):

* ``binary`` (the paper's reported model): 0;
* ``scaled``: the constant ``c`` (paper's best: 0.1);
* ``normal``: ``f_norm(c · scene_dist[i, j])`` with σ = 1/√(2π), i.e. ``exp(−π c² d²)``, so
  that a distance of 0 gives exactly 1 (paper's best: c = √0.5). ``scene_dist`` is the
  distance between the tokens' nearest scenes in the scene graph.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Literal

import torch
from torch import Tensor

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
from structnmt.model.methods.shared import check_site, head_mask, valid_pairs

#: the best ``c`` the paper found for each graded mask
DEFAULT_C = {"scaled": 0.1, "normal": math.sqrt(0.5)}


@dataclass
class SasaParams(MethodParams):
    """Defaults: the paper's one head of encoder layer 4 (the top layer of its 4-layer
    encoder) with the binary mask. A shallower model must set ``layers`` (the Multi30k recipe
    uses its top layer, 3)."""

    layers: list[int] = field(default_factory=lambda: [4])
    heads: list[int] | int | str = field(default_factory=lambda: [0])
    mask: Literal["binary", "scaled", "normal"] = "binary"
    c: float | None = None  # out-of-scene constant (scaled) or distance factor (normal); None: paper's best

    def validate(self, where: str) -> None:
        super().validate(where)
        check_site(self, "encoder", "self", where)
        if self.c is not None:
            if self.mask == "binary":
                raise ConfigError("the binary mask takes no c (use mask: scaled or normal)", f"{where}.c")
            if self.mask == "scaled" and not 0.0 < self.c < 1.0:
                raise ConfigError(f"the scaled mask needs 0 < c < 1, got {self.c}", f"{where}.c")
            if self.mask == "normal" and not self.c > 0.0:
                raise ConfigError(f"the normal mask needs c > 0, got {self.c}", f"{where}.c")

    def constant(self) -> float:
        return self.c if self.c is not None else DEFAULT_C.get(self.mask, 0.0)


def scene_weights(scene_mask: Tensor, scene_dist: Tensor | None, valid: Tensor, mask: str, c: float,
                  dtype: torch.dtype) -> Tensor:
    """(B, 1, I, J) mask M: 1 within a scene, the ``mask`` kind's value outside.

    Cells with a special token are 1 whatever ``scene_mask`` holds there.
    """
    inside = scene_mask[:, None] | ~valid_pairs(valid)
    if mask == "binary":
        outside = torch.zeros((), dtype=dtype, device=scene_mask.device)
    elif mask == "scaled":
        outside = torch.full((), c, dtype=dtype, device=scene_mask.device)
    else:
        assert scene_dist is not None
        outside = torch.exp(-math.pi * (c * scene_dist[:, None].to(dtype)).square())
    return torch.where(inside, torch.ones((), dtype=dtype, device=scene_mask.device), outside)


class SasaPlugin(AttentionPlugin):
    """A·M without renormalising, 0 <= M <= 1 for every mask kind: a probability scale (SDPA runs it)."""

    effect = Effect.PROB_SCALE
    scale_at_most_one = True

    def __init__(self, heads: list[int], mask: str, c: float) -> None:
        super().__init__(heads)
        self.mask = mask
        self.c = c

    def scale(self, ctx: AttentionContext) -> Tensor:
        """M on the owned heads, 1 on the others."""
        assert ctx.q is not None
        src = ctx.side("src")
        m = scene_weights(src["scene_mask"], src.get("scene_dist"), src["valid"], self.mask, self.c, ctx.q.dtype)
        return torch.where(head_mask(self.heads, ctx.q.size(1), m.device), m, 1.0)


@register("sasa")
class Sasa(Method[SasaParams]):
    """Self-attention weights masked outside the query's scenes, not renormalised (SASA, Slobodkin et al.)."""

    Params = SasaParams
    needs = {"src": ("scene_mask",)}
    needs_at_inference = {"src": ("scene_mask",)}

    def __init__(self, params: SasaParams, model_cfg: Any) -> None:
        super().__init__(params, model_cfg)
        if getattr(params, "mask", "binary") == "normal":  # only the normal mask reads scene distances
            fields = ("scene_mask", "scene_dist")
            self.needs = {"src": fields}
            self.needs_at_inference = {"src": fields}

    def make_plugin(self, site: Site) -> AttentionPlugin:
        p = self.p
        return SasaPlugin(self.head_list(), p.mask, p.constant())
