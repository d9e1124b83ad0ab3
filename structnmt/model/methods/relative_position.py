"""Relative position representations (Shaw et al. 2018, "Self-Attention with Relative Position
Representations"): the RPE baseline of deps-san-peng's Table 1.

Learned vectors for the clipped distance between query ``i`` and key ``j`` enter the scores
and the output of the configured heads:

    r_ij = clip(j − i, −k, k)
    e_ij = q_i (k_j + a^K_{r_ij})ᵀ / √d_head
    z_i  = Σ_j α_ij (v_j + a^V_{r_ij})

``a^K, a^V ∈ R^{(2k+1)×d_head}`` are shared by all heads of a layer (as in the paper); each
layer has its own, so a layer adds ``(2k+1)·d_head`` parameters for keys and as many for
values (``values: false`` drops the second table).

Cost: ``q · a^K`` is one (I × (2k+1)) product per head, gathered into the (I, J) grid by
each cell's distance bucket; the value term sums each row's weights into its 2k+1 buckets
(a scatter-add) and multiplies by ``a^V``. Nothing is built per pair of positions.

Positions are absolute indices of the sequence the attention sees (EOS, BOS included, as
in the paper); in incremental decoding the query row is at ``ctx.q_offset``. The value
term uses the weights before attention dropout (the project's default attention dropout is
0, where the two agree). The base model's sinusoidal positions are kept, as in
deps-san-peng's "+RPE"; Shaw et al.'s relative-only model is ``model.positional: none``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

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


def relative_buckets(n_rows: int, n_keys: int, offset: int, clip: int, device: torch.device) -> Tensor:
    """(I, J) long: clip(j − i, −k, k) + k for query rows ``offset .. offset+I−1``."""
    rows = torch.arange(offset, offset + n_rows, device=device)
    keys = torch.arange(n_keys, device=device)
    return (keys[None, :] - rows[:, None]).clamp(-clip, clip) + clip


class RelativeKeysPlugin(AttentionPlugin):
    """``q · a^K_{j−i} / √d`` added to the scores (the paper's eq. 4, ``values: false``): an
    additive term, so the fused kernels run it."""

    effect = Effect.ADDITIVE

    def __init__(self, heads: list[int], d_head: int, clip: int) -> None:
        super().__init__(heads)
        self.clip = clip
        self.scale = 1.0 / math.sqrt(d_head)
        self.rel_k = nn.Embedding(2 * clip + 1, d_head)
        nn.init.normal_(self.rel_k.weight, std=d_head ** -0.5)

    def key_term(self, ctx: AttentionContext) -> Tensor:
        """(B, H, I, J): each cell's bucket score on the owned heads, 0 on the others."""
        assert ctx.q is not None and ctx.k is not None
        heads = self.head_index(ctx.q.device)
        q = ctx.q.index_select(1, heads)  # (B, h, I, d_head)
        per_bucket = torch.matmul(q, self.rel_k.weight.to(q.dtype).t()) * self.scale  # (B, h, I, 2k+1)
        b, _, i, n = per_bucket.shape
        table = per_bucket.new_zeros(b, ctx.q.size(1), i, n).index_copy(1, heads, per_bucket)
        j = ctx.k.size(2)
        idx = relative_buckets(i, j, ctx.q_offset, self.clip, table.device)
        return table.gather(-1, idx.expand(b, table.size(1), i, j))

    def term(self, ctx: AttentionContext) -> Tensor:
        return self.key_term(ctx)


class RelativeKeysValuesPlugin(AttentionPlugin):
    """The keys' term of :class:`RelativeKeysPlugin` (the same code) and ``Σ_j A_ij a^V_{j−i}``
    added to the output (the paper's eq. 3): the value term reads the weights, so the layer runs
    explicitly."""

    effect = Effect.EXPLICIT

    def __init__(self, heads: list[int], d_head: int, clip: int) -> None:
        super().__init__(heads)
        self.clip = clip
        self.scale = 1.0 / math.sqrt(d_head)
        self.rel_k = nn.Embedding(2 * clip + 1, d_head)
        self.rel_v = nn.Embedding(2 * clip + 1, d_head)
        for table in (self.rel_k, self.rel_v):
            nn.init.normal_(table.weight, std=d_head ** -0.5)

    key_term = RelativeKeysPlugin.key_term

    def scores(self, s: Tensor, ctx: AttentionContext) -> Tensor:
        return s + self.key_term(ctx)

    def extra_output(self, a: Tensor, ctx: AttentionContext) -> Tensor | None:
        heads = self.head_index(a.device)
        weights = a.index_select(1, heads)
        b, h, i, j = weights.shape
        buckets = relative_buckets(i, j, ctx.q_offset, self.clip, a.device).expand(b, h, i, j)
        per_bucket = weights.new_zeros(b, h, i, 2 * self.clip + 1).scatter_add(-1, buckets, weights)
        term = torch.matmul(per_bucket, self.rel_v.weight.to(a.dtype))  # (B, h, I, d_head)
        out = term.new_zeros(b, a.size(1), i, term.size(-1))
        return out.index_copy(1, heads, term)


@dataclass
class RelativePositionParams(MethodParams):
    """Defaults: encoder self-attention, every layer of the base model, all heads, k = 16.

    Shaw et al. use relative positions in every self-attention layer of encoder and decoder
    (add a second entry with ``stack: decoder`` for the decoder, as the recipe does) and
    k = 16 in their main experiments (their Table 3: little change for k ≥ 2).
    """

    layers: list[int] = field(default_factory=lambda: [1, 2, 3])
    heads: list[int] | int | str = "all"
    clip: int = 16  # k: distances beyond ±k share one vector
    values: bool = True  # also add a^V to the output (the paper's eq. 3)

    def validate(self, where: str) -> None:
        super().validate(where)
        if self.attention != "self":
            raise ConfigError("relative positions are defined within one sequence: self-attention only",
                              f"{where}.attention")
        if self.clip < 1:
            raise ConfigError(f"must be at least 1, got {self.clip}", f"{where}.clip")


@register("relative_position")
class RelativePosition(Method[RelativePositionParams]):
    """Learned clipped relative-position vectors on keys and values (Shaw et al. 2018)."""

    Params = RelativePositionParams
    adds_parameters = True

    def make_plugin(self, site: Site) -> AttentionPlugin:
        p = self.p
        cfg = self.model_cfg
        d_head = cfg.d_model // cfg.n_heads
        if p.values:
            return RelativeKeysValuesPlugin(self.head_list(), d_head, p.clip)
        return RelativeKeysPlugin(self.head_list(), d_head, p.clip)
