"""Local attention windows: the local-attention comparison of sync-latent-phrase-harada2021 (§5.1).

In the configured heads of the bottom encoder layers a query ``i`` may only attend to keys
``j`` with ``|i − j| ≤ w`` (w = 2), after Cui et al. (2019)'s mixed multi-head attention. The
paper uses it to show that a local constraint alone teaches word order: run it with and
without positional embeddings (recipe ``multi30k_en_de_local_window_nopos`` sets
``model.positional: none``).

The mask is an additive ``−inf`` term, so the layer keeps PyTorch's fused attention kernel.
It is positional, reads no structure fields and applies to every non-padding query row,
special tokens included. Rows of padding queries are left unmasked: a padding row whose
window holds only padding would otherwise have no key left and turn into NaN.
"""

from __future__ import annotations

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
    Site,
    register,
)


def window_mask(rows: Tensor, n_keys: int, window: int) -> Tensor:
    """(I, J) bool, True where key ``j`` lies outside the window ``|i − j| ≤ window`` of query ``rows[i]``."""
    keys = torch.arange(n_keys, device=rows.device)
    return (rows[:, None] - keys[None, :]).abs() > window


class LocalWindowPlugin(AttentionPlugin):
    effect = Effect.ADDITIVE  # the fused kernel stays

    def __init__(self, heads: list[int], n_heads: int, window: int) -> None:
        super().__init__(heads)
        self.window = window
        head_mask = torch.zeros(n_heads, dtype=torch.bool)
        head_mask[heads] = True
        self.register_buffer("head_mask", head_mask, persistent=False)

    def term(self, ctx: AttentionContext) -> Tensor:
        assert ctx.q is not None and ctx.k is not None
        n_rows, n_keys = ctx.q.size(2), ctx.k.size(2)
        rows = torch.arange(ctx.q_offset, ctx.q_offset + n_rows, device=ctx.q.device)
        outside = window_mask(rows, n_keys, self.window)[None, None] & self.head_mask[None, :, None, None]
        if ctx.key_padding is not None and ctx.q_offset == 0 and n_rows == n_keys:  # full self-attention pass
            outside = outside & ~ctx.key_padding[:, None, :, None]  # padding query rows stay unmasked
        zero = torch.zeros((), dtype=ctx.q.dtype, device=ctx.q.device)
        return torch.where(outside, torch.tensor(float("-inf"), dtype=ctx.q.dtype, device=ctx.q.device), zero)

@dataclass
class LocalWindowParams(MethodParams):
    layers: list[int] = field(default_factory=lambda: [1, 2])  # the two bottom encoder layers
    heads: list[int] | int | str = "all"
    window: int = 2

    def validate(self, where: str) -> None:
        super().validate(where)
        if self.attention != "self":
            raise ConfigError("local windows apply to self-attention", f"{where}.attention")
        if self.window < 0:
            raise ConfigError("must not be negative", f"{where}.window")


@register("local_window")
class LocalWindow(Method[LocalWindowParams]):
    """Heads confined to keys within w positions of the query (Cui et al. 2019); reads no structure."""

    Params = LocalWindowParams

    def make_plugin(self, site: Site) -> AttentionPlugin:
        return LocalWindowPlugin(self.head_list(), self.model_cfg.n_heads, self.p.window)
