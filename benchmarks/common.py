"""What every benchmark shares: the machine's description, its matrix-multiply peak, peak
memory of a measured part, and the Markdown report.

Benchmarks are run by hand (``python benchmarks/bench_*.py``), so this file is imported as a
plain module from the script's own directory, not as part of the ``structnmt`` package.
Every figure a benchmark prints is a ratio of two things measured in the same run on the same
machine: absolute numbers from different days or machines are never compared.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import platform
import resource
import shlex
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]  # the repository
#: gitignored; the smoke tests point it elsewhere (BENCH_RESULTS) so that a test run writes nothing here
RESULTS = Path(os.environ.get("BENCH_RESULTS") or ROOT / "benchmarks" / "results")
ENVS = ROOT / "benchmarks" / "envs"  # gitignored: venvs and scratch runs


# ---------------------------------------------------------------------------
# the machine


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _memory_gib() -> float | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) / 2**20
    except OSError:
        pass
    return None


def machine() -> dict[str, Any]:
    """What the numbers depend on: CPU, usable cores, memory, torch and its threads, GPU."""
    import torch

    info: dict[str, Any] = {
        "cpu": _cpu_model(),
        "cores (usable)": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
        "memory (GiB)": round(_memory_gib() or 0.0, 1),
        "os": platform.platform(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "torch threads": torch.get_num_threads(),
        "load average (1 min) at start": round(os.getloadavg()[0], 2),
    }
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        info["gpu"] = f"{props.name}, {props.total_memory / 2**30:.0f} GiB, CUDA {torch.version.cuda}"
    else:
        info["gpu"] = "none"
    return info


# ---------------------------------------------------------------------------
# peak arithmetic


def _sync(device: Any) -> None:
    import torch

    if getattr(device, "type", device) == "cuda":
        torch.cuda.synchronize()


#: the size a GPU's matmul peak is measured at: at 1,024/2,048 an H200 gave 424 bf16 TFLOP/s against
#: 783 at 8,192, so shares of that smaller "peak" were ~1.8x too kind (docs/benchmarks.md, GPU report)
GPU_PEAK_SIZES = (8192,)
CPU_PEAK_SIZES = (1024, 2048)  # a CPU's products take seconds at 8,192


def peak_sizes(device: str) -> tuple[int, ...]:
    return GPU_PEAK_SIZES if str(device).startswith("cuda") else CPU_PEAK_SIZES


def measure_matmul_peak(device: str = "cpu", dtype: str = "float32", sizes: Sequence[int] = CPU_PEAK_SIZES,
                        repeats: int = 5, max_seconds: float = 20.0) -> float:
    """The best FLOP/s of large square matrix multiplies: the ceiling a model's FLOP/s is held to.

    Best of ``repeats`` at each size, not the mean: the ceiling is what the hardware *can* do,
    and interference from other processes only ever lowers a sample.
    """
    import torch

    dev = torch.device(device)
    dt = getattr(torch, dtype)
    best = 0.0
    started = time.perf_counter()
    for n in sizes:
        a = torch.randn(n, n, device=dev, dtype=dt)
        b = torch.randn(n, n, device=dev, dtype=dt)
        torch.matmul(a, b)  # warm-up: thread pool, kernels, caches
        _sync(dev)
        for _ in range(repeats):
            t0 = time.perf_counter()
            torch.matmul(a, b)
            _sync(dev)
            seconds = time.perf_counter() - t0
            best = max(best, 2.0 * n**3 / seconds)
            if time.perf_counter() - started > max_seconds:
                return best
    return best


# ---------------------------------------------------------------------------
# peak resident memory


def _vm_hwm(pid: int | str = "self") -> int | None:
    """Peak RSS of a live process's own memory map (Linux ``VmHWM``), in bytes; None elsewhere."""
    try:
        with open(f"/proc/{pid}/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def peak_rss_self() -> int:
    """This process's peak resident set size in bytes.

    ``VmHWM`` where Linux has it, not ``ru_maxrss``: a process started by fork/vfork + exec
    inherits in ``ru_maxrss`` the high-water mark of its parent's memory at the exec (seen
    here: a fresh child of a benchmark that had built 25 models reported 4.9 GB for 1.7 GB
    of its own).
    """
    hwm = _vm_hwm()
    if hwm is not None:
        return hwm
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(peak if sys.platform == "darwin" else peak * 1024)


def _child(fn: Callable[..., Any], args: tuple, queue: Any) -> None:
    try:
        result = fn(*args)
        queue.put(("ok", result, peak_rss_self()))
    except BaseException as err:  # report it in the parent instead of a silent dead child
        queue.put(("error", f"{type(err).__name__}: {err}", peak_rss_self()))


def run_with_peak_rss(fn: Callable[..., Any], *args: Any) -> tuple[Any, int]:
    """Run ``fn(*args)`` in a fresh process; (its result, that process's peak RSS in bytes).

    A fresh process per figure, so that each peak is that part's own and not the highest
    of everything run before it. ``fn`` must be a module-level function (spawn pickles it).
    """
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    proc = ctx.Process(target=_child, args=(fn, args, queue))
    proc.start()
    status, result, peak = queue.get()
    proc.join()
    if status != "ok":
        raise RuntimeError(f"measured part failed: {result}")
    return result, peak


#: ``time.monotonic()`` past which :func:`run_command` kills the command it runs (None: never);
#: set by a script with a time limit (``gpu_report.py``) so that no command outlives its budget
DEADLINE: float | None = None


@dataclass
class CommandResult:
    returncode: int
    seconds: float
    peak_rss: int  # bytes, of the command's own process
    output: str


def run_command(cmd: Sequence[str], cwd: Path | None = None, env: dict[str, str] | None = None,
                log: Path | None = None) -> CommandResult:
    """Run a command, returning its wall time and its own peak RSS.

    On Linux the peak is the command's ``VmHWM``, sampled every 50 ms while it runs (the
    ``ru_maxrss`` of ``wait4`` would include this process's own high-water mark, see
    :func:`peak_rss_self`); elsewhere, or for a command over before the first sample,
    ``ru_maxrss``. ``VmHWM`` is the command's own process: children it starts are not
    counted (the commands benchmarked here start none), and growth in its last 50 ms is missed.
    A command still running at :data:`DEADLINE` is killed (its return code is then -9).
    """
    started = time.perf_counter()
    with open(log, "w") if log else open(os.devnull, "w") as sink:
        proc = subprocess.Popen(list(cmd), cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True)
        samples: list[int] = []
        done = threading.Event()

        def sample() -> None:
            while not done.wait(0.05):
                hwm = _vm_hwm(proc.pid)
                if hwm is not None:
                    samples.append(hwm)

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        killer = None
        if DEADLINE is not None:
            killer = threading.Timer(max(0.0, DEADLINE - time.monotonic()), proc.kill)
            killer.daemon = True
            killer.start()
        lines = []
        assert proc.stdout is not None
        try:
            for line in proc.stdout:
                lines.append(line)
                sink.write(line)
        except BaseException:  # stopped (Ctrl-C, SIGTERM as SystemExit): the command stops with us
            proc.kill()
            proc.wait()
            done.set()
            raise
        done.set()
        sampler.join()
        if killer is not None:  # before the reaping: a timer firing after it could hit a reused pid
            killer.cancel()
        _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)  # we reaped it ourselves
    seconds = time.perf_counter() - started
    peak = max(samples) if samples else (usage.ru_maxrss if sys.platform == "darwin" else usage.ru_maxrss * 1024)
    return CommandResult(proc.returncode, seconds, int(peak), "".join(lines))


def mib(n_bytes: float) -> str:
    return f"{n_bytes / 2**20:,.0f} MiB"


# ---------------------------------------------------------------------------
# the report


def command_line() -> str:
    return " ".join(shlex.quote(a) for a in [Path(sys.executable).name, *sys.argv])


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    def cell(value: Any) -> str:
        return f"{value:,.3g}" if isinstance(value, float) else str(value)

    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)


def write_report(name: str, title: str, sections: Sequence[tuple[str, str]], machine_info: dict[str, Any],
                 out_dir: Path = RESULTS) -> Path:
    """``benchmarks/results/<name>.md``: the results with the machine, command and date they belong to."""
    from structnmt.io import atomic_write_text

    parts = [f"# {title}", "",
             f"Date: {time.strftime('%Y-%m-%d %H:%M:%S %Z')}  ",
             f"Command: `{command_line()}` (in `{ROOT}`)", "", "## Machine", ""]
    parts += [f"- {key}: {value}" for key, value in machine_info.items()]
    for heading, body in sections:
        parts += ["", f"## {heading}", "", body.rstrip()]
    path = out_dir / f"{name}.md"
    atomic_write_text(path, "\n".join(parts) + "\n")
    return path


def raise_recompile_limits(limit: int = 256, accumulated: int = 1024) -> None:
    """Let dynamo compile one function for many models (every model of a benchmark goes through
    ``Updater._forward_loss``): torch 2.6 and later call the settings ``recompile_limit`` and
    ``accumulated_recompile_limit``, earlier ones ``cache_size_limit`` and
    ``accumulated_cache_size_limit`` (setting a name a torch lacks raises)."""
    import torch._dynamo

    config = torch._dynamo.config
    new = hasattr(config, "recompile_limit")
    setattr(config, "recompile_limit" if new else "cache_size_limit", limit)
    setattr(config, "accumulated_recompile_limit" if new else "accumulated_cache_size_limit", accumulated)


def set_threads(threads: int) -> None:
    """Pin torch's intra-op threads (0: leave torch's default, one per core)."""
    import torch

    if threads > 0:
        torch.set_num_threads(threads)


# ---------------------------------------------------------------------------
# smoke runs: every benchmark's --smoke, run by tests/test_benchmarks.py so that none can rot


SMOKE_HELP = "a few steps on the built-in synthetic task (no data file): checks the script end to end"


def smoke_task(work: Path, base_config: str = "configs/multi30k_en_de_transformer.yaml") -> tuple[Path, Path]:
    """(config, dataset) of a tiny stand-in for Multi30k that needs no data file: the built-in
    synthetic task (gold trees on both sides, source scenes) with the base recipe's model and
    training sections, so a benchmark's own code path runs end to end in seconds."""
    import yaml

    from structnmt.config import config_from_dict
    from structnmt.data.prepare import prepare
    from structnmt.data.synthetic import demo_config, write_task

    work = Path(work)
    config_file = work / "smoke.yaml"
    dataset = work / "dataset"
    if config_file.is_file() and (dataset / "meta.json").is_file():
        return config_file, dataset
    write_task(work / "data", sizes={"train": 300, "val": 20, "test": 20}, seed=2)
    raw = demo_config(work, 0.0)
    base = yaml.safe_load((ROOT / base_config).read_text(encoding="utf-8"))
    raw["model"] = {**base["model"], "d_model": 64, "d_ff": 128, "n_heads": 4}
    raw["training"] = {**base["training"], "out_dir": str(work / "run"), "max_tokens": 512, "warmup": 10}
    raw["decoding"] = base["decoding"]
    raw["data"]["subwords"]["vocab_size"] = 300
    prepare(config_from_dict(raw), force=True, verbose=False)
    config_file.write_text(yaml.safe_dump(raw, sort_keys=False), encoding="utf-8")
    return config_file, dataset
