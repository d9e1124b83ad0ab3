"""Dependency-based self-attention (DBSA; Deguchi et al. 2019, as used in syncattn-deguchi2021 §3).

One head of a self-attention layer scores keys with a learned bilinear form,
``S = Q U Kᵀ / √d`` instead of ``Q Kᵀ / √d``; its softmax row ``t`` is read as the
distribution over the syntactic head of token ``t`` and trained with

    L_dep = −Σ_t log A[t, parent_first[t]]      (sum over real sub-words, weighted by λ_dep)

on the source (encoder) and/or the target (decoder) side. The head *is* the parser, so the
trees are needed in training only: at translation time the head runs as it learned to and no
structure field is read.

Choices the paper leaves open:

* The bilinear form replaces the head's scoring function for every row and column, special
  tokens included (unlike the parameter-free methods, which leave special-token cells alone):
  the head must compute the same function in training, where ``valid`` exists, and in
  translation, where target fields never do. Only the *loss* reads ``valid``.
* The decoder head is causally masked, so a target token whose parent lies in the future
  (``parent_first[t] > t`` in ``tgt_in`` positions) cannot attend to it; such tokens are left
  out of ``L_dep``.
* ``U`` starts as the identity, so the head starts as an ordinary dot-product head.
* ``L_dep`` is a sum over tokens (like the translation loss before the trainer divides it by
  the batch's target tokens) and is added in training only.

The same plug-in serves SISA (``sisa.py``) and the DBSA heads that SyncAttn synchronises
(``syncattn.py``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
from torch import Tensor, nn

from structnmt.errors import ConfigError
from structnmt.method_config import Stack
from structnmt.model.methods.base import (
    AttentionContext,
    AttentionPlugin,
    Effect,
    Method,
    MethodParams,
    Site,
    register,
)
from structnmt.model.methods.shared import at_least_float32

EPS = 1e-9  # floor for log A: a head can put (numerically) zero mass on the gold parent early in training


class BiaffineHeadPlugin(AttentionPlugin):
    """Bilinear scores ``Q U Kᵀ/√d`` in ``heads`` (one ``U`` per head), supervised with ``parent_first``:
    the loss reads the weights, so the layer runs explicitly."""

    effect = Effect.EXPLICIT

    def __init__(self, heads: list[int], d_head: int, loss_name: str, weight: float) -> None:
        super().__init__(heads)
        self.d_head = d_head
        self.loss_name = loss_name
        self.weight = weight
        self.U = nn.Parameter(torch.eye(d_head).repeat(len(heads), 1, 1))  # (H', d, d)

    def scores(self, s: Tensor, ctx: AttentionContext) -> Tensor:
        assert ctx.q is not None and ctx.k is not None
        idx = self.head_index(s.device)
        q = ctx.q.index_select(1, idx)  # (B, H', I, d)
        k = ctx.k.index_select(1, idx)  # (B, H', J, d)
        qu = torch.matmul(q, self.U.to(q.dtype))
        bilinear = torch.matmul(qu, k.transpose(-1, -2)) / math.sqrt(self.d_head)
        return s.index_copy(1, idx, bilinear.to(s.dtype))

    def fold_queries(self, weight: Tensor, bias: Tensor) -> tuple[Tensor, Tensor]:
        """``(x Wᵀ + b) U = x (Uᵀ W)ᵀ + b U`` per head: the bilinear head is a dot-product head with
        other query weights, and the loss (training only) is all that is left of the method."""
        weight, bias = weight.clone(), bias.clone()
        d = self.d_head
        for u, h in zip(self.U.detach(), self.heads):
            rows = slice(h * d, (h + 1) * d)
            weight[rows] = u.T.to(weight.dtype) @ weight[rows]
            bias[rows] = bias[rows] @ u.to(bias.dtype)
        return weight, bias

    def probs(self, a: Tensor, ctx: AttentionContext) -> Tensor:
        heads = a.index_select(1, self.head_index(a.device))  # (B, H', I, J)
        ctx.record("dbsa", heads)
        fields = ctx.side()
        if ctx.training and "parent_first" in fields and "valid" in fields:
            ctx.add_loss(self.loss_name, self.weight * dependency_nll(heads, fields["parent_first"],
                                                                       fields["valid"], causal=ctx.causal))
        return a


def dependency_nll(heads: Tensor, parent_first: Tensor, valid: Tensor, causal: bool) -> Tensor:
    """``−Σ log A[t, parent_first[t]]`` over valid tokens and heads (teacher-forced: rows = all positions).

    With ``causal``, tokens whose parent comes later than themselves are skipped: a causally
    masked head cannot attend there.
    """
    b, h, i, j = heads.shape
    parent = parent_first[:, :i].clamp(0, j - 1)
    picked = heads.gather(-1, parent[:, None, :, None].expand(b, h, i, 1)).squeeze(-1)  # (B, H', I)
    keep = valid[:, :i]
    if causal:
        keep = keep & (parent_first[:, :i] <= torch.arange(i, device=heads.device))
    logp = at_least_float32(picked).clamp_min(EPS).log()
    return -(logp * keep[:, None, :].to(logp.dtype)).sum()


@dataclass
class DBSAParams(MethodParams):
    layers: list[int] = field(default_factory=lambda: [1])  # l_dep = 1 (the paper's setting)
    heads: list[int] | int | str = field(default_factory=lambda: [0])  # one head
    stack: Stack | list[Stack] = field(default_factory=lambda: ["encoder", "decoder"])  # (older: sides: [src, tgt])
    lambda_dep: float = 0.5

    def validate(self, where: str) -> None:
        super().validate(where)
        if self.attention != "self":
            raise ConfigError("DBSA heads live in self-attention", f"{where}.attention")
        if self.lambda_dep < 0:
            raise ConfigError("must not be negative", f"{where}.lambda_dep")


@register("dbsa")
class DBSA(Method[DBSAParams]):
    """A supervised bilinear head in the self-attention of each stack named."""

    Params = DBSAParams
    adds_parameters = True
    loss_prefix = "dbsa"
    readouts = {"dependency_tree": "dbsa"}  # the head's attention is its parser (SISA, SyncAttn inherit it)

    def __init__(self, params: DBSAParams, model_cfg) -> None:
        super().__init__(params, model_cfg)
        # the fields depend on the configured stacks, so they are per instance
        self.needs = {site.struct_side: ("valid", "parent_first") for site in self.sites()}
        self.needs_at_inference = {}

    def make_plugin(self, site: Site) -> AttentionPlugin:
        d_head = self.model_cfg.d_model // self.model_cfg.n_heads
        return BiaffineHeadPlugin(self.head_list(), d_head, f"{self.loss_prefix}_{site.struct_side}",
                                  self.p.lambda_dep)
