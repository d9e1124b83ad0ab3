"""The encoder-decoder Transformer (Vaswani et al. 2017) that every method plugs into.

Pre- or post-norm layers, shared or separate embeddings, tied output projection, and
structure-aware plug-ins attached to attention modules by ``model.methods`` entries of
the config. The model never names a method: it asks each configured method for its
plug-ins and losses.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from structnmt.config import ModelConfig
from structnmt.data.batch import PAD_ID, Batch
from structnmt.model.attention import MultiHeadAttention
from structnmt.model.methods import Method, RecordKey, Site, build_methods, structure_needs


@dataclass
class ModelOutput:
    logits: Tensor  # (B, J, V)
    losses: dict[str, Tensor] = field(default_factory=dict)  # weighted auxiliary terms, by name
    records: dict[RecordKey, Tensor] = field(default_factory=dict)


@dataclass
class EncoderOutput:
    memory: Tensor  # (B, I, d)
    src_pad: Tensor  # (B, I) True at padding
    struct: dict[str, dict[str, Tensor]]  # the batch's structure tensors (source side used by decoding)
    padded: bool = True  # any padding at all (known once, so decoding steps need no device sync)

    def index_select(self, index: Tensor) -> EncoderOutput:
        """Rows ``index`` of everything (beam expansion and shrinking)."""
        return EncoderOutput(
            self.memory.index_select(0, index),
            self.src_pad.index_select(0, index),
            {side: {k: v.index_select(0, index) for k, v in f.items()} for side, f in self.struct.items()},
            self.padded,
        )


def _always_mask(pad: Tensor) -> bool:
    """Pass padding masks even when nothing is padded under ``torch.compile`` and off the CPU.

    Asking the tensor whether any padding exists is a host sync: it splits a compiled graph and
    makes the host wait for a GPU. An all-False mask gives the same result; only the CPU, where
    the question costs nothing, still asks (and keeps the mask-free kernel it always took).
    """
    return torch.compiler.is_compiling() or pad.device.type != "cpu"


def sinusoidal_table(n: int, d: int) -> Tensor:
    position = torch.arange(n, dtype=torch.float32)[:, None]
    rate = torch.exp(torch.arange(0, d, 2, dtype=torch.float32) * (-math.log(10000.0) / d))
    table = torch.zeros(n, d)
    table[:, 0::2] = torch.sin(position * rate)
    table[:, 1::2] = torch.cos(position * rate[: d // 2])
    return table


class FeedForward(nn.Module):
    def __init__(self, d_model: int, d_ff: int, dropout: float) -> None:
        super().__init__()
        self.fc1 = nn.Linear(d_model, d_ff)
        self.fc2 = nn.Linear(d_ff, d_model)
        self.dropout = dropout

    def forward(self, x: Tensor) -> Tensor:
        return self.fc2(F.dropout(F.relu(self.fc1(x)), self.dropout, self.training))


class EncoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, layer: int) -> None:
        super().__init__()
        self.pre_norm = cfg.norm == "pre"
        self.self_attn = MultiHeadAttention(cfg.d_model, cfg.n_heads, cfg.attention_dropout,
                                            Site("encoder", "self", layer), cfg.attention_kernel)
        self.ffn = FeedForward(cfg.d_model, cfg.d_ff, cfg.activation_dropout)
        self.norm1 = nn.LayerNorm(cfg.d_model)
        self.norm2 = nn.LayerNorm(cfg.d_model)
        self.dropout = cfg.dropout

    def _block(self, x: Tensor, fn, norm: nn.LayerNorm) -> Tensor:
        if self.pre_norm:
            return x + F.dropout(fn(norm(x)), self.dropout, self.training)
        return norm(x + F.dropout(fn(x), self.dropout, self.training))

    def forward(self, x: Tensor, pad: Tensor | None, **kw: Any) -> Tensor:
        x = self._block(x, lambda h: self.self_attn(h, key_padding=pad, **kw), self.norm1)
        return self._block(x, self.ffn, self.norm2)


class DecoderLayer(EncoderLayer):
    def __init__(self, cfg: ModelConfig, layer: int) -> None:
        super().__init__(cfg, layer)
        self.self_attn = MultiHeadAttention(cfg.d_model, cfg.n_heads, cfg.attention_dropout,
                                            Site("decoder", "self", layer), cfg.attention_kernel)
        self.cross_attn = MultiHeadAttention(cfg.d_model, cfg.n_heads, cfg.attention_dropout,
                                             Site("decoder", "cross", layer), cfg.attention_kernel)
        self.norm3 = nn.LayerNorm(cfg.d_model)

    def forward(self, x: Tensor, memory: Tensor, src_pad: Tensor | None, tgt_pad: Tensor | None,
                cache: dict[str, Any] | None = None, **kw: Any) -> Tensor:  # type: ignore[override]
        self_cache = cache.setdefault("self", {}) if cache is not None else None
        cross_cache = cache.setdefault("cross", {}) if cache is not None else None
        x = self._block(x, lambda h: self.self_attn(h, key_padding=tgt_pad, causal=True, cache=self_cache, **kw),
                        self.norm1)
        x = self._block(x, lambda h: self.cross_attn(h, memory, key_padding=src_pad, cache=cross_cache, **kw),
                        self.norm3)
        return self._block(x, self.ffn, self.norm2)


class Transformer(nn.Module):
    def __init__(self, cfg: ModelConfig, src_vocab_size: int, tgt_vocab_size: int) -> None:
        super().__init__()
        self.cfg = cfg
        d = cfg.d_model
        self.src_embed = nn.Embedding(src_vocab_size, d, padding_idx=PAD_ID)
        if cfg.share_embeddings and src_vocab_size == tgt_vocab_size:
            self.tgt_embed = self.src_embed
        else:
            self.tgt_embed = nn.Embedding(tgt_vocab_size, d, padding_idx=PAD_ID)
        if cfg.positional == "sinusoidal":
            self.register_buffer("pos_table", sinusoidal_table(cfg.max_positions, d), persistent=False)
        elif cfg.positional == "learned":
            self.pos_embed = nn.Embedding(cfg.max_positions, d)
        self.encoder = nn.ModuleList(EncoderLayer(cfg, i) for i in range(cfg.enc_layers))
        self.decoder = nn.ModuleList(DecoderLayer(cfg, i) for i in range(cfg.dec_layers))
        self.enc_norm = nn.LayerNorm(d) if cfg.norm == "pre" else nn.Identity()
        self.dec_norm = nn.LayerNorm(d) if cfg.norm == "pre" else nn.Identity()
        self.output = None if cfg.tie_output else nn.Linear(d, tgt_vocab_size, bias=False)
        self._reset_parameters()
        # plug-ins are attached after initialisation so that they keep their own initial values
        self.methods: list[Method] = build_methods(cfg)
        self.method_modules = nn.ModuleDict()
        for i, method in enumerate(self.methods):
            for site, plugin in method.plugins():
                self.attention(site).add_plugin(plugin)
            module = method.embedding_module()
            if module is not None:
                self.method_modules[f"{i}_{method.name}"] = module
        self._requested: set[RecordKey] = set().union(*(m.records() for m in self.methods)) if self.methods else set()

    def _reset_parameters(self) -> None:
        for name, p in self.named_parameters():
            if p.dim() > 1 and "embed" not in name:
                nn.init.xavier_uniform_(p)
        for emb in {self.src_embed, self.tgt_embed}:
            nn.init.normal_(emb.weight, mean=0.0, std=self.cfg.d_model ** -0.5)
            with torch.no_grad():
                emb.weight[PAD_ID].zero_()

    # -- plumbing -----------------------------------------------------------------
    def attention(self, site: Site) -> MultiHeadAttention:
        if site.stack == "encoder":
            return self.encoder[site.layer].self_attn
        layer = self.decoder[site.layer]
        return layer.self_attn if site.attention == "self" else layer.cross_attn

    def structure_needs(self, inference: bool = False) -> dict[str, set[str]]:
        """Structure fields the batches must carry for this model's methods."""
        return structure_needs(self.methods, inference)

    def _embed(self, tokens: Tensor, embed: nn.Embedding, side: str, struct: dict[str, dict[str, Tensor]],
               offset: int = 0) -> Tensor:
        x = embed(tokens) * math.sqrt(self.cfg.d_model)
        for method in self.methods:
            x = method.embed(x, side, struct.get(side, {}))
        length = tokens.size(1)
        if self.cfg.positional == "sinusoidal":
            x = x + self.pos_table[offset: offset + length].to(x.dtype)
        elif self.cfg.positional == "learned":
            x = x + self.pos_embed(torch.arange(offset, offset + length, device=tokens.device))
        return F.dropout(x, self.cfg.dropout, self.training)

    def _logits(self, h: Tensor) -> Tensor:
        if self.output is None:
            return F.linear(h, self.tgt_embed.weight)
        return self.output(h)

    # -- the three entry points -----------------------------------------------------
    def encode(self, src: Tensor, struct: dict[str, dict[str, Tensor]] | None = None,
               records: dict[RecordKey, Tensor] | None = None, requested: set[RecordKey] | frozenset = frozenset(),
               losses: dict[str, Tensor] | None = None) -> EncoderOutput:
        struct = struct or {"src": {}, "tgt": {}}
        pad = src.eq(PAD_ID)
        pad_arg = pad if _always_mask(pad) or bool(pad.any()) else None
        x = self._embed(src, self.src_embed, "src", struct)
        for layer in self.encoder:
            x = layer(x, pad_arg, struct=struct, records=records, requested=requested, losses=losses)
        return EncoderOutput(self.enc_norm(x), pad, struct, pad_arg is not None)

    def decode(self, tgt_in: Tensor, enc: EncoderOutput, struct: dict[str, dict[str, Tensor]] | None = None,
               cache: list[dict[str, Any]] | None = None, records: dict[RecordKey, Tensor] | None = None,
               requested: set[RecordKey] | frozenset = frozenset(),
               losses: dict[str, Tensor] | None = None) -> Tensor:
        """Logits for every position of ``tgt_in``; with ``cache`` only the new positions are fed."""
        struct = struct if struct is not None else enc.struct
        offset = 0
        if cache is not None and "k" in cache[0].get("self", {}):
            offset = cache[0]["self"]["k"].size(2)
        tgt_pad = tgt_in.eq(PAD_ID) if cache is None else None
        tgt_pad = tgt_pad if tgt_pad is not None and (_always_mask(tgt_pad) or bool(tgt_pad.any())) else None
        src_pad = enc.src_pad if enc.padded else None
        x = self._embed(tgt_in, self.tgt_embed, "tgt", struct, offset)
        for i, layer in enumerate(self.decoder):
            x = layer(x, enc.memory, src_pad, tgt_pad, cache=None if cache is None else cache[i], struct=struct,
                      records=records, requested=requested, losses=losses)
        return self._logits(self.dec_norm(x))

    def forward(self, batch: Batch, record: set[RecordKey] | None = None) -> ModelOutput:
        """Teacher-forced pass; ``record`` names extra attention tensors to return (analyses)."""
        requested = self._requested | set(record or ())
        records: dict[RecordKey, Tensor] = {}
        losses: dict[str, Tensor] = {}
        enc = self.encode(batch.src, batch.struct, records, requested, losses)
        logits = self.decode(batch.tgt_in, enc, batch.struct, None, records, requested, losses)
        pads = {"src": enc.src_pad, "tgt": batch.tgt_in.eq(PAD_ID)}
        for method in self.methods:
            losses.update(method.loss(records, batch.struct, pads))
        return ModelOutput(logits, losses, records)

    def new_cache(self) -> list[dict[str, Any]]:
        return [{} for _ in self.decoder]

    def shares_source_across_beams(self) -> bool:
        """True if beam search may keep one copy of each source for all its beams.

        A cross-attention layer without plug-ins then reads the source's keys and values once per
        sentence, with the beams as extra queries; a plug-in there may read per-row state, so
        then every beam gets its own copy, as before. (No decoder self-attention plug-in or
        target embedding reads source structure today; one that did would have to turn this
        off too, since the encoder output then holds one row per sentence.)"""
        return not any(layer.cross_attn.plugins for layer in self.decoder)

    @staticmethod
    def reorder_cache(cache: list[dict[str, Any]], index: Tensor | None, cross_index: Tensor | None = None) -> None:
        """Keep rows ``index`` of every self-attention cache and rows ``cross_index`` of every
        cross-attention cache (beam re-ordering and shrinking); None leaves that cache as it is.

        The two differ when beams share their source (one cross row per sentence)."""

        def pick(node: Any, rows: Tensor) -> Any:
            if isinstance(node, Tensor):
                return node.index_select(0, rows)
            if isinstance(node, dict):
                return {k: pick(v, rows) for k, v in node.items()}
            return node

        for layer_cache in cache:
            for kind, rows in (("self", index), ("cross", cross_index)):
                if rows is not None:
                    layer_cache[kind] = pick(layer_cache.get(kind, {}), rows)

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())
