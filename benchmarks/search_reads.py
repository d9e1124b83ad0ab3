"""Beam search's reads of the device, and its time, against another commit's beam search.

    python benchmarks/search_reads.py CHECKPOINT [--dataset data/multi30k_en_de] [--against 190b9bf]

Every read of a tensor into Python (``tolist``, ``item``, ``int``, ``float``, ``bool``,
``nonzero``) waits for the device on a GPU; on a CPU it costs little, so this counts them rather
than timing a GPU. For the first batch of the split (``--max-tokens``) it counts the reads of this
checkout's ``beam_search`` and of the one in commit ``--against`` (its ``structnmt/model/search.py``
read with ``git show``, run against this checkout's model), then decodes the whole split with
both, batch by batch in alternating order, and prints whether every hypothesis (tokens, score,
log-probability) is the same and the seconds of each (one thread).
"""

from __future__ import annotations

import argparse
import collections
import importlib.util
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
READS = ("tolist", "item", "__int__", "__float__", "__bool__", "nonzero")


def search_of(commit: str) -> Any:
    """``structnmt/model/search.py`` as it was in ``commit``, as a module."""
    text = subprocess.run(["git", "-C", str(ROOT), "show", f"{commit}:structnmt/model/search.py"],
                          capture_output=True, text=True, check=True).stdout
    path = Path(tempfile.mkdtemp()) / f"search_{commit}.py"
    path.write_text(text, encoding="utf-8")
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[path.stem] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def count_reads(fn: Any) -> collections.Counter:
    counts: collections.Counter = collections.Counter()
    real = {name: getattr(torch.Tensor, name) for name in READS}

    def counting(name: str) -> Any:
        def counted(self: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
            counts[name] += 1
            return real[name](self, *args, **kwargs)
        return counted

    try:
        for name in READS:
            setattr(torch.Tensor, name, counting(name))
        fn()
    finally:
        for name in READS:
            setattr(torch.Tensor, name, real[name])
    return counts


def main(argv: list[str] | None = None) -> int:
    from structnmt.data.batching import collate, token_batches
    from structnmt.data.dataset import ParallelDataset
    from structnmt.model import search
    from structnmt.training.checkpoint import load_model

    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("checkpoint", nargs="?", help="a trained model (not with --smoke)")
    p.add_argument("--smoke", type=Path, metavar="DIR",
                   help="train 8 updates on the built-in synthetic task in DIR and compare on its test split")
    p.add_argument("--dataset", default="data/multi30k_en_de")
    p.add_argument("--split", default="test_2016_flickr")
    p.add_argument("--against", default="190b9bf", help="the commit whose beam search to compare with")
    p.add_argument("--max-tokens", type=int, default=2000, help="source tokens a batch (the read count: 8,000)")
    p.add_argument("--beam", type=int, default=5)
    args = p.parse_args(argv)
    if args.smoke:
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        import bench_joey
        import common

        config, dataset = common.smoke_task(args.smoke)
        _, _, last = bench_joey.structnmt_train(dataset, 8, 4, 1, 512, config=str(config), work=args.smoke)
        args.checkpoint, args.dataset, args.split = str(last), str(dataset), "test"
    elif not args.checkpoint:
        p.error("a checkpoint, or --smoke DIR")
    torch.set_num_threads(1)
    model, _, _ = load_model(args.checkpoint, "cpu", dataset_dir=args.dataset)
    fields = {side: set(names) for side, names in model.structure_needs().items() if side == "src"}
    ds = ParallelDataset(args.dataset, args.split)
    other = search_of(args.against)
    searches = {"here": search, args.against: other}

    first = collate(ds, token_batches(ds.src_lengths, None, 8000, shuffle=False, seed=0, epoch=0)[0], fields)
    for name, module in searches.items():
        counts = count_reads(lambda m=module: m.beam_search(model, first, args.beam, 0.6, 1.2, 10, 1))
        print(f"{name}: {sum(counts.values()):,} device reads for one batch of {first.src.size(0)} sentences "
              f"({', '.join(f'{k} {v:,}' for k, v in sorted(counts.items()))})")

    batches = [collate(ds, b, fields) for b in
               token_batches(ds.src_lengths, None, args.max_tokens, shuffle=False, seed=0, epoch=0)]
    seconds = dict.fromkeys(searches, 0.0)
    same = total = 0
    for i, batch in enumerate(batches):
        out = {}
        for name in (list(searches) if i % 2 == 0 else list(searches)[::-1]):
            began = time.perf_counter()
            out[name] = searches[name].beam_search(model, batch, args.beam, 0.6, 1.2, 10, 1)
            seconds[name] += time.perf_counter() - began
        for a, b in zip(out["here"], out[args.against]):
            total += 1
            same += [(h.tokens, h.score, h.logprob) for h in a] == [(h.tokens, h.score, h.logprob) for h in b]
    print(f"{same:,} of {total:,} sentences the same (tokens, score, log-probability); seconds: here "
          f"{seconds['here']:.2f}, {args.against} {seconds[args.against]:.2f}, "
          f"here / {args.against} {seconds['here'] / seconds[args.against]:.3f}")
    return 0 if same == total else 1


if __name__ == "__main__":
    raise SystemExit(main())
