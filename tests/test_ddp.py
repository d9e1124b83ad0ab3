"""Two gloo processes with half a batch each reach the parameters of one process with all of it:
once through ``Updater`` with hand-picked uneven halves, once through a whole ``Trainer.run``
on sharded token batches (rank 0 alone writes the run), the DDP run reading its updates' statistics
late, as on GPUs (collectives only where the ranks read), the single process at once."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from test_training import V, make_dataset, tiny_cfg, words  # the tests folder is on sys.path

from structnmt.data.batching import collate
from structnmt.data.dataset import ParallelDataset
from structnmt.model.transformer import Transformer
from structnmt.training.checkpoint import load_checkpoint
from structnmt.training.distributed import DistContext
from structnmt.training.logger import read_log
from structnmt.training.trainer import Trainer, Updater

FIELDS = {"src": set(), "tgt": set()}
# three updates of two micro-batches each (global example indices); halves get unequal tokens
UPDATES = [(np.arange(0, 7), np.arange(7, 12)), (np.arange(12, 20), np.arange(20, 23)),
           (np.arange(23, 30), np.arange(30, 40))]


def _cfg(out: Path | str, **training):
    cfg = tiny_cfg(out, eps=1e-4, **training)  # eps above rounding noise (see test_training)
    cfg.model.dropout = 0.0
    return cfg


def _updater_run(data_dir: Path, ctx: DistContext) -> dict[str, torch.Tensor]:
    cfg = _cfg("unused")
    torch.manual_seed(0)
    model = Transformer(cfg.model, V, V)
    updater = Updater(model, cfg.training, torch.device("cpu"), ctx)
    data = ParallelDataset(data_dir, "train")
    for group in UPDATES:
        mine = [np.array_split(indices, ctx.world_size)[ctx.rank] for indices in group]
        updater.update([collate(data, idx, FIELDS) for idx in mine])
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def _trainer_run(data_dir: Path, out: Path, max_tokens: int, ctx: DistContext, late: bool = False,
                 workers: int = 0) -> Trainer:
    cfg = _cfg(out, max_steps=6, valid_every=2, log_every=3, max_tokens=max_tokens, num_workers=workers)
    torch.manual_seed(cfg.training.seed)
    model = Transformer(cfg.model, V, V)
    trainer = Trainer(cfg, model, ParallelDataset(data_dir, "train"), ParallelDataset(data_dir, "val"),
                      decode=words, vocab={"src_vocab_size": V, "tgt_vocab_size": V, "fingerprint": "t"},
                      ctx=ctx, device=torch.device("cpu"))
    trainer.read_every_update = not late
    trainer.run()
    return trainer


def _worker(rank: int, world: int, port: int, data_dir: str, out: str) -> None:
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        ctx = DistContext(rank=rank, world_size=world, local_rank=rank)
        weights = _updater_run(Path(data_dir), ctx)
        if rank == 0:
            torch.save(weights, Path(out) / "updater.pt")
        _trainer_run(Path(data_dir), Path(out) / "run", 32, ctx, late=True)
        # batches collated ahead by a worker per rank: each rank pulls its stream (and so reaches
        # the epoch end's collective) by the same rule, and trains on the same batches
        _trainer_run(Path(data_dir), Path(out) / "run_workers", 32, ctx, late=True, workers=1)
    finally:
        dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_two_processes_match_one_process_with_the_whole_batch(tmp_path):
    data_dir = make_dataset(tmp_path / "data")
    out = tmp_path / "ddp"
    out.mkdir()
    mp.spawn(_worker, args=(2, _free_port(), str(data_dir), str(out)), nprocs=2, join=True)

    single = _updater_run(data_dir, DistContext())
    shared = torch.load(out / "updater.pt", weights_only=True)
    for name, value in single.items():
        torch.testing.assert_close(shared[name], value, atol=1e-6, rtol=0)

    # the same through the trainer: 2 x 32 tokens per process = 64 tokens in one process
    reference = _trainer_run(data_dir, tmp_path / "one", 64, DistContext())
    ddp_state = load_checkpoint(out / "run" / "last.pt")
    assert ddp_state["progress"]["step"] == 6 and ddp_state["world_size"] == 2
    assert ddp_state["progress"]["epoch"] > 1  # an epoch end (a collective) was crossed
    assert len(ddp_state["rng"]) == 2  # every rank's generators, for an exact resume
    assert ddp_state["progress"]["tokens"] == reference.progress.tokens
    for name, value in reference.updater.model.state_dict().items():
        torch.testing.assert_close(ddp_state["model"][name], value, atol=1e-6, rtol=0)
    train_steps = [r["step"] for r in read_log(out / "run" / "log.jsonl") if r["kind"] == "train"]
    assert train_steps == [3, 6]  # written once, by rank 0
    valid = [r for r in read_log(out / "run" / "log.jsonl") if r["kind"] == "valid"]
    assert [r["step"] for r in valid] == [2, 4, 6]
    with_workers = load_checkpoint(out / "run_workers" / "last.pt")
    position = ("step", "epoch", "batch", "tokens")
    assert [with_workers["progress"][k] for k in position] == [ddp_state["progress"][k] for k in position]
    for name, value in ddp_state["model"].items():
        assert torch.equal(with_workers["model"][name], value), name
