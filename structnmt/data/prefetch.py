"""Training batches collated ahead, in worker processes (``training.num_workers``).

Collating a 4,096-token Multi30k batch costs the host 10–30 ms (more with tree fields: distance
and scene tables are built there). On a GPU whose update is queued without waiting, or replayed
from a CUDA graph, that host time is the update's critical path. With workers, ``collate`` runs
in other processes a few batches ahead while the main process queues updates.

A batch is the same whichever process collates it: collation is deterministic and touches no
random-number state, so a run's weights do not depend on ``num_workers``, and a resume starts
from the saved data position as before (batches collated ahead and not used are dropped).
Collation options that the trainer only knows after an update (whether filler rows may pad a
batch, which needs to know that the model has no auxiliary loss) are read when a batch is
submitted; the trainer holds submission back until they are settled (``ready``).
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import signal
import sys
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import Any

import numpy as np
import torch

from structnmt.data.batch import Batch
from structnmt.data.batching import collate
from structnmt.processes import die_with_parent, libc_prctl

#: batches collated ahead per worker
AHEAD_PER_WORKER = 2
#: seconds a batch may take in a worker before collation comes home (a hung worker never hangs training)
WORKER_TIMEOUT_S = 120.0

_dataset: Any = None  # the worker's dataset (set once, by the pool's initializer)

#: the log's note when a worker failed a batch that the main process then collated
WORKERS_FAIL = ("data workers failed a batch that the main process collates: training batches are collated "
                "in the main process from here on")


def _start_worker(dataset: Any, parent: int, prctl: Any) -> None:
    global _dataset
    # the kernel kills the worker when the trainer dies, however it dies (a fork keeps the run
    # directory's lock open)
    if not die_with_parent(prctl, signal.SIGKILL, parent):
        os._exit(1)
    _dataset = dataset
    torch.set_num_threads(1)  # workers share the cores with the main process's intra-op threads
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the trainer's to handle (save, then stop)


def _collate_in_worker(indices: np.ndarray, options: dict[str, Any]) -> Batch | None:
    """The batch, or None where collation failed: the main process then collates it itself, so
    that a data error is raised there with its own message and type."""
    try:
        return collate(_dataset, indices, **options)
    except Exception:  # noqa: BLE001 - redone in the main process, which raises it
        return None


Item = tuple[int, int, int, np.ndarray]  # (epoch, index in epoch, batches in epoch, example indices)


class BatchPrefetcher:
    """``collated(stream, options, ready)``: the stream's batches in order, collated by ``workers``
    processes ahead of use with ``collate`` and ``options()``, or by ``here`` in this process when
    asked for (no workers; a batch a worker could not collate; workers that stopped)."""

    def __init__(self, dataset: Any, workers: int, here: Callable[[np.ndarray], Batch]) -> None:
        self.here = here
        self.workers = workers
        self.pool: ProcessPoolExecutor | None = None
        self.note: str | None = None  # said once, when the workers stopped and collation came home
        if workers > 0:
            # fork shares the memory-mapped dataset without pickling it; elsewhere it is pickled
            method = "fork" if sys.platform.startswith("linux") else "spawn"
            prctl = libc_prctl() if method == "fork" else None
            self.pool = ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context(method),
                                            initializer=_start_worker, initargs=(dataset, os.getpid(), prctl))

    def collated(self, stream: Iterator[Item], options: Callable[[], dict[str, Any]],
                 ready: Callable[[], bool] = lambda: True) -> Iterator[tuple[int, int, int, Batch]]:
        """``options()``: ``collate``'s keyword arguments for the next batch; ``ready()``: whether
        they are settled, so that batches may be collated ahead. A batch collated ahead with
        options that differ from ``options()`` when it is used is collated again here."""
        ahead: deque[tuple[Item, dict[str, Any], Future[Batch | None]]] = deque()
        exhausted = False
        while True:
            # pulled ahead by the same rule even after the workers stopped: the stream's epoch ends
            # hold a collective (DDP), which every rank must reach at the same point
            while self.workers > 0 and not exhausted and len(ahead) < AHEAD_PER_WORKER * self.workers and ready():
                item = next(stream, None)
                if item is None:
                    exhausted = True
                    break
                opts = options()
                ahead.append((item, opts, self._submit(item[3], opts)))
            worker_failed = False
            if ahead:
                item, opts, future = ahead.popleft()
                batch = self._result(future)
                worker_failed = batch is None and self.pool is not None  # it returned None: collation raised
                if batch is not None and opts != options():  # the trainer's options moved on
                    batch = None
            else:
                next_item = None if exhausted else next(stream, None)
                if next_item is None:
                    return
                item, batch = next_item, None
            if batch is None:
                batch = self.here(item[3])  # a data error is raised here, with its own message
                if worker_failed:  # ...but this batch collates here: the workers are at fault, not the data
                    self._failed(WORKERS_FAIL)
            yield item[0], item[1], item[2], batch

    def _submit(self, indices: np.ndarray, options: dict[str, Any]) -> Future[Batch | None]:
        if self.pool is None:
            return self._failed()
        try:
            return self.pool.submit(_collate_in_worker, indices, options)
        except (BrokenProcessPool, RuntimeError):
            return self._failed()

    def _result(self, future: Future[Batch | None]) -> Batch | None:
        try:
            return future.result(timeout=WORKER_TIMEOUT_S)
        except Exception:  # noqa: BLE001 - a killed or hung worker, a batch that could not be sent back
            self._failed()  # (shared memory full): collate here from now on
            return None

    def _failed(self, why: str | None = None) -> Future[Batch | None]:
        if self.pool is not None:
            workers = list(getattr(self.pool, "_processes", None) or ())  # their pids
            self.pool.shutdown(wait=False, cancel_futures=True)
            for pid in workers:  # a hung worker would otherwise be waited for when the trainer exits
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)
            self.pool = None
            self.note = why or "data workers stopped: training batches are collated in the main process from here on"
        done: Future[Batch | None] = Future()
        done.set_result(None)
        return done

    def close(self) -> None:
        if self.pool is not None:  # the workers finish the batch at hand (milliseconds) and exit
            self.pool.shutdown(wait=True, cancel_futures=True)
            self.pool = None

    def __enter__(self) -> BatchPrefetcher:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
