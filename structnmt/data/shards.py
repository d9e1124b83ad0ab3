"""Running the shards of a sharded ``prepare`` as jobs: local processes or a SLURM job array.

Both go through submitit: ``submitit.LocalExecutor`` starts one process per shard on this
machine (``prepare --jobs N``), ``submitit.AutoExecutor(cluster="slurm")`` submits them as
one job array (``prepare --jobs N --slurm``, with ``--slurm-set KEY=VALUE`` for submitit's
parameters: ``slurm_partition=cpu``, ``timeout_min=720``, ``cpus_per_task=4``, ``mem_gb=8``).
Job folders and logs go to ``<data.dir>.shards/jobs``. Shards already encoded from the
current plan are not run again, so after a failure the same command redoes only the rest.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from structnmt.config import ExperimentConfig
from structnmt.errors import StructNMTError

#: submitit's own default for local jobs is two minutes: far too short for a WMT shard
DEFAULT_TIMEOUT_MIN = 24 * 60


class ShardJobError(StructNMTError):
    """One or more shard jobs failed."""


def shard_job(cfg: ExperimentConfig, index: int, count: int) -> str | None:
    """What a job runs: one shard. A user-facing error comes back as its one-line message."""
    from structnmt.data.prepare import prepare_shard

    try:
        prepare_shard(cfg, index, count, verbose=True)
    except StructNMTError as err:
        return str(err)
    return None


def executor(folder: Path, slurm: bool, params: dict):
    import submitit

    if slurm:
        ex = submitit.AutoExecutor(folder=folder, cluster="slurm")
    else:
        ex = submitit.LocalExecutor(folder=folder)
    ex.update_parameters(**{"timeout_min": DEFAULT_TIMEOUT_MIN, **params})
    return ex


def run_shards(cfg: ExperimentConfig, count: int, slurm: bool = False, params: dict | None = None,
               verbose: bool = True) -> None:
    """Run every shard not yet encoded from the current plan, and wait for all of them."""
    from structnmt.data.prepare import current_plan, read_shard_record, shard_name, shards_dir

    assert cfg.data is not None
    if count < 1:
        raise StructNMTError(f"--jobs: expected at least 1 shard, got {count}")
    work = shards_dir(cfg.data)
    _, plan = current_plan(cfg.data)
    todo = []
    for index in range(count):
        record = read_shard_record(work / shard_name(index, count))
        if not (record and record.get("config_digest") == plan["config_digest"]
                and record.get("subwords") == plan["inputs"]["subwords"]):
            todo.append(index)
    for stale in sorted(work.glob("shard-*")):
        if not stale.name.endswith(f"-of-{count:03d}"):  # from a run with another shard count
            if verbose:
                print(f"{stale}: from a run with another number of shards; removed")
            shutil.rmtree(stale, ignore_errors=True)
    if not todo:
        return
    ex = executor(work / "jobs", slurm, params or {})
    jobs = ex.map_array(shard_job, [cfg] * len(todo), todo, [count] * len(todo))
    if verbose:
        where = "SLURM job array" if slurm else "local processes"
        print(f"running {len(todo)} of {count} shards as {where} (logs: {work / 'jobs'})", flush=True)
    failures = []
    for index, job in zip(todo, jobs):
        try:
            message = job.result()
        except Exception as err:  # submitit raises its own errors with the job's traceback
            last = str(err).strip().splitlines()[-1] if str(err).strip() else type(err).__name__
            message = f"{last} (log: {job.paths.stderr})"
        if message:
            failures.append(f"shard {index + 1}/{count}: {message}")
        elif verbose:
            print(f"shard {index + 1}/{count} done", flush=True)
    if failures:
        more = f" (and {len(failures) - 1} more)" if len(failures) > 1 else ""
        raise ShardJobError(f"{failures[0]}{more}; fix it and run the same command again (finished shards are kept)")
