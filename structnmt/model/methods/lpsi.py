"""Latent phrase structure induction (LPSI) and its synchronisation (sync-latent-phrase-harada2021).

Each gated head computes a syntactic distance per position from its own keys with a 1-D
convolution that looks back ``M`` positions (left-padded with zeros),

    d_i = tanh(W_D [k_{i−M}; …; k_i] + b_D),

and gates its attention with the probability that no phrase boundary separates query ``t``
and key ``i`` (PRPN, Shen et al. 2018):

    α_{j,t} = (hardtanh((d_t − d_j)·τ) + 1) / 2,    g_{i,t} = Π_{j strictly between i and t} α_{j,t},
    ã_{·,t} = softmax(S_{t,·} + log g_{·,t}).

The paper writes the product for keys left of the query (``j = i+1 … t−1``, the decoder's
causal case); the bidirectional encoder uses the same rule on the right (``j = t+1 … i−1``), so
the gate is symmetric in where the boundary lies. ``g_{t,t} = g_{t±1,t} = 1``. The product is a
difference of cumulative sums of ``log α`` (each ``α`` floored at 1e-6 so the logs stay
finite): no loop over positions.

Choices the paper leaves open:

* one convolution (``(M+1)·d_head + 1`` parameters) per attention module, shared by its gated
  heads; each head gets its own distances from its own keys;
* a layer's distance sequence (recorded as ``"distance"``, (B, H', L)) is the mean over its
  gated heads where one sequence is needed (synchronisation, tree induction);
* like DBSA, the gate is part of the model and applies to every position, special tokens
  included: it reads no structure fields, in training or in translation;
* incremental decoding recomputes the distances of all positions from the cached keys (the
  convolution only looks back, so earlier distances never change).

Synchronisation (``sync: mse | rank``; ``synch`` in older recipes): the source distances ``e``
of distance layer ``l`` are projected through the cross-attention ``C`` (J×I, mean over heads)
of synchronised decoder layer ``l``, ``d̃ = C e``, and compared with the target distances ``d`` of distance layer ``l``:

    SynchMSE   Σ_l Σ_i (d_i − d̃_i)²
    SynchRank  Σ_l Σ_{i<j} max(0, 1 − sign(d_i − d_j)·(d̃_i − d̃_j))

over non-padding target positions, weighted by λ = 0.01 and summed over the batch. The paper
induces in the two bottom layers and synchronises through the two top cross-attention layers;
we pair the l-th distance layer (ascending) with the l-th synchronised layer (ascending).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from structnmt.errors import ConfigError
from structnmt.method_config import Stack
from structnmt.model.methods.base import (
    AttentionContext,
    AttentionPlugin,
    Effect,
    Method,
    MethodParams,
    RecordKey,
    Site,
    register,
)
from structnmt.model.methods.shared import at_least_float32

ALPHA_FLOOR = 1e-6


def syntactic_gate_log(distances: Tensor, rows: Tensor, tau: float) -> Tensor:
    """``log g`` (..., I, J) for query positions ``rows`` (I,) over keys 0..J−1 of ``distances`` (..., J)."""
    j_len = distances.size(-1)
    d_query = distances.index_select(-1, rows)  # (..., I)
    alpha = (F.hardtanh((d_query[..., :, None] - distances[..., None, :]) * tau) + 1.0) / 2.0  # α[t, j]
    prefix = alpha.clamp_min(ALPHA_FLOOR).log().cumsum(-1)  # Σ_{j' ≤ j} log α[t, j']
    keys = torch.arange(j_len, device=distances.device)
    lo = torch.minimum(rows[:, None], keys[None, :])  # (I, J)
    hi = torch.maximum(rows[:, None], keys[None, :])
    shape = prefix.shape
    upper = prefix.gather(-1, (hi - 1).clamp_min(0).expand(shape))
    lower = prefix.gather(-1, lo.expand(shape))
    return torch.where(hi > lo, upper - lower, torch.zeros((), dtype=prefix.dtype, device=prefix.device))


class SyntacticGatePlugin(AttentionPlugin):
    """Distances from a look-back convolution over the keys; attention gated by ``log g``."""

    effect = Effect.ADDITIVE

    def __init__(self, heads: list[int], d_head: int, lookback: int, tau: float) -> None:
        super().__init__(heads)
        self.lookback = lookback
        self.tau = tau
        self.conv = nn.Conv1d(d_head, 1, kernel_size=lookback + 1)
        self._every_head_in_order = self.heads == list(range(len(self.heads)))  # the gate needs no scatter

    def distances(self, keys: Tensor) -> Tensor:
        """(B, H', J, d) keys -> (B, H', J) distances in [−1, 1]."""
        if torch.compiler.is_compiling():
            return self._distances_by_taps(keys)
        b, h, j, d = keys.shape
        x = keys.reshape(b * h, j, d).transpose(1, 2)  # (B·H', d, J)
        x = F.pad(x, (self.lookback, 0))
        return torch.tanh(self.conv(x.to(self.conv.weight.dtype))).view(b, h, j)

    def _distances_by_taps(self, keys: Tensor) -> Tensor:
        """The convolution as one projection and M+1 shifted sums, y_i = b + Σ_m k_{i−M+m}·W_m.

        The same numbers as ``self.conv`` (to rounding), for torch.compile: its convolution
        lowering fixes the sequence length, one recompilation per batch length, while this
        keeps the length symbolic. Eager training keeps the convolution, so its records stay
        bit for bit."""
        weight = self.conv.weight[0]  # (d, M+1)
        z = torch.matmul(keys.to(weight.dtype), weight)  # (B, H', J, M+1): key i's term for tap m
        j = keys.size(2)
        y = self.conv.bias.expand(z.shape[:-1])
        for m in range(self.lookback + 1):
            y = y + F.pad(z[..., m], (self.lookback - m, 0))[..., :j]  # tap m reads M−m keys back
        return torch.tanh(y)

    def term(self, ctx: AttentionContext) -> Tensor:
        """``log g`` on the gated heads, 0 on the others, from the distances of every key position
        (cached ones too)."""
        assert ctx.q is not None and ctx.k is not None
        idx = self.head_index(ctx.q.device)
        dist = at_least_float32(self.distances(ctx.k.index_select(1, idx)))
        ctx.record("distance", dist)
        rows = torch.arange(ctx.q_offset, ctx.q_offset + ctx.q.size(2), device=ctx.q.device)
        gate = syntactic_gate_log(dist, rows, self.tau).to(ctx.q.dtype)  # (B, H', I, J)
        if self._every_head_in_order and len(self.heads) == ctx.q.size(1):
            return gate
        b, _, i, j = gate.shape
        return gate.new_zeros(b, ctx.q.size(1), i, j).index_copy(1, idx, gate)


@dataclass
class LPSIParams(MethodParams):
    layers: list[int] = field(default_factory=lambda: [1, 2])  # the two bottom layers
    heads: list[int] | int | str = "all"
    stack: Stack | list[Stack] = field(default_factory=lambda: ["encoder", "decoder"])  # (older: sides)
    lookback: int = 5  # M
    tau: float = 1.0
    sync: Literal["none", "mse", "rank"] = "none"  # SynchMSE / SynchRank
    sync_layers: list[int] | None = None  # decoder cross-attention layers; None: the top len(layers)
    lambda_sync: float = 0.01

    RENAMED = {"synch": "sync", "synch_layers": "sync_layers", "lambda_synch": "lambda_sync"}

    def validate(self, where: str) -> None:
        super().validate(where)
        if self.attention != "self":
            raise ConfigError("LPSI gates self-attention", f"{where}.attention")
        if self.lookback < 0:
            raise ConfigError("must not be negative", f"{where}.lookback")
        if self.tau <= 0:
            raise ConfigError("must be positive", f"{where}.tau")
        if self.lambda_sync < 0:
            raise ConfigError("must not be negative", f"{where}.lambda_sync")
        if self.sync != "none" and sorted(self.stacks()) != ["decoder", "encoder"]:
            raise ConfigError("synchronisation needs distances in both stacks: [encoder, decoder]", f"{where}.stack")
        if self.sync_layers is not None and len(self.sync_layers) != len(self.layers):
            raise ConfigError("give one synchronised layer per distance layer", f"{where}.sync_layers")

    def check_model(self, model, where: str) -> None:
        super().check_model(model, where)
        if any(not 1 <= layer <= model.dec_layers for layer in self.synchronised_layers(model.dec_layers)):
            raise ConfigError(f"synchronised layers must lie in the decoder's layers 1..{model.dec_layers}",
                              f"{where}.sync_layers")

    def synchronised_layers(self, dec_layers: int) -> list[int]:
        n = len(self.layers)
        return self.sync_layers or [max(1, dec_layers - n + 1 + i) for i in range(n)]


@register("lpsi")
class LPSI(Method[LPSIParams]):
    """Attention gated by learned syntactic distances (latent phrase structure induction; Harada 2021)."""

    Params = LPSIParams
    adds_parameters = True
    readouts = {"phrase_structure": "distance"}  # the gates' distances split into a binary tree

    def __init__(self, params: LPSIParams, model_cfg) -> None:
        super().__init__(params, model_cfg)
        top = params.synchronised_layers(model_cfg.dec_layers)
        self.pairs = list(zip(sorted(params.layers), sorted(top)))  # (distance layer, cross-attention layer)

    def make_plugin(self, site: Site) -> AttentionPlugin:
        d_head = self.model_cfg.d_model // self.model_cfg.n_heads
        return SyntacticGatePlugin(self.head_list(), d_head, self.p.lookback, self.p.tau)

    def records(self) -> set[RecordKey]:
        if self.p.sync == "none":
            return set()
        out: set[RecordKey] = set()
        for dist_layer, cross_layer in self.pairs:
            out.add(("encoder", dist_layer - 1, "self", "distance"))
            out.add(("decoder", dist_layer - 1, "self", "distance"))
            out.add(("decoder", cross_layer - 1, "cross", "probs"))
        return out

    def loss(self, records: dict[RecordKey, Tensor], batch_struct: dict[str, dict[str, Tensor]],
             pads: dict[str, Tensor]) -> dict[str, Tensor]:
        if self.p.sync == "none":
            return {}
        total: Tensor | None = None
        for dist_layer, cross_layer in self.pairs:
            keys = [("encoder", dist_layer - 1, "self", "distance"),
                    ("decoder", dist_layer - 1, "self", "distance"),
                    ("decoder", cross_layer - 1, "cross", "probs")]
            if not all(k in records for k in keys):
                return {}
            e = at_least_float32(records[keys[0]]).mean(1).masked_fill(pads["src"], 0.0)  # (B, I)
            d = at_least_float32(records[keys[1]]).mean(1)  # (B, J)
            c = at_least_float32(records[keys[2]]).mean(1)  # (B, J, I)
            term = synch_loss(d, c @ e.unsqueeze(-1), pads["tgt"], self.p.sync)
            total = term if total is None else total + term
        assert total is not None
        return {"lpsi_synch": self.p.lambda_sync * total}


def synch_loss(d: Tensor, projected: Tensor, tgt_pad: Tensor, kind: str) -> Tensor:
    """SynchMSE or SynchRank between target distances ``d`` (B, J) and ``projected`` = C e (B, J[, 1])."""
    d_tilde = projected.reshape(d.shape)
    keep = ~tgt_pad
    if kind == "mse":
        return ((d - d_tilde) ** 2).masked_fill(~keep, 0.0).sum()
    sign = torch.sign(d[:, :, None] - d[:, None, :])
    hinge = torch.relu(1.0 - sign * (d_tilde[:, :, None] - d_tilde[:, None, :]))  # (B, J, J): pair (i, j)
    j = d.size(1)
    upper = torch.ones(j, j, dtype=torch.bool, device=d.device).triu(1)
    pairs = upper[None] & keep[:, :, None] & keep[:, None, :]
    return hinge.masked_fill(~pairs, 0.0).sum()
