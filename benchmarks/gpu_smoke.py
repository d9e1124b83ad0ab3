"""The GPU smoke test, for the day a GPU is there: the CUDA paths that no CPU test can run.

    python benchmarks/gpu_smoke.py                 # on a machine with CUDA; under 10 minutes
    python benchmarks/gpu_smoke.py --cpu --updates 2 --only vanilla,dbsa   # the script's own dry run

On the synthetic task (prepared here, a few seconds), for every registered method (the cases
of ``tests/registry_cases.py``, which cover the whole registry):

* 50 updates under bf16 autocast and 50 under fp16 autocast with a gradient scaler: every
  loss finite, at most a few updates skipped, the fp16 scale not collapsed; updates/s and the
  peak CUDA memory of each method (eager; vanilla once more through ``torch.compile``, the
  default on a GPU where the toolkit has ``training.compile``);
* beam search on the GPU (fp32, and under the bf16 autocast as validation runs it) against the
  same model's fp32 beam search on the CPU: the share of identical lines (TF32 off);
* with several GPUs, DDP over all of them with NCCL: 20 updates of vanilla and of DBSA (an
  auxiliary loss), after which every rank must hold the same parameters.

Without CUDA it says so and exits 0 (nothing is checked). ``--cpu`` runs the same steps on
the CPU (DDP: two gloo processes with ``--ddp-cpu 2``) so that the script itself is tested
(``tests/test_gpu_smoke.py``); its figures mean nothing. Results go to
``benchmarks/results/gpu_smoke.md``; a failed check exits 1 after the whole report.
"""

from __future__ import annotations

import argparse
import math
import os
import socket
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import common  # noqa: E402  (a script beside this one, not a package)

MODEL = {"d_model": 256, "n_heads": 4, "d_ff": 1024, "dropout": 0.1}
#: the --cpu dry run: the same steps on a tiny model and data (two shared cores take it in about a minute)
DRY_MODEL = {"d_model": 32, "n_heads": 4, "d_ff": 64, "dropout": 0.1}
BUDGET_S = 600


def _updater(model: Any, precision: str, device: Any, ctx: Any = None, compiled: bool = False) -> Any:
    """The training path's ``Updater``; eager unless ``compiled`` (``training.compile``, where the
    toolkit has it: compiling every method twice would not fit in the 10 minutes)."""
    import dataclasses

    from structnmt.config import TrainingConfig
    from structnmt.training.updater import Updater

    settings: dict[str, Any] = {"lr": 1e-3, "warmup": 10, "clip_norm": 1.0, "label_smoothing": 0.1,
                                "precision": precision}
    if "compile" in {f.name for f in dataclasses.fields(TrainingConfig)}:
        settings["compile"] = "on" if compiled else "off"
    return Updater(model, TrainingConfig(**settings), device, ctx)


def train_case(case: str, precision: str, data: Path, vocab: int, device: Any, updates: int,
               size: dict[str, Any], compiled: bool = False, fused_kernel: str | None = None) -> dict[str, Any]:
    """``updates`` updates of one method under one precision: finiteness, skips, scale, speed, peak memory."""
    import torch

    from structnmt.model.attention import MultiHeadAttention
    from structnmt.training.compiled import length_multiple
    from tests.registry_cases import batches, make_model

    torch.manual_seed(1)
    model = make_model(case, vocab, **size)
    for module in model.modules():  # --fused-kernel: the route every layer prefers (model.attention_kernel)
        if isinstance(module, MultiHeadAttention) and fused_kernel:
            module.kernel = fused_kernel
    updater = _updater(model, precision, device, compiled=compiled)
    # lengths padded as the trainer pads them (8 for compiled training on CUDA: training.pad_to_multiple)
    train = batches(data, "train", model, max_tokens=2048,
                    multiple=length_multiple(0, updater.compiled, torch.device(device)))
    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats(device)
    start_scale = updater.scaler.get_scale() if updater.scaler.is_enabled() else None
    started = time.perf_counter()
    losses, skipped, problems = [], 0, []
    for step in range(updates):
        stats = updater.update([train[step % len(train)]])
        values = [stats.loss, *stats.aux.values()]
        if not all(math.isfinite(v) for v in values):
            problems.append(f"update {step}: loss {stats.loss}, aux {stats.aux}")
        skipped += not stats.applied
        losses.append(stats.loss)
    if device.type == "cuda":
        torch.cuda.synchronize()
    seconds = time.perf_counter() - started
    scale = updater.scaler.get_scale() if updater.scaler.is_enabled() else None
    if skipped > max(2, updates // 10):
        problems.append(f"{skipped} of {updates} updates skipped")
    if start_scale is not None and scale is not None and scale < start_scale / 16:
        problems.append(f"the gradient scale collapsed from {start_scale:g} to {scale:g}")
    peak = torch.cuda.max_memory_allocated(device) if device.type == "cuda" else None
    return {"case": case, "precision": precision, "model": model, "seconds": seconds, "skipped": skipped,
            "first_loss": losses[0], "last_loss": losses[-1], "scale": scale, "peak": peak, "problems": problems}


def beam_agreement(model: Any, data: Path, device: Any, precisions: tuple[str, ...]) -> dict[str, tuple[float, int]]:
    """Per precision: the share of test lines whose beam-4 output on ``device`` (under that
    precision's autocast) equals the same model's fp32 output on the CPU, and the line count."""
    import copy

    import torch

    from structnmt.model.search import beam_search
    from tests.registry_cases import batches

    cpu_model = copy.deepcopy(model).to("cpu").float()
    model = model.to(device)
    same = dict.fromkeys(precisions, 0)
    total = 0
    for batch in batches(data, "test", cpu_model, max_tokens=2048, inference=True):
        reference = [h[0].tokens for h in beam_search(cpu_model, batch, beam=4)]
        total += len(reference)
        for precision in precisions:
            with _updater(torch.nn.Linear(1, 1), precision, device).autocast():
                found = [h[0].tokens for h in beam_search(model, batch.to(device), beam=4)]
            same[precision] += sum(a == b for a, b in zip(reference, found))
    return {precision: (same[precision] / max(total, 1), total) for precision in precisions}


def _one_line(err: BaseException) -> str:
    """An exception in one line (its first): the compilers' messages run to pages."""
    lines = [line for line in str(err).splitlines() if line.strip()]
    return f"{type(err).__name__}: {lines[0][:300] if lines else ''}"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def ddp_worker(rank: int, world: int, port: int, data: str, vocab: int, use_cuda: bool, updates: int,
               size: dict[str, Any], queue: Any) -> None:
    """One rank: ``updates`` DDP updates of vanilla and of DBSA on this rank's shard; returns a
    parameter fingerprint per case (equal on every rank when the replicas stayed in step)."""
    import numpy as np
    import torch

    from structnmt.data.batching import collate, token_batches
    from structnmt.data.dataset import ParallelDataset
    from structnmt.training import distributed as D
    from tests.registry_cases import make_model

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    device = torch.device("cuda", rank) if use_cuda else torch.device("cpu")
    ctx = D.init_distributed(device, D.DistContext(rank=rank, world_size=world, local_rank=rank))
    try:
        dataset = ParallelDataset(Path(data), "train")
        lengths = np.asarray([len(dataset.side_arrays(i, "src")["ids"]) for i in range(len(dataset))])
        plan = token_batches(lengths, None, 1024, shuffle=True, seed=1, epoch=1, num_shards=world, shard=rank)
        fingerprints = {}
        for case in ("vanilla", "dbsa"):
            torch.manual_seed(1)
            model = make_model(case, vocab, **size)
            updater = _updater(model, "bf16" if use_cuda else "fp32", device, ctx)
            needs = model.structure_needs()
            fields = {"src": needs["src"] | {"valid"}, "tgt": needs["tgt"] | {"valid"}}
            for step in range(updates):
                updater.update([collate(dataset, plan[step % len(plan)], fields)])
            fingerprints[case] = float(sum(p.detach().double().sum() for p in updater.model.parameters()))
        queue.put((rank, fingerprints))
    finally:
        D.shutdown()


def run_ddp(data: Path, vocab: int, world: int, use_cuda: bool, updates: int,
            size: dict[str, Any]) -> dict[int, dict[str, float]]:
    import torch.multiprocessing as mp

    context = mp.get_context("spawn")
    queue = context.Queue()
    mp.start_processes(ddp_worker, args=(world, _free_port(), str(data), vocab, use_cuda, updates, size, queue),
                       nprocs=world, start_method="spawn")
    return dict(queue.get() for _ in range(world))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--updates", type=int, default=50, help="updates per method and precision")
    p.add_argument("--only", help="comma-separated cases of tests/registry_cases.py (default: all)")
    p.add_argument("--cpu", action="store_true", help="dry run of this script on the CPU (figures mean nothing)")
    p.add_argument("--ddp-cpu", type=int, default=0, help="with --cpu: DDP over this many gloo processes")
    p.add_argument("--out", type=Path, default=common.RESULTS, help="folder of the report")
    p.add_argument("--no-compiled", action="store_true", help="leave out the compiled vanilla run")
    p.add_argument("--fused-kernel", choices=["flex", "sdpa"],
                   help="the route every layer prefers, as model.attention_kernel (default: auto)")
    args = p.parse_args(argv)

    import torch

    if not args.cpu and not torch.cuda.is_available():
        print("gpu_smoke: no CUDA device here (torch.cuda.is_available() is False); nothing was checked. "
              "Run it on a machine with a GPU, or pass --cpu for a dry run of the script.")
        return 0
    from tests.registry_cases import all_cases, covered_methods, prepare_synthetic, registered_methods, vocab_size

    started = time.perf_counter()
    device = torch.device("cpu") if args.cpu else torch.device("cuda", 0)
    torch.backends.cuda.matmul.allow_tf32 = False  # the beam comparison wants fp32 to mean fp32
    torch.backends.cudnn.allow_tf32 = False
    cases = args.only.split(",") if args.only else sorted(all_cases())
    failures = [f"no case for {m}" for m in sorted(registered_methods() - covered_methods())]
    work = Path(tempfile.mkdtemp(prefix="gpu_smoke-"))
    size = DRY_MODEL if args.cpu else MODEL
    data = prepare_synthetic(work, train=200 if args.cpu else 2000, test=16 if args.cpu else 100)
    vocab = vocab_size(data)
    torch.set_num_threads(1 if args.cpu else max(1, min(8, len(os.sched_getaffinity(0)))))

    rows, beam_rows = [], []
    for case in cases:
        bf16_model = None
        for precision in ("bf16", "fp16"):
            try:
                result = train_case(case, precision, data, vocab, device, args.updates, size,
                                    fused_kernel=args.fused_kernel)
            except Exception as err:  # one method's failure must not hide the others'
                failures.append(f"{case} {precision}: {_one_line(err)}")
                rows.append([case, precision, "**error**", "", "", "", ""])
                print(f"{case} {precision}: error: {_one_line(err)}", flush=True)
                continue
            failures += [f"{case} {precision}: {problem}" for problem in result["problems"]]
            rows.append([case, precision, f"{args.updates / result['seconds']:.1f}", result["skipped"],
                         f"{result['first_loss']:.2f} → {result['last_loss']:.2f}",
                         "" if result["scale"] is None else f"{result['scale']:g}",
                         "" if result["peak"] is None else common.mib(result["peak"])])
            print(" | ".join(str(c) for c in rows[-1]), flush=True)
            if precision == "bf16":
                bf16_model = result["model"]
        if bf16_model is None:
            continue
        try:
            agreement = beam_agreement(bf16_model, data, device, ("fp32", "bf16"))
        except Exception as err:
            failures.append(f"{case}: beam search: {_one_line(err)}")
            continue
        for precision, (share, lines) in agreement.items():
            beam_rows.append([case, precision, f"{share:.1%} of {lines}"])
            if precision == "fp32" and share < 0.95:
                failures.append(f"{case}: GPU beam search equals the CPU's on {share:.1%} of lines only")

    # the default on a GPU (training.compile: auto) compiles forward and loss: once here
    if not args.cpu and not args.no_compiled:
        try:
            result = train_case("vanilla", "bf16", data, vocab, device, args.updates, size, compiled=True)
            failures += [f"vanilla bf16 compiled: {problem}" for problem in result["problems"]]
            rows.append(["vanilla (compiled)", "bf16", f"{args.updates / result['seconds']:.1f}", result["skipped"],
                         f"{result['first_loss']:.2f} → {result['last_loss']:.2f}", "", common.mib(result["peak"])])
        except Exception as err:
            failures.append(f"vanilla bf16 compiled: {_one_line(err)}")
            rows.append(["vanilla (compiled)", "bf16", "**error**", "", "", "", ""])
    sections = [("Training: every method, bf16 and fp16 (loss scaler)", common.markdown_table(
        ["case", "precision", "updates/s", "skipped", "loss first → last", "fp16 scale", "peak memory"], rows)),
        ("Beam search on the device against fp32 on the CPU", common.markdown_table(
            ["case", "device precision", "identical lines"], beam_rows))]
    world = torch.cuda.device_count() if not args.cpu else args.ddp_cpu
    if world <= 1:
        sections.append(("DDP", "not run: one device"))
    else:
        try:
            prints = run_ddp(data, vocab, world, not args.cpu, 20 if not args.cpu else 2, size)
        except Exception as err:
            failures.append(f"DDP: {_one_line(err)}")
            sections.append(("DDP", f"failed: {_one_line(err)}"))
        else:
            for case in ("vanilla", "dbsa"):
                values = {rank: prints[rank][case] for rank in sorted(prints)}
                if len(set(values.values())) != 1:
                    failures.append(f"DDP {case}: the ranks' parameters differ: {values}")
            backend = "gloo" if args.cpu else "NCCL"
            sections.append((f"DDP over {world} processes ({backend})", common.markdown_table(
                ["case", "parameter sum per rank"],
                [[c, ", ".join(f"{prints[r][c]:.6f}" for r in sorted(prints))] for c in ("vanilla", "dbsa")])))
    elapsed = time.perf_counter() - started
    if not args.cpu and elapsed > BUDGET_S:
        failures.append(f"took {elapsed:.0f} s, over the {BUDGET_S} s budget")
    verdict = "\n".join(f"- FAILED: {f}" for f in failures) or f"all checks passed in {elapsed:.0f} s"
    sections.append(("Verdict", verdict))
    args.out.mkdir(parents=True, exist_ok=True)
    report = common.write_report("gpu_smoke", "GPU smoke test" + (" (CPU dry run)" if args.cpu else ""), sections,
                                 common.machine(), out_dir=args.out)
    print(f"report: {report}")
    for failure in failures:
        print(f"FAILED: {failure}", file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
