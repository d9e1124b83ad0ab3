"""Running the shards of a sharded ``prepare`` as jobs: local processes or a SLURM job array.

Both go through submitit: ``submitit.LocalExecutor`` starts one process per shard on this
machine (``prepare --jobs N``), ``submitit.AutoExecutor(cluster="slurm")`` submits them as
one job array (``prepare --jobs N --slurm``, with ``--slurm-set KEY=VALUE`` for submitit's
parameters: ``slurm_partition=cpu``, ``timeout_min=720``, ``cpus_per_task=4``, ``mem_gb=8``,
``slurm_max_num_timeout=3``).
Which shards to run, and what a shard does, is :mod:`structnmt.data.prepare`'s business; this
module only runs them and gathers their failures into one error.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from structnmt.errors import StructNMTError

#: submitit's own default for local jobs is two minutes: far too short for a WMT shard
DEFAULT_TIMEOUT_MIN = 24 * 60
#: ``--slurm-set`` keys that submitit takes when the executor is made, not in ``update_parameters``
CONSTRUCTOR_KEYS = ("slurm_max_num_timeout", "slurm_python")


class ShardJobError(StructNMTError):
    """One or more shard jobs failed."""


def executor(folder: Path, slurm: bool, params: dict):
    import submitit

    params = dict(params)
    made_with = {key: params.pop(key) for key in CONSTRUCTOR_KEYS if key in params}
    if slurm:
        ex = submitit.AutoExecutor(folder=folder, cluster="slurm", **made_with)
    else:
        ex = submitit.LocalExecutor(folder=folder)
    ex.update_parameters(**{"timeout_min": DEFAULT_TIMEOUT_MIN, **params})
    return ex


def run_jobs(job: Callable[[object, int, int], str | None], cfg: object, todo: list[int], count: int,
             folder: Path, slurm: bool = False, params: dict | None = None, verbose: bool = True) -> None:
    """``job(cfg, index, count)`` for every index in ``todo``, as one job array; waits for all.

    ``job`` returns None or a one-line error message; every failure is gathered into one
    :class:`ShardJobError` naming the first.
    """
    ex = executor(folder, slurm, params or {})
    jobs = ex.map_array(job, [cfg] * len(todo), todo, [count] * len(todo))
    if verbose:
        where = "SLURM job array" if slurm else "local processes"
        print(f"running {len(todo)} of {count} shards as {where} (logs: {folder})", flush=True)
    failures = []
    for index, handle in zip(todo, jobs):
        try:
            message = handle.result()
        except Exception as err:  # submitit raises its own errors with the job's traceback
            last = str(err).strip().splitlines()[-1] if str(err).strip() else type(err).__name__
            message = f"{last} (log: {handle.paths.stderr})"
        if message:
            failures.append(f"shard {index + 1}/{count}: {message}")
        elif verbose:
            print(f"shard {index + 1}/{count} done", flush=True)
    if failures:
        more = f" (and {len(failures) - 1} more)" if len(failures) > 1 else ""
        raise ShardJobError(f"{failures[0]}{more}; fix it and run the same command again (finished shards are kept)")
