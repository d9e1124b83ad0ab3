"""Host time of collating training batches, and what data workers (``training.num_workers``) hide.

    python benchmarks/bench_collate.py                       # data/multi30k_en_de, 4,096-token batches
    python benchmarks/bench_collate.py --step-ms 15 --workers 0 1 2
    python benchmarks/bench_collate.py --smoke DIR           # the built-in synthetic task (tests)

1. ``collate`` of ``--batches`` planned training batches (token batches of ``--max-tokens``, epoch 1's
   shuffle), in this process, for the fields each kind of method asks for: none (vanilla), parents
   (PASCAL), tree distances (Deps-SAN, UDISCAL), scenes (SASA): milliseconds per batch, and each
   against vanilla's.
2. The same batches through ``BatchPrefetcher`` with 0, 1 and 2 workers, while the consumer stands
   for a GPU that takes ``--step-ms`` per queued update (it sleeps, taking no core, as a host that
   has queued its kernels does): wall time per batch and its ratio to 0 workers. Without workers
   each batch costs the collation plus the step; with them the collation runs beside the step, as
   long as the workers have cores of their own.

Tree distance fields need a dataset prepared with trees (``structnmt prepare`` of a method recipe);
a field the dataset lacks is reported as such.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import common

sys.path.insert(0, str(common.ROOT))

#: the structure fields each kind of method asks for (``Method.needs``)
FIELD_SETS: dict[str, set[str]] = {
    "vanilla": set(),
    "parents (PASCAL)": {"parent_mid"},
    "tree distances (Deps-SAN, UDISCAL)": {"dist"},
    "scenes (SASA)": {"scene_mask", "scene_dist"},
}


def collate_ms(data, batches, fields: set[str], rounds: int) -> float:
    from structnmt.data.batching import collate

    times = []
    for _ in range(rounds):
        began = time.perf_counter()
        for indices in batches:
            collate(data, indices, {"src": fields, "tgt": set()})
        times.append((time.perf_counter() - began) / len(batches) * 1e3)
    return statistics.median(times)


def prefetched_ms(data, batches, workers: int, step_ms: float, fields: set[str]) -> float:
    from structnmt.data.batching import collate
    from structnmt.data.prefetch import BatchPrefetcher

    both = {"src": fields, "tgt": set()}
    stream = ((1, i, len(batches), idx) for i, idx in enumerate(batches))
    with BatchPrefetcher(data, workers, lambda idx: collate(data, idx, both)) as prefetch:
        it = prefetch.collated(stream, lambda: {"fields": both})
        next(it)  # the workers start: not part of the steady state
        began = time.perf_counter()
        n = 0
        for _ in it:
            time.sleep(step_ms / 1e3)
            n += 1
    return (time.perf_counter() - began) / max(n, 1) * 1e3


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dataset", default="data/multi30k_en_de")
    p.add_argument("--max-tokens", type=int, default=4096)
    p.add_argument("--batches", type=int, default=60)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--step-ms", type=float, default=15.0, help="the stand-in GPU step, in ms")
    p.add_argument("--workers", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--smoke", type=Path, help=common.SMOKE_HELP)
    args = p.parse_args()
    common.set_threads(args.threads)

    from structnmt.data.batching import token_batches
    from structnmt.data.dataset import ParallelDataset

    if args.smoke:
        _, dataset = common.smoke_task(args.smoke)
        args.max_tokens, args.batches, args.rounds, args.step_ms = 512, 8, 1, 2.0
    else:
        dataset = common.ROOT / args.dataset
    data = ParallelDataset(Path(dataset), "train")
    planned = token_batches(data.src_lengths, data.tgt_lengths, args.max_tokens, shuffle=True, seed=1, epoch=1)
    batches = planned[: args.batches]
    rows_per_batch = statistics.mean(len(b) for b in batches)
    stored = set(data.side_arrays(int(batches[0][0]), "src"))

    collate_rows, base = [], None
    for name, fields in FIELD_SETS.items():
        try:
            ms = collate_ms(data, batches, fields, args.rounds)
        except Exception as err:  # noqa: BLE001 - a field this dataset was not prepared with
            collate_rows.append([name, f"not measured: {type(err).__name__}: {str(err)[:80]}", ""])
            continue
        base = ms if base is None else base
        collate_rows.append([name, f"{ms:.2f}", f"{ms / base:.2f}x"])
    print(common.markdown_table(["fields", "ms per batch", "against vanilla"], collate_rows))

    prefetch_rows, inline = [], None
    for workers in args.workers:
        ms = prefetched_ms(data, batches, workers, args.step_ms, set())
        inline = ms if inline is None and workers == 0 else inline
        ratio = f"{inline / ms:.2f}x" if inline else ""
        prefetch_rows.append([workers, f"{ms:.2f}", ratio])
    print(common.markdown_table(["workers", "ms per batch (step + what is not hidden)", "speed-up against 0"],
                                prefetch_rows))

    intro = (f"Dataset `{dataset}` (split train, stored source fields: {', '.join(sorted(stored))}); "
             f"{len(batches)} token batches of {args.max_tokens:,} tokens (epoch 1's shuffle, "
             f"{rows_per_batch:.0f} sentences each on average); {args.threads} torch thread(s); "
             f"median of {args.rounds} round(s).")
    path = common.write_report(
        "collate", "Collating training batches, and data workers",
        [("Setup", intro), ("Collation in this process", common.markdown_table(
            ["fields", "ms per batch", "against vanilla"], collate_rows)),
         (f"Through the prefetcher, beside a {args.step_ms:g} ms stand-in step", common.markdown_table(
             ["workers", "ms per batch", "speed-up against 0"], prefetch_rows))],
        common.machine())
    print(f"report: {path}")
    if args.smoke:
        print("smoke: collate and prefetch measured")


if __name__ == "__main__":
    main()
