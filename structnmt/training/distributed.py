"""Data-parallel training across processes started by ``torchrun``.

One process per device reads ``RANK``, ``WORLD_SIZE`` and ``LOCAL_RANK``; NCCL joins GPUs,
gloo joins CPU processes. Each rank trains on its own shard of every epoch's batch list and
only rank 0 writes checkpoints and logs.

Exactness: the translation loss is a *sum* over target tokens divided by the number of
target tokens of the **global** batch (all ranks, all accumulated micro-batches). DDP
averages gradients over ranks, so each rank multiplies its loss by ``world_size``; the mean
of the ranks' gradients is then the gradient of ``global_sum / global_tokens``, which is
what one process with the whole batch computes.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn


@dataclass(frozen=True)
class DistContext:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0

    @property
    def enabled(self) -> bool:
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def context_from_env() -> DistContext:
    """What ``torchrun`` put in the environment (a single process when nothing is there)."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local = int(os.environ.get("LOCAL_RANK", str(rank)))
    return DistContext(rank=rank, world_size=world, local_rank=local)


def init_distributed(device: torch.device, ctx: DistContext | None = None) -> DistContext:
    """Join the process group when more than one process runs; no-op otherwise."""
    ctx = ctx or context_from_env()
    if ctx.enabled and not dist.is_initialized():
        backend = "nccl" if device.type == "cuda" else "gloo"
        if device.type == "cuda":
            torch.cuda.set_device(device)
        dist.init_process_group(backend=backend, rank=ctx.rank, world_size=ctx.world_size)
    return ctx


def shutdown() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()


def all_reduce_sum(values: list[float], device: torch.device) -> list[float]:
    """Sum a few numbers over ranks (float64, so token counts stay exact)."""
    if not (dist.is_available() and dist.is_initialized()):
        return list(values)
    t = torch.tensor(values, dtype=torch.float64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return t.tolist()


def all_reduce_(t: torch.Tensor) -> torch.Tensor:
    """Sum ``t`` over ranks in place, where it lives (no host read); returns ``t``."""
    if dist.is_available() and dist.is_initialized():
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return t


def all_reduce_min(value: int, device: torch.device) -> int:
    if not (dist.is_available() and dist.is_initialized()):
        return value
    t = torch.tensor([value], dtype=torch.long, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MIN)
    return int(t.item())


def broadcast_object(obj: object, src: int = 0) -> object:
    """Rank ``src``'s value on every rank (decisions such as early stopping)."""
    if not (dist.is_available() and dist.is_initialized()):
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=src)
    return box[0]


def barrier() -> None:
    if dist.is_available() and dist.is_initialized():
        dist.barrier()


def wrap_model(model: nn.Module, ctx: DistContext, device: torch.device,
               find_unused_parameters: bool = False) -> nn.Module:
    """DDP-wrap ``model`` when distributed; DDP also copies rank 0's initial weights everywhere.

    ``find_unused_parameters`` is needed when some parameters get no gradient in a step
    (structure-aware plug-ins that act only on some batches); it costs an extra graph walk.
    """
    if not ctx.enabled:
        return model
    ids = [device.index] if device.type == "cuda" else None
    return nn.parallel.DistributedDataParallel(
        model, device_ids=ids, output_device=ids[0] if ids else None,
        find_unused_parameters=find_unused_parameters,
    )


def unwrap(model: nn.Module) -> nn.Module:
    return model.module if isinstance(model, nn.parallel.DistributedDataParallel) else model
