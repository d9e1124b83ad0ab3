"""Training batches collated ahead by worker processes (``training.num_workers``): the same
batches in the same order, the same weights, a resume that is still exact, and collation that
comes home when a worker dies or a batch cannot be collated there."""

from __future__ import annotations

import multiprocessing
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from structnmt.data.batching import collate, token_batches
from structnmt.data.dataset import ParallelDataset
from structnmt.data.prefetch import BatchPrefetcher
from structnmt.errors import DataError
from tests.test_training import SlowTrainer, make_dataset, make_trainer, params, tiny_cfg

FIELDS: dict[str, set[str]] = {"src": set(), "tgt": set()}


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory) -> Path:
    return make_dataset(tmp_path_factory.mktemp("data"), n_train=96)


def _stream(data: ParallelDataset, epochs: int = 2):
    for epoch in range(1, epochs + 1):
        batches = token_batches(data.src_lengths, data.tgt_lengths, 40, shuffle=True, seed=3, epoch=epoch)
        for i, indices in enumerate(batches):
            yield epoch, i, len(batches), indices


def _same(a, b) -> bool:
    return (torch.equal(a.src, b.src) and torch.equal(a.tgt_in, b.tgt_in) and torch.equal(a.tgt_out, b.tgt_out)
            and torch.equal(a.index, b.index))


def test_workers_yield_the_streams_batches_in_order(data_dir):
    data = ParallelDataset(data_dir, "train")
    options = {"fields": FIELDS, "multiple": 8}
    want = [(e, i, n, collate(data, idx, **options)) for e, i, n, idx in _stream(data)]
    assert len(want) > 8 and len({e for e, *_ in want}) == 2
    with BatchPrefetcher(data, 2, lambda idx: collate(data, idx, **options)) as prefetch:
        got = list(prefetch.collated(_stream(data), lambda: options))
        assert prefetch.pool is not None  # the workers collated them, not the fallback
    assert [w[:3] for w in want] == [g[:3] for g in got]
    assert all(_same(w[3], g[3]) for w, g in zip(want, got))
    assert all(g[3].src.size(1) % 8 == 0 for g in got)  # the options reached the workers


def test_nothing_is_collated_ahead_until_the_options_are_settled(data_dir):
    data = ParallelDataset(data_dir, "train")
    settled = False
    here: list[int] = []

    def collate_here(idx):
        here.append(len(idx))
        return collate(data, idx, FIELDS)

    with BatchPrefetcher(data, 2, collate_here) as prefetch:
        stream = prefetch.collated(_stream(data, 1), lambda: {"fields": FIELDS}, lambda: settled)
        next(stream), next(stream)
        assert len(here) == 2  # collated when asked for, in this process
        settled = True
        rest = list(stream)
    assert len(here) == 2 and rest


def test_a_killed_worker_sends_collation_home_with_the_same_batches(data_dir):
    data = ParallelDataset(data_dir, "train")
    want = [collate(data, idx, FIELDS) for *_, idx in _stream(data)]
    with BatchPrefetcher(data, 1, lambda idx: collate(data, idx, FIELDS)) as prefetch:
        stream = prefetch.collated(_stream(data), lambda: {"fields": FIELDS})
        got = [next(stream)[3]]
        pool = prefetch.pool
        assert pool is not None
        for pid in list(pool._processes):  # noqa: SLF001 - the test kills the worker
            os.kill(pid, signal.SIGKILL)
        got += [b for *_, b in stream]
        assert prefetch.pool is None and prefetch.note and "main process" in prefetch.note
    assert len(got) == len(want) and all(_same(w, g) for w, g in zip(want, got))


def test_a_batch_collated_ahead_with_options_that_changed_is_collated_again(data_dir):
    data = ParallelDataset(data_dir, "train")
    multiple = {"now": 1}
    here: list[int] = []

    def collate_here(idx):
        here.append(multiple["now"])
        return collate(data, idx, FIELDS, multiple=multiple["now"])

    with BatchPrefetcher(data, 1, collate_here) as prefetch:
        stream = prefetch.collated(_stream(data, 1), lambda: {"fields": FIELDS, "multiple": multiple["now"]})
        first = next(stream)[3]  # one more is being collated ahead with multiple 1
        multiple["now"] = 16  # say, compiling fell back: the trainer's padding changed
        rest = [b for *_, b in stream]
    assert first.src.size(1) < 16 and all(b.src.size(1) % 16 == 0 for b in rest)
    assert here == [16]  # the one collated ahead with the old options, redone here


def _hang(indices, options):
    time.sleep(3600)


def test_a_hung_worker_is_killed_and_collation_comes_home(data_dir, monkeypatch):
    import structnmt.data.prefetch as prefetch_module

    monkeypatch.setattr(prefetch_module, "_collate_in_worker", _hang)  # forked workers run this
    monkeypatch.setattr(prefetch_module, "WORKER_TIMEOUT_S", 0.5)
    data = ParallelDataset(data_dir, "train")
    want = [collate(data, idx, FIELDS) for *_, idx in _stream(data, 1)]
    with BatchPrefetcher(data, 1, lambda idx: collate(data, idx, FIELDS)) as prefetch:
        stream = prefetch.collated(_stream(data, 1), lambda: {"fields": FIELDS})
        got = [b for *_, b in stream]
        assert prefetch.pool is None and prefetch.note
    assert all(_same(w, g) for w, g in zip(want, got)) and len(got) == len(want)
    deadline = time.monotonic() + 10  # killed, not left to hang this process's exit
    while multiprocessing.active_children() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not multiprocessing.active_children()


def test_workers_die_with_the_trainer(data_dir, tmp_path):
    script = tmp_path / "parent.py"
    script.write_text(f"""
import sys, time
from pathlib import Path
from structnmt.data.batching import collate
from structnmt.data.dataset import ParallelDataset
from structnmt.data.prefetch import BatchPrefetcher
data = ParallelDataset(Path({str(data_dir)!r}), "train")
prefetch = BatchPrefetcher(data, 2, lambda idx: collate(data, idx, {{"src": set(), "tgt": set()}}))
fields = {{"src": set(), "tgt": set()}}
stream = prefetch.collated(iter([(1, i, 9, [i]) for i in range(9)]), lambda: {{"fields": fields}})
next(stream)
print(" ".join(str(pid) for pid in prefetch.pool._processes), flush=True)
time.sleep(60)
""")
    parent = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True,
                              cwd=Path(__file__).resolve().parents[1])
    workers = [int(pid) for pid in parent.stdout.readline().split()]
    assert len(workers) == 2 and all(_alive(pid) for pid in workers)
    parent.kill()  # SIGKILL: no Python code of the parent runs
    parent.wait()
    deadline = time.monotonic() + 10
    while any(_alive(pid) for pid in workers) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(_alive(pid) for pid in workers)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().split(")")[-1].split()[0] != "Z"  # a zombie is dead
    except FileNotFoundError:
        return False


def test_a_batch_the_workers_cannot_collate_raises_the_real_error_here(data_dir):
    data = ParallelDataset(data_dir, "train")

    def collate_here(idx):
        raise DataError("example 10**9 is not in the split", "train.bin")

    stream = iter([(1, 0, 1, np.array([10**9]))])
    with BatchPrefetcher(data, 1, collate_here) as prefetch, pytest.raises(DataError, match="train.bin: example"):
        list(prefetch.collated(stream, lambda: {"fields": FIELDS}))


def _fail_in_worker(indices, options):
    return None  # what _collate_in_worker returns when collation raised there


def test_workers_that_fail_what_this_process_collates_are_stopped_and_said_so(data_dir, monkeypatch):
    # a worker that cannot collate what the main process can (say, collation that touched CUDA in
    # a forked worker) would otherwise have every batch collated twice, silently
    import structnmt.data.prefetch as prefetch_module

    monkeypatch.setattr(prefetch_module, "_collate_in_worker", _fail_in_worker)  # forked workers run this
    data = ParallelDataset(data_dir, "train")
    want = [collate(data, idx, FIELDS) for *_, idx in _stream(data, 1)]
    here: list[int] = []

    def collate_here(idx):
        here.append(len(idx))
        return collate(data, idx, FIELDS)

    with BatchPrefetcher(data, 1, collate_here) as prefetch:
        got = [b for *_, b in prefetch.collated(_stream(data, 1), lambda: {"fields": FIELDS})]
        assert prefetch.pool is None and prefetch.note == prefetch_module.WORKERS_FAIL
    assert len(got) == len(want) and all(_same(w, g) for w, g in zip(want, got))
    assert len(here) == len(want)  # each batch collated once here, none twice


def test_training_with_workers_gives_the_same_weights_and_resumes_exactly(data_dir, tmp_path):
    inline = make_trainer(tiny_cfg(tmp_path / "a", max_steps=8, accumulate=2), data_dir)
    inline.run()
    first = make_trainer(tiny_cfg(tmp_path / "b", max_steps=4, accumulate=2, num_workers=2), data_dir)
    assert first.run()["step"] == 4
    second = make_trainer(tiny_cfg(tmp_path / "b", max_steps=8, accumulate=2, num_workers=2), data_dir)
    assert second.run(resume=True)["step"] == 8
    want, got = params(inline.updater.model), params(second.updater.model)
    assert all(torch.equal(want[k], got[k]) for k in want)
    assert (inline.progress.epoch, inline.progress.batch) == (second.progress.epoch, second.progress.batch)
    assert inline.progress.tokens == second.progress.tokens


def test_a_trainer_that_collates_its_own_batches_keeps_them_in_process(data_dir, tmp_path, capsys):
    trainer = make_trainer(tiny_cfg(tmp_path / "run", max_steps=2, num_workers=2), data_dir, cls=SlowTrainer)
    trainer.run()
    assert "training.num_workers: 2 ignored: SlowTrainer collates its own batches" in capsys.readouterr().err


@pytest.mark.parametrize(("cores", "processes", "device", "expected"), [
    (16, 1, "cuda", 2),  # a GPU host: two workers collate beside the queued updates
    (2, 1, "cuda", 1),  # one core for the update, one for a worker
    (1, 1, "cuda", 0),
    (16, 8, "cuda", 1),  # eight DDP processes on the node share its cores
    (16, 1, "cpu", 0),  # on a CPU the workers would take the update's cores
])
def test_num_workers_auto_collates_ahead_on_a_gpu_only(cores, processes, device, expected, monkeypatch):
    from structnmt.training.environment import data_workers

    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(cores)), raising=False)
    workers, reason = data_workers("auto", torch.device(device), processes)
    assert workers == expected and reason.startswith(f"{expected} (auto")
    assert data_workers(3, torch.device(device), processes) == (3, "3")  # a number is taken as it is


def test_num_workers_accepts_auto_or_a_count_and_names_the_field_otherwise():
    from structnmt.config import config_from_dict
    from structnmt.errors import ConfigError

    assert config_from_dict({}).training.num_workers == "auto"
    assert config_from_dict({"training": {"num_workers": 2}}).training.num_workers == 2
    for bad, says in ((-1, "must not be negative"), ("many", "expected int or")):
        with pytest.raises(ConfigError, match=says) as err:
            config_from_dict({"training": {"num_workers": bad}})
        assert "training.num_workers" in str(err.value)
