"""Multi-head attention that runs structure-aware plug-ins.

Without plug-ins (or with plug-ins that only add a bias) a layer calls PyTorch's fused
``scaled_dot_product_attention``; as soon as a plug-in needs the explicit score or weight
matrix, or someone asked to record the weights, the layer computes them step by step.
Both paths compute the same function (a test checks it). Which one runs without plug-ins is
``model.attention_kernel``: ``auto`` takes the fused kernel except under bf16/fp16 autocast on a
CPU, where PyTorch's CPU kernel is slower than three plain ops at NMT shapes (measured on the
benchmark machine: vanilla training 3,560 vs 2,920 target tokens/s in bf16; in fp32 the fused
kernel is ~2% faster, and on CUDA it is the fast one).
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from structnmt.model.methods.base import AttentionContext, AttentionPlugin, RecordKey, Site


class MultiHeadAttention(nn.Module):
    def __init__(self, d_model: int, n_heads: int, dropout: float, site: Site, kernel: str = "auto") -> None:
        super().__init__()
        self.kernel = kernel
        self.d_model = d_model
        self.n_heads = n_heads
        self.d_head = d_model // n_heads
        self.site = site
        self.dropout = dropout
        self.is_self = site.attention == "self"
        if self.is_self:
            self.qkv_proj = nn.Linear(d_model, 3 * d_model)
        else:
            self.q_proj = nn.Linear(d_model, d_model)
            self.kv_proj = nn.Linear(d_model, 2 * d_model)
        self.out_proj = nn.Linear(d_model, d_model)
        self.plugins = nn.ModuleList()

    def add_plugin(self, plugin: AttentionPlugin) -> None:
        self.plugins.append(plugin)

    # -- projections ------------------------------------------------------------
    def _split(self, x: Tensor) -> Tensor:
        b, length, _ = x.shape
        return x.view(b, length, self.n_heads, self.d_head).transpose(1, 2)

    def project_keys(self, x: Tensor) -> Tensor:
        """Keys (B, H, J, d_head) of an input: what SACrA re-projects from scene-averaged states."""
        if self.is_self:
            w = self.qkv_proj.weight[self.d_model: 2 * self.d_model]
            b = self.qkv_proj.bias[self.d_model: 2 * self.d_model]
        else:
            w = self.kv_proj.weight[: self.d_model]
            b = self.kv_proj.bias[: self.d_model]
        return self._split(F.linear(x, w, b))

    def forward(
        self,
        x: Tensor,
        memory: Tensor | None = None,
        key_padding: Tensor | None = None,
        causal: bool = False,
        struct: dict[str, dict[str, Tensor]] | None = None,
        cache: dict[str, Any] | None = None,
        records: dict[RecordKey, Tensor] | None = None,
        requested: set[RecordKey] | frozenset = frozenset(),
        losses: dict[str, Tensor] | None = None,
    ) -> Tensor:
        """``x`` (B, I, d) queries; ``memory`` (B, J, d) for cross-attention.

        ``cache`` (incremental decoding) holds this layer's keys and values: for
        self-attention they grow by one position a step, for cross-attention they are
        computed once from the encoder output.
        """
        key_input = x if self.is_self else memory
        q_offset = 0
        ctx = AttentionContext(
            self.site, struct or {}, key_padding, causal, self.training,
            records=records, requested=requested, losses=losses,
            key_input=key_input, key_proj=self.project_keys,
            state=cache.setdefault("plugin_state", {}) if cache is not None else None,
        )
        if self.is_self:
            q, k, v = self.qkv_proj(x).chunk(3, dim=-1)
            q, k, v = self._split(q), self._split(k), self._split(v)
            for plugin in self.plugins:
                k = plugin.keys(k, ctx)
            if cache is not None:
                if "k" in cache:
                    q_offset = cache["k"].size(2)
                    k = torch.cat([cache["k"], k], dim=2)
                    v = torch.cat([cache["v"], v], dim=2)
                cache["k"], cache["v"] = k, v
                causal = causal and x.size(1) > 1  # one new query sees every cached key
        else:
            q = self._split(self.q_proj(x))
            if cache is not None and "k" in cache:
                k, v = cache["k"], cache["v"]
            else:
                k, v = self.kv_proj(memory).chunk(2, dim=-1)
                k, v = self._split(k), self._split(v)
                for plugin in self.plugins:
                    k = plugin.keys(k, ctx)
                if cache is not None:
                    cache["k"], cache["v"] = k, v
        ctx.q_offset = q_offset
        ctx.causal = causal
        for plugin in self.plugins:
            q = plugin.queries(q, ctx)
        ctx.q, ctx.k, ctx.v = q, k, v

        explicit = (ctx.wants("probs") or any(p.explicit for p in self.plugins)
                    or self.prefers_explicit(q))
        bias = None
        for plugin in self.plugins:
            extra = plugin.bias(ctx)
            if extra is not None:
                bias = extra if bias is None else bias + extra
        if explicit:
            out = self._explicit(q, k, v, key_padding, causal, bias, ctx)
        else:
            out = self._fused(q, k, v, key_padding, causal, bias)
        b, _, length, _ = out.shape
        out = out.transpose(1, 2).reshape(b, length, self.d_model)
        return self.out_proj(out)

    # -- the two paths ----------------------------------------------------------------
    def prefers_explicit(self, q: Tensor) -> bool:
        if self.kernel == "auto":
            return q.device.type == "cpu" and q.dtype in (torch.bfloat16, torch.float16)
        return self.kernel == "explicit"

    def _allowed(self, key_padding: Tensor | None, causal: bool, i: int, j: int, device) -> Tensor | None:
        """Boolean mask (B|1, 1, I, J), True where a query may look at a key."""
        mask = None
        if key_padding is not None:
            mask = ~key_padding[:, None, None, :]
        if causal:
            tri = torch.ones(i, j, dtype=torch.bool, device=device).tril(j - i)
            mask = tri[None, None] if mask is None else mask & tri
        return mask

    def _fused(self, q: Tensor, k: Tensor, v: Tensor, key_padding: Tensor | None, causal: bool,
               bias: Tensor | None) -> Tensor:
        p = self.dropout if self.training else 0.0
        if bias is None and key_padding is None:
            # is_causal aligns the mask top-left: right only when queries and keys start together
            if not causal or q.size(2) == 1 or q.size(2) == k.size(2):
                return F.scaled_dot_product_attention(q, k, v, dropout_p=p, is_causal=causal and q.size(2) > 1)
            return F.scaled_dot_product_attention(
                q, k, v, attn_mask=self._allowed(None, True, q.size(2), k.size(2), q.device), dropout_p=p)
        allowed = self._allowed(key_padding, causal, q.size(2), k.size(2), q.device)
        if bias is None:
            mask: Tensor | None = allowed
        else:
            mask = bias.to(q.dtype)
            if allowed is not None:
                mask = mask.masked_fill(~allowed, float("-inf"))
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=p)

    def _explicit(self, q: Tensor, k: Tensor, v: Tensor, key_padding: Tensor | None, causal: bool,
                  bias: Tensor | None, ctx: AttentionContext) -> Tensor:
        s = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(self.d_head)
        for plugin in self.plugins:
            s = plugin.scores(s, ctx)
        if bias is not None:
            s = s + bias
        allowed = self._allowed(key_padding, causal, q.size(2), k.size(2), q.device)
        if allowed is not None:
            s = s.masked_fill(~allowed, float("-inf"))
        a = torch.softmax(s.float(), dim=-1).to(q.dtype)
        for plugin in self.plugins:
            a = plugin.probs(a, ctx)
        ctx.record("probs", a)
        out = torch.matmul(F.dropout(a, self.dropout, self.training), v)
        for plugin in self.plugins:
            extra = plugin.extra_output(a, ctx)
            if extra is not None:
                out = out + extra
        return out
