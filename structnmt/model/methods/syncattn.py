"""Synchronous syntactic attention (SyncAttn; syncattn-deguchi2021 §4).

DBSA heads on both sides (encoder matrix ``E``, I×I; decoder matrix ``D``, J×J) are tied
together through the cross-attention ``C`` (J×I) of decoder layer ``l_sync``:

    D_mapped = C E Cᵀ,   D′ = softmax(causal_mask(D_mapped)),   L_sync = Σ_{t,q} (D′_tq − D_tq)²

summed over the cells a causal decoder row may see (q ≤ t) in non-padding rows and columns,
weighted by λ_sync. ``C`` is the mean over ``sync_heads`` of that layer's cross-attention.

Design choice: a ``syncattn`` entry installs its own DBSA heads (same plug-in as
``dbsa.py``, layer ``layers`` = l_dep on both sides, losses ``dbsa_src`` / ``dbsa_tgt``), so
one config entry is the whole method. Do not add a separate ``dbsa`` entry for the same
heads. ``L_sync`` is computed in every teacher-forced pass (training and validation): it needs
no structure fields, only the model's own attention.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from structnmt.errors import ConfigError
from structnmt.method_config import check_heads, resolve_heads
from structnmt.model.methods.base import RecordKey, kept_index, register
from structnmt.model.methods.dbsa import DBSA, DBSAParams
from structnmt.model.methods.shared import at_least_float32


@dataclass
class SyncAttnParams(DBSAParams):
    sync_layer: int | None = None  # 1-based decoder layer of C; None: the penultimate (5 of 6 in the paper)
    sync_heads: list[int] | int | str = "all"  # cross-attention heads averaged into C
    lambda_sync: float = 1.0  # tuned in {0.01, 0.05, 0.1, 0.5, 1, 5, 10} in the paper

    def validate(self, where: str) -> None:
        super().validate(where)
        if sorted(self.stacks()) != ["decoder", "encoder"]:
            raise ConfigError("SyncAttn needs DBSA heads in both stacks: [encoder, decoder]", f"{where}.stack")
        if len(self.layers) != 1:
            raise ConfigError("give one l_dep layer", f"{where}.layers")
        if self.lambda_sync < 0:
            raise ConfigError("must not be negative", f"{where}.lambda_sync")

    def check_model(self, model, where: str) -> None:
        super().check_model(model, where)
        if not 1 <= self.synchronised_layer(model.dec_layers) <= model.dec_layers:
            raise ConfigError(f"layer {self.sync_layer} is outside the decoder's layers 1..{model.dec_layers}",
                              f"{where}.sync_layer")
        check_heads(self.sync_heads, model.n_heads, f"{where}.sync_heads")

    def synchronised_layer(self, dec_layers: int) -> int:
        return self.sync_layer if self.sync_layer is not None else max(1, dec_layers - 1)


@register("syncattn")
class SyncAttn(DBSA):
    """DBSA heads in both stacks, tied through a decoder layer's cross-attention (Deguchi et al. 2021)."""

    Params = SyncAttnParams

    p: SyncAttnParams

    def __init__(self, params: SyncAttnParams, model_cfg) -> None:
        super().__init__(params, model_cfg)
        self.sync_layer = params.synchronised_layer(model_cfg.dec_layers)
        self.sync_head_list = resolve_heads(params.sync_heads, model_cfg.n_heads)
        self._sync_index: dict[torch.device, Tensor] = {}

    def _keys(self) -> tuple[RecordKey, RecordKey, RecordKey]:
        layer = self.p.layers[0] - 1
        return (("encoder", layer, "self", "dbsa"), ("decoder", layer, "self", "dbsa"),
                ("decoder", self.sync_layer - 1, "cross", "probs"))

    def records(self) -> set[RecordKey]:
        return set(self._keys())

    def loss(self, records: dict[RecordKey, Tensor], batch_struct: dict[str, dict[str, Tensor]],
             pads: dict[str, Tensor]) -> dict[str, Tensor]:
        enc_key, dec_key, cross_key = self._keys()
        if not all(k in records for k in (enc_key, dec_key, cross_key)):
            return {}
        e = at_least_float32(records[enc_key]).mean(1)  # (B, I, I)
        d = at_least_float32(records[dec_key]).mean(1)  # (B, J, J)
        cross = records[cross_key]
        idx = kept_index(self._sync_index, self.sync_head_list, cross.device)
        c = at_least_float32(cross.index_select(1, idx)).mean(1)  # (B, J, I)
        return {"syncattn": self.p.lambda_sync * sync_loss(e, d, c, pads["tgt"])}


def sync_loss(e: Tensor, d: Tensor, c: Tensor, tgt_pad: Tensor) -> Tensor:
    """``Σ (softmax(causal_mask(C E Cᵀ)) − D)²`` over causal, non-padding cells, summed over the batch."""
    j = d.size(-1)
    mapped = c @ e @ c.transpose(-1, -2)  # (B, J, J)
    seen = torch.ones(j, j, dtype=torch.bool, device=d.device).tril()[None] & ~tgt_pad[:, None, :]
    mapped_probs = torch.softmax(mapped.masked_fill(~seen, float("-inf")), dim=-1)
    cells = seen & ~tgt_pad[:, :, None]
    return ((mapped_probs - d) ** 2).masked_fill(~cells, 0.0).sum()
