"""``training.compile``: the forward pass and the loss of an update through ``torch.compile``.

What is compiled is a *function* of the model (forward, label-smoothed loss, the methods'
auxiliary terms), never the module itself, so a compiled run saves the eager model's state-dict
keys and a checkpoint resumes in either mode. Three choices keep it exact and cheap:

* ``fallback_random``: dropout inside the compiled graph draws from PyTorch's own generator
  in program order, the stream an eager run draws from, so a run's random-number states in its
  checkpoints mean the same in both modes (and inductor's own CPU random kernels are slower
  than eager's, docs/benchmarks.md);
* ``dynamic=None``: the first batch shape is compiled as it is; at the second, the lengths and
  batch size become symbolic, so token-count batches of every shape reuse one graph instead of
  recompiling per shape (recompilations are counted and logged);
* on CUDA, batch lengths padded to a multiple of 8 (``training.pad_to_multiple``, see
  :func:`length_multiple`): inductor's GPU kernels guard on ``length % 8``, and without the
  padding a Multi30k run compiled five graphs, one static and one per combination of aligned
  and unaligned source and target lengths (docs/benchmarks.md); padded, two are expected;
* where compiling fails (no C++ compiler for inductor's CPU kernels, an unsupported platform),
  the update runs eagerly and one line says why.

``training.cuda_graphs`` replays the compiled step as CUDA graphs (inductor's
``triton.cudagraphs``, all that ``mode="reduce-overhead"`` sets; torch takes a mode or options,
not both, and ``fallback_random`` stays): one launch for the forward and one for the backward
instead of hundreds of kernel launches, what a small model's update is bound by. A graph is
recorded per batch shape, so the trainer then pads batches to a few bucketed shapes
(:func:`structnmt.data.batching.bucket`).

``auto`` compiles where it pays: on CUDA GPUs. On the CPU the compiled step measured no faster
than the eager one at the Multi30k recipe's shapes (``docs/benchmarks.md``), so ``auto`` stays
eager there and ``on`` asks for it explicitly.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from typing import Any

import torch

#: inductor options for training graphs (see the module docstring)
INDUCTOR_OPTIONS = {"fallback_random": True}


def compile_unavailable(device: torch.device) -> str | None:
    """Why ``torch.compile`` cannot run on ``device`` here, or None."""
    if not hasattr(torch, "compile"):
        return "this torch has no torch.compile"
    if device.type == "cpu":
        compiler = os.environ.get("CXX") or "g++"
        if shutil.which(compiler) is None and shutil.which("clang++") is None:
            return f"inductor's CPU kernels need a C++ compiler, and {compiler!r} is not on PATH"
    elif device.type == "cuda":
        try:
            from torch.utils._triton import has_triton
        except ImportError:  # pragma: no cover - very old torch
            return "this torch cannot tell whether Triton is installed"
        if not has_triton():
            return "inductor's GPU kernels need Triton, which is not installed"
    else:
        return f"not tried on {device.type} devices"
    return None


def resolve_compile(setting: str, device: torch.device) -> tuple[bool, str]:
    """(compile or not, the reason in a few words) for ``training.compile`` on ``device``."""
    if setting == "off":
        return False, "off"
    why_not = compile_unavailable(device)
    if why_not is not None:
        return False, f"eager ({why_not})"
    if setting == "on":
        return True, "on"
    if device.type == "cuda":
        return True, "on (auto: a CUDA GPU)"
    return False, "eager (auto: on the CPU the compiled step measured no faster; training.compile: on forces it)"


def resolve_cuda_graphs(setting: str, compiled: bool, device: torch.device) -> tuple[bool, str]:
    """(replay CUDA graphs or not, the reason in a few words) for ``training.cuda_graphs``."""
    if setting == "off":
        return False, "off"
    if device.type != "cuda":
        return False, "off (CUDA graphs need CUDA; training without them)" if setting == "on" else \
            "off (auto: not on CUDA)"
    if not compiled:
        return False, "off (CUDA graphs are recorded through torch.compile, and the step is not compiled)"
    return True, "on" if setting == "on" else "on (auto: compiled training on CUDA)"


def length_multiple(setting: int, compiled: bool, device: torch.device) -> int:
    """``training.pad_to_multiple``: as set, or under 0 (auto) 8 for compiled training on CUDA and
    1 elsewhere, so that eager and CPU runs keep the batches (and results) they always had."""
    if setting:
        return setting
    return 8 if compiled and device.type == "cuda" else 1


def graphs_compiled() -> int:
    """Graphs dynamo has compiled in this process so far (a recompilation adds one)."""
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])


def compile_step(fn: Callable[..., Any], cuda_graphs: bool = False) -> Callable[..., Any]:
    """``fn`` through inductor with the options above (compiled lazily, at its first call)."""
    return torch.compile(fn, dynamic=None, options={**INDUCTOR_OPTIONS, "triton.cudagraphs": cuda_graphs})


def is_compiler_error(err: BaseException) -> bool:
    """Errors that come from dynamo or inductor themselves, not from the model's own code."""
    module = type(err).__module__ or ""
    return module.startswith(("torch._dynamo", "torch._inductor", "torch._functorch")) or \
        "CppCompileError" in type(err).__name__
