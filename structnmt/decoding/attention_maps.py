"""Every attention matrix of a model on one sentence pair, as arrays with their sub-word tokens.

The model has one way to show its attention: ``record=`` keys naming ``(stack, layer, kind,
"probs")`` tensors (docs/ARCHITECTURE.md). This module asks for all of them at once, for one
source sentence and either a given target or the model's own translation of it, and hands
them back as NumPy arrays (one per stack) beside the tokens that label their rows and
columns, which is what heat maps and alignment analyses start from.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from structnmt.config import DecodingConfig
from structnmt.data.batch import BOS_ID, Batch
from structnmt.data.pipeline import Preprocessor
from structnmt.model.methods import RecordKey
from structnmt.model.search import translate_batch
from structnmt.model.transformer import Transformer


@dataclass
class AttentionMaps:
    """Attention probabilities of every layer and head for one sentence pair.

    Rows are queries, columns keys. ``I`` = ``len(source_tokens)`` (the source sub-words and
    the final ``</s>``); ``J`` = ``len(target_tokens)`` (``<s>`` and the target sub-words: the
    decoder's inputs, so row ``j`` is the position that *predicts* target token ``j``, with
    ``</s>`` predicted by the last row). Layers are 0-based here.
    """

    source_tokens: list[str]
    target_tokens: list[str]
    target: str  # the detokenised target the maps were computed for
    encoder: np.ndarray  # (encoder layers, heads, I, I) float32: encoder self-attention
    decoder: np.ndarray  # (decoder layers, heads, J, J) float32: decoder self-attention (causal)
    cross: np.ndarray  # (decoder layers, heads, J, I) float32: cross-attention


def all_attention_keys(model: Transformer) -> set[RecordKey]:
    """The record keys of every attention module of ``model``."""
    keys: set[RecordKey] = {("encoder", layer, "self", "probs") for layer in range(model.cfg.enc_layers)}
    for layer in range(model.cfg.dec_layers):
        keys |= {("decoder", layer, "self", "probs"), ("decoder", layer, "cross", "probs")}
    return keys


@torch.no_grad()
def attention_maps(model: Transformer, pre: Preprocessor, batch: Batch, decoding: DecodingConfig,
                   target_ids: Sequence[int] | None = None) -> AttentionMaps:
    """The :class:`AttentionMaps` of the single source sentence of ``batch``.

    ``target_ids`` are the target's sub-word ids (no BOS/EOS); without them the model's own
    translation with the ``decoding`` settings is used, as ``translate`` would produce it.
    ``pre`` (the dataset's preprocessing) names the tokens and detokenises the target.
    """
    device = next(model.parameters()).device
    batch = batch.to(device)
    if batch.src.size(0) != 1:
        raise ValueError(f"attention maps are drawn for one sentence at a time, got {batch.src.size(0)}")
    model.eval()
    if target_ids is None:
        target_ids = translate_batch(model, batch, decoding.beam, decoding.length_penalty, decoding.max_len_a,
                                     decoding.max_len_b)[0][0].tokens
    target_ids = [int(t) for t in target_ids]
    tgt_in = torch.tensor([[BOS_ID] + target_ids], dtype=torch.long, device=device)
    keys = all_attention_keys(model)
    records: dict[RecordKey, torch.Tensor] = {}
    struct = {"src": batch.struct.get("src", {}), "tgt": {}}
    enc = model.encode(batch.src, struct, records, keys)
    model.decode(tgt_in, enc, struct, None, records, keys)

    def stack(name: str, kind: str, layers: int) -> np.ndarray:
        return np.stack([records[(name, k, kind, "probs")][0].float().cpu().numpy() for k in range(layers)])

    return AttentionMaps(
        source_tokens=[pre.subwords["src"].piece(int(t)) for t in batch.src[0].tolist()],
        target_tokens=["<s>"] + [pre.subwords["tgt"].piece(int(t)) for t in target_ids],
        target=pre.decode(target_ids),
        encoder=stack("encoder", "self", model.cfg.enc_layers),
        decoder=stack("decoder", "self", model.cfg.dec_layers),
        cross=stack("decoder", "cross", model.cfg.dec_layers),
    )
