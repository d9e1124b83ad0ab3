"""One optimiser update: the arithmetic that makes training exact and DDP-correct.

An update consumes ``training.accumulate`` batches (per process). Its loss is the
label-smoothed cross-entropy *summed* over target tokens plus the methods' auxiliary terms,
divided by the number of target tokens of the whole update (all micro-batches on all ranks),
so that accumulation and the number of processes do not change the gradient. An update whose
loss or gradient is not finite is skipped (no weight change, no schedule step) and reported;
with fp16 and a gradient scaler an overflowing gradient is the scaler's business (it lowers the
scale), not a bad step.

Nothing here waits for the device: on a GPU the host queues the next update while the device
computes this one. Whether an update is skipped is decided on the device, where fused
Adam(W) reads it as ``found_inf`` (a skipped update moves no weight, no moment and not the
optimiser's step count), and the learning rate of each update is looked up there too, by the
count of updates applied (:class:`~structnmt.training.optim.DeviceRates`), so a skip known only
to the device still holds the schedule back. The statistics stay on the device until read
(:class:`UpdateStats`); the trainer reads them when it logs. On the CPU all of this computes
what the host-side checks and ``LambdaLR`` computed before, bit for bit.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
from torch import Tensor, nn

from structnmt.config import TrainingConfig
from structnmt.data.batch import PAD_ID, Batch
from structnmt.training import distributed as D
from structnmt.training.compiled import (
    compile_step,
    graphs_compiled,
    is_compiler_error,
    resolve_compile,
    resolve_cuda_graphs,
)
from structnmt.training.environment import choose_precision, tf32_matmuls
from structnmt.training.optim import DeviceRates, build_optimizer, build_scheduler


class UpdateStats:
    """What one update did, per target token of the whole update (all ranks):

    ``loss``, ``nll``, ``aux`` (auxiliary terms by name), ``tokens`` (target tokens), ``lr`` (the
    rate it used), ``grad_norm``, ``applied`` (False: skipped), ``bad`` (a non-finite loss or
    gradient, which counts towards ``training.max_bad_steps``; an fp16 overflow is not bad), and
    ``compiled`` (graphs torch.compile built during the update, 0 in steady state).

    Every field but ``compiled`` is read from the device at the first access to any of them,
    in one copy: reading waits for the update to finish, so a trainer reads at log time.
    """

    _FIELDS = frozenset({"loss", "nll", "aux", "tokens", "lr", "grad_norm", "applied", "bad"})

    def __init__(self, values: Tensor, aux_names: list[str], compiled: int = 0) -> None:
        # values: loss sum, NLL sum, the auxiliary sums, grad norm, rate, applied, bad, tokens
        self._pending = (values, aux_names)
        self.compiled = compiled

    def __getattr__(self, name: str) -> Any:
        pending = self.__dict__.get("_pending")
        if name not in self._FIELDS or pending is None:
            raise AttributeError(name)
        values, names = pending
        *sums, grad_norm, lr, applied, bad, tokens = values.tolist()
        per_token = [s / tokens if tokens else 0.0 for s in sums]
        self.loss, self.nll = per_token[:2]
        self.aux = dict(zip(names, per_token[2:]))
        self.tokens, self.grad_norm, self.lr = int(tokens), grad_norm, lr
        self.applied, self.bad = bool(applied), bool(bad)
        self._pending = None
        return getattr(self, name)


class Updater:
    """Model + optimiser + schedule + scaler, and the arithmetic of one exact update.

    After ``training.max_bad_steps`` non-finite updates in a row (where a trainer stops the run
    as diverged) it applies no more updates: a trainer that reads the statistics late still finds
    the weights, moments and schedule of the update where it stops.
    """

    def __init__(self, model: nn.Module, cfg: TrainingConfig, device: torch.device,
                 ctx: D.DistContext | None = None, precision: str | None = None,
                 find_unused_parameters: bool = False, compile: str | None = None) -> None:
        self.cfg = cfg
        self.device = device
        self.ctx = ctx = ctx or D.DistContext()
        self.model = model.to(device)
        self.wrapped = D.wrap_model(self.model, ctx, device, find_unused_parameters)
        self.optimizer = build_optimizer(self.model, cfg)
        # the host's record of the schedule (checkpoints keep its state); the rates themselves
        # are looked up by ``applied``, counted on the device
        self.scheduler = build_scheduler(self.optimizer, cfg)
        self.rates = DeviceRates(self.scheduler, device)
        self.applied = torch.zeros((), dtype=torch.float64, device=device)
        self.issued = 0  # updates started (applied or not): ``applied`` is at most this
        self.bad_run = torch.zeros((), dtype=torch.float64, device=device)  # non-finite updates in a row
        # the CUDA kernel of fused Adam reads a tensor rate as float32; the CPU kernel reads float64
        self._rate_dtype = torch.float32 if device.type == "cuda" else torch.float64
        #: the run's precision and why (``training.precision``)
        self.precision = choose_precision(precision or cfg.precision, device,
                                          getattr(getattr(model, "cfg", None), "d_model", None))
        self.amp_dtype = self.precision.amp
        self.scaler = torch.amp.GradScaler(device.type, enabled=self.precision.scaler)
        #: whether forward and loss run through torch.compile, and why (``training.compile``)
        self.compiled, self.compile_reason = resolve_compile(compile or cfg.compile, device)
        #: whether the compiled step replays CUDA graphs, and why (``training.cuda_graphs``)
        self.cuda_graphs, self.cuda_graphs_reason = resolve_cuda_graphs(cfg.cuda_graphs, self.compiled, device)
        self._step = compile_step(self._forward_loss, cuda_graphs=self.cuda_graphs) if self.compiled \
            else self._forward_loss
        self._compile_proven = False  # a first compiled update succeeded
        self.notes: list[str] = []  # one-line messages for the run's log (a compile fallback)
        #: the auxiliary losses of the last update (None before the first)
        self.aux_names: list[str] | None = None

    def _amp(self) -> contextlib.AbstractContextManager:
        if self.amp_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=self.amp_dtype)

    @contextlib.contextmanager
    def autocast(self) -> Iterator[None]:
        """The run's precision around a forward pass outside an update (validation): autocast, or
        fp32 with TF32 matrix products where ``precision: auto`` picked them."""
        with tf32_matmuls(self.precision.tf32), self._amp():
            yield

    def _forward_loss(self, batch: Batch) -> tuple[Tensor, Tensor, Tensor, dict[str, Tensor]]:
        """(loss to differentiate, smoothed loss, NLL, auxiliary terms) of one micro-batch, summed
        over its target tokens: the part of an update that ``training.compile`` compiles."""
        from structnmt.model.losses import label_smoothed_nll

        with self._amp():
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
        with tf32_matmuls(self.precision.tf32):
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
                self.cuda_graphs, self.cuda_graphs_reason = False, "off (compiling failed)"
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
        if self.cuda_graphs:
            torch.compiler.cudagraph_mark_step_begin()  # a new step: the graphs may reuse their outputs' memory
        batches = [b.to(self.device, non_blocking=True) for b in batches]
        # target tokens of the whole update (all micro-batches, all ranks), counted on the device
        tokens = D.all_reduce_(sum(b.tgt_out.ne(PAD_ID).sum() for b in batches).double())
        lr = self.rates.rate(self.applied, self.issued)
        self.issued += 1
        # DDP averages gradients over ranks: scale by world_size so the mean is the global-batch
        # gradient; float32 as the losses (a float64 factor would make the product float64)
        scale = (torch.full_like(tokens, self.ctx.world_size) / tokens).float()
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
        self.aux_names = names
        sums = D.all_reduce_(torch.stack([loss_sum, nll_sum] + [aux_sums[n] for n in names]))

        self.scaler.unscale_(self.optimizer)
        max_norm = self.cfg.clip_norm if self.cfg.clip_norm > 0 else float("inf")
        grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), max_norm)
        finite = torch.isfinite(sums)
        loss_ok = finite[0] & finite[2:].all()
        grad_ok = torch.isfinite(grad_norm)
        empty = tokens == 0  # nothing to learn from: skipped, not bad
        bad = (~loss_ok if self.scaler.is_enabled() else ~(loss_ok & grad_ok)) & ~empty
        halted = self.bad_run >= max(self.cfg.max_bad_steps, 1)
        skip = ~(loss_ok & grad_ok) | empty | halted
        self._optimizer_step(lr, skip)
        self.scaler.update()  # after an overflow: a lower scale
        self.applied += ~skip
        self.bad_run.add_(bad).mul_(skip)
        flags = torch.stack([grad_norm.double(), lr, (~skip).double(), bad.double(), tokens])
        return UpdateStats(torch.cat([sums, flags]), names)

    def _optimizer_step(self, lr: Tensor, skip: Tensor) -> None:
        """Fused Adam(W) at the device-side rate ``lr``; ``skip`` (as ``found_inf``, the way a
        gradient scaler passes it) leaves weights, moments and step counts as they were."""
        groups = self.optimizer.param_groups
        host_rates = [group["lr"] for group in groups]
        rate = lr.to(self._rate_dtype)
        for group in groups:
            group["lr"] = rate
        self.optimizer.found_inf = skip.float()
        try:
            self.optimizer.step()
        finally:
            del self.optimizer.found_inf
            for group, host_rate in zip(groups, host_rates):
                group["lr"] = host_rate

    def _catch_up_scheduler(self) -> None:
        """Step the host's ``LambdaLR`` to the updates applied on the device (a read: checkpoints
        only), so that checkpoints hold its state as they always did."""
        for _ in range(int(self.applied.item()) - self.scheduler.last_epoch):
            self.scheduler.step()

    def state_dict(self) -> dict[str, Any]:
        self._catch_up_scheduler()
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
        # the state brings back the rate and the Adam settings it was saved with; the config in
        # force sets them (unchanged ones are the same numbers, so an exact resume stays exact)
        betas = (float(self.cfg.betas[0]), float(self.cfg.betas[1]))
        for group in self.optimizer.param_groups:
            group.update(betas=betas, eps=self.cfg.eps, weight_decay=self.cfg.weight_decay, initial_lr=self.cfg.lr)
        self.scheduler.base_lrs = [self.cfg.lr] * len(self.scheduler.base_lrs)
        self.rates = DeviceRates(self.scheduler, self.device)  # the loaded schedule's rates
        self.applied.fill_(self.scheduler.last_epoch)
        self.issued = self.scheduler.last_epoch
        if state.get("scaler"):
            self.scaler.load_state_dict(state["scaler"])
