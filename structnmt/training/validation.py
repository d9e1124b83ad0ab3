"""Validation during training: the loss on the validation split, BLEU of its translations,
and which result counts as better.

Runs on the main process only; the trainer shares the verdict with the other ranks. The
loss is per target token (label-smoothed, as trained); BLEU is sacreBLEU's on the
detokenised greedy (``training.valid_beam = 1``) or beam translations against the split's
raw references.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np
import torch
from torch import nn

from structnmt.config import DecodingConfig, TrainingConfig
from structnmt.data.batch import Batch


@torch.no_grad()
def validate(model: nn.Module, batches: Iterable[tuple[Any, Batch]], dataset: Any, device: torch.device,
             autocast: Callable[[], contextlib.AbstractContextManager], label_smoothing: float,
             decoding: DecodingConfig, beam: int, decode: Callable[[list[int]], str] | None = None
             ) -> dict[str, float]:
    """``{"loss", "nll", "ppl"}`` over ``batches`` ((indices, batch) of ``dataset``), and ``"bleu"``
    when ``decode`` turns target ids into text. The model is left in training mode."""
    from structnmt.model.losses import label_smoothed_nll

    model.eval()
    loss_sum = nll_sum = 0.0
    tokens = 0
    hyps: dict[int, str] = {}
    try:
        for indices, batch in batches:
            batch = batch.to(device)
            with autocast():
                out = model(batch)
            loss, nll = label_smoothed_nll(out.logits.float(), batch.tgt_out, label_smoothing)
            loss_sum += float(loss)
            nll_sum += float(nll)
            tokens += batch.n_tgt_tokens
            if decode is not None:
                from structnmt.model.search import translate_batch

                src_only = Batch(src=batch.src, struct={"src": batch.struct.get("src", {}), "tgt": {}},
                                 index=batch.index)
                with autocast():
                    found = translate_batch(model, src_only, beam=beam, length_penalty=decoding.length_penalty,
                                            max_len_a=decoding.max_len_a, max_len_b=decoding.max_len_b, nbest=1)
                rows = batch.index.tolist() if batch.index is not None else list(indices)
                for row, nbest in zip(rows, found):
                    hyps[int(row)] = decode(nbest[0].tokens) if nbest else ""
    finally:
        model.train()
    tokens = max(tokens, 1)
    result = {"loss": loss_sum / tokens, "nll": nll_sum / tokens,
              "ppl": float(np.exp(min(nll_sum / tokens, 50.0)))}
    if decode is not None:
        import sacrebleu

        refs = list(dataset.raw("tgt"))
        system = [hyps.get(i, "") for i in range(len(refs))]
        # sacreBLEU's "forgot to detokenize" advice, withheld where the references end in " ." too
        # (structnmt.evaluation.scores.references_tokenised: the data's convention, not a mistake)
        tokenised = sum(1 for line in refs if line.endswith(" .")) >= 100
        result["bleu"] = float(sacrebleu.corpus_bleu(system, [refs], force=tokenised).score)
    return result


def metric_name(cfg: TrainingConfig, bleu_computed: bool) -> str:
    """The metric the best checkpoint is chosen by: BLEU only when validation computes it."""
    return "bleu" if cfg.early_stopping_metric == "bleu" and bleu_computed else "loss"


def improved(result: dict[str, float], best: float | None, preferred: str) -> tuple[bool, float]:
    """(whether ``result`` beats ``best``, its value): higher BLEU or, without BLEU, lower loss."""
    metric = "bleu" if preferred == "bleu" and "bleu" in result else "loss"
    value = result[metric]
    better = best is None or (value > best if metric == "bleu" else value < best)
    return better, value
