"""One optimiser update: the arithmetic that makes training exact and DDP-correct.

An update consumes ``training.accumulate`` batches (per process). Its loss is the
label-smoothed cross-entropy *summed* over target tokens plus the methods' auxiliary terms,
divided by the number of target tokens of the whole update (all micro-batches on all ranks),
so that accumulation and the number of processes do not change the gradient. An update whose
loss or gradient is not finite is skipped (no weight change, no schedule step) and reported;
with fp16 and a gradient scaler an overflowing gradient is the scaler's business (it lowers the
scale), not a bad step.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from structnmt.config import TrainingConfig
from structnmt.data.batch import PAD_ID, Batch
from structnmt.training import distributed as D
from structnmt.training.compiled import compile_step, graphs_compiled, is_compiler_error, resolve_compile
from structnmt.training.environment import pick_precision
from structnmt.training.optim import build_optimizer, build_scheduler, current_lr


@dataclass
class UpdateStats:
    loss: float  # label-smoothed loss per target token (whole update, all ranks)
    nll: float  # per target token
    tokens: int  # target tokens of the whole update
    aux: dict[str, float]  # auxiliary terms per target token
    lr: float  # the rate this update used
    grad_norm: float
    applied: bool  # False: skipped (non-finite loss/gradient or fp16 overflow)
    bad: bool  # a non-finite loss or gradient (counts towards max_bad_steps)
    compiled: int = 0  # graphs torch.compile built during this update (0 in steady state)


class Updater:
    """Model + optimiser + schedule + scaler, and the arithmetic of one exact update."""

    def __init__(self, model: nn.Module, cfg: TrainingConfig, device: torch.device,
                 ctx: D.DistContext | None = None, precision: str | None = None,
                 find_unused_parameters: bool = False, compile: str | None = None) -> None:
        self.cfg = cfg
        self.device = device
        self.ctx = ctx = ctx or D.DistContext()
        self.model = model.to(device)
        self.wrapped = D.wrap_model(self.model, ctx, device, find_unused_parameters)
        self.optimizer = build_optimizer(self.model, cfg)
        self.scheduler = build_scheduler(self.optimizer, cfg)
        self.amp_dtype, use_scaler = pick_precision(precision or cfg.precision, device)
        self.scaler = torch.amp.GradScaler(device.type, enabled=use_scaler)
        #: whether forward and loss run through torch.compile, and why (``training.compile``)
        self.compiled, self.compile_reason = resolve_compile(compile or cfg.compile, device)
        self._step = compile_step(self._forward_loss) if self.compiled else self._forward_loss
        self._compile_proven = False  # a first compiled update succeeded
        self.notes: list[str] = []  # one-line messages for the run's log (a compile fallback)

    def autocast(self) -> contextlib.AbstractContextManager:
        if self.amp_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=self.amp_dtype)

    def _forward_loss(self, batch: Batch) -> tuple[Tensor, Tensor, Tensor, dict[str, Tensor]]:
        """(loss to differentiate, smoothed loss, NLL, auxiliary terms) of one micro-batch, summed
        over its target tokens: the part of an update that ``training.compile`` compiles."""
        from structnmt.model.losses import label_smoothed_nll

        with self.autocast():
            out = self.wrapped(batch)
        loss, nll = label_smoothed_nll(out.logits.float(), batch.tgt_out, self.cfg.label_smoothing,
                                       ignore_index=PAD_ID)
        total = loss
        aux = {}
        for name, value in out.losses.items():
            aux[name] = value.float()
            total = total + aux[name]
        return total, loss, nll, aux

    def update(self, batches: list[Batch]) -> UpdateStats:
        """One update; the first compiled one falls back to eager if the compiler fails."""
        if not self.compiled:
            return self._update(batches)
        before = graphs_compiled()
        if self._compile_proven:
            return self._counted(self._update(batches), before)
        rng = torch.get_rng_state()
        try:
            stats = self._update(batches)
        except Exception as err:
            if not is_compiler_error(err):
                raise
            first = (str(err).strip().splitlines() or [""])[0][:200]
            self.notes.append(f"training.compile: compiling failed ({type(err).__name__}: {first}); "
                              "training eagerly")
            self.compiled, self.compile_reason = False, "eager (compiling failed)"
            self._step = self._forward_loss
            torch.set_rng_state(rng)
            return self._update(batches)
        self._compile_proven = True
        return self._counted(stats, before)

    @staticmethod
    def _counted(stats: UpdateStats, before: int) -> UpdateStats:
        """``stats`` with the graphs compiled since ``before`` (applied or skipped update alike)."""
        stats.compiled = graphs_compiled() - before
        return stats

    def _update(self, batches: list[Batch]) -> UpdateStats:
        self.wrapped.train()
        self.optimizer.zero_grad(set_to_none=True)
        batches = [b.to(self.device, non_blocking=True) for b in batches]
        local_tokens = sum(b.n_tgt_tokens for b in batches)
        global_tokens = D.all_reduce_sum([float(local_tokens)], self.device)[0]
        lr = current_lr(self.optimizer)
        if global_tokens == 0:
            return UpdateStats(0.0, 0.0, 0, {}, lr, 0.0, applied=False, bad=False)
        # DDP averages gradients over ranks: scale by world_size so the mean is the global-batch gradient
        scale = self.ctx.world_size / global_tokens
        loss_sum = torch.zeros((), dtype=torch.float64, device=self.device)
        nll_sum = torch.zeros((), dtype=torch.float64, device=self.device)
        aux_sums: dict[str, torch.Tensor] = {}
        for i, batch in enumerate(batches):
            last = i == len(batches) - 1
            sync = contextlib.nullcontext() if last or not self.ctx.enabled else self.wrapped.no_sync()
            with sync:
                total, loss, nll, aux = self._step(batch)
                for name, value in aux.items():
                    aux_sums[name] = aux_sums.get(name, 0.0) + value.detach().double()
                self.scaler.scale(total * scale).backward()
            loss_sum += loss.detach().double()
            nll_sum += nll.detach().double()
        names = sorted(aux_sums)
        sums = D.all_reduce_sum([float(loss_sum), float(nll_sum)] + [float(aux_sums[n]) for n in names],
                                self.device)
        loss_tok, nll_tok = sums[0] / global_tokens, sums[1] / global_tokens
        aux = {n: s / global_tokens for n, s in zip(names, sums[2:])}

        self.scaler.unscale_(self.optimizer)
        max_norm = self.cfg.clip_norm if self.cfg.clip_norm > 0 else float("inf")
        grad_norm = float(torch.nn.utils.clip_grad_norm_(self.model.parameters(), max_norm))
        loss_ok = np.isfinite(loss_tok) and all(np.isfinite(v) for v in aux.values())
        grad_ok = np.isfinite(grad_norm)
        stats = UpdateStats(loss_tok, nll_tok, int(global_tokens), aux, lr, grad_norm, applied=False,
                            bad=not loss_ok or (not grad_ok and not self.scaler.is_enabled()))
        if not loss_ok or not grad_ok:
            self.optimizer.zero_grad(set_to_none=True)
            if self.scaler.is_enabled():
                self.scaler.update()  # lowers the scale after an overflow; no step taken
            return stats
        self.scaler.step(self.optimizer)
        self.scaler.update()
        self.scheduler.step()
        stats.applied = True
        return stats

    def state_dict(self) -> dict[str, Any]:
        return {
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "scaler": self.scaler.state_dict(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        if state.get("scaler"):
            self.scaler.load_state_dict(state["scaler"])
