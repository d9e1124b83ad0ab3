"""Training loop: token-count batches, exact resume, validation BLEU, checkpoints, DDP.

One optimiser *update* consumes ``training.accumulate`` batches (per process). The loss of
an update is the label-smoothed cross-entropy *summed* over target tokens plus the methods'
auxiliary terms, divided by the number of target tokens of the whole update (all
micro-batches on all ranks). Auxiliary terms must therefore be sums over the batch like
the translation loss (the papers' ``L = L_t + λ L_dep``); they are logged per target token.

Resume is exact: a checkpoint holds the model, optimiser, schedule, gradient scaler, every
random-number state and the data position (epoch, index of the next batch in that epoch's
deterministic batch list). On CPU a run resumed from step k reaches bitwise the same
weights as one that never stopped.

Updates whose loss or gradient is not finite are skipped (no weight change, no schedule
step) and logged; after ``training.max_bad_steps`` such updates *in a row* the run stops
with status ``diverged`` and leaves the last good checkpoint as it was. With fp16 and a
gradient scaler an overflowing gradient is the scaler's business (it lowers the scale),
not a bad step.

Run directory (``training.out_dir``): ``config.yaml`` (resolved), ``run.json`` (command,
versions, sizes), ``log.jsonl``, ``tensorboard/``, ``last.pt``, ``best.pt``, ``step_N.pt``.
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import random
import shutil
import signal
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
import yaml
from torch import nn

import structnmt
from structnmt.config import ExperimentConfig, TrainingConfig, config_from_dict, to_dict
from structnmt.data.batch import PAD_ID, Batch
from structnmt.errors import CheckpointError, ConfigError, DataError
from structnmt.io import atomic_write_text
from structnmt.locks import DirectoryLock
from structnmt.training import distributed as D
from structnmt.training.checkpoint import (
    dataset_fingerprint,
    load_checkpoint,
    newest_good_checkpoint,
    save_checkpoint,
    write_averaged_checkpoint,
)
from structnmt.training.logger import RunLogger, rewind_log
from structnmt.training.optim import build_optimizer, build_scheduler, current_lr

# ---------------------------------------------------------------------------
# devices, precision, seeds


def pick_device(spec: str, ctx: D.DistContext) -> torch.device:
    """``auto``: the process's GPU when there is one, else the CPU."""
    if spec == "auto":
        spec = "cuda" if torch.cuda.is_available() else "cpu"
    if spec.startswith("cuda"):
        if not torch.cuda.is_available():
            raise ConfigError(f"device {spec!r} asked for, but no CUDA GPU is available", "training.device")
        if spec == "cuda":
            return torch.device("cuda", ctx.local_rank)
    try:
        return torch.device(spec)
    except RuntimeError:
        raise ConfigError(f"not a device: {spec!r}", "training.device") from None


def pick_precision(spec: str, device: torch.device) -> tuple[torch.dtype | None, bool]:
    """(autocast dtype or None for fp32, whether a gradient scaler is needed)."""
    if spec == "auto":
        if device.type == "cpu":
            # CPUs with native bf16 (AVX512-BF16, AMX) multiply bf16 about twice as fast as fp32
            # (measured here: 174 vs 79 GFLOP/s); elsewhere bf16 is emulated and slower
            native = bool(getattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", lambda: False)())
            return (torch.bfloat16, False) if native else (None, False)
        if device.type != "cuda":
            return None, False
        return (torch.bfloat16, False) if torch.cuda.is_bf16_supported() else (torch.float16, True)
    if spec == "bf16":
        return torch.bfloat16, False
    if spec == "fp16":
        if device.type != "cuda":
            raise ConfigError("fp16 training needs a CUDA GPU (use bf16 or fp32 on the CPU)",
                              "training.precision")
        return torch.float16, True
    return None, False


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def rng_state() -> dict[str, Any]:
    """Every generator's state in types ``torch.load(weights_only=True)`` accepts."""
    np_state = np.random.get_state(legacy=False)
    state: dict[str, Any] = {
        "python": random.getstate(),
        "numpy": {
            "key": torch.from_numpy(np_state["state"]["key"].astype(np.int64)),
            "pos": int(np_state["state"]["pos"]),
            "has_gauss": int(np_state["has_gauss"]),
            "gauss": float(np_state["gauss"]),
        },
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    py = state["python"]
    random.setstate((py[0], tuple(py[1]), py[2]))
    npst = state["numpy"]
    np.random.set_state({
        "bit_generator": "MT19937",
        "state": {"key": npst["key"].numpy().astype(np.uint32), "pos": npst["pos"]},
        "has_gauss": npst["has_gauss"],
        "gauss": npst["gauss"],
    })
    torch.set_rng_state(state["torch"].cpu())
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all([s.cpu() for s in state["cuda"]])


# ---------------------------------------------------------------------------
# one optimiser update


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


class Updater:
    """Model + optimiser + schedule + scaler, and the arithmetic of one exact update."""

    def __init__(self, model: nn.Module, cfg: TrainingConfig, device: torch.device,
                 ctx: D.DistContext | None = None, precision: str | None = None,
                 find_unused_parameters: bool = False) -> None:
        self.cfg = cfg
        self.device = device
        self.ctx = ctx = ctx or D.DistContext()
        self.model = model.to(device)
        self.wrapped = D.wrap_model(self.model, ctx, device, find_unused_parameters)
        self.optimizer = build_optimizer(self.model, cfg)
        self.scheduler = build_scheduler(self.optimizer, cfg)
        self.amp_dtype, use_scaler = pick_precision(precision or cfg.precision, device)
        self.scaler = torch.amp.GradScaler(device.type, enabled=use_scaler)

    def autocast(self) -> contextlib.AbstractContextManager:
        if self.amp_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=self.amp_dtype)

    def update(self, batches: list[Batch]) -> UpdateStats:
        from structnmt.model.losses import label_smoothed_nll

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
                with self.autocast():
                    out = self.wrapped(batch)
                loss, nll = label_smoothed_nll(out.logits.float(), batch.tgt_out, self.cfg.label_smoothing,
                                               ignore_index=PAD_ID)
                total = loss
                for name, value in out.losses.items():
                    value = value.float()
                    total = total + value
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


# ---------------------------------------------------------------------------
# the run


@dataclass
class Progress:
    """Everything besides weights and generators that an exact resume needs."""

    step: int = 0  # applied updates
    epoch: int = 1  # 1-based
    batch: int = 0  # index of the next batch in this epoch's (rank-local) list
    bad_in_a_row: int = 0
    bad_total: int = 0
    best_metric: float | None = None
    best_step: int = 0
    stale_validations: int = 0
    elapsed_s: float = 0.0
    tokens: int = 0
    history: list[dict[str, float]] = field(default_factory=list)  # validation results


class Trainer:
    """Drives :class:`Updater` over the data; writes logs and checkpoints on rank 0.

    The two data hooks (:meth:`make_batches`, :meth:`collate`) are the only places that
    know the dataset classes; a test or an experiment may override them.
    """

    def __init__(self, cfg: ExperimentConfig, model: nn.Module, train_set: Any, valid_set: Any = None,
                 decode: Callable[[list[int]], str] | None = None, vocab: dict[str, Any] | None = None,
                 ctx: D.DistContext | None = None, device: torch.device | None = None) -> None:
        self.cfg = cfg
        self.t = cfg.training
        self.ctx = ctx or D.DistContext()
        self.device = device or pick_device(self.t.device, self.ctx)
        self.train_set = train_set
        self.valid_set = valid_set
        self.decode = decode
        self.vocab = vocab or {}
        self.run_dir = Path(self.t.out_dir)
        needs = getattr(model, "structure_needs", None)
        self.fields = needs() if needs is not None else {"src": set(), "tgt": set()}
        self.updater = Updater(model, self.t, self.device, self.ctx,
                               find_unused_parameters=bool(cfg.model.methods))
        self.progress = Progress()
        self._signal: int | None = None
        self._epoch_cache: tuple[int, list[np.ndarray]] | None = None

    # -- data hooks -----------------------------------------------------------
    def make_batches(self, dataset: Any, epoch: int, shuffle: bool, shard: bool) -> list[np.ndarray]:
        from structnmt.data.batching import token_batches

        return token_batches(
            dataset.src_lengths, dataset.tgt_lengths, self.t.max_tokens, shuffle=shuffle, seed=self.t.seed,
            epoch=epoch, num_shards=self.ctx.world_size if shard else 1, shard=self.ctx.rank if shard else 0,
        )

    def collate(self, dataset: Any, indices: np.ndarray, fields: dict[str, set[str]]) -> Batch:
        from structnmt.data.batching import collate

        return collate(dataset, indices, fields)

    # -- batches ----------------------------------------------------------------
    def epoch_batches(self, epoch: int) -> list[np.ndarray]:
        """This rank's batches of ``epoch``; every rank gets the same number (DDP steps in lock-step)."""
        if self._epoch_cache is not None and self._epoch_cache[0] == epoch:
            return self._epoch_cache[1]
        batches = list(self.make_batches(self.train_set, epoch, shuffle=True, shard=True))
        batches = batches[: D.all_reduce_min(len(batches), self.device)]
        if not batches:
            raise DataError("the training split yields no batches (is it empty, or max_tokens too small?)",
                            getattr(self.train_set, "path", None))
        self._epoch_cache = (epoch, batches)
        return batches

    def _stream(self) -> Iterator[tuple[int, int, int, np.ndarray]]:
        """(epoch, index, batches in epoch, indices) from the saved position on, across epochs."""
        epoch, start = self.progress.epoch, self.progress.batch
        while not self.t.max_epochs or epoch <= self.t.max_epochs:
            batches = self.epoch_batches(epoch)
            for i in range(start, len(batches)):
                yield epoch, i, len(batches), batches[i]
            epoch, start = epoch + 1, 0

    # -- checkpoints ------------------------------------------------------------
    def checkpoint_state(self) -> dict[str, Any]:
        """The whole training state; RNG states of every rank (gathered to rank 0)."""
        rng = [rng_state()]
        if self.ctx.enabled:
            gathered: list[Any] = [None] * self.ctx.world_size
            torch.distributed.all_gather_object(gathered, rng[0])
            rng = gathered
        raw = to_dict(self.cfg)
        raw.pop("path", None)
        return {**self.updater.state_dict(), "rng": rng, "progress": asdict(self.progress),
                "config": raw, "vocab": self.vocab, "world_size": self.ctx.world_size}

    def save(self, best: bool = False) -> Path | None:
        """Write step_N.pt (when kept), last.pt and maybe best.pt; one serialisation, hard links."""
        state = self.checkpoint_state()  # collective: every rank takes part
        if not self.ctx.is_main:
            return None
        step = self.progress.step
        keep = self.t.keep_last > 0
        first = self.run_dir / (f"step_{step}.pt" if keep else "last.pt")
        save_checkpoint(first, state)
        targets = ([self.run_dir / "last.pt"] if keep else []) + ([self.run_dir / "best.pt"] if best else [])
        for target in targets:
            _publish_copy(first, target)
        if keep:
            steps = sorted(self.run_dir.glob("step_*.pt"), key=lambda p: int(p.stem.split("_")[1]))
            for old in steps[: -self.t.keep_last]:
                old.unlink(missing_ok=True)
        return self.run_dir / "last.pt"

    def restore(self, path: Path) -> None:
        # on the CPU: generator states must stay there; load_state_dict moves the rest to the device
        state = load_checkpoint(path, map_location="cpu")
        self._check_resumable(path, state)
        try:
            self.updater.load_state_dict(state)
        except (KeyError, RuntimeError, ValueError) as err:
            raise CheckpointError(f"{path}: does not fit this model/optimiser ({err})") from None
        self.progress = Progress(**state["progress"])
        rngs = state["rng"]
        if len(rngs) == self.ctx.world_size:
            set_rng_state(rngs[self.ctx.rank])
        else:  # another number of processes: exactness is lost anyway, keep the streams distinct
            seed_everything(self.t.seed + 1000 * self.progress.step + self.ctx.rank)
        self._epoch_cache = None

    def _check_resumable(self, path: Path, state: dict[str, Any]) -> None:
        """Refuse, in one line, a checkpoint of another model or another dataset."""
        stored = (state.get("vocab") or {}).get("fingerprint")
        current = self.vocab.get("fingerprint")
        if stored and current and stored != current:
            raise CheckpointError(
                f"{path}: made on a dataset with vocabulary fingerprint {stored[:12]}, but "
                f"{self.cfg.data.dir if self.cfg.data else 'the dataset'} now has {current[:12]} "
                "(re-prepared or another dataset): its embeddings would stand for other pieces; "
                "train a new run instead of resuming")
        raw = state.get("config") or {}
        now = to_dict(self.cfg)
        differ = config_differences(raw.get("model") or {}, now.get("model") or {}, "model")
        if differ:
            shown = "; ".join(f"{k}: {a!r} in the checkpoint, {b!r} now" for k, a, b in differ[:4])
            more = f" (+{len(differ) - 4} more)" if len(differ) > 4 else ""
            raise CheckpointError(f"{path}: the model changed since this checkpoint ({shown}{more}); "
                                  "resume with the run's own config.yaml or start a new run")

    # -- validation ---------------------------------------------------------------
    @torch.no_grad()
    def validate(self) -> dict[str, float]:
        """Loss per target token and (greedy/beam) BLEU on the validation split; rank 0 only."""
        from structnmt.model.losses import label_smoothed_nll

        model = self.updater.model
        model.eval()
        loss_sum = nll_sum = 0.0
        tokens = 0
        hyps: dict[int, str] = {}
        want_bleu = self.t.valid_bleu and self.decode is not None
        dec = self.cfg.decoding
        try:
            for indices in self.make_batches(self.valid_set, 1, shuffle=False, shard=False):
                batch = self.collate(self.valid_set, indices, self.fields).to(self.device)
                with self.updater.autocast():
                    out = model(batch)
                loss, nll = label_smoothed_nll(out.logits.float(), batch.tgt_out, self.t.label_smoothing)
                loss_sum += float(loss)
                nll_sum += float(nll)
                tokens += batch.n_tgt_tokens
                if want_bleu:
                    from structnmt.decoding.search import translate_batch

                    src_only = Batch(src=batch.src, struct={"src": batch.struct.get("src", {}), "tgt": {}},
                                     index=batch.index)
                    with self.updater.autocast():
                        found = translate_batch(model, src_only, beam=self.t.valid_beam,
                                                length_penalty=dec.length_penalty, max_len_a=dec.max_len_a,
                                                max_len_b=dec.max_len_b, nbest=1)
                    rows = batch.index.tolist() if batch.index is not None else list(indices)
                    for row, nbest in zip(rows, found):
                        hyps[int(row)] = self.decode(nbest[0].tokens) if nbest else ""
        finally:
            model.train()
        tokens = max(tokens, 1)
        result = {"loss": loss_sum / tokens, "nll": nll_sum / tokens,
                  "ppl": float(np.exp(min(nll_sum / tokens, 50.0)))}
        if want_bleu:
            import sacrebleu

            refs = list(self.valid_set.raw("tgt"))
            system = [hyps.get(i, "") for i in range(len(refs))]
            bleu = sacrebleu.corpus_bleu(system, [refs])
            result["bleu"] = float(bleu.score)
        return result

    def _metric_name(self) -> str:
        """The metric best_metric holds: BLEU only when validation computes it."""
        bleu = self.t.early_stopping_metric == "bleu" and self.t.valid_bleu and self.decode is not None
        return "bleu" if bleu else "loss"

    def _improved(self, result: dict[str, float]) -> tuple[bool, float]:
        metric = "bleu" if self.t.early_stopping_metric == "bleu" and "bleu" in result else "loss"
        value = result[metric]
        best = self.progress.best_metric
        better = best is None or (value > best if metric == "bleu" else value < best)
        return better, value

    # -- main loop ------------------------------------------------------------------
    def _on_signal(self, signum: int, frame: Any) -> None:
        self._signal = signum
        signal.signal(signum, signal.SIG_DFL)  # a second Ctrl-C kills at once

    def _prepare_run_dir(self, resume: bool) -> Path | None:
        """Where to resume from (or None); refuses to overwrite a run that was not asked to resume."""
        start = None
        self._fallback: str | None = None
        if resume:
            damaged: list[tuple[Path, str]] = []
            start = newest_good_checkpoint(self.run_dir, damaged)
            if start is None and any(self.run_dir.glob("*.pt")):
                reasons = "; ".join(reason for _, reason in damaged[:3])
                raise CheckpointError(f"{self.run_dir}: no checkpoint there verifies ({reasons}); cannot resume")
            skipped = [(p, r) for p, r in damaged if p.name == "last.pt" or p.name.startswith("step_")]
            if start is not None and skipped:
                self._fallback = (f"not resuming from {', '.join(p.name for p, _ in skipped)}: "
                                  f"{'; '.join(r for _, r in skipped)}; falling back to {start.name}")
        elif (self.run_dir / "last.pt").exists():
            raise ConfigError(f"{self.run_dir} already holds a run (last.pt); pass --resume to continue it "
                              "or choose another out_dir", "training.out_dir")
        return start

    def _write_run_files(self, resumed_from: Path | None) -> None:
        raw = to_dict(self.cfg)
        raw.pop("path", None)
        atomic_write_text(self.run_dir / "config.yaml",
                          yaml.safe_dump(raw, sort_keys=False, allow_unicode=True))
        info = {
            "command": sys.argv,
            "python": platform.python_version(),
            "torch": torch.__version__,
            "structnmt": structnmt.__version__,
            "sacrebleu": _version("sacrebleu"),
            "parameters": sum(p.numel() for p in self.updater.model.parameters()),
            "dataset": self.cfg.data.dir if self.cfg.data is not None else None,
            "parsers": _dataset_parsers(self.cfg),
            "methods": [m.get("name") for m in self.cfg.model.methods],
            "device": str(self.device),
            "world_size": self.ctx.world_size,
            "precision": str(self.updater.amp_dtype or torch.float32).replace("torch.", ""),
            "config_file": self.cfg.path,
            "resumed_from": str(resumed_from) if resumed_from else None,
            "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        }
        atomic_write_text(self.run_dir / "run.json", json.dumps(info, indent=2) + "\n")

    def run(self, resume: bool = False) -> dict[str, Any]:
        """Train until a budget, early stopping, a signal or divergence; returns a summary.

        The main process holds the run directory's lock throughout: a second ``train`` on the
        same ``out_dir`` is refused at once instead of interleaving logs and checkpoints.
        """
        lock = DirectoryLock(self.run_dir, "train", messages=_stderr) if self.ctx.is_main else None
        if lock is not None:
            lock.acquire()
        try:
            return self._run(resume)
        finally:
            if lock is not None:
                lock.release()

    def _run(self, resume: bool) -> dict[str, Any]:
        start = self._prepare_run_dir(resume)
        if start is not None:
            self.restore(start)
        else:
            seed_everything(self.t.seed + self.ctx.rank)
        if self.ctx.is_main:
            self.run_dir.mkdir(parents=True, exist_ok=True)
            self._write_run_files(start)
            if start is not None:
                moved = rewind_log(self.run_dir / "log.jsonl", self.progress.step)
                if moved:
                    _stderr(f"{moved} log records after step {self.progress.step} (trained again now) moved "
                            "to log.superseded.jsonl")
        if self._fallback:
            _stderr(self._fallback)
        log = RunLogger(self.run_dir, enabled=self.ctx.is_main, tensorboard=self.t.tensorboard,
                        progress=self.t.progress, total_steps=self.t.max_steps,
                        initial_step=self.progress.step)
        if resume and start is None:
            log.message(f"nothing to resume in {self.run_dir}: starting a new run")
        parsers = _dataset_parsers(self.cfg) or {}
        for side, info in parsers.items():
            if info:
                log.message(f"{side} trees of {self.cfg.data.dir}: {info.get('name') or info.get('backend')} "
                            f"{info.get('version') or ''} ({info.get('model') or '-'}, {info.get('convention')})")
        if start is not None:
            log.message(f"resuming from {start} (step {self.progress.step}, epoch {self.progress.epoch})")
            log.log("event", {"event": "resume", "step": self.progress.step, "from": str(start)})
        old_handlers = {}
        for sig in (signal.SIGINT, signal.SIGTERM):
            with contextlib.suppress(ValueError):  # not in the main thread: leave signals alone
                old_handlers[sig] = signal.signal(sig, self._on_signal)
        try:
            status = self._loop(log)
        finally:
            for sig, handler in old_handlers.items():
                signal.signal(sig, handler)
            log.close()
        p = self.progress
        summary = {
            "status": status,
            "step": p.step,
            "epoch": p.epoch,
            "best_metric": p.best_metric,
            "best_step": p.best_step,
            "metric": self._metric_name(),
            "bad_steps": p.bad_total,
            "run_dir": str(self.run_dir),
            "last": str(self.run_dir / "last.pt"),
            "best": str(self.run_dir / "best.pt") if (self.run_dir / "best.pt").exists() else None,
        }
        return summary

    def _loop(self, log: RunLogger) -> str:
        t, p = self.t, self.progress
        began = time.monotonic() - p.elapsed_s
        window: dict[str, float] = {}
        window_start = time.monotonic()
        saved_step = p.step if p.step > 0 else -1
        stream = self._stream()
        status = "finished"
        while True:
            if t.max_steps and p.step >= t.max_steps:
                break
            group: list[np.ndarray] = []
            epoch_end = False
            for epoch, i, n, indices in stream:
                group.append(indices)
                p.epoch, p.batch = epoch, i + 1
                if i + 1 == n:
                    epoch_end = True
                    p.epoch, p.batch = epoch + 1, 0
                if len(group) == t.accumulate or epoch_end:
                    break
            if not group:
                status = "max_epochs"
                break
            batches = [self.collate(self.train_set, idx, self.fields) for idx in group]
            stats = self.updater.update(batches)
            p.tokens += stats.tokens
            if stats.applied:
                p.step += 1
                p.bad_in_a_row = 0
            elif stats.bad:
                p.bad_in_a_row += 1
                p.bad_total += 1
                log.log("event", {"event": "skipped_update", "step": p.step, "epoch": p.epoch,
                                  "loss": stats.loss, "grad_norm": stats.grad_norm})
                log.message(f"step {p.step}: non-finite loss or gradient, update skipped "
                            f"({p.bad_in_a_row} in a row)")
                if p.bad_in_a_row >= t.max_bad_steps:
                    log.message(f"stopping: {p.bad_in_a_row} non-finite updates in a row; "
                                f"the last good checkpoint is left as it was")
                    log.log("event", {"event": "diverged", "step": p.step})
                    return "diverged"
            self._accumulate(window, stats)
            log.progress(1 if stats.applied else 0, loss=stats.loss, lr=stats.lr)
            if stats.applied and p.step % max(t.log_every, 1) == 0:
                self._flush_window(log, window, time.monotonic() - window_start)
                window, window_start = {}, time.monotonic()

            due = (t.valid_every > 0 and stats.applied and p.step % t.valid_every == 0) or \
                  (t.valid_every == 0 and epoch_end)
            if due:
                p.elapsed_s = time.monotonic() - began
                outcome = self._validate_and_save(log)
                saved_step = p.step
                if outcome is not None:
                    return outcome
            p.elapsed_s = time.monotonic() - began
            # one small all-reduce: any rank's signal or clock stops every rank at the same step
            signalled, late = D.all_reduce_sum(
                [float(self._signal is not None), float(bool(t.max_minutes) and p.elapsed_s >= 60 * t.max_minutes)],
                self.device)
            if signalled:
                status = "interrupted"
                log.message("signal received: saving a checkpoint and stopping")
                break
            if late:
                status = "time_budget"
                break
        if t.max_steps and p.step >= t.max_steps and status == "finished":
            status = "max_steps"
        p.elapsed_s = time.monotonic() - began
        if window:
            self._flush_window(log, window, time.monotonic() - window_start)
        if saved_step != p.step:
            if status != "interrupted" and self.valid_set is not None:
                return self._validate_and_save(log) or status
            return self._save_unless_diverged(log, best=False) or status
        return status

    def _save_unless_diverged(self, log: RunLogger, best: bool) -> str | None:
        """Save; with non-finite weights save nothing and return ``"diverged"``."""
        if not all(bool(torch.isfinite(v).all()) for v in self.updater.model.state_dict().values()
                   if v.is_floating_point()):
            log.message("stopping: the weights are no longer finite; the last good checkpoint is kept")
            log.log("event", {"event": "diverged", "step": self.progress.step})
            return "diverged"
        self.save(best=best)
        return None

    def _validate_and_save(self, log: RunLogger) -> str | None:
        """Validate (rank 0), save, decide on early stopping; a status when the run must stop."""
        p = self.progress
        stop = False
        improved = False
        if self.valid_set is not None:
            if self.ctx.is_main:
                result = self.validate()
                improved, value = self._improved(result)
                if improved:
                    p.best_metric, p.best_step, p.stale_validations = value, p.step, 0
                else:
                    p.stale_validations += 1
                p.history.append({"step": p.step, **result})
                log.log("valid", {"step": p.step, "epoch": p.epoch, **result,
                                  "best": p.best_metric, "best_step": p.best_step})
                stop = bool(self.t.early_stopping) and p.stale_validations >= self.t.early_stopping
            improved, stop, shared = D.broadcast_object(
                (improved, stop, (p.best_metric, p.best_step, p.stale_validations)))
            p.best_metric, p.best_step, p.stale_validations = shared
        outcome = self._save_unless_diverged(log, best=improved)
        return outcome or ("early_stopped" if stop else None)

    @staticmethod
    def _accumulate(window: dict[str, float], stats: UpdateStats) -> None:
        window["updates"] = window.get("updates", 0) + 1
        window["skipped"] = window.get("skipped", 0) + (0 if stats.applied else 1)
        window["tokens"] = window.get("tokens", 0) + stats.tokens
        if np.isfinite(stats.loss):
            window["loss_sum"] = window.get("loss_sum", 0.0) + stats.loss * stats.tokens
            window["nll_sum"] = window.get("nll_sum", 0.0) + stats.nll * stats.tokens
            window["good_tokens"] = window.get("good_tokens", 0) + stats.tokens
            for name, value in stats.aux.items():
                window[f"aux:{name}"] = window.get(f"aux:{name}", 0.0) + value * stats.tokens
        window["lr"] = stats.lr
        window["grad_norm"] = stats.grad_norm

    def _flush_window(self, log: RunLogger, window: dict[str, float], seconds: float) -> None:
        good = max(window.get("good_tokens", 0), 1)
        record = {
            "step": self.progress.step,
            "epoch": self.progress.epoch,
            "loss": window.get("loss_sum", float("nan")) / good,
            "nll": window.get("nll_sum", float("nan")) / good,
            "lr": window["lr"],
            "grad_norm": window["grad_norm"],
            "tgt_tokens_per_s": window["tokens"] / max(seconds, 1e-9),
            "skipped": int(window["skipped"]),
        }
        for key, value in window.items():
            if key.startswith("aux:"):
                record[key[4:]] = value / good
        log.log("train", record)


def _publish_copy(source: Path, target: Path) -> None:
    """Make ``target`` a copy of ``source`` atomically (a hard link where the file system allows)."""
    tmp = target.with_name(f".{target.name}.link.tmp")
    tmp.unlink(missing_ok=True)
    try:
        os.link(source, tmp)
    except OSError:
        shutil.copyfile(source, tmp)
    os.replace(tmp, target)


# ---------------------------------------------------------------------------
# entry points


def apply_overrides(cfg: ExperimentConfig, overrides: dict[str, Any] | None) -> ExperimentConfig:
    """``{"training.lr": 1e-3, ...}`` on top of a loaded config, validated again."""
    if not overrides:
        return cfg
    raw = to_dict(cfg)
    path = raw.pop("path", None)
    for key, value in overrides.items():
        node = raw
        parts = key.split(".")
        for part in parts[:-1]:
            if not isinstance(node.get(part), dict):
                raise ConfigError("no such section", ".".join(parts[:-1]))
            node = node[part]
        node[parts[-1]] = value
    new = config_from_dict(raw)
    new.path = path
    return new


def vocab_sizes(pre: Any) -> tuple[int, int]:
    """Source and target vocabulary sizes of a dataset's ``Preprocessor``."""
    sizes = []
    for side in ("src", "tgt"):
        size = getattr(pre, f"{side}_vocab_size", None)
        sizes.append(int(size if size is not None else pre.subwords[side].vocab_size))
    return sizes[0], sizes[1]


def _version(package: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(package)
    except PackageNotFoundError:
        return "-"


def _dataset_parsers(cfg: ExperimentConfig) -> dict[str, Any] | None:
    """Which parser made the trees of the run's dataset (as its meta.json records it)."""
    meta_file = Path(cfg.data.dir) / "meta.json" if cfg.data is not None else None
    if meta_file is None or not meta_file.is_file():
        return None
    return json.loads(meta_file.read_text(encoding="utf-8")).get("parsers")


def _stderr(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def _flatten(node: Any, prefix: str) -> dict[str, Any]:
    if isinstance(node, dict):
        out: dict[str, Any] = {}
        for key, value in node.items():
            out.update(_flatten(value, f"{prefix}.{key}"))
        return out
    return {prefix: node}


def config_differences(a: dict[str, Any], b: dict[str, Any], prefix: str,
                       ignore: tuple[str, ...] = ()) -> list[tuple[str, Any, Any]]:
    """(field, a's value, b's value) for each leaf field that differs, e.g. ("model.d_model", 256, 512)."""
    fa, fb = _flatten(json.loads(json.dumps(a)), prefix), _flatten(json.loads(json.dumps(b)), prefix)
    return [(k, fa.get(k), fb.get(k)) for k in sorted(set(fa) | set(fb))
            if fa.get(k) != fb.get(k) and k not in ignore]


#: data fields that do not change what a prepared dataset holds
DATA_FIELDS_WITHOUT_EFFECT = ("data.processes", "data.cache_dir", "data.dir")


def check_dataset_matches_config(cfg: ExperimentConfig, dataset_dir: Path) -> None:
    """Refuse a dataset prepared from another ``data`` section than the config asks for.

    A config asking for an 8k vocabulary must not train on a 6k dataset without a word: the
    dataset's ``meta.json`` keeps the data section it was built from, field by field.
    """
    meta_file = dataset_dir / "meta.json"
    if cfg.data is None or not meta_file.is_file():
        return
    meta = json.loads(meta_file.read_text(encoding="utf-8"))
    built = meta.get("data")
    if not isinstance(built, dict):
        return
    differ = config_differences(built, asdict(cfg.data), "data", DATA_FIELDS_WITHOUT_EFFECT)
    if differ:
        shown = "; ".join(f"{k}: {b!r} asked, {a!r} in the dataset" for k, a, b in differ[:3])
        more = f" (+{len(differ) - 3} more)" if len(differ) > 3 else ""
        raise ConfigError(f"{dataset_dir} was prepared from another data section ({shown}{more}); "
                          "run `structnmt prepare CONFIG --force` or point data.dir elsewhere", "data")


def check_shared_embeddings(cfg: ExperimentConfig, dataset_dir: Path) -> None:
    """Sharing source and target embeddings is only meaningful over one joint vocabulary."""
    meta_file = dataset_dir / "meta.json"
    meta = json.loads(meta_file.read_text(encoding="utf-8")) if meta_file.is_file() else {}
    if cfg.model.share_embeddings and meta.get("joint_vocab") is False:
        raise ConfigError("the dataset has separate source and target vocabularies; set share_embeddings: false "
                          "(or prepare with data.subwords.joint: true)", "model.share_embeddings")


def check_lengths(data: Any, max_positions: int) -> None:
    """Refuse, before training, a sentence longer than the model's positions (it would fail mid-run)."""
    for side, lengths in (("src", data.src_lengths), ("tgt", data.tgt_lengths)):
        if lengths is None or len(lengths) == 0:
            continue
        longest = int(np.argmax(lengths))
        if int(lengths[longest]) + 1 > max_positions:
            raise DataError(f"sentence {longest + 1} of split {data.split!r} has {int(lengths[longest])} {side} "
                            f"sub-words; the model reads at most {max_positions - 1} (model.max_positions; or "
                            "lower data.clean.max_len)", data.path)


def warn_weak_german_trees(model: Any, cfg: ExperimentConfig) -> None:
    """German UD trees come from a parser trained on GSD's 720 dev sentences: say so."""
    needs = model.structure_needs()
    for side in ("src", "tgt"):
        if needs[side] and getattr(cfg.data, side).lang == "de":
            _stderr(f"warning: the {side} side is German: the only German UD training data here is GSD dev "
                    "(720 sentences; its parser reaches 71.7 UAS, docs/parsers.md), so these trees are weak. "
                    "For target-side trees prefer the En->Fr recipes (configs/multi30k_en_fr_*.yaml): spaCy's "
                    "French model is trained on UD.")


def check_conventions(model: Any, dataset_dir: Path) -> None:
    """Refuse to synchronise trees of two annotation conventions (SyncAttn, both-side DBSA).

    A method that reads trees on both sides compares them; a ClearNLP-style English tree and
    a UD French tree disagree on what heads what, so the loss would teach noise.
    """
    needs = model.structure_needs()
    tree_fields = {"parent_first", "parent_mid", "dist", "scene_mask", "scene_dist", "labels"}
    if not (needs["src"] & tree_fields and needs["tgt"] & tree_fields):
        return
    meta_file = dataset_dir / "meta.json"
    meta = json.loads(meta_file.read_text(encoding="utf-8")) if meta_file.is_file() else {}
    parsers = meta.get("parsers") or {}
    conventions = {side: (parsers.get(side) or {}).get("convention") for side in ("src", "tgt")}
    if conventions["src"] != conventions["tgt"]:
        raise ConfigError(
            f"the methods compare source and target trees, but {dataset_dir} has {conventions['src']} trees "
            f"on the source side and {conventions['tgt']} trees on the target side; parse both sides with "
            "parsers of one convention (UD: `structnmt parser train`)", "data.src.parser")


def train(cfg: ExperimentConfig, resume: bool = False,
          overrides: dict[str, Any] | None = None) -> dict[str, Any]:
    """Train the model ``cfg`` describes on its prepared dataset (``structnmt train``)."""
    from structnmt.data.dataset import ParallelDataset
    from structnmt.data.pipeline import Preprocessor
    from structnmt.model.transformer import Transformer

    cfg = apply_overrides(cfg, overrides)
    if cfg.data is None:
        raise ConfigError("training needs a data section naming the prepared dataset (data.dir)", "data")
    t = cfg.training
    if t.threads > 0:
        torch.set_num_threads(t.threads)
    if t.deterministic:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.use_deterministic_algorithms(True)
    ctx = D.context_from_env()
    device = pick_device(t.device, ctx)
    D.init_distributed(device, ctx)
    try:
        pre = Preprocessor.from_dataset(cfg.data.dir)
        src_vocab, tgt_vocab = vocab_sizes(pre)
        seed_everything(t.seed)  # same initial weights on every rank (DDP also broadcasts rank 0's)
        check_dataset_matches_config(cfg, Path(cfg.data.dir))
        check_shared_embeddings(cfg, Path(cfg.data.dir))
        model = Transformer(cfg.model, src_vocab, tgt_vocab)
        check_conventions(model, Path(cfg.data.dir))
        warn_weak_german_trees(model, cfg)
        train_set = ParallelDataset(cfg.data.dir, cfg.data.train_split)
        valid_dir = Path(cfg.data.dir) / cfg.data.valid_split
        if not valid_dir.is_dir() and (t.valid_every > 0 or t.early_stopping > 0):
            splits = sorted(p.name for p in Path(cfg.data.dir).iterdir() if p.is_dir() and not p.name.startswith("."))
            raise ConfigError(f"the dataset has no split {cfg.data.valid_split!r} to validate on "
                              f"(splits: {', '.join(splits)})", "data.valid_split")
        valid_set = ParallelDataset(cfg.data.dir, cfg.data.valid_split) if valid_dir.is_dir() else None
        for split in (train_set, valid_set):
            if split is not None:
                check_lengths(split, cfg.model.max_positions)
        vocab = {"src_vocab_size": src_vocab, "tgt_vocab_size": tgt_vocab,
                 "fingerprint": dataset_fingerprint(cfg.data.dir)}
        trainer = Trainer(cfg, model, train_set, valid_set, decode=pre.decode, vocab=vocab, ctx=ctx,
                          device=device)
        return trainer.run(resume=resume)
    finally:
        D.shutdown()


def average(paths: list[str | Path], out: str | Path) -> Path:
    """Average the weights of several checkpoints of one run into ``out``."""
    return write_averaged_checkpoint(paths, out)


def main(argv: list[str] | None = None) -> int:
    """``python -m structnmt.training.trainer CONFIG.yaml [--resume] [--set key=value ...]``."""
    import argparse

    from structnmt.config import load_config
    from structnmt.errors import StructNMTError

    parser = argparse.ArgumentParser(prog="python -m structnmt.training.trainer", description=main.__doc__)
    parser.add_argument("config")
    parser.add_argument("--resume", action="store_true",
                        help="continue from the run's newest good checkpoint")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="override a config field (YAML value), e.g. training.max_steps=100")
    args = parser.parse_args(argv)
    try:
        overrides = {}
        for item in args.set:
            key, sep, value = item.partition("=")
            if not sep:
                raise ConfigError(f"expected KEY=VALUE, got {item!r}", "--set")
            overrides[key] = yaml.safe_load(value)
        cfg = load_config(args.config, overrides)
        summary = train(cfg, resume=args.resume)
    except StructNMTError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(yaml.safe_dump(summary, sort_keys=False), end="")
    from structnmt.cli.main import exit_status

    return exit_status(summary)


if __name__ == "__main__":
    sys.exit(main())
