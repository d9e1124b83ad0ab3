"""The kernels one eager training update runs, for every registered method against vanilla.

    python benchmarks/kernel_counts.py [--precision fp32|bf16] [--methods sasa,lpsi_mse] [--top 6]

On a GPU a small model's eager update is launch-bound: each kernel costs a launch of a few
microseconds whatever its size, so a plug-in's eager overhead there follows the kernels it adds,
not its arithmetic. The dispatcher's calls can be counted on a CPU: this runs one update (forward, loss, backward,
clipping, Adam) of each case of ``tests/registry_cases.py`` (every registered method at least
once) at the small recipe's shape on one batch of the built-in synthetic task, under a dispatch
mode that sees every ATen call below autograd, and counts the calls that can run a kernel (views,
aliases and other calls that only make tensor metadata are left out). It prints each case's
count, its ratio to vanilla's (counted in the same run), and the ops it adds most. Counts do not
depend on the batch's size or the CPU; they change with the code, so they say which plug-ins to
cut kernels from before any GPU is at hand, and whether a change did (``--against COMMIT`` is not
offered: run the script in a worktree of the other commit).

A CPU count is a guide to a GPU's, not its copy: dropout is three calls on a CPU and one
(``native_dropout``) on CUDA, the batch's copies to the device appear only there, and a fused or
``_foreach`` optimizer call is one call that launches several kernels. ``--device cuda`` counts
the calls as a GPU makes them (still calls, not launches: a profiler counts those).
"""

from __future__ import annotations

import argparse
import collections
import functools
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

#: ATen calls that make or read tensor metadata only (no kernel on any device)
NO_KERNEL = {"detach", "alias", "lift_fresh", "empty", "empty_like", "empty_strided", "new_empty",
             "new_empty_strided", "set_", "resize_", "sym_size", "sym_stride", "sym_numel", "is_same_size",
             "_unsafe_view", "_local_scalar_dense", "_has_compatible_shallow_copy_type",
             "promote_types", "_record_function_enter_new", "_record_function_exit"}  # a dtype; profiler marks


def op_name(func: Any) -> str:
    return func._schema.name.split("::", 1)[-1]


def launches_kernel(func: Any) -> bool:
    """Whether an ATen call can run a kernel: not a view and not one of ``NO_KERNEL``."""
    return not getattr(func, "is_view", False) and op_name(func) not in NO_KERNEL


class KernelCounter(TorchDispatchMode):
    """Counts the ATen calls that can run a kernel, by op name."""

    def __init__(self) -> None:
        super().__init__()
        self.counts: collections.Counter[str] = collections.Counter()

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        if launches_kernel(func):
            self.counts[op_name(func)] += 1
        return func(*args, **(kwargs or {}))


def small_shape() -> dict[str, Any]:
    """The small recipe's layers, width and dropout (configs/multi30k_en_de_transformer.yaml)."""
    from structnmt import load_config

    m = load_config(ROOT / "configs" / "multi30k_en_de_transformer.yaml").model
    return {"enc_layers": m.enc_layers, "dec_layers": m.dec_layers, "d_model": m.d_model, "n_heads": m.n_heads,
            "d_ff": m.d_ff, "dropout": m.dropout}


def count_update(case: str, dataset: Path, vocab: int, size: dict[str, Any], precision: str,
                 max_tokens: int, kernel: str, device: str = "cpu") -> collections.Counter[str]:
    """Kernels of the second eager update of ``case`` (the first makes Adam's state)."""
    from structnmt import load_config
    from structnmt.data.batching import collate, token_batches
    from structnmt.data.dataset import ParallelDataset
    from structnmt.training.updater import Updater
    from tests.registry_cases import make_model

    torch.manual_seed(1)
    model = make_model(case, vocab, attention_kernel=kernel, **size)
    training = load_config(ROOT / "configs" / "multi30k_en_de_transformer.yaml",
                           {"training.precision": precision, "training.compile": "off",
                            "training.max_tokens": max_tokens}).training
    updater = Updater(model, training, torch.device(device))
    ds = ParallelDataset(dataset, "train")
    needs = model.structure_needs()
    fields = {"src": needs["src"] | {"valid"}, "tgt": needs["tgt"] | {"valid"}}
    indices = token_batches(ds.src_lengths, ds.tgt_lengths, max_tokens, shuffle=False, seed=1, epoch=1)[0]
    batch = collate(ds, indices, fields, 8)
    updater.update([batch])
    counter = KernelCounter()
    with counter:
        updater.update([batch])
        if torch.device(device).type == "cuda":  # an asynchronous error belongs to this count, not the next timing
            torch.cuda.synchronize()
    return counter.counts


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--precision", default="fp32", choices=["fp32", "bf16"])
    parser.add_argument("--methods", default="", help="comma-separated cases (default: every case)")
    parser.add_argument("--top", type=int, default=5, help="ops a case adds most, shown per case")
    parser.add_argument("--max-tokens", type=int, default=256)
    parser.add_argument("--kernel", default="sdpa", choices=["sdpa", "explicit", "auto"],
                        help="model.attention_kernel: sdpa is the route auto takes on a GPU (default); "
                             "auto is the CPU's own (explicit for bf16 and for plug-ins that scale)")
    parser.add_argument("--device", default="cpu",
                        help="cuda: the calls as dispatched on a GPU (a profiler counts launches)")
    parser.add_argument("--tiny", action="store_true", help="the registry's tiny model (the tests' dry run)")
    args = parser.parse_args(argv)

    from tests.registry_cases import all_cases, prepare_synthetic, vocab_size

    torch.set_num_threads(1)
    size = {"enc_layers": 2, "dec_layers": 2, "d_model": 32, "n_heads": 4, "d_ff": 64, "dropout": 0.1} \
        if args.tiny else small_shape()
    cases = [c for c in sorted(all_cases()) if c != "vanilla"]
    if args.methods:
        wanted = [c.strip() for c in args.methods.split(",") if c.strip()]
        unknown = sorted(set(wanted) - set(cases))
        if unknown:
            parser.error(f"no such case: {', '.join(unknown)} (cases: {', '.join(cases)})")
        cases = [c for c in cases if c in wanted]
    with tempfile.TemporaryDirectory() as work:
        dataset = prepare_synthetic(Path(work) / "synthetic", train=96, test=8)
        vocab = vocab_size(dataset)
        count = functools.partial(count_update, dataset=dataset, vocab=vocab, size=size, precision=args.precision,
                                  max_tokens=args.max_tokens, kernel=args.kernel, device=args.device)
        vanilla = count("vanilla")
        base = sum(vanilla.values())
        print(f"one eager update, {size['enc_layers']}+{size['dec_layers']} layers, d_model {size['d_model']}, "
              f"{args.precision}, attention_kernel {args.kernel}, {args.device}, torch {torch.__version__}: "
              "ATen calls that can run a kernel")
        print(f"{'case':<20} {'kernels':>8} {'vs vanilla':>11}  most added")
        print(f"{'vanilla':<20} {base:>8} {'1.000':>11}")
        rows = []
        for case in cases:
            counts = count(case)
            total = sum(counts.values())
            added = counts.copy()
            added.subtract(vanilla)
            top = ", ".join(f"{name} {n:+d}" for name, n in added.most_common(args.top) if n > 0)
            rows.append((total, case, top))
        for total, case, top in sorted(rows):
            print(f"{case:<20} {total:>8} {total / base:>11.3f}  {top}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
