"""What a record pins so that a reader can redo its run: machine, versions, code, data, trees, calls.

Records made before these fields were kept lack them; the report shows what is known (the
thread count of the last call, resumes from the training log) rather than guessing.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

CALLS_FILE = "calls.jsonl"  # in the work folder of a run: one line per call that trained it

#: the instruction-set extensions that change which kernels torch runs on a CPU
SIMD_FLAGS = ("sse4_2", "avx", "avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512_vnni", "avx512_bf16",
              "avx512_fp16", "amx_bf16", "amx_int8", "amx_tile", "asimd", "sve")


def lines_digest(lines: list[str]) -> str:
    """SHA-256 of text lines as a file holds them (each ends with a newline): the same for the
    prepared dataset's ``raw.tgt.txt`` and for the corpus file it was read from."""
    digest = hashlib.sha256()
    for line in lines:
        digest.update(line.encode("utf-8") + b"\n")
    return digest.hexdigest()


def cpu_name() -> str:
    """The CPU's model name, as the kernel reports it (a record's ``cpu``)."""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def cpu_info() -> dict[str, Any]:
    """CPU model, the instruction set torch dispatches to, and the SIMD flags the kernel reports."""
    import torch

    model, flags = platform.processor() or platform.machine(), set()
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name") and model == (platform.processor() or platform.machine()):
                model = line.split(":", 1)[1].strip()
            elif line.startswith(("flags", "Features")) and not flags:
                flags = set(line.split(":", 1)[1].split())
    capability = None
    with contextlib.suppress(Exception):
        capability = torch.backends.cpu.get_cpu_capability()
    return {"model": model, "isa": capability, "simd": [f for f in SIMD_FLAGS if f in flags]}


def machine(on_gpu: bool = True) -> dict[str, Any]:
    """The cores this process may use, the memory and the accelerator: what besides the CPU
    model decides how fast a run went and which kernels it ran. ``on_gpu=False`` (a run that
    trained on the CPU of a machine with a GPU) names no GPU."""
    import torch

    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    memory = None
    with contextlib.suppress(OSError, ValueError, IndexError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                memory = round(int(line.split()[1]) / 2**20, 1)  # kB to GiB
                break
    gpu = None
    with contextlib.suppress(Exception):
        if on_gpu and torch.cuda.is_available():
            gpu = torch.cuda.get_device_name(torch.cuda.current_device())
    return {"cores": cores, "memory_gib": memory, "gpu": gpu}


def select_gpu(device: str) -> None:
    """Make a run's GPU (``cuda:N``) the process's current one, so that :func:`machine` names the
    GPU the run trains on rather than the first; nothing for any other device."""
    import torch

    kind, _, index = device.partition(":")
    if kind == "cuda" and index.isdigit() and torch.cuda.is_available():
        torch.cuda.set_device(int(index))


def versions() -> dict[str, str | None]:
    """Exact versions of what decides the numbers: Python and the libraries that touch data or weights."""
    from importlib.metadata import PackageNotFoundError, version

    out: dict[str, str | None] = {"python": platform.python_version()}
    for package in ("torch", "numpy", "sentencepiece", "spacy", "sacrebleu", "structnmt"):
        try:
            out[package] = version(package)
        except PackageNotFoundError:
            out[package] = None
    return out


def outside_methods() -> dict[str, str | None]:
    """The modules of methods kept outside structnmt that this run loaded, each with its file's
    SHA-256 (None for a module without a file): structnmt's commit does not pin their code."""
    from structnmt.io import sha256_file
    from structnmt.model.methods import outside_modules

    out: dict[str, str | None] = {}
    for name in outside_modules():
        path = getattr(sys.modules.get(name), "__file__", None)
        out[name] = sha256_file(path) if path else None
    return out


def git_commit() -> str | None:
    """structnmt's commit (``+dirty`` when tracked files differ from it). ``STRUCTNMT_COMMIT``, when
    set and not git's HEAD, names it instead: a copy of the working tree on a borrowed GPU machine
    has no ``.git``, or one whose HEAD is the last commit that landed with the commits since as
    uncommitted changes. None when neither says."""
    named = os.environ.get("STRUCTNMT_COMMIT", "").strip()
    where = Path(__file__).resolve().parent
    root = where.parent.parent
    try:
        top, commit = subprocess.run(["git", "rev-parse", "--show-toplevel", "HEAD"], cwd=where, capture_output=True,
                                     text=True, timeout=10, check=True).stdout.split()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no", "--", "structnmt"],
                               cwd=root, capture_output=True, text=True, timeout=30).stdout.strip()
        if Path(top).resolve() != root:  # a copy lying inside another repository: that one's commit is not ours
            commit, dirty = "", ""
    except (OSError, subprocess.SubprocessError, ValueError):
        commit, dirty = "", ""
    if named and not (commit and commit.startswith(named)):
        return named
    if not commit:
        return None
    return commit + ("+dirty" if dirty else "")


def corpora_digests(data_dir: str | Path) -> dict[str, str]:
    """The SHA-256 of every corpus file the dataset was prepared from, as ``prepare`` recorded them."""
    meta = json.loads((Path(data_dir) / "meta.json").read_text(encoding="utf-8"))
    files = (meta.get("inputs") or {}).get("files") or {}
    return {key.removeprefix("splits."): info.get("sha256") for key, info in sorted(files.items())}


#: the stored fields that are the trees (and the scenes built from them)
TREE_FIELDS = ("heads", "labels", "scene_members", "scene_parent")


def trees_digest(data_dir: str | Path) -> dict[str, str] | None:
    """Per side, one SHA-256 over the trees of every split of a prepared dataset (heads, labels,
    scenes and their offsets); None when the dataset holds no trees. Two parsers that agree on
    every arc give the same digest, whatever their weights."""
    root = Path(data_dir)
    out: dict[str, str] = {}
    for side in ("src", "tgt"):
        digest, found = hashlib.sha256(), False
        for split in sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith(".")):
            for name in TREE_FIELDS:
                for part in ("data", "offsets"):
                    path = split / f"{side}.{name}.{part}.npy"
                    if path.is_file():
                        found = True
                        digest.update(f"{split.name}/{path.name}\0".encode() + path.read_bytes())
        if found:
            out[side] = digest.hexdigest()
    return out or None


# ---------------------------------------------------------------------------
# the calls that trained a run


def start_call(run_dir: Path, threads: int, from_step: int) -> None:
    """Note a call that trains the run: from which step, with how many threads, on which machine
    and commit (a resumed run may have trained on two)."""
    import socket

    entry = {"from_step": from_step, "threads": threads, "host": socket.gethostname(),
             "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "cpu": cpu_info()["model"], **machine(),
             "git_commit": git_commit()}
    with open(run_dir / CALLS_FILE, "a", encoding="utf-8") as handle:
        handle.write(json.dumps(entry) + "\n")


def read_calls(run_dir: Path) -> list[dict[str, Any]]:
    path = run_dir / CALLS_FILE
    if not path.is_file():
        return []
    calls = []
    for line in path.read_text(encoding="utf-8").splitlines():
        with contextlib.suppress(ValueError):
            entry = json.loads(line)
            if isinstance(entry, dict):
                calls.append(entry)
    return calls


def resume_step(run_dir: Path) -> int:
    """The step the next call starts from: its newest good checkpoint's (0 when there is none)."""
    from structnmt.training.checkpoint import newest_good_checkpoint, read_header

    start = newest_good_checkpoint(run_dir, [])
    if start is None:
        return 0
    return int(read_header(start)[0].get("step", 0))


def known_calls(record: dict[str, Any], log: Path | None) -> tuple[list[str], bool]:
    """The calls that trained a recorded run, as short texts (``0→ (2 threads)``), and whether
    that list is complete. Records made before calls were kept give what the log shows: the
    steps it resumed from, with the thread count of the last call only."""
    calls = record.get("calls")
    if isinstance(calls, list) and calls:
        return [f"{c.get('from_step', '?')}→ ({c.get('threads', '?')} thr)" for c in calls], True
    resumes = []
    if log is not None and log.is_file():
        for line in log.read_text(encoding="utf-8").splitlines():
            with contextlib.suppress(ValueError):
                entry = json.loads(line)
                if isinstance(entry, dict) and entry.get("kind") == "event" and entry.get("event") == "resume":
                    resumes.append(entry.get("step"))
    return ["0→"] + [f"{s}→" for s in resumes], False
