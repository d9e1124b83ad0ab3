"""Label-smoothed cross-entropy (Szegedy et al. 2016), the translation loss of every recipe."""

from __future__ import annotations

import torch
from torch import Tensor

from structnmt.data.batch import PAD_ID


def label_smoothed_nll(logits: Tensor, target: Tensor, epsilon: float,
                       ignore_index: int = PAD_ID) -> tuple[Tensor, Tensor]:
    """Summed smoothed loss and summed NLL over non-padding targets.

    The smoothing mass ``epsilon`` is spread uniformly over the whole vocabulary (the gold
    token included), so ``epsilon = 0`` gives plain cross-entropy. Sums, not means: the
    trainer divides by the number of target tokens of the whole (possibly distributed)
    batch, which keeps gradient accumulation and DDP exact.
    """
    lprobs = torch.log_softmax(logits.to(torch.promote_types(logits.dtype, torch.float32)), dim=-1)
    mask = target.ne(ignore_index)
    gold = target.masked_fill(~mask, 0).unsqueeze(-1)
    nll = -lprobs.gather(-1, gold).squeeze(-1)
    smooth = -lprobs.mean(dim=-1)
    loss = (1.0 - epsilon) * nll + epsilon * smooth
    return loss.masked_fill(~mask, 0.0).sum(), nll.masked_fill(~mask, 0.0).sum()
