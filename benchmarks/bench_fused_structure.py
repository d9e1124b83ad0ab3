"""Structure inside a fused kernel: time and peak memory of one structure-aware attention layer, on
the explicit route (the (B, H, I, J) scores and weights) and on SDPA with the plug-ins' float mask.

    python benchmarks/bench_fused_structure.py --threads 1             # B=8, H=4, L=256 and L=32
    python benchmarks/bench_fused_structure.py --smoke                  # a few tiny steps (tests)

For each method with an SDPA form (``tests/test_fused_structure.py`` checks that both routes give the
same outputs and gradients), one encoder self-attention layer of the base model's width
(d = 256, 4 heads) with that method's plug-ins runs forward and backward on a batch of B sentences
of length L, with synthetic structure (random tree distances and scenes, padding in half the
sentences). Time: the median of ``--repeats`` steps after two warm-up steps, both routes in this
process, alternated. Memory: each (method, route) in a fresh process, the peak resident memory of
one step (after a warm-up step) above what the process held before it, with glibc told to map
every allocation above 64 KiB on its own (``MALLOC_MMAP_THRESHOLD_``) so that freed tensors leave
the resident memory. Every ratio is SDPA / explicit of the same run. FlexAttention is not
measured: torch has no FlexAttention backward on the CPU.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import common

sys.path.insert(0, str(common.ROOT))

#: the methods whose plug-ins SDPA runs, each on encoder layer 1 (vanilla: the layer without plug-ins)
METHODS: dict[str, list[dict]] = {
    "vanilla": [],
    "local_window": [{"name": "local_window", "layers": [1]}],
    "localness": [{"name": "localness"}],
    "deps_san (Wink only)": [{"name": "deps_san", "layers": [1], "scaling": False, "wink_sparsing": True}],
    "lpsi": [{"name": "lpsi", "layers": [1]}],
    "relative_position (values: false)": [{"name": "relative_position", "layers": [1], "values": False}],
    "sasa": [{"name": "sasa", "layers": [1], "heads": [0]}],
    "udiscal": [{"name": "udiscal", "layers": [1], "heads": [0]}],
}


def _layer_and_inputs(methods: list[dict], batch: int, length: int, seed: int = 0):
    """One encoder self-attention layer with the methods' plug-ins, its input and synthetic structure."""
    import torch

    from structnmt.config import ModelConfig
    from structnmt.model.transformer import Transformer

    torch.manual_seed(seed)
    cfg = ModelConfig(enc_layers=1, dec_layers=1, d_model=256, n_heads=4, d_ff=1024, dropout=0.0, methods=methods)
    attn = Transformer(cfg, 100, 100).encoder[0].self_attn.train()
    lengths = torch.tensor([length if i % 2 == 0 else length * 3 // 4 for i in range(batch)])
    positions = torch.arange(length)
    padding = positions[None, :] >= lengths[:, None]  # (B, L)
    valid = ~padding & (positions[None, :] < lengths[:, None] - 1)  # EOS and padding are not sub-words
    depth = torch.randint(0, 6, (batch, length)).float()
    dist = (depth[:, :, None] - depth[:, None, :]).abs() + (positions[:, None] != positions[None, :]).float()
    scene = torch.randint(0, 4, (batch, length))
    src = {"valid": valid, "dist": dist, "parent_mid": torch.rand(batch, length) * lengths[:, None],
           "scene_mask": scene[:, :, None] == scene[:, None, :],
           "scene_dist": (scene[:, :, None] - scene[:, None, :]).abs().float()}
    x = torch.randn(batch, length, cfg.d_model, requires_grad=True)
    return attn, x, padding, {"src": src, "tgt": {}}


def _set_route(attn, route: str) -> None:
    attn.kernel = route  # model.attention_kernel: a layer that cannot take the route falls back


def _step(attn, x, padding, struct) -> None:
    out = attn(x, key_padding=padding, struct=struct)
    out.square().mean().backward()
    attn.zero_grad(set_to_none=True)
    x.grad = None


def time_routes(methods: list[dict], batch: int, length: int, repeats: int) -> dict[str, float]:
    """Median seconds per forward + backward step of each route, alternated in one process."""
    attn, x, padding, struct = _layer_and_inputs(methods, batch, length)
    seconds: dict[str, list[float]] = {"explicit": [], "sdpa": []}
    for route in seconds:
        _set_route(attn, route)
        for _ in range(2):
            _step(attn, x, padding, struct)
    for _ in range(repeats):
        for route in seconds:
            _set_route(attn, route)
            t0 = time.perf_counter()
            _step(attn, x, padding, struct)
            seconds[route].append(time.perf_counter() - t0)
    return {route: statistics.median(values) for route, values in seconds.items()}


def step_memory(methods: list[dict], batch: int, length: int, route: str, threads: int) -> int:
    """Bytes of resident memory one step takes above what the process held before it (fresh process)."""
    common.set_threads(threads)
    attn, x, padding, struct = _layer_and_inputs(methods, batch, length)
    _set_route(attn, route)
    _step(attn, x, padding, struct)  # warm-up: first-call buffers and caches are not the step's
    try:
        Path("/proc/self/clear_refs").write_text("5")  # Linux: the peak (VmHWM) restarts from now
    except OSError:
        pass  # elsewhere the peak includes the warm-up step (the same step)
    before = _rss()
    _step(attn, x, padding, struct)
    return common.peak_rss_self() - before


def _rss() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return common.peak_rss_self()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch", type=int, default=8, help="sentences per batch (default %(default)s)")
    parser.add_argument("--lengths", type=int, nargs="+", default=[256, 32],
                        help="sentence lengths, one table each (default: %(default)s)")
    parser.add_argument("--repeats", type=int, default=10, help="timed steps per route (default %(default)s)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default %(default)s)")
    parser.add_argument("--no-memory", action="store_true", help="skip the peak-memory processes")
    parser.add_argument("--name", default="fused_structure", help="report: benchmarks/results/NAME.md")
    parser.add_argument("--smoke", action="store_true", help="two tiny steps per method: checks the script")
    args = parser.parse_args(argv)
    measured = set(METHODS)  # the methods whose peak memory is measured (two fresh processes each)
    if args.smoke:
        args.batch, args.lengths, args.repeats = 2, [12], 1
        measured = set(list(METHODS)[:1])  # the memory path once: a process each costs seconds
    common.set_threads(args.threads)
    # glibc: every allocation above 64 KiB its own mapping, returned at free, so that the resident
    # memory of the fresh processes follows the live tensors (read at their start, hence here)
    os.environ.setdefault("MALLOC_MMAP_THRESHOLD_", "65536")
    info = common.machine()
    info["precision"] = "float32"
    sections = []
    for length in args.lengths:
        rows = []
        for name, methods in METHODS.items():
            times = time_routes(methods, args.batch, length, args.repeats)
            row = [name, f"{times['explicit'] * 1e3:.2f}", f"{times['sdpa'] * 1e3:.2f}",
                   f"{times['sdpa'] / times['explicit']:.2f}"]
            if not args.no_memory and name not in measured:
                row += ["-", "-", "-"]
            elif not args.no_memory:
                memory = {route: common.run_with_peak_rss(step_memory, methods, args.batch, length, route,
                                                           args.threads)[0]
                          for route in ("explicit", "sdpa")}
                row += [common.mib(memory["explicit"]), common.mib(memory["sdpa"]),
                        f"{memory['sdpa'] / max(memory['explicit'], 1):.2f}"]
            rows.append(row)
            print(f"L={length} {name}: " + ", ".join(row[1:]), flush=True)
        header = ["method", "explicit ms/step", "SDPA ms/step", "time SDPA/explicit"]
        if not args.no_memory:
            header += ["explicit peak", "SDPA peak", "memory SDPA/explicit"]
        sections.append((f"B={args.batch}, H=4, d=256, L={length}: one layer, forward + backward",
                         common.markdown_table(header, rows)))
    path = common.write_report(args.name, "Structure inside a fused kernel (CPU)", sections, info)
    print(f"report: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
