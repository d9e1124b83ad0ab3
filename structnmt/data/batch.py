"""The padded batch every model, trainer and decoder works on.

Token layout (fairseq-like):

* ``src``    = sub-words of the source + EOS, right-padded;
* ``tgt_in`` = BOS + sub-words of the target (decoder input), right-padded;
* ``tgt_out``= sub-words of the target + EOS (what the decoder predicts).

Structure tensors (``struct["src"]``, ``struct["tgt"]``) are aligned with the tensors the
attention sees: source fields with ``src`` positions, target fields with ``tgt_in``
positions (so target token ``m`` sits at position ``m + 1`` behind BOS). Only the fields
some method asked for are present. Field meanings (docs/structures.md, "The fields"):

=============== ============ ==============================================================
field           shape        meaning
=============== ============ ==============================================================
valid           (B, L) bool  a real sub-word (not BOS/EOS/padding); always present
word_index      (B, L) long  word of the token (-1 for specials)
parent_mid      (B, L) float mean position of the parent word's sub-words; root: its own
                             word's middle; specials: own position
parent_first    (B, L) long  first sub-word of the parent word for a word-initial token,
                             else the first sub-word of its own word; root: itself;
                             specials: own position
dist            (B, L, L)    undirected tree distance between the tokens' words (0 within a
                float        word; 0 wherever a special token is involved)
scene_mask      (B, L, L)    True iff the tokens share a scene; diagonal True; a token in no
                bool         scene has an all-True row; True wherever a special is involved
scene_dist      (B, L, L)    distance in the scene graph between the tokens' nearest scenes
                float        (0 when they share one)
labels          (B, L) long  dependency-label id of the token's word (0 for specials)
=============== ============ ==============================================================

Cells where a special token is involved are never modified by a method: use ``valid``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor

PAD_ID, UNK_ID, BOS_ID, EOS_ID = 0, 1, 2, 3


@dataclass
class Batch:
    src: Tensor
    tgt_in: Tensor | None = None
    tgt_out: Tensor | None = None
    struct: dict[str, dict[str, Tensor]] = field(default_factory=lambda: {"src": {}, "tgt": {}})
    index: Tensor | None = None  # (B,) example numbers within the split

    @property
    def src_pad(self) -> Tensor:
        return self.src.eq(PAD_ID)

    @property
    def tgt_pad(self) -> Tensor:
        assert self.tgt_in is not None
        return self.tgt_in.eq(PAD_ID)

    @property
    def n_tgt_tokens(self) -> int:
        assert self.tgt_out is not None
        return int(self.tgt_out.ne(PAD_ID).sum())

    @property
    def size(self) -> int:
        return self.src.size(0)

    def to(self, device: torch.device | str, non_blocking: bool = False) -> Batch:
        def move(t: Tensor | None) -> Tensor | None:
            return None if t is None else t.to(device, non_blocking=non_blocking)

        return Batch(
            src=move(self.src),
            tgt_in=move(self.tgt_in),
            tgt_out=move(self.tgt_out),
            struct={side: {k: move(v) for k, v in fields.items()} for side, fields in self.struct.items()},
            index=move(self.index),
        )
