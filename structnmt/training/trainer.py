"""Training loop: token-count batches, exact resume, validation BLEU, checkpoints, DDP.

The loop itself is :meth:`Trainer._loop`: take ``training.accumulate`` batches, make one
update, log it, validate and save when due, stop on a budget, a signal, early stopping or
divergence. The pieces it calls live beside it:

* :mod:`~structnmt.training.updater`: the arithmetic of one exact, DDP-correct update;
* :mod:`~structnmt.training.validation`: validation loss and BLEU, and which result is better;
* :mod:`~structnmt.training.checkpoint_policy`: which checkpoints are written, which one a
  resume starts from;
* :mod:`~structnmt.training.logger`: ``log.jsonl``, TensorBoard, the run's record;
* :mod:`~structnmt.training.checks`: what is refused before a run starts;
* :mod:`~structnmt.training.environment`: device, precision, random-number states.

Resume is exact: a checkpoint holds the model, optimiser, schedule, gradient scaler, every
random-number state and the data position (epoch, index of the next batch in that epoch's
deterministic batch list). On CPU a run resumed from step k reaches bitwise the same
weights as one that never stopped.

Updates whose loss or gradient is not finite are skipped and logged; after
``training.max_bad_steps`` such updates *in a row* the run stops with status ``diverged``
and leaves the last good checkpoint as it was.

On a GPU the loop does not wait for each update: it counts an update as applied when it queues
it and reads the updates' statistics (:class:`~.updater.UpdateStats`) only where a decision needs
them: a ``train`` record, a validation, the last step, an epoch's end, a stop. It then goes
through them in order as if it had read each at once, so every record, step number and decision
is the one of a loop that reads every update, which the CPU's loop does (reading costs nothing
there). A skipped update holds the step count back at the next read; that read comes before the
step count reaches any multiple it acts on, so nothing is logged, validated or saved at a step
that was not reached.

Run directory (``training.out_dir``): ``config.yaml`` (resolved), ``run.json`` (command,
versions, sizes), ``log.jsonl``, ``tensorboard/``, ``last.pt``, ``best.pt``, ``step_N.pt``.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from structnmt.config import ExperimentConfig, TrainingConfig, to_dict, with_overrides
from structnmt.data.batch import Batch
from structnmt.errors import CheckpointError, ConfigError, DataError
from structnmt.io import OutputError
from structnmt.locks import DirectoryLock
from structnmt.training import distributed as D
from structnmt.training.checkpoint import dataset_fingerprint, load_checkpoint
from structnmt.training.checkpoint_policy import (
    check_resumable,
    resume_changes,
    resume_point,
    weights_finite,
    write_checkpoints,
)
from structnmt.training.checks import (
    check_conventions,
    check_dataset_matches_config,
    check_fields_stored,
    check_inputs_unchanged,
    check_lengths,
    check_methods_against_dataset,
    check_shared_embeddings,
    warn_weak_german_trees,
)
from structnmt.training.compiled import length_multiple
from structnmt.training.environment import data_workers, pick_device, rng_state, seed_everything, set_rng_state
from structnmt.training.logger import RunLogger, TrainWindow, dataset_parsers, rewind_log, write_run_files
from structnmt.training.updater import Updater, UpdateStats
from structnmt.training.validation import improved, metric_name, validate
from structnmt.wording import counted

#: updates a GPU run leaves unread at most (their statistics wait on the device)
MAX_UNREAD = 256

#: ``structnmt train``'s exit status when a signal stopped it after saving a checkpoint:
#: EX_TEMPFAIL ("try again later"), so that ``train && test`` stops and a scheduler can tell a
#: resumable interruption (rerun with --resume) from a finished run (0) or a diverged one (1)
EXIT_INTERRUPTED = 75


def exit_status(summary: dict) -> int:
    """The process exit status of a training summary: 0 done, 1 diverged, 75 interrupted."""
    status = summary.get("status")
    return {"diverged": 1, "interrupted": EXIT_INTERRUPTED}.get(status, 0)


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
    know the dataset classes; a test or an experiment may override them (and :meth:`validate`).
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
        #: read each update's statistics at once (the CPU), or only where a decision needs them
        self.read_every_update = self.device.type != "cuda"
        #: pad training batches to bucketed shapes: CUDA graphs record one graph per shape
        self.bucketed = self.updater.cuda_graphs
        self.shapes: set[tuple[int, ...]] = set()  # training batch shapes so far (with bucketed batches)
        self.compiles = 0  # graphs torch.compile built in this call (warm-up and recompilations)
        self._signal: int | None = None
        self._epoch_cache: tuple[int, list[np.ndarray]] | None = None

    # -- data hooks -----------------------------------------------------------
    def make_batches(self, dataset: Any, epoch: int, shuffle: bool, shard: bool) -> list[np.ndarray]:
        from structnmt.data.batching import token_batches

        return token_batches(
            dataset.src_lengths, dataset.tgt_lengths, self.t.max_tokens, shuffle=shuffle, seed=self.t.seed,
            epoch=epoch, num_shards=self.ctx.world_size if shard else 1, shard=self.ctx.rank if shard else 0,
            bucket_width=self.t.bucket_width,
        )

    def collate(self, dataset: Any, indices: np.ndarray, fields: dict[str, set[str]], pad: bool = False) -> Batch:
        """``pad``: lengths rounded up as ``training.pad_to_multiple`` says, and with CUDA graphs to
        length and batch-size buckets (training updates only: validation runs eagerly and keeps its
        batches as they are). Filler sentences pad the batch size only for a model whose updates
        showed no auxiliary loss: the translation loss ignores them, but an auxiliary term may not
        (LPSI's synchronisation loss reads every target position that is not padding)."""
        from structnmt.data.batching import collate

        options = self.training_collation() if pad else {}
        return collate(dataset, indices, **{**options, "fields": fields})

    def training_collation(self) -> dict[str, Any]:
        """``collate``'s options for a training batch (see :meth:`collate`); the filler-row choice
        is settled once the first update has shown whether the model has auxiliary losses."""
        return {"fields": self.fields, "limit": self.cfg.model.max_positions, "bucketed": self.bucketed,
                "multiple": length_multiple(self.t.pad_to_multiple, self.updater.compiled, self.device),
                "fill_rows": self.bucketed and self.updater.aux_names == []}

    def _collation_settled(self) -> bool:
        """After the first update: whether compiling worked (the length multiple) and whether the
        model has auxiliary losses (filler rows) are known by then."""
        return self.updater.aux_names is not None

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
        """Write the checkpoints of this step (:func:`~.checkpoint_policy.write_checkpoints`)."""
        state = self.checkpoint_state()  # collective: every rank takes part
        if not self.ctx.is_main:
            return None
        return write_checkpoints(self.run_dir, state, self.progress.step, self.t.keep_last, best)

    def restore(self, path: Path) -> None:
        # on the CPU: generator states must stay there; load_state_dict moves the rest to the device
        state = load_checkpoint(path, map_location="cpu")
        check_resumable(path, state, self.cfg, self.vocab)
        if self.ctx.is_main and (changed := resume_changes(state, self.cfg)):
            _stderr(changed)
        try:
            self.updater.load_state_dict(state)
        except (KeyError, RuntimeError, ValueError) as err:
            raise CheckpointError(f"{path}: does not fit this model/optimiser ({err})") from None
        self.progress = Progress(**state["progress"])
        self.updater.bad_run.fill_(self.progress.bad_in_a_row)
        rngs = state["rng"]
        if len(rngs) == self.ctx.world_size:
            set_rng_state(rngs[self.ctx.rank])
        else:  # another number of processes: exactness is lost anyway, keep the streams distinct
            seed_everything(self.t.seed + 1000 * self.progress.step + self.ctx.rank)
        self._epoch_cache = None

    # -- validation ---------------------------------------------------------------
    def validate(self) -> dict[str, float]:
        """Loss per target token and (greedy/beam) BLEU on the validation split; rank 0 only."""
        batches = ((indices, self.collate(self.valid_set, indices, self.fields))
                   for indices in self.make_batches(self.valid_set, 1, shuffle=False, shard=False))
        return validate(self.updater.model, batches, self.valid_set, self.device, self.updater.autocast,
                        self.t.label_smoothing, self.cfg.decoding, self.t.valid_beam,
                        self.decode if self.t.valid_bleu else None)

    # -- the run ------------------------------------------------------------------
    def _on_signal(self, signum: int, frame: Any) -> None:
        self._signal = signum
        signal.signal(signum, signal.SIG_DFL)  # a second Ctrl-C kills at once

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
        start, fallback = resume_point(self.run_dir, resume)
        if start is not None:
            self.restore(start)
        else:
            seed_everything(self.t.seed + self.ctx.rank)
        if self.ctx.is_main:
            self.run_dir.mkdir(parents=True, exist_ok=True)
            write_run_files(self.run_dir, self.cfg, sum(p.numel() for p in self.updater.model.parameters()),
                            str(self.device), self.ctx.world_size, self.updater.precision.name, start)
            # from a checkpoint: the steps after it are trained again; from scratch (a run killed
            # before its first checkpoint, resumed): all of them are
            since = self.progress.step if start is not None else 0
            moved = rewind_log(self.run_dir / "log.jsonl", since)
            if moved:
                _stderr(f"{moved} log records after step {since} (trained again now) moved "
                        "to log.superseded.jsonl")
        if fallback:
            _stderr(fallback)
        if self.ctx.is_main and (endless := endless_note(self.t)):
            _stderr(endless)
        log = RunLogger(self.run_dir, enabled=self.ctx.is_main, tensorboard=self.t.tensorboard,
                        progress=self.t.progress, total_steps=self.t.max_steps,
                        initial_step=self.progress.step)
        if resume and start is None:
            log.message(f"nothing to resume in {self.run_dir}: starting a new run")
        for side, info in (dataset_parsers(self.cfg) or {}).items():
            if info:
                log.message(f"{side} trees of {self.cfg.data.dir}: {info.get('name') or info.get('backend')} "
                            f"{info.get('version') or ''} ({info.get('model') or '-'}, {info.get('convention')})")
        log.message(f"training.precision: {self.updater.precision.reason}")
        if self.updater.compiled or self.t.compile != "auto" or self.device.type == "cuda":
            log.message(f"training.compile: {self.updater.compile_reason}")
        if self.updater.cuda_graphs or self.t.cuda_graphs != "auto" or self.device.type == "cuda":
            log.message(f"training.cuda_graphs: {self.updater.cuda_graphs_reason}")
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
        return {
            "status": status,
            "step": p.step,
            "epoch": p.epoch,
            "best_metric": p.best_metric,
            "best_step": p.best_step,
            "metric": metric_name(self.t, self.t.valid_bleu and self.decode is not None),
            "bad_steps": p.bad_total,
            "train_seconds": round(p.elapsed_s, 1),  # every call's, across resumes (kept in checkpoints)
            "run_dir": str(self.run_dir),
            "last": str(self.run_dir / "last.pt"),
            "best": str(self.run_dir / "best.pt") if (self.run_dir / "best.pt").exists() else None,
        }

    def _log_compilation(self, log: RunLogger, stats: Any, seconds: float, window: TrainWindow) -> None:
        """Say when torch.compile built graphs (the warm-up, or a recompilation) and keep that
        time out of the tokens/s of the ``train`` records, which report the steady state."""
        for note in self.updater.notes:
            log.message(note)
        self.updater.notes.clear()
        if not stats.compiled:
            return
        self.compiles += stats.compiled
        window.started += seconds
        step = self.progress.step + len(self._unread)  # the updates not yet read counted as applied
        log.log("event", {"event": "compile", "step": step, "graphs": stats.compiled,
                          "graphs_total": self.compiles, "seconds": round(seconds, 1)})
        what = "compiled" if self.compiles == stats.compiled else "recompiled (a new batch shape or branch)"
        log.message(f"step {step}: torch.compile {what}: {counted(stats.compiled, 'graph')} in "
                    f"{seconds:.1f} s ({self.compiles} so far)")

    def _next_group(self, stream: Iterator[tuple[int, int, int, Batch]]) -> tuple[list[Batch], bool]:
        """The batches of the next update (``accumulate`` of them, fewer at an epoch's end) and
        whether the epoch ended; moves the data position past them."""
        p = self.progress
        group: list[Batch] = []
        for epoch, i, n, batch in stream:
            group.append(batch)
            if self.bucketed:
                self.shapes.add(tuple(batch.src.shape) + tuple(batch.tgt_in.shape))
            p.epoch, p.batch = epoch, i + 1
            if i + 1 == n:
                p.epoch, p.batch = epoch + 1, 0
                return group, True
            if len(group) == self.t.accumulate:
                break
        return group, False

    def _loop(self, log: RunLogger) -> str:
        from structnmt.data.prefetch import BatchPrefetcher

        workers, reason = data_workers(self.t.num_workers, self.device,
                                       int(os.environ.get("LOCAL_WORLD_SIZE", "1")) if self.ctx.enabled else 1,
                                       self.t.threads)
        if workers and type(self).collate is not Trainer.collate:
            log.message(f"training.num_workers: {workers} ignored: {type(self).__name__} collates its own "
                        "batches (workers run the default collate)")
            workers = 0
        elif workers or self.device.type == "cuda":
            log.message(f"training.num_workers: {reason}")

        def here(indices: np.ndarray) -> Batch:
            return self.collate(self.train_set, indices, self.fields, pad=True)

        with BatchPrefetcher(self.train_set, workers, here) as prefetch:
            return self._loop_batches(log, prefetch)

    def _loop_batches(self, log: RunLogger, prefetch: Any) -> str:
        t, p = self.t, self.progress
        self._began = time.monotonic() - p.elapsed_s
        self._window = TrainWindow()
        self._saved_step = p.step if p.step > 0 else -1
        self._unread: list[tuple[UpdateStats, bool, tuple[int, int]]] = []
        stream = prefetch.collated(self._stream(), self.training_collation, self._collation_settled)
        status = "finished"
        while True:
            if t.max_steps and p.step >= t.max_steps:
                break
            group, epoch_end = self._next_group(stream)
            if not group:
                status = "max_epochs"
                break
            update_began = time.monotonic()
            stats = self.updater.update(group)
            if prefetch.note:
                log.message(prefetch.note)
                prefetch.note = None
            self._log_compilation(log, stats, time.monotonic() - update_began, self._window)
            self._unread.append((stats, epoch_end, (p.epoch, p.batch)))
            read = self.read_every_update or self._read_due(epoch_end)
            if read and (outcome := self._read_updates(log)) is not None:
                return outcome
            p.elapsed_s = time.monotonic() - self._began
            if self.ctx.enabled and not read:
                continue  # the collective below would wait for the device: ranks check where they read
            # one small all-reduce: any rank's signal or clock stops every rank at the same step
            signalled, late = D.all_reduce_sum(
                [float(self._signal is not None), float(bool(t.max_minutes) and p.elapsed_s >= 60 * t.max_minutes)],
                self.device)
            if (signalled or late) and (outcome := self._read_updates(log)) is not None:
                return outcome
            if signalled:
                status = "interrupted"
                log.message("signal received: saving a checkpoint and stopping")
                break
            if late:
                status = "time_budget"
                break
        if t.max_steps and p.step >= t.max_steps and status == "finished":
            status = "max_steps"
        p.elapsed_s = time.monotonic() - self._began
        if self._window:
            log.log("train", self._train_record(p.elapsed_s))
        if self.bucketed:
            log.message(f"{len(self.shapes)} training batch shapes (CUDA graphs record one graph per shape)")
        if self._saved_step != p.step:
            if status != "interrupted" and self.valid_set is not None:
                return self._validate_and_save(log) or status
            return self._save_unless_diverged(log, best=False) or status
        return status

    def _read_due(self, epoch_end: bool) -> bool:
        """Whether the updates not yet read must be read now: the epoch ended, too many wait, or,
        were they all applied, the last of them would end a log window, be due for validation or
        reach ``max_steps`` (a skip among them only moves that point later)."""
        t = self.t
        ahead = self.progress.step + len(self._unread)
        return (epoch_end or len(self._unread) >= MAX_UNREAD or ahead % max(t.log_every, 1) == 0
                or (t.valid_every > 0 and ahead % t.valid_every == 0) or bool(t.max_steps and ahead >= t.max_steps))

    def _read_updates(self, log: RunLogger) -> str | None:
        """Go through the updates not yet read, in order, as the loop would have after each: count
        the step, log, validate and save where due. A status when the run must stop there."""
        t, p = self.t, self.progress
        unread, self._unread = self._unread, []
        for stats, epoch_end, position in unread:
            p.epoch, p.batch = position
            p.tokens += stats.tokens
            if stats.applied:
                p.step += 1
                p.bad_in_a_row = 0
            elif stats.bad and self._bad_update(log, stats.loss, stats.grad_norm):
                return "diverged"
            self._window.add(stats)
            log.progress(1 if stats.applied else 0, loss=stats.loss, lr=stats.lr)
            if stats.applied and p.step % max(t.log_every, 1) == 0:
                log.log("train", self._train_record(time.monotonic() - self._began))
                self._window = TrainWindow()
            due = (t.valid_every > 0 and stats.applied and p.step % t.valid_every == 0) or \
                  (t.valid_every == 0 and epoch_end)
            if due:
                p.elapsed_s = time.monotonic() - self._began
                outcome = self._validate_and_save(log)
                self._saved_step = p.step
                if outcome is not None:
                    return outcome
        return None

    def _train_record(self, elapsed: float) -> dict[str, Any]:
        p = self.progress
        record = {**self._window.record(p.step, p.epoch), "elapsed_s": round(elapsed, 3)}
        if self.bucketed:
            record["batch_shapes"] = len(self.shapes)
        return record

    def _bad_update(self, log: RunLogger, loss: float, grad_norm: float) -> bool:
        """Count and log a skipped non-finite update; True when too many came in a row."""
        p = self.progress
        p.bad_in_a_row += 1
        p.bad_total += 1
        log.log("event", {"event": "skipped_update", "step": p.step, "epoch": p.epoch,
                          "loss": loss, "grad_norm": grad_norm})
        log.message(f"step {p.step}: non-finite loss or gradient, update skipped ({p.bad_in_a_row} in a row)")
        if p.bad_in_a_row < self.t.max_bad_steps:
            return False
        log.message(f"stopping: {p.bad_in_a_row} non-finite updates in a row; "
                    f"the last good checkpoint is left as it was")
        log.log("event", {"event": "diverged", "step": p.step})
        return True

    def _save_unless_diverged(self, log: RunLogger, best: bool) -> str | None:
        """Save; with non-finite weights save nothing and return ``"diverged"``."""
        if not weights_finite(self.updater.model):
            log.message("stopping: the weights are no longer finite; the last good checkpoint is kept")
            log.log("event", {"event": "diverged", "step": self.progress.step})
            return "diverged"
        self.save(best=best)
        return None

    def _validate_and_save(self, log: RunLogger) -> str | None:
        """Validate (rank 0), save, decide on early stopping; a status when the run must stop."""
        p = self.progress
        stop = False
        better = False
        if self.valid_set is not None:
            if self.ctx.is_main:
                result = self.validate()
                better, value = improved(result, p.best_metric, self.t.early_stopping_metric)
                if better:
                    p.best_metric, p.best_step, p.stale_validations = value, p.step, 0
                else:
                    p.stale_validations += 1
                p.history.append({"step": p.step, **result})
                log.log("valid", {"step": p.step, "epoch": p.epoch, **result,
                                  "best": p.best_metric, "best_step": p.best_step},
                        best_of=metric_name(self.t, "bleu" in result))
                stop = bool(self.t.early_stopping) and p.stale_validations >= self.t.early_stopping
            better, stop, shared = D.broadcast_object(
                (better, stop, (p.best_metric, p.best_step, p.stale_validations)))
            p.best_metric, p.best_step, p.stale_validations = shared
        outcome = self._save_unless_diverged(log, best=better)
        return outcome or ("early_stopped" if stop else None)


# ---------------------------------------------------------------------------
# entry points


def vocab_sizes(pre: Any) -> tuple[int, int]:
    """Source and target vocabulary sizes of a dataset's ``Preprocessor``."""
    sizes = []
    for side in ("src", "tgt"):
        size = getattr(pre, f"{side}_vocab_size", None)
        sizes.append(int(size if size is not None else pre.subwords[side].vocab_size))
    return sizes[0], sizes[1]


def _stderr(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def endless_note(t: TrainingConfig) -> str | None:
    """The line that says, at the start, that a run with no step, epoch or time limit (all 0) ends
    only when stopped or by early stopping: otherwise it looks like a run that should have ended."""
    if t.max_steps or t.max_epochs or t.max_minutes:
        return None
    limits = "training.max_steps, max_epochs and max_minutes are 0 (no limit): training stops only"
    if t.early_stopping:
        return (f"note: {limits} by early stopping (after {t.early_stopping} validations without improvement) "
                "or when stopped (Ctrl-C or SIGTERM; --resume continues it)")
    return (f"warning: {limits} when stopped (Ctrl-C or SIGTERM; --resume continues it); set one of them, or "
            "training.early_stopping, for it to end by itself")


def train(cfg: ExperimentConfig, resume: bool = False,
          overrides: dict[str, Any] | None = None) -> dict[str, Any]:
    """Train the model ``cfg`` describes on its prepared dataset (``structnmt train``)."""
    from structnmt.data.dataset import ParallelDataset, splits_here
    from structnmt.data.pipeline import Preprocessor
    from structnmt.model.transformer import Transformer

    cfg = with_overrides(cfg, overrides)
    if cfg.data is None:
        raise ConfigError("training needs a data section naming the prepared dataset (data.dir)", "data")
    t = cfg.training
    if Path(t.out_dir).exists() and not Path(t.out_dir).is_dir():  # one line before any work, not "File exists"
        raise OutputError(f"training.out_dir: {t.out_dir} is not a directory; give a directory name")
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
        check_inputs_unchanged(cfg, Path(cfg.data.dir))
        check_shared_embeddings(cfg, Path(cfg.data.dir))
        model = Transformer(cfg.model, src_vocab, tgt_vocab)
        check_conventions(model, Path(cfg.data.dir), cfg.path)
        check_methods_against_dataset(model, Path(cfg.data.dir))
        warn_weak_german_trees(model, cfg)
        train_set = ParallelDataset(cfg.data.dir, cfg.data.train_split)
        check_fields_stored(cfg, model, train_set)
        valid_dir = Path(cfg.data.dir) / cfg.data.valid_split
        if not valid_dir.is_dir() and (t.valid_every > 0 or t.early_stopping > 0):
            raise ConfigError(f"the dataset has no split {cfg.data.valid_split!r} to validate on "
                              f"({splits_here(Path(cfg.data.dir))}): add it to data.splits and prepare again, "
                              "or train without validating (training.valid_every: 0 and "
                              "training.early_stopping: 0)", "data.valid_split", cfg.path)
        valid_set = ParallelDataset(cfg.data.dir, cfg.data.valid_split) if valid_dir.is_dir() else None
        for split in (train_set, valid_set):
            if split is not None:
                check_lengths(split, cfg.model.max_positions)
        vocab = {"src_vocab_size": src_vocab, "tgt_vocab_size": tgt_vocab,
                 "fingerprint": dataset_fingerprint(cfg.data.dir),
                 "dataset": str(Path(cfg.data.dir).resolve())}  # found from the run, not the cwd
        trainer = Trainer(cfg, model, train_set, valid_set, decode=pre.decode, vocab=vocab, ctx=ctx,
                          device=device)
        return trainer.run(resume=resume)
    finally:
        D.shutdown()
