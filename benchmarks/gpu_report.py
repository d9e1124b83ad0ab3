"""The GPU figures in one command, for a short loan of a GPU with no network.

    python benchmarks/gpu_report.py                                        # on a CUDA machine: < 8 minutes
    python benchmarks/gpu_report.py --sections training --precisions fp32  # rerun a part
    python benchmarks/gpu_report.py --cpu                                  # dry run: every section, tiny sizes

One report, ``benchmarks/results/gpu_report.md`` and ``.json`` (paths printed at the end), rewritten
after every figure so that a run cut short keeps what it finished. Each section has a share of
``--time-limit`` (450 s; what a section leaves unused passes to the next ones), checks it before each
measurement and reports what it had no time for as "not measured: why", never an estimate; the
report's last table gives each section's budget and the seconds it used. Commands it starts are
killed at their section's end, and the whole run stops at the limit + 20 s, writing the report first.
The sections are reported in the order below and run in the order 1, 2, 4, 5, 6, 3: the training
shapes, whose compilations are the longest and least predictable part, take what the others leave.

1. Machine: GPU, driver, torch, CUDA, cuDNN, Triton, commit.
2. Matmul peak: the best square products at 8,192 in bf16, fp32 (TF32 off: torch's default and the
   toolkit's fp32) and TF32; and bf16 at 1,024/2,048, the sizes ``bench_train.py`` once used on GPUs
   too (H200: 424 against 783 TFLOP/s). Every share of the peak below is against the 8,192 figure.
3. Training throughput of the small recipe's shape (``configs/multi30k_en_de_transformer.yaml``) and
   the Transformer-big shape (6+6 layers, d 1,024, 16 heads, ff 4,096, 16,384 target tokens an update),
   each in bf16 and fp32, under eager (``training.compile: off``), compiled (``on``) and CUDA graphs
   (``training.compile: on`` and ``training.cuda_graphs: on``, "not available at this commit" where
   the config has no such key): the toolkit's ``Updater`` on one fixed batch, blocks of updates
   interleaved across the modes, ``--rounds`` rounds, the median; matmul FLOP/s counted analytically
   (``bench_train.batch_matmul_flops``) and its share of the peak.
4. Every registered method's training overhead against vanilla on the small shape, eager, precision
   auto, on the built-in synthetic task (gold trees on both sides, so every method has its fields):
   blocks interleaved vanilla/method, ``--rounds`` (>= 3) rounds; the median and the spread.
   ``--methods-mode graphs`` takes the GPU's default route instead (compiled, CUDA graphs), each
   model on one fixed batch: a compile per method, so a call of its own (``--sections methods``).
5. ``structnmt train`` (eager, precision auto) for ``--train-steps`` updates, then beam-5 decoding of
   the test split with that model: sentences/s, model loading excluded, after a warm-up; then the same
   training with every speed setting at its default (two data workers on a GPU host), and without
   data workers (issue 41, goal 2).
6. Joey NMT 2.3.0 on the same data, vocabulary, shape and device in the same run (``bench_joey.py``'s
   inputs), training and beam-5 decoding beside section 5's figures, when an interpreter imports
   joeynmt (this one, ``benchmarks/envs/joey``, or ``--joey-python``); nothing is installed (no
   network): otherwise the report says "not installed" and how to bring it over as wheels.

Sections 5 and 6 train on the prepared Multi30k data when it is here (``--dataset``, else
``data/multi30k_en_de_plain`` or ``data/multi30k_en_de``) and otherwise on the synthetic task, and
say which. Without CUDA (and without ``--cpu``) the script says so and exits 0. ``--cpu`` runs every
section's code on the CPU with tiny sizes, torch.compile taking dynamo's ``eager`` backend (the
toolkit's own compile route, no code generated): it is what ``tests/test_gpu_report.py`` runs, and
its figures mean nothing.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import gc
import json
import math
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import bench_joey  # noqa: E402  (scripts beside this one, not a package)
import bench_train  # noqa: E402
import common  # noqa: E402
from gpu_smoke import _one_line as one_line  # noqa: E402

NAME = "gpu_report"
TIME_LIMIT_S = 450  # the 8 minutes, less margin: a rerun still fits a 15-minute loan
GRACE_S = 20  # past the limit, the run stops wherever it is (after writing the report)

#: section key -> heading in the report (the machine is the report's own "Machine" part)
HEADINGS = {
    "peak": "Matmul peak at 8,192³",
    "training": "Training throughput: eager, torch.compile, CUDA graphs",
    "methods": "Every registered method's training overhead against vanilla",
    "decoding": "structnmt: training command and beam-5 decoding",
    "joey": "Joey NMT 2.3.0 on the same device",
}
#: the order the sections run in: training, whose compilations take the longest and are the least
#: predictable, last, so that it gets all the time the others leave and cannot starve them
RUN_ORDER = ["peak", "methods", "decoding", "joey", "training"]
#: each section's share of the time limit (what one leaves unused passes to the next)
BUDGET = {"peak": 0.03, "methods": 0.15, "decoding": 0.24, "joey": 0.18, "training": 0.40}
JOEY_ABSENT = "not measured: Joey NMT is not installed"
JOEY_INSTALL = (
    "To bring it to a machine without network: on a machine with network, `bash benchmarks/gpu_wheels.sh` "
    "fetches Joey NMT 2.3.0 with importlib_metadata<10 (10.x needs lazy_importer, hence the pin) and structnmt's "
    "other missing needs as pure-Python wheels for Python 3.12 into `.whl/`; carry `.whl` over and start the "
    "command there with `source benchmarks/gpu_env.sh`, which runs `python3 -m pip install --no-index --no-deps "
    "--target /tmp/site .whl/*.whl` and puts them on PYTHONPATH (or name an interpreter that has Joey NMT "
    "with `--joey-python`).")
#: the words of a variant this commit's toolkit has no setting for (training.cuda_graphs)
NOT_AVAILABLE = "not available at this commit"


@dataclasses.dataclass(frozen=True)
class Shape:
    name: str
    enc: int
    dec: int
    d: int
    heads: int
    ff: int
    vocab: int
    length: int  # source and target length of every sentence of the fixed batch
    tokens: int  # target tokens per update
    dropout: float

    @property
    def batch(self) -> int:
        return self.tokens // self.length

    def model_config(self) -> Any:
        """The small recipe's model section (norm, tied embeddings, positions) at this shape."""
        return dataclasses.replace(recipe().model, enc_layers=self.enc, dec_layers=self.dec, d_model=self.d,
                                   n_heads=self.heads, d_ff=self.ff, dropout=self.dropout, methods=[])

    def describe(self) -> str:
        return (f"{self.name}: {self.enc}+{self.dec} layers, d_model {self.d:,}, {self.heads} heads, ff {self.ff:,}, "
                f"{self.vocab:,} joint sub-words, {self.batch} sentences x {self.length} sub-words = "
                f"{self.tokens:,} target tokens an update")


@functools.cache
def recipe() -> Any:
    """``configs/multi30k_en_de_transformer.yaml``, the small vanilla recipe."""
    from structnmt import load_config

    return load_config(bench_train.BASE_CONFIG)


def shapes(dry: bool) -> dict[str, Shape]:
    if dry:
        return {"small": Shape("small recipe (dry run: tiny)", 1, 1, 32, 4, 64, 300, 8, 64, 0.2),
                "big": Shape("Transformer-big (dry run: tiny)", 1, 1, 64, 4, 128, 500, 16, 128, 0.3)}
    m, cfg = recipe().model, recipe()
    return {"small": Shape("small recipe", m.enc_layers, m.dec_layers, m.d_model, m.n_heads, m.d_ff,
                           cfg.data.subwords.vocab_size, 32, cfg.training.max_tokens, m.dropout),
            "big": Shape("Transformer-big", 6, 6, 1024, 16, 4096, 32000, 64, 16384, 0.3)}


MODES = ("eager", "compiled", "graphs")
MODE_LABEL = {"eager": "eager", "compiled": "torch.compile (training.compile: on)",
              "graphs": "CUDA graphs (training.cuda_graphs: on)"}


class TimeUp(BaseException):
    """The run's hard time limit: raised by SIGALRM wherever the run is."""


def _time_up(signum: int, frame: Any) -> None:
    raise TimeUp()


class NotMeasured(Exception):
    """A figure that cannot be measured here, and why."""


# ---------------------------------------------------------------------------
# the report


@dataclasses.dataclass
class Section:
    key: str
    heading: str
    status: str = "not reached: the run stopped before this section"
    text: list[str] = dataclasses.field(default_factory=list)
    header: list[str] = dataclasses.field(default_factory=list)
    rows: list[list[Any]] = dataclasses.field(default_factory=list)
    notes: list[str] = dataclasses.field(default_factory=list)
    data: dict[str, Any] = dataclasses.field(default_factory=dict)
    budget_s: float | None = None  # its share of the time limit
    until_s: float | None = None  # the latest it could run to, in seconds after the start
    seconds: float | None = None  # what it used

    def body(self) -> str:
        parts = [] if self.status == "done" else [f"**{self.status}**"]
        parts += self.text
        if self.header and self.rows:
            parts.append(common.markdown_table(self.header, self.rows))
        parts += self.notes
        return "\n\n".join(parts)

    def as_json(self) -> dict[str, Any]:
        return {"heading": self.heading, "status": self.status, "text": self.text,
                "table": [dict(zip(self.header, row)) for row in self.rows], "notes": self.notes, "data": self.data,
                "budget_s": self.budget_s, "until_s": self.until_s, "seconds": self.seconds}


class Report:
    """The Markdown report and its JSON twin, both rewritten whole (atomically) on every ``save``."""

    def __init__(self, out: Path, dry: bool, machine: dict[str, Any], keys: list[str], time_limit: float) -> None:
        self.out, self.dry, self.machine, self.time_limit = out, dry, machine, time_limit
        self.sections = {key: Section(key, HEADINGS[key]) for key in HEADINGS}
        for key in HEADINGS:
            if key not in keys:
                self.sections[key].status = "not run: left out by --sections"
        self.started = time.strftime("%Y-%m-%d %H:%M:%S %Z")
        self.began = time.monotonic()

    def timing(self) -> str:
        rows = [[s.heading, f"{s.budget_s:.0f}", f"{s.until_s:.0f}",
                 "-" if s.seconds is None else f"{s.seconds:.1f}"]
                for s in self.sections.values() if s.budget_s is not None]
        return (f"Time limit {self.time_limit:.0f} s (+{GRACE_S} s grace), {time.monotonic() - self.began:.0f} s "
                "so far; each section has its share, and may also run on into what the sections before it left.\n\n"
                + common.markdown_table(["section (in the order run)", "budget (s)", "latest end (s after start)",
                                         "used (s)"], sorted(rows, key=lambda r: float(r[2]))))

    def save(self) -> tuple[Path, Path]:
        from structnmt.io import atomic_write_text

        title = "GPU report" + (" (CPU dry run: tiny sizes; the figures mean nothing)" if self.dry else "")
        self.out.mkdir(parents=True, exist_ok=True)
        parts = [(s.heading, s.body()) for s in self.sections.values()] + [("Time per section", self.timing())]
        path = common.write_report(NAME, title, parts, self.machine, out_dir=self.out)
        data = {"title": title, "started": self.started, "command": common.command_line(), "dry_run": self.dry,
                "time_limit_s": self.time_limit, "elapsed_s": time.monotonic() - self.began,
                "machine": self.machine, "sections": {k: s.as_json() for k, s in self.sections.items()}}
        atomic_write_text(self.out / f"{NAME}.json", json.dumps(data, indent=1, default=str) + "\n")
        return path, self.out / f"{NAME}.json"


@dataclasses.dataclass
class Run:
    """What the sections share: the device, the options, the figures later sections use."""

    args: Any
    device: Any
    dry: bool
    work: Path
    report: Report
    peaks: dict[str, float] = dataclasses.field(default_factory=dict)
    synthetic: Path | None = None
    structnmt: dict[str, Any] = dataclasses.field(default_factory=dict)  # section 5's figures, for section 6
    data_choice: tuple | None = None

    @property
    def block_s(self) -> float:
        """The length of a timed block: about a second of updates (the dry run: a few updates)."""
        return 0.02 if self.dry else 1.0

    def sync(self) -> None:
        if self.device.type == "cuda":
            import torch

            torch.cuda.synchronize()


def fmt_rate(value: float) -> str:
    return f"{value:,.0f}" if value >= 100 else f"{value:,.3g}"


def fmt_flops(value: float) -> str:
    return f"{value / 1e12:,.1f} TFLOP/s" if value >= 1e12 else f"{value / 1e9:,.2f} GFLOP/s"


def remember_error(sec: Section, what: str, err: BaseException) -> None:
    """The end of an error's whole text, in the JSON report (the Markdown gives its first line)."""
    sec.data.setdefault("errors", []).append(f"{what}: {type(err).__name__}: {str(err)[-2000:]}")


# ---------------------------------------------------------------------------
# 1. machine


def _quiet(cmd: list[str], timeout: float = 15) -> str | None:
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=common.ROOT)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def driver_of(smi: str | None, proc_version: str | None) -> str:
    """The driver line from ``nvidia-smi --query-gpu=driver_version,clocks.max.sm,power.limit``'s
    output, else from ``/proc/driver/nvidia/version``'s first line."""
    if smi:
        driver, clock, power = (part.strip() for part in (smi.splitlines()[0].split(",") + ["?", "?"])[:3])
        return f"{driver} (nvidia-smi); max SM clock {clock}, power limit {power}"
    if proc_version:
        return f"{proc_version.splitlines()[0].strip()} (no nvidia-smi)"
    return "unknown (no nvidia-smi, no /proc/driver/nvidia/version)"


def machine_info(dry: bool) -> dict[str, Any]:
    import torch

    info = common.machine()
    info["driver"] = "none (no CUDA device)"
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        info["gpu"] = (f"{props.name}, {props.total_memory / 2**30:.0f} GiB, compute capability "
                       f"{props.major}.{props.minor}, {props.multi_processor_count} SMs; "
                       f"{torch.cuda.device_count()} visible")
        smi = _quiet(["nvidia-smi", "--query-gpu=driver_version,clocks.max.sm,power.limit",
                      "--format=csv,noheader"]) if shutil.which("nvidia-smi") else None
        try:
            proc = Path("/proc/driver/nvidia/version").read_text()
        except OSError:
            proc = None
        info["driver"] = driver_of(smi, proc)
        get_driver = getattr(torch._C, "_cuda_getDriverVersion", None)
        if get_driver:
            version = get_driver()
            info["CUDA driver API"] = f"{version // 1000}.{version % 1000 // 10}"
    info["CUDA (torch built with)"] = torch.version.cuda or "none (CPU build)"
    info["cuDNN"] = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else "none"
    try:
        import triton

        info["triton"] = triton.__version__
    except ImportError:
        info["triton"] = "not installed (no torch.compile on CUDA)"
    commit = _quiet(["git", "rev-parse", "--short", "HEAD"])
    if commit:
        dirty = _quiet(["git", "status", "--porcelain", "--untracked-files=no"])
        commit += " with uncommitted changes" if dirty else ""
    named = os.environ.get("STRUCTNMT_COMMIT", "").strip()[:7]
    # a borrowed GPU's copy of the tree may carry the last commit that landed as its git HEAD and
    # the local commits as uncommitted changes: the commit the caller names comes first
    if named:
        info["commit"] = f"{named} (as STRUCTNMT_COMMIT names it; git here: {commit or 'none'})"
    else:
        info["commit"] = commit or "unknown (no git repository here; STRUCTNMT_COMMIT unset)"
    info["training.cuda_graphs"] = "a config key here" if cuda_graphs_known() else NOT_AVAILABLE
    if dry:
        info["mode"] = "CPU dry run (--cpu): tiny sizes; every figure is meaningless"
    return info


# ---------------------------------------------------------------------------
# 2. the matmul peak


PEAKS = [  # key, label, dtype, TF32, sizes
    ("bf16", "bf16", "bfloat16", None, common.GPU_PEAK_SIZES),
    ("fp32", "fp32, TF32 off (torch's default: the toolkit's fp32)", "float32", False, common.GPU_PEAK_SIZES),
    ("tf32", "fp32, TF32 on", "float32", True, common.GPU_PEAK_SIZES),
    ("bf16_small", "bf16 at 1,024 and 2,048 (bench_train.py's sizes on GPUs before issue 41)", "bfloat16", None,
     (1024, 2048)),
]


def dry_sizes(sizes: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(n // 32 for n in sizes)


def measure_peak(run: Run, key: str) -> float:
    import torch

    _, _, dtype, tf32, sizes = next(p for p in PEAKS if p[0] == key)
    sizes = dry_sizes(sizes) if run.dry else sizes
    before = torch.backends.cuda.matmul.allow_tf32
    if tf32 is not None:
        torch.backends.cuda.matmul.allow_tf32 = tf32
    try:
        peak = common.measure_matmul_peak(run.device.type, dtype, sizes, repeats=10, max_seconds=2 if run.dry else 8)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = before
    run.peaks[key] = peak
    return peak


def section_peak(run: Run, sec: Section, deadline: float) -> None:
    sec.text.append("Best of 10 square matrix products at each size (one warm-up first), timed with a device "
                    "synchronisation: the ceiling every share below is held to."
                    + (" Dry run: sizes / 32." if run.dry else ""))
    sec.header = ["precision", "size", "peak", "share of the bf16 8,192 peak"]
    for key, label, _, _, sizes in PEAKS:
        if time.monotonic() > deadline:
            sec.rows.append([label, "", "not measured: the section's time ran out", ""])
            continue
        peak = measure_peak(run, key)
        shown = dry_sizes(sizes) if run.dry else sizes
        bf16 = run.peaks.get("bf16")
        sec.rows.append([label, " and ".join(f"{n:,}³" for n in shown), fmt_flops(peak),
                         f"{peak / bf16:.0%}" if bf16 else ""])
        sec.data[key] = peak
        run.report.save()
    if "bf16" in run.peaks and "bf16_small" in run.peaks:
        ratio = run.peaks["bf16"] / run.peaks["bf16_small"]
        sec.notes.append(f"A share of the peak taken against the 1,024/2,048 peak is {ratio:.2f}x the share "
                         "against the 8,192 peak (`bench_train.py` now measures its GPU peak at 8,192).")


# ---------------------------------------------------------------------------
# 3. training throughput, fixed shapes


def fixed_batch(shape: Shape, device: Any, seed: int = 1) -> Any:
    """B x L random sub-words on each side, no padding: every update the same shape and work."""
    import torch

    from structnmt.data.batch import BOS_ID, EOS_ID, Batch

    g = torch.Generator().manual_seed(seed)
    B, L, V = shape.batch, shape.length, shape.vocab
    src = torch.randint(4, V, (B, L), generator=g)
    src[:, -1] = EOS_ID
    tgt = torch.randint(4, V, (B, L), generator=g)
    tgt_out = tgt.clone()
    tgt_out[:, -1] = EOS_ID
    tgt_in = torch.cat([torch.full((B, 1), BOS_ID), tgt[:, :-1]], dim=1)
    return Batch(src, tgt_in, tgt_out).to(device)


def cuda_graphs_known() -> bool:
    """Whether this commit's config has ``training.cuda_graphs``."""
    from structnmt.config import TrainingConfig

    return "cuda_graphs" in {f.name for f in dataclasses.fields(TrainingConfig)}


def training_config(precision: str, compile: str = "off", cuda_graphs: str = "off", **sets: Any) -> Any:
    """The small recipe's training section (Adam, schedule, clipping, label smoothing) with these
    settings, read by ``load_config`` as a user's ``--set`` would be. ``training.cuda_graphs`` goes in
    where the config knows it or where it is asked for; a config that does not know it raises
    :class:`NotMeasured` saying so, not a ``ConfigError``."""
    from structnmt import ConfigError, load_config

    overrides = {"training.precision": precision, "training.compile": compile,
                 **{f"training.{k}": v for k, v in sets.items()}}
    if cuda_graphs != "off" or cuda_graphs_known():
        overrides["training.cuda_graphs"] = cuda_graphs
    try:
        return load_config(bench_train.BASE_CONFIG, overrides).training
    except ConfigError as err:
        if "training.cuda_graphs" in str(err) and "unknown field" in str(err):
            raise NotMeasured(f"{NOT_AVAILABLE} (training.cuda_graphs is not a key of its config)") from None
        raise


def make_updater(run: Run, model: Any, precision: str, mode: str) -> Any:
    """The toolkit's ``Updater`` for one mode, configured as a user would; raises ``NotMeasured``
    where the mode cannot run here."""
    from structnmt.training.updater import Updater

    cfg = training_config(precision, "off" if mode == "eager" else "on", "on" if mode == "graphs" else "off")
    updater = Updater(model, cfg, run.device)
    if mode != "eager" and not updater.compiled:
        raise NotMeasured(updater.compile_reason)
    return updater


def timed_updates(run: Run, updater: Any, batch: Any, n: int, graphs: bool) -> float:
    import torch

    run.sync()
    started = time.perf_counter()
    for _ in range(n):
        if graphs:
            torch.compiler.cudagraph_mark_step_begin()  # a new iteration: earlier outputs may be overwritten
        updater.update([batch])
    run.sync()
    return time.perf_counter() - started


def host_syncs(run: Run, updater: Any, batches: list[Any], ours: Path | None = None) -> dict[str, Any] | None:
    """The synchronising CUDA calls of one update (``torch.cuda.set_sync_debug_mode``): a step that
    reads the device (``.item()``, a ``nonzero``, a copy to the host) waits for the GPU and leaves
    it idle while Python catches up. None off CUDA, where nothing is asynchronous.

    Each is named by the innermost line of ours (``structnmt/``) on the stack when it warned, so
    that a sync inside a torch function points at the structnmt line that called it; the warning's
    own place where no line of ours is on the stack."""
    import traceback
    import warnings

    import torch

    if run.device.type != "cuda":
        return None
    import structnmt

    root = os.path.realpath(ours or Path(structnmt.__file__).parent) + os.sep
    found: list[str] = []

    def note(message: Any, _category: Any, filename: str, lineno: int, *_rest: Any) -> None:
        if "synchroniz" not in str(message):
            return
        mine = [f for f in traceback.extract_stack()[:-1] if os.path.realpath(f.filename).startswith(root)]
        found.append(f"{Path(mine[-1].filename).name}:{mine[-1].lineno}" if mine else f"{Path(filename).name}:{lineno}")

    before = torch.cuda.get_sync_debug_mode()
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.showwarning = note
        torch.cuda.set_sync_debug_mode("warn")
        try:
            updater.update(batches)
        finally:
            torch.cuda.set_sync_debug_mode(before)
    return {"count": len(found), "where": sorted(set(found))[:8]}


def syncs_cell(found: dict[str, Any] | None) -> str:
    if found is None:
        return "-"
    return str(found["count"]) + (f" ({', '.join(found['where'])})" if found["where"] else "")


def accumulate_check(run: Run, shape: Shape, updater: Any, batch: Any) -> dict[str, Any]:
    """CUDA graphs with ``training.accumulate`` 2: three updates of two micro-batches each through
    the graphs' updater (every micro-batch replays the same graphs): finite losses, no new graph,
    no graph skipped by inductor, and the host syncs of one such update."""
    from torch._dynamo.utils import counters

    from structnmt.training.compiled import graphs_compiled

    other = fixed_batch(shape, run.device, seed=2)
    before, skips = graphs_compiled(), counters["inductor"]["cudagraph_skips"]
    losses = [float(updater.update([batch, other]).loss) for _ in range(3)]
    found = host_syncs(run, updater, [batch, other])
    run.sync()
    return {"losses": losses, "finite": all(math.isfinite(v) for v in losses),
            "new_graphs": graphs_compiled() - before, "skips": counters["inductor"]["cudagraph_skips"] - skips,
            "host_syncs": found}


def warm_up(run: Run, shape: Shape, precision: str, mode: str, batch: Any) -> tuple[Any, float]:
    """(updater, seconds of its first three updates, compilation included); ``NotMeasured`` where the
    mode did not run as asked. Each mode trains its own model from the same initialisation (so that
    no mode's compiled graph is reused by another)."""
    import torch

    from structnmt.model.transformer import Transformer

    torch.manual_seed(1)
    updater = make_updater(run, Transformer(shape.model_config(), shape.vocab, shape.vocab), precision, mode)
    warm = timed_updates(run, updater, batch, 3, mode == "graphs")
    if mode != "eager" and not updater.compiled:
        raise NotMeasured("compiling failed, the update fell back to eager: " + "; ".join(updater.notes))
    if mode == "graphs" and not run.dry and getattr(updater, "cuda_graphs", None) is False:
        raise NotMeasured("the update ran without CUDA graphs: " + str(getattr(updater, "cuda_graphs_reason", "")))
    return updater, warm


def training_cell(run: Run, sec: Section, shape_key: str, precision: str, deadline: float,
                  compile_estimate: dict[str, float]) -> None:
    """One shape in one precision under every mode: warm-ups (compilations), then interleaved blocks."""
    import torch
    from torch._dynamo.utils import counters

    from structnmt.training.compiled import graphs_compiled

    shape = shapes(run.dry)[shape_key]
    peak_key = "bf16" if precision == "bf16" else ("tf32" if run.args.tf32 else "fp32")
    peak = run.peaks.get(peak_key) or measure_peak(run, peak_key)
    flops = bench_train.batch_matmul_flops(shape.model_config(), shape.vocab, shape.batch, shape.length,
                                           shape.length)
    batch = fixed_batch(shape, run.device)
    done: dict[str, dict[str, Any]] = {}
    missing: dict[str, str] = {}
    per_update = steps = 1
    for mode in MODES:
        estimate = compile_estimate.get(shape_key, 60.0 if shape_key == "big" else 40.0) if not run.dry else 0.0
        if mode != "eager" and time.monotonic() + estimate > deadline:
            missing[mode] = f"not measured: the section's time budget ran out (a compile takes ~{estimate:.0f} s)"
            continue
        skips, graphs_before = counters["inductor"]["cudagraph_skips"], graphs_compiled()
        if run.device.type == "cuda":
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
        resident = torch.cuda.memory_allocated() if run.device.type == "cuda" else 0  # the other modes' models
        try:
            updater, warm = warm_up(run, shape, precision, mode, batch)
            if mode == "eager":  # the block length: about run.block_s of eager updates
                per_update = timed_updates(run, updater, batch, 1, False)
                steps = max(3, min(40, math.ceil(run.block_s / max(per_update, 1e-6))))
        except NotMeasured as err:
            missing[mode] = str(err) if str(err).startswith(NOT_AVAILABLE) else f"not measured: {err}"
            continue
        except Exception as err:  # one mode's failure (compiler, memory) must not hide the others
            missing[mode] = f"not measured: {one_line(err)}"
            remember_error(sec, f"{shape_key} {precision} {mode}", err)
            print(f"{shape_key} {precision} {mode}: {one_line(err)}", flush=True)
            gc.collect()
            continue
        if mode != "eager":
            compile_estimate[shape_key] = max(compile_estimate.get(shape_key, 0.0), warm)
        done[mode] = {"updater": updater, "warm_s": warm, "rates": [],
                      "graphs": graphs_compiled() - graphs_before,
                      "skips": counters["inductor"]["cudagraph_skips"] - skips,
                      "memory": torch.cuda.max_memory_allocated() - resident if run.device.type == "cuda" else None}
        print(f"{shape_key} {precision} {mode}: warm-up {warm:.1f} s", flush=True)
    for r in range(run.args.rounds):
        if r and time.monotonic() + 1.5 * len(done) * steps * per_update > deadline:  # eager is the slowest
            sec.notes.append(f"{shape.name}, {precision}: {r} round(s) of {run.args.rounds}: the budget ran out.")
            break
        order = list(done)[r % max(len(done), 1):] + list(done)[: r % max(len(done), 1)]
        for mode in order:
            seconds = timed_updates(run, done[mode]["updater"], batch, steps, mode == "graphs")
            done[mode]["rates"].append(steps * shape.tokens / seconds)
    for mode, entry in done.items():  # after the timing: the sync check's own overhead is not timed
        try:
            entry["syncs"] = host_syncs(run, entry["updater"], [batch])
        except Exception as err:
            entry["syncs"] = None
            remember_error(sec, f"{shape_key} {precision} {mode} host syncs", err)
    if "graphs" in done and shape_key == "small":
        try:
            check = accumulate_check(run, shape, done["graphs"]["updater"], batch)
        except Exception as err:
            check = {"error": one_line(err)}
            remember_error(sec, f"{shape_key} {precision} CUDA graphs with accumulate 2", err)
        sec.data.setdefault("accumulate", []).append({"precision": precision, **check})
        sec.notes.append(f"{shape.name}, {precision}, CUDA graphs with `training.accumulate` 2 (3 updates of two "
                         "micro-batches): " + (f"failed: {check['error']}" if "error" in check else
                         f"losses {', '.join(f'{v:.4f}' for v in check['losses'])}"
                         f"{'' if check['finite'] else ' (**not finite**)'}, {check['new_graphs']} new graph(s), "
                         f"{check['skips']} skipped by inductor, host syncs in one update: "
                         f"{syncs_cell(check['host_syncs'])}."))
    if "graphs" in done and shape_key == "big":
        cached_compile(run, sec, shape, precision, batch, deadline, done["graphs"]["warm_s"])
    eager_rate = statistics.median(done["eager"]["rates"]) if done.get("eager", {}).get("rates") else None
    for mode in MODES:
        name = MODE_LABEL[mode] + (" (dry run: dynamo's eager backend)" if run.dry and mode != "eager" else "")
        cell = {"shape": shape_key, "precision": precision, "mode": mode}
        if mode in missing or not done.get(mode, {}).get("rates"):
            why = missing.get(mode, "not measured: no timed block")
            sec.rows.append([shape.name, precision, name, why, "", "", "", "", "", "", ""])
            sec.data.setdefault("cells", []).append({**cell, "not_measured": why})
            continue
        entry = done[mode]
        rate = statistics.median(entry["rates"])
        achieved = flops * rate / shape.tokens
        note = f"{entry['warm_s']:.1f} s" + (f", {entry['graphs']} graph(s)" if mode != "eager" else "")
        if entry["skips"]:
            name += " **(graphs skipped by inductor: compiled only; TORCH_LOGS=cudagraphs says why)**"
        sec.rows.append([shape.name, precision, name, fmt_rate(rate), f"{1000 * shape.tokens / rate:.1f}",
                         fmt_flops(achieved), f"{achieved / peak:.1%}",
                         f"{rate / eager_rate:.2f}x" if eager_rate else "", note,
                         common.mib(entry["memory"]) if entry["memory"] is not None else "-",
                         syncs_cell(entry.get("syncs"))])
        sec.data.setdefault("cells", []).append({
            **cell, "tokens_per_s": rate, "rates": entry["rates"], "steps_per_block": steps,
            "matmul_flops_per_update": flops, "achieved_flops": achieved, "peak": peak, "peak_kind": peak_key,
            "share_of_peak": achieved / peak, "warm_up_s": entry["warm_s"], "graphs": entry["graphs"],
            "cudagraph_skips": entry["skips"], "peak_memory": entry["memory"], "host_syncs": entry.get("syncs")})
    del done, batch
    torch._dynamo.reset()  # frees the compiled graphs (and CUDA graph pools) before the next shape
    gc.collect()
    if run.device.type == "cuda":
        torch.cuda.empty_cache()


def cached_compile(run: Run, sec: Section, shape: Shape, precision: str, batch: Any, deadline: float,
                   cold_s: float) -> None:
    """The CUDA-graphs warm-up again with inductor's caches warm (``torch._dynamo.reset()``, a new
    model, the same process): what a study's later runs pay, as they share one compile cache
    (``TORCHINDUCTOR_CACHE_DIR``, :func:`structnmt.study.runs.share_compile_cache`). Issue 41 asks for
    a warm-up of at most 30 s or one paid once per study. In one process some kernels stay loaded,
    so this is a lower bound on a new process's warm-up."""
    import torch

    if time.monotonic() + cold_s > deadline:
        sec.notes.append(f"{shape.name}, {precision}, CUDA graphs with the compile cache warm: not measured: "
                         "the section's time budget ran out.")
        return
    torch._dynamo.reset()
    try:
        updater, warm = warm_up(run, shape, precision, "graphs", batch)
    except Exception as err:
        remember_error(sec, f"{shape.name} {precision} cached compile", err)
        sec.notes.append(f"{shape.name}, {precision}, CUDA graphs with the compile cache warm: failed: {one_line(err)}")
        return
    del updater
    sec.data.setdefault("cached_compile", []).append({"shape": shape.name, "precision": precision, "cold_s": cold_s,
                                                      "warm_cache_s": warm})
    sec.notes.append(f"{shape.name}, {precision}, CUDA graphs: warm-up {cold_s:.1f} s the first time, {warm:.1f} s "
                     "again with inductor's caches warm (same process, a new model: a lower bound of what a study's "
                     "later runs pay, new processes sharing one compile cache).")


def section_training(run: Run, sec: Section, deadline: float) -> None:
    import torch

    sizes = shapes(run.dry)
    torch.backends.cuda.matmul.allow_tf32 = bool(run.args.tf32)
    common.raise_recompile_limits()  # many models through one compiled function
    fp32_peak = "fp32 with TF32 on" if run.args.tf32 else "fp32 (TF32 off, torch's default, as the toolkit trains)"
    sec.text.append(
        "Each update is the toolkit's `Updater.update` (forward, label-smoothed loss, backward, clipping, Adam, "
        "schedule) on one fixed batch already on the device, its training settings those of "
        f"`{bench_train.BASE_CONFIG}` with `training.compile` and `training.cuda_graphs` as the mode names. "
        "Shapes: " + "; ".join(sizes[k].describe() for k in run.args.shapes) + ". "
        f"Blocks of updates (about {run.block_s:g} s of eager updates each) interleaved across the modes, "
        f"{run.args.rounds} round(s), the median. Achieved FLOP/s: the analytic matmul FLOPs of the batch "
        f"(bench_train.py's count, x3 for the backward) over the time; share against the 8,192 peak of the "
        f"precision (bf16; {fp32_peak}). Warm-up: the first three updates, compilation included; memory: "
        "the mode's own (model, optimiser, activations): `torch.cuda.max_memory_allocated` over its warm-up, less "
        "what the modes before it held. Host syncs: the synchronising CUDA calls of one more update, after "
        "the timing, under `torch.cuda.set_sync_debug_mode(\"warn\")` (the goal is none; where they are, by "
        "file and line); \"-\" off CUDA.")
    sec.header = ["shape", "precision", "mode", "target tokens/s", "ms/update", "matmul FLOP/s", "share of peak",
                  "against eager", "warm-up", "peak memory", "host syncs in an update"]
    estimate: dict[str, float] = {}
    for precision in run.args.precisions:
        for shape_key in run.args.shapes:
            if time.monotonic() > deadline:
                for mode in MODES:
                    sec.rows.append([sizes[shape_key].name, precision, MODE_LABEL[mode],
                                     "not measured: the section's time budget ran out", "", "", "", "", "", "", ""])
                continue
            try:
                training_cell(run, sec, shape_key, precision, deadline, estimate)
            except Exception as err:  # the other cells still run
                remember_error(sec, f"{shape_key} {precision}", err)
                sec.rows.append([sizes[shape_key].name, precision, "all modes", f"not measured: {one_line(err)}",
                                 "", "", "", "", "", "", ""])
                print(f"{shape_key} {precision}: {one_line(err)}", flush=True)
                torch._dynamo.reset()
                gc.collect()
            run.report.save()


# ---------------------------------------------------------------------------
# 4. every registered method against vanilla


def synthetic_dataset(run: Run) -> Path:
    from tests.registry_cases import prepare_synthetic

    if run.synthetic is None:
        sizes = {"train": 200, "test": 16} if run.dry else {"train": 3000, "test": 500}
        run.synthetic = prepare_synthetic(run.work / "synthetic", **sizes)
    return run.synthetic


def method_size(run: Run) -> dict[str, Any]:
    if run.dry:  # the registry's own tiny model (two layers a side: some cases name layer 2)
        return {"enc_layers": 2, "dec_layers": 2, "d_model": 32, "n_heads": 4, "d_ff": 64, "dropout": 0.2}
    s = shapes(False)["small"]
    return {"enc_layers": s.enc, "dec_layers": s.dec, "d_model": s.d, "n_heads": s.heads, "d_ff": s.ff,
            "dropout": s.dropout}


def describe_entry(entry: dict[str, Any]) -> str:
    """``{"name": "sasa", "layers": [2]}`` -> ``sasa (layers=[2])``."""
    params = ", ".join(f"{k}={v}" for k, v in entry.items() if k != "name")
    return entry["name"] + (f" ({params})" if params else "")


def section_methods(run: Run, sec: Section, deadline: float) -> None:
    import torch

    from structnmt.data.dataset import ParallelDataset
    from structnmt.training.updater import Updater
    from tests.registry_cases import all_cases, covered_methods, make_model, registered_methods, vocab_size

    dataset = synthetic_dataset(run)
    vocab = vocab_size(dataset)
    size = method_size(run)
    training = training_config("auto", max_tokens=256 if run.dry else 4096)
    precision = auto_precision(run.device, size.get("d_model"))
    ds = ParallelDataset(dataset, "train")
    batches = bench_train.train_batches(ds, training, 8)
    cases = [c for c in sorted(all_cases()) if c != "vanilla"]
    if run.args.methods:
        cases = [c for c in cases if c in run.args.methods]
    uncovered = sorted(registered_methods() - covered_methods())
    graphs = run.args.methods_mode == "graphs"
    route = ("under CUDA graphs (training.compile and training.cuda_graphs on), each model on one fixed batch "
             "(the first planned batch, its fields collated once, lengths padded to buckets, no filler rows; "
             "collation outside the timing)") if graphs else "eager, collation included as in the trainer"
    sec.text.append(
        f"The built-in synthetic task ({len(ds):,} training pairs, gold trees on both sides, source scenes, "
        f"{vocab} sub-words), batches of at most {training.max_tokens:,} tokens, the same for every model; each "
        f"case of `tests/registry_cases.py` (every registered method at least once) on the small shape "
        f"({size['enc_layers']}+{size['dec_layers']} layers, d_model {size['d_model']}, ff {size['d_ff']}), "
        f"{precision} (training.precision auto), {route}. A round is one vanilla block and one method block on the "
        f"same batches, in alternating order; the overhead is 1 - the median of "
        f"the rounds' method/vanilla ratios ({run.args.rounds} round(s)); the spread, the lowest and the highest "
        "round's overhead.")
    if uncovered:
        sec.notes.append(f"Registered methods with no case: {', '.join(uncovered)}.")
    sec.header = ["case", "methods", "tokens/s", "vanilla tokens/s (same rounds)", "overhead (median)",
                  "spread (min … max)", "rounds", "within 10%", "kernels of an eager update (× vanilla's)"]
    sec.text.append("The last column counts the ATen calls that can run a kernel in one eager update of each model "
                    "(`benchmarks/kernel_counts.py`, on this device, same precision and attention route): what an "
                    "eager update dispatches (a guide to its launches), against which the overhead can be read.")

    fixed: dict[str, Any] = {}  # graphs: each variant's one batch, and its target tokens
    if graphs:  # every model goes through the one compiled function (Updater._forward_loss)
        common.raise_recompile_limits()

    def variant(case: str) -> Any:
        torch.manual_seed(1)
        model = make_model(case, vocab, **size)
        if not graphs:
            return bench_train.Variant(case, None, Updater(model, training, run.device), model.structure_needs())
        from structnmt.data.batching import collate

        v = bench_train.Variant(case, None, make_updater(run, model, "auto", "graphs"), model.structure_needs())
        batch = collate(ds, batches[0], v.fields, multiple=8, bucketed=True)
        tokens = 0
        for _ in range(3):  # compilation and graph recording, outside the timing
            torch.compiler.cudagraph_mark_step_begin()
            tokens = v.updater.update([batch]).tokens
        if not v.updater.compiled:
            raise NotMeasured("compiling failed, the update fell back to eager: " + "; ".join(v.updater.notes))
        if not run.dry and getattr(v.updater, "cuda_graphs", None) is False:
            why = getattr(v.updater, "cuda_graphs_reason", "")
            raise NotMeasured(f"the update ran without CUDA graphs: {why}")
        fixed[case] = (batch, tokens)
        return v

    def block(v: Any, n: int) -> float:
        if graphs:
            batch, tokens = fixed[v.name]
            return tokens * n / timed_updates(run, v.updater, batch, n, True)
        tokens, seconds = bench_train.run_block(v, ds, batches[:n], sync=True)
        return tokens / seconds

    def kernels(case: str) -> int | None:
        try:
            import kernel_counts  # a private torch module behind it: its failure costs the column, not the report

            return sum(kernel_counts.count_update(case, dataset, vocab, size, "auto", 256, "auto",
                                                  str(run.device)).values())
        except Exception as err:  # the count is beside the timing: its failure must not lose the row
            remember_error(sec, f"{case} (kernel count)", err)
            return None

    vanilla_kernels = kernels("vanilla")

    def kernels_cell(n: int | None) -> str:
        if n is None:
            return "not counted"
        return f"{n}" + (f" ({n / vanilla_kernels:.2f}×)" if vanilla_kernels else "")

    vanilla = variant("vanilla")
    if graphs:
        block(vanilla, 2)
    else:
        bench_train.run_block(vanilla, ds, batches[:2])
    started = time.perf_counter()
    block(vanilla, 1)
    vanilla_update = time.perf_counter() - started
    estimate = 0.0
    stopped = ""  # why no case can be measured any more
    for case in cases:
        entries = "; ".join(describe_entry(e) for e in all_cases()[case])
        if stopped or time.monotonic() + estimate > deadline:
            why = stopped or "the section's time budget ran out"
            sec.rows.append([case, entries, f"not measured: {why}", "", "", "", "", "", ""])
            continue
        began = time.monotonic()
        try:
            method = variant(case)
            started = time.perf_counter()
            if graphs:  # warm-up: two updates
                block(method, 2)
            else:
                bench_train.run_block(method, ds, batches[:2])
            per_update = max((time.perf_counter() - started) / 2, vanilla_update)
            # eager walks the 8 planned batches; a fixed batch under graphs allows blocks of ~run.block_s / 2
            steps = max(2, min(200 if graphs else 8, math.ceil(run.block_s / 2 / per_update)))
            ratios, rates, vanilla_rates = [], [], []
            for r in range(run.args.rounds):
                if r and time.monotonic() > deadline:
                    break
                if r % 2 == 0:
                    v_rate, m_rate = block(vanilla, steps), block(method, steps)
                else:
                    m_rate, v_rate = block(method, steps), block(vanilla, steps)
                ratios.append(m_rate / v_rate)
                rates.append(m_rate)
                vanilla_rates.append(v_rate)
            n_kernels = kernels(case)  # inside the case's time, so the next case's estimate counts it
        except Exception as err:  # one method's failure must not hide the others'
            remember_error(sec, case, err)
            sec.rows.append([case, entries, f"not measured: {one_line(err)}", "", "", "", "", "", ""])
            print(f"{case}: {one_line(err)}", flush=True)
            if graphs:  # a failed replay leaves cudagraph trees unusable: start them afresh, vanilla too
                method = None
                torch._dynamo.reset()
                try:
                    vanilla = variant("vanilla")
                    block(vanilla, 2)
                except Exception as again:
                    remember_error(sec, "vanilla (rebuilt)", again)
                    stopped = f"vanilla, rebuilt after {case} failed, failed too: {one_line(again)}"
                    print(stopped, flush=True)
            continue
        finally:
            estimate = max(estimate, time.monotonic() - began)
        ratio = statistics.median(ratios)
        spread = [1 - max(ratios), 1 - min(ratios)]
        sec.rows.append([case, entries, fmt_rate(statistics.median(rates)), fmt_rate(statistics.median(vanilla_rates)),
                         f"{100 * (1 - ratio):+.1f}%", f"{100 * spread[0]:+.1f}% … {100 * spread[1]:+.1f}%",
                         len(ratios) if len(ratios) >= 3 else f"**{len(ratios)}** (the budget ran out)",
                         "yes" if 1 - ratio <= 0.10 else "**no**", kernels_cell(n_kernels)])
        sec.data[case] = {"ratios": ratios, "rates": rates, "vanilla_rates": vanilla_rates, "steps_per_block": steps,
                          "overhead": 1 - ratio, "spread": spread, "rounds": len(ratios), "kernels": n_kernels,
                          "vanilla_kernels": vanilla_kernels}
        print(f"{case}: overhead {100 * (1 - ratio):+.1f}% ({len(ratios)} rounds)", flush=True)
        del method
        run.report.save()


# ---------------------------------------------------------------------------
# 5. structnmt's training command and beam-5 decoding


def pick_data(run: Run) -> tuple[Path, str, bool, str, str]:
    """(dataset, config, parse-free overrides, test split, description) for sections 5 and 6."""
    if run.data_choice:
        return run.data_choice
    root = common.ROOT
    given = Path(run.args.dataset) if run.args.dataset else None
    plain, parsed = root / bench_train.PLAIN_DIR, root / bench_train.PARSED_DIR
    candidates = [] if run.dry and not given else [given] if given else [plain, parsed]
    for path in candidates:
        if path is not None and (path / "meta.json").is_file():
            split = "test_2016_flickr" if (path / "test_2016_flickr").is_dir() else "test"
            run.data_choice = (path, bench_train.BASE_CONFIG, path.resolve() != parsed.resolve(), split,
                               f"the prepared Multi30k En->De dataset `{path}` with `{bench_train.BASE_CONFIG}`")
            return run.data_choice
    dataset = synthetic_dataset(run)
    run.data_choice = (dataset, str(synthetic_config(run, dataset)), False, "test",
                       "the built-in synthetic task (" + ("the dry run's choice" if run.dry else
                                                          "no prepared Multi30k dataset here") + ")")
    return run.data_choice


def synthetic_config(run: Run, dataset: Path) -> Path:
    """A training config for the synthetic dataset of ``prepare_synthetic``: its data section, the
    small recipe's model (tiny in the dry run), training and decoding."""
    import yaml

    from structnmt.data.synthetic import demo_config

    base = yaml.safe_load((common.ROOT / bench_train.BASE_CONFIG).read_text(encoding="utf-8"))
    raw = demo_config(dataset.parent, 0.0)
    raw["data"]["subwords"]["vocab_size"] = 300  # as prepare_synthetic prepares it
    size = method_size(run)
    size["enc_layers"] = size["dec_layers"] = 1 if run.dry else size["enc_layers"]
    raw["model"] = {**base["model"], **size}
    raw["training"] = {**base["training"], "out_dir": str(run.work / "run")}
    raw["decoding"] = base["decoding"]
    path = run.work / "synthetic.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False), encoding="utf-8")
    return path


def model_of(config: str) -> Any:
    from structnmt import load_config

    return load_config(config).model


def auto_precision(device: Any, d_model: int | None = None) -> str:
    """What ``training.precision: auto`` resolves to on ``device`` for a model of width ``d_model``."""
    import torch

    from structnmt.training.environment import choose_precision

    chosen = choose_precision("auto", device, d_model)
    name = {None: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}[chosen.amp]
    return f"{name}+TF32" if chosen.tf32 else name


def eager_sets(steps: int) -> dict[str, Any]:
    """``--set``s of an eager training command (Joey NMT trains eagerly), validating once at the end."""
    graphs = {"training.cuda_graphs": "off"} if cuda_graphs_known() else {}
    return {"training.compile": "off", **graphs, "training.valid_every": steps}


def section_decoding(run: Run, sec: Section, deadline: float) -> None:
    import torch

    dataset, config, plain, split, described = pick_data(run)
    m = model_of(config)
    precision = f"precision auto: {auto_precision(run.device, m.d_model)}"
    args = run.args
    device = "cuda" if run.device.type == "cuda" else "cpu"
    threads = 1 if run.dry else 0
    max_tokens = 512 if run.dry else 4096
    sec.text.append(
        f"Data: {described}. `structnmt train` as a user runs it ({m.enc_layers}+{m.dec_layers} layers, d_model "
        f"{m.d_model}, {m.n_heads} heads, ff {m.d_ff}; batches of {max_tokens:,} tokens; training.compile off, "
        f"so that it compares with Joey NMT's eager training; precision auto), {args.train_steps} updates, "
        f"throughput from its log (windows of {args.log_every} updates after the first); then beam 5 over "
        f"`{split}` with that model (`translate_split`, batches of {args.decode_tokens:,} tokens), model loading "
        "excluded, after a warm-up on a few sentences. An untrained model decodes to the length limit: compare "
        "decoding speeds where the mean output lengths are close.")
    if run.device.type == "cuda":
        torch.cuda.empty_cache()  # the training command and Joey NMT share this GPU
    work = run.work / "toolkits"
    sets = eager_sets(args.train_steps)
    began = time.monotonic()
    tps, _, last = bench_joey.structnmt_train(dataset, args.train_steps, args.log_every, threads, max_tokens,
                                              config=config, work=work, device=device, sets=sets, plain=plain)
    sec.header = ["what", "figure"]
    sec.rows.append([f"training ({precision}), target tokens/s", fmt_rate(tps)])
    run.structnmt.update(train_tps=tps, precision=precision, checkpoint=str(last), dataset=dataset, split=split,
                         config=config, max_tokens=max_tokens, threads=threads, device=device)
    sec.data["train_tokens_per_s"] = tps
    run.report.save()
    bench_joey.structnmt_decode(str(last), str(dataset), split, 5, args.decode_tokens, threads, 8, device)
    decoded = bench_joey.structnmt_decode(str(last), str(dataset), split, 5, args.decode_tokens, threads,
                                          args.decode_limit, device)
    sps = decoded["sentences"] / decoded["seconds"]
    sec.rows += [["beam-5 decoding, sentences", decoded["sentences"]],
                 ["beam-5 decoding, seconds", f"{decoded['seconds']:.2f}"],
                 ["beam-5 decoding, sentences/s", fmt_rate(sps)],
                 ["mean output length (sub-words)", f"{decoded['pieces']:.1f}"]]
    run.structnmt.update(decode=decoded)
    sec.data["decode"] = decoded
    eager_s = time.monotonic() - began
    train_defaults(run, sec, deadline, eager_s, dataset, config, plain, threads, max_tokens, device, work)


#: issue 41's figure for ``structnmt train`` with the defaults of commit 1c433cd (bf16, compile auto)
BASELINE_1C433CD = "48k target tokens/s on one H200 (torch 2.11.0+cu130, 2026-11-27)"


def train_defaults(run: Run, sec: Section, deadline: float, eager_s: float, dataset: Path, config: str,
                   plain: bool, threads: int, max_tokens: int, device: str, work: Path) -> None:
    """``structnmt train`` with every speed setting at its default (compile, CUDA graphs and precision
    auto; ``training.num_workers`` auto, two data workers on a GPU host), then without data workers:
    the figure goal 2 of issue 41 asks for (>= 3x commit 1c433cd's default on the same GPU), and what
    the workers give. Compilation and graph recording stay out of the log's tokens/s; each
    run is expected to take the eager run's time (``eager_s``) and, on a GPU, a minute of compiling."""
    from structnmt.wording import counted

    args = run.args
    sec.text.append(
        f"Then the same training with the defaults (training.compile, cuda_graphs, precision and num_workers auto: "
        f"on a GPU host two worker processes collate batches ahead), and with `training.num_workers: 0`, "
        f"{args.train_steps} updates each, "
        f"compilation and graph recording kept out of the log's tokens/s. For reference, commit 1c433cd's default "
        f"gave {BASELINE_1C433CD}.")
    for label, extra in (("defaults", {}), ("defaults, no data workers", {"training.num_workers": 0})):
        row = f"training ({label}), target tokens/s"
        key = label.replace(" ", "_").replace(",", "")
        if time.monotonic() + eager_s + (0 if run.dry else 60) > deadline:
            sec.rows.append([row, "not measured: the section's time budget ran out"])
            continue
        try:
            sets = {"training.valid_every": args.train_steps, **extra}
            tps, _, last = bench_joey.structnmt_train(dataset, args.train_steps, args.log_every, threads, max_tokens,
                                                     config=config, work=work / key,
                                                     device=device, sets=sets, plain=plain)
        except (Exception, SystemExit) as err:  # the report keeps the other rows
            remember_error(sec, label, err)
            sec.rows.append([row, f"not measured: {one_line(err)}"])
            continue
        sec.rows.append([row, fmt_rate(tps)])
        sec.data[f"train_tokens_per_s_{key}"] = tps
        summary = training_log_summary(last.parent / "log.jsonl")
        sec.data[f"train_log_{key}"] = summary
        sec.notes.append(f"Training ({label}), the log's windows of {args.log_every} updates: "
                         f"{', '.join(fmt_rate(r) for r in summary['windows'])} target tokens/s; "
                         f"{summary['batch_shapes']} batch shapes; "
                         f"{counted(summary['compile_events'], 'compile event')} "
                         f"({summary['compile_s']:.1f} s, kept out of the windows).")
        run.report.save()


def training_log_summary(log: Path) -> dict[str, Any]:
    """A training run's steady state from its ``log.jsonl``: each window's target tokens/s, the
    batch shapes seen (CUDA graphs record one graph per shape), and the compilations."""
    windows, shapes, events, seconds = [], 0, 0, 0.0
    for line in log.read_text(encoding="utf-8").splitlines():
        record = json.loads(line)
        if record.get("kind") == "train":
            windows.append(record["tgt_tokens_per_s"])
            shapes = max(shapes, record.get("batch_shapes", 0))
        elif record.get("event") == "compile":
            events += 1
            seconds += record.get("seconds", 0.0)
    return {"windows": windows, "batch_shapes": shapes, "compile_events": events, "compile_s": seconds}


# ---------------------------------------------------------------------------
# 6. Joey NMT beside it


def section_joey(run: Run, sec: Section, deadline: float) -> None:
    import yaml

    args = run.args
    python = bench_joey.find_joey_python(args.joey_python)
    if python is None:
        tried = f"`{args.joey_python}`" if args.joey_python else \
            f"this interpreter (`{sys.executable}`) and `{bench_joey.joey_python()}`"
        sec.status = JOEY_ABSENT
        sec.data["installed"] = False
        sec.text.append(f"No interpreter here imports joeynmt (tried {tried}); nothing is installed by this "
                        f"script (a GPU machine has no network). {JOEY_INSTALL}")
        return
    joey_v, torch_v = ((bench_joey.joey_version(python) or "") + " ? ?").split()[:2]
    sec.data.update(installed=True, python=str(python), joeynmt=joey_v, torch=torch_v)
    dataset, config, plain, split, described = pick_data(run)
    ours = run.structnmt
    m = model_of(config)
    threads = 1 if run.dry else 0
    max_tokens = ours.get("max_tokens", 512 if run.dry else 4096)
    work = run.work / "joey"
    work.mkdir(parents=True, exist_ok=True)
    bench_joey.WORK = work  # where bench_joey's commands write their logs and hypotheses
    path = bench_joey.write_joey_inputs(dataset, work, args.train_steps, args.log_every, args.decode_tokens,
                                        max_tokens, args.decode_limit, split)
    joey_cfg = yaml.safe_load(path.read_text(encoding="utf-8"))
    joey_cfg["use_cuda"] = run.device.type == "cuda"
    for stack in (joey_cfg["model"]["encoder"], joey_cfg["model"]["decoder"]):  # structnmt's shape, whatever it is
        stack.update(num_heads=m.n_heads, hidden_size=m.d_model, ff_size=m.d_ff, dropout=m.dropout)
        stack["embeddings"]["embedding_dim"] = m.d_model
    joey_cfg["model"]["encoder"]["num_layers"] = m.enc_layers
    joey_cfg["model"]["decoder"]["num_layers"] = m.dec_layers
    path.write_text(yaml.safe_dump(joey_cfg, sort_keys=False), encoding="utf-8")
    sec.text.append(
        f"`{python}` (joeynmt {joey_v}, torch {torch_v}). Data: {described}; the same sub-words (Joey's sentencepiece "
        f"tokenizer reads the dataset's `spm.model`), shape ({m.enc_layers}+{m.dec_layers} layers, d_model "
        f"{m.d_model}, ff {m.d_ff}), optimiser settings and {max_tokens:,}-token batches (`{path}`); Joey NMT "
        f"trains in fp32 (its fp16 option is off), {args.train_steps} updates, throughput from its log's "
        f"\"Tokens per Sec\" after the first window; decoding: its \"Generation took\" on `{split}`, beam 5, "
        "alpha 0.6. The commands run one after the other on the same device. Models of a few hundred updates stop at "
        "other lengths: where the mean output lengths differ, compare output sub-words/s, not sentences/s.")
    joey_tps, _ = bench_joey.joey_train(python, path, threads)
    sec.header = ["toolkit", "training target tokens/s", "against Joey NMT", "decoding sentences/s",
                  "against Joey NMT", "mean output length (sub-words)", "output sub-words/s (against Joey NMT)"]
    train_rows = [[f"Joey NMT {joey_v} (fp32)", fmt_rate(joey_tps), "1.00x", "", "", "", ""]]
    sec.rows = train_rows
    run.report.save()
    joey = bench_joey.joey_decode(python, path, threads, None, dataset / "spm.model")
    joey_sps = joey["sentences"] / joey["seconds"]
    joey_pps = joey_sps * joey["pieces"]  # sub-words/s: models 200 updates old stop at other lengths
    train_rows[0][3:] = [fmt_rate(joey_sps), "1.00x", f"{joey['pieces']:.1f}", f"{fmt_rate(joey_pps)} (1.00x)"]
    sec.data.update(joey_train_tokens_per_s=joey_tps, joey_decode=joey)
    if "train_tps" in ours:
        row = [f"structnmt ({ours['precision']})", fmt_rate(ours["train_tps"]),
               f"**{ours['train_tps'] / joey_tps:.2f}x**"]
        if "decode" in ours:
            sps = ours["decode"]["sentences"] / ours["decode"]["seconds"]
            pps = sps * ours["decode"]["pieces"]
            row += [fmt_rate(sps), f"**{sps / joey_sps:.2f}x**", f"{ours['decode']['pieces']:.1f}",
                    f"{fmt_rate(pps)} ({pps / joey_pps:.2f}x)" if joey_pps else ""]
        else:
            row += ["not measured (section 5 did not decode)", "", "", ""]
        sec.rows.append(row)
    else:
        sec.notes.append("structnmt's figures come from the decoding section, which did not run: no ratio.")
    run.report.save()
    if "train_tps" in ours and time.monotonic() + 30 < deadline:  # the same precision as Joey's, time allowing
        fp32, _, _ = bench_joey.structnmt_train(dataset, args.train_steps, args.log_every, threads, max_tokens,
                                                precision="fp32", config=config, work=run.work / "toolkits",
                                                device=ours["device"], plain=plain,
                                                sets=eager_sets(args.train_steps))
        sec.rows.append(["structnmt (fp32)", fmt_rate(fp32), f"{fp32 / joey_tps:.2f}x", "", "", "", ""])
        sec.data["structnmt_fp32_train_tokens_per_s"] = fp32
    else:
        sec.notes.append("structnmt in fp32: not measured (no time left in the section, or no structnmt run).")


RUNNERS = {"peak": section_peak, "training": section_training, "methods": section_methods,
           "decoding": section_decoding, "joey": section_joey}


def eager_backend_for_torch_compile() -> None:
    """The dry run's stand-in for inductor: every ``torch.compile`` (the toolkit's own, through
    ``training.compile``) traces with dynamo and runs the graphs eagerly, generating no code. Each
    call has its own backend, so that, as with inductor's options, one call's graphs are not reused
    by another's (dynamo checks the backend)."""
    import torch
    from torch._dynamo.backends.debugging import eager

    real = torch.compile

    def compile(model: Any = None, **kw: Any) -> Any:
        kw = {k: v for k, v in kw.items() if k not in ("backend", "mode", "options")}
        if model is None:  # used as a decorator with arguments
            return lambda fn: compile(fn, **kw)
        return real(model, backend=lambda gm, inputs, **_: eager(gm, inputs), **kw)

    torch.compile = compile


# ---------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--cpu", action="store_true", help="dry run of every section on the CPU (figures mean nothing)")
    p.add_argument("--out", type=Path, default=common.RESULTS, help="folder of the report (default %(default)s)")
    p.add_argument("--time-limit", type=float, help=f"seconds for the whole run (default {TIME_LIMIT_S}; "
                                                    "--cpu: 300); each section gets its share")
    p.add_argument("--sections", default=",".join(HEADINGS), help="comma-separated, of: %(default)s")
    p.add_argument("--rounds", type=int, default=3, help="interleaved rounds (default %(default)s)")
    p.add_argument("--methods-mode", choices=["eager", "graphs"], default="eager",
                   help="section 4's route: eager (collation timed, as the trainer without workers) or CUDA graphs "
                        "(a compile and a recording per method: a call of its own, --sections methods)")
    p.add_argument("--shapes", default="small,big", help="training shapes: small, big")
    p.add_argument("--precisions", default="bf16,fp32", help="training precisions: bf16, fp32")
    p.add_argument("--tf32", action="store_true", help="fp32 training with TF32 matmuls (default: off, as torch)")
    p.add_argument("--methods", help="comma-separated cases of tests/registry_cases.py (default: all)")
    p.add_argument("--dataset", help="a prepared parse-free dataset of the base recipe for sections 5-6 "
                                     "(default: data/multi30k_en_de_plain or data/multi30k_en_de, else synthetic)")
    p.add_argument("--train-steps", type=int, help="updates of each toolkit's training command (default 200)")
    p.add_argument("--log-every", type=int, help="updates per throughput window (default 20)")
    p.add_argument("--decode-tokens", type=int, default=8000, help="tokens per decoding batch (both toolkits)")
    p.add_argument("--decode-limit", type=int, help="decode only the first N test sentences (default all)")
    p.add_argument("--joey-python", metavar="PATH",
                   help="an interpreter that imports joeynmt (default: this one, else benchmarks/envs/joey)")
    p.add_argument("--work", type=Path, help="work folder (default: a new temporary folder)")
    args = p.parse_args(argv)
    dry = args.cpu
    args.train_steps = args.train_steps or (4 if dry else 200)
    args.log_every = args.log_every or (2 if dry else 20)
    args.decode_limit = args.decode_limit if args.decode_limit is not None else (8 if dry else 0)
    args.time_limit = args.time_limit or (300 if dry else TIME_LIMIT_S)
    keys = [k for k in args.sections.split(",") if k]
    bad = [k for k in keys if k not in HEADINGS]
    keys = [k for k in RUN_ORDER if k in keys]
    args.shapes = [s for s in args.shapes.split(",") if s]
    args.precisions = [s for s in args.precisions.split(",") if s]
    args.methods = args.methods.split(",") if args.methods else None
    bad += [x for x in args.shapes if x not in ("small", "big")]
    bad += [x for x in args.precisions if x not in ("bf16", "fp32")]
    if bad:
        p.error(f"unknown: {', '.join(bad)}")

    import torch

    if not dry and not torch.cuda.is_available():
        print("gpu_report: no CUDA device here (torch.cuda.is_available() is False); nothing was measured. "
              "Run it on a machine with a GPU, or pass --cpu for a dry run of the script.")
        return 0
    started = time.monotonic()
    signal.signal(signal.SIGALRM, _time_up)
    signal.alarm(int(args.time_limit + GRACE_S))
    device = torch.device("cpu") if dry else torch.device("cuda", 0)
    if dry:
        torch.set_num_threads(1)
        eager_backend_for_torch_compile()
    work = args.work or Path(tempfile.mkdtemp(prefix="gpu_report-"))
    work.mkdir(parents=True, exist_ok=True)
    report = Report(args.out, dry, machine_info(dry), keys, args.time_limit)
    report.began = started
    print(json.dumps(report.machine, indent=1, default=str), flush=True)
    total = sum(BUDGET[k] for k in keys) or 1.0
    mark = 0.0
    for key in keys:  # each section's share, and the latest it may end (what earlier ones leave passes on)
        sec = report.sections[key]
        sec.budget_s = args.time_limit * BUDGET[key] / total
        mark += sec.budget_s
        sec.until_s = min(mark, args.time_limit)
    report.save()
    run = Run(args, device, dry, work, report)
    code = 0
    for i, key in enumerate(keys):
        sec = report.sections[key]
        deadline = started + sec.until_s
        common.DEADLINE = deadline + 5  # a command still running then is killed (5 s past the checks)
        sec.status = "running (a report that ends here was cut short during this section)"
        report.save()
        print(f"== {sec.heading} (until +{deadline - started:.0f} s)", flush=True)
        began = time.monotonic()
        try:
            RUNNERS[key](run, sec, deadline)
            if sec.status.startswith("running"):
                sec.status = "done"
            print(f"   {key}: {time.monotonic() - began:.1f} s", flush=True)
        except (TimeUp, KeyboardInterrupt) as err:
            why = f"the run's time limit ({args.time_limit + GRACE_S:.0f} s)" if isinstance(err, TimeUp) \
                else "an interrupt"
            sec.status = f"cut short by {why}: the rows here are what finished"
            for later in keys[i + 1:]:
                report.sections[later].status = f"not measured: {why} came first"
            code = 0 if isinstance(err, TimeUp) else 130
            report.save()
            break
        except (Exception, SystemExit) as err:  # a section's failure is reported; the next ones still run
            sec.status = f"not measured: {one_line(err)}"
            remember_error(sec, key, err)
            tail = str(err).strip().splitlines()[1:][-20:]  # a failed command's output (bench_joey's exits)
            if tail:
                sec.notes.append("```\n" + "\n".join(tail)[-3000:] + "\n```")
            print(f"{key}: {one_line(err)}", file=sys.stderr, flush=True)
        finally:
            sec.seconds = time.monotonic() - began
        report.save()
    signal.alarm(0)
    common.DEADLINE = None
    elapsed = time.monotonic() - started
    markdown, data = report.save()
    print(f"report ({elapsed:.0f} s): {markdown} and {data}")
    if not args.work:
        shutil.rmtree(work, ignore_errors=True)
    return code


if __name__ == "__main__":
    sys.exit(main())
