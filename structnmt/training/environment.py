"""What a run needs from the machine, and what an exact resume puts back.

The device a process trains on (its own GPU under DDP), the precision (autocast dtype, gradient
scaler, TF32 matrix products) and why, and every random-number generator's state in a form a
checkpoint can hold (``torch.load(weights_only=True)`` accepts it).
"""

from __future__ import annotations

import contextlib
import os
import random
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from structnmt.errors import ConfigError
from structnmt.training import distributed as D
from structnmt.wording import counted


def pick_device(spec: str, ctx: D.DistContext) -> torch.device:
    """``auto``: the process's GPU when there is one, else the CPU."""
    if spec == "auto":
        spec = "cuda" if torch.cuda.is_available() else "cpu"
    if spec.startswith("cuda"):
        if not torch.cuda.is_available():
            raise ConfigError(f"device {spec!r} asked for, but no CUDA GPU is available", "training.device")
        if spec == "cuda":
            return torch.device("cuda", ctx.local_rank)
    try:
        return torch.device(spec)
    except RuntimeError:
        raise ConfigError(f"not a device: {spec!r}", "training.device") from None


#: ``precision: auto`` on a GPU trains models narrower than this in fp32 (TF32 matrix products) and
#: wider ones under bf16 autocast. A narrow model's update is bound by kernel launches, not by its
#: small products, and autocast adds a cast kernel before each product: the small Multi30k recipe
#: (d_model 256) trained at less than half its fp32 speed under bf16 on an H200. From d_model 1,024
#: (Transformer-big) the products approach the sizes where bf16's peak, twice TF32's, is reached
#: (docs/training.md, "Precision").
SMALL_MODEL_WIDTH = 1024


@dataclass(frozen=True)
class Precision:
    """What a run computes in: an autocast dtype (None: fp32), whether it needs a gradient scaler,
    whether fp32 matrix products may use TF32 (CUDA only), and why this choice."""

    amp: torch.dtype | None
    scaler: bool
    tf32: bool = False
    reason: str = ""

    @property
    def name(self) -> str:
        """The run's precision in its records: bfloat16, float16, float32 or tf32."""
        if self.amp is not None:
            return str(self.amp).replace("torch.", "")
        return "tf32" if self.tf32 else "float32"


def choose_precision(spec: str, device: torch.device, d_model: int | None = None) -> Precision:
    """``training.precision`` on ``device`` for a model of width ``d_model`` (None: unknown, as wide)."""
    if spec == "bf16":
        return Precision(torch.bfloat16, False, reason="bf16 autocast")
    if spec == "fp16":
        # float16 autocast with a gradient scaler runs on the CPU too (slowly): the path of a GPU
        # without bf16 (V100, T4), so that its overflows show up in tests on any machine
        return Precision(torch.float16, True, reason="fp16 autocast with a gradient scaler")
    if spec != "auto":
        return Precision(None, False, reason="fp32")
    if device.type == "cpu":
        # CPUs with native bf16 (AVX512-BF16, AMX) multiply bf16 about twice as fast as fp32
        # (measured here: 174 vs 79 GFLOP/s); elsewhere bf16 is emulated and slower
        if bool(getattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", lambda: False)()):
            return Precision(torch.bfloat16, False, reason="bf16 autocast (auto: this CPU multiplies bf16 natively)")
        return Precision(None, False, reason="fp32 (auto: this CPU has no native bf16, emulating it is slower)")
    if device.type != "cuda":
        return Precision(None, False, reason=f"fp32 (auto: not tried on {device.type} devices)")
    if d_model is not None and d_model < SMALL_MODEL_WIDTH:
        tf32 = torch.cuda.get_device_capability(device) >= (8, 0)
        return Precision(None, False, tf32, f"fp32{' with TF32 matmuls' if tf32 else ''} (auto: d_model {d_model} "
                         f"< {SMALL_MODEL_WIDTH}, a launch-bound update that autocast's casts slow down)")
    why = f"d_model {d_model} >= {SMALL_MODEL_WIDTH}" if d_model is not None else "model width unknown"
    if torch.cuda.is_bf16_supported():
        return Precision(torch.bfloat16, False, reason=f"bf16 autocast (auto: {why}, matmul-bound)")
    return Precision(torch.float16, True, reason=f"fp16 autocast with a gradient scaler (auto: {why}, no bf16 here)")


def pick_precision(spec: str, device: torch.device, d_model: int | None = None) -> tuple[torch.dtype | None, bool]:
    """(autocast dtype or None for fp32, whether a gradient scaler is needed): :func:`choose_precision`."""
    chosen = choose_precision(spec, device, d_model)
    return chosen.amp, chosen.scaler


@contextlib.contextmanager
def tf32_matmuls(on: bool = True) -> Iterator[None]:
    """CUDA fp32 matrix products in TF32 inside the block (and as they were after it), so that a
    run's choice does not leak into later work of the same process (decoding, another run)."""
    if not on:
        yield
        return
    matmul = torch.backends.cuda.matmul
    new_api = hasattr(torch.backends, "fp32_precision")  # mixing it with allow_tf32 raises
    before = matmul.fp32_precision if new_api else matmul.allow_tf32
    if new_api:
        matmul.fp32_precision = "tf32"
    else:
        matmul.allow_tf32 = True
    try:
        yield
    finally:
        if new_api:
            matmul.fp32_precision = before
        else:
            matmul.allow_tf32 = before


def data_workers(spec: int | str, device: torch.device, processes_here: int = 1,
                 threads: int = 0) -> tuple[int, str]:
    """``training.num_workers`` resolved, with the reason the log gives. ``auto``: on a GPU the host
    collating the next batch is the update's critical path (a small model's update is a few ms),
    so two workers collate ahead where this process has at least three cores of its own: the
    node's usable cores over its ``processes_here`` training processes, and no more than
    ``training.threads`` where that is set (a study's executor sets it to each run's share when
    it packs runs on one host). On a CPU 0, since workers would take cores from the update."""
    if spec != "auto":
        return int(spec), f"{spec}"
    if device.type != "cuda":
        return 0, "0 (auto: on a CPU the update needs the cores)"
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    own = cores // max(processes_here, 1)
    if threads > 0:
        own = min(own, threads)
    workers = max(0, min(2, own - 1))
    return workers, f"{workers} (auto: {counted(own, 'core')} for this process on a GPU)"


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def rng_state() -> dict[str, Any]:
    """Every generator's state in types ``torch.load(weights_only=True)`` accepts."""
    np_state = np.random.get_state(legacy=False)
    state: dict[str, Any] = {
        "python": random.getstate(),
        "numpy": {
            "key": torch.from_numpy(np_state["state"]["key"].astype(np.int64)),
            "pos": int(np_state["state"]["pos"]),
            "has_gauss": int(np_state["has_gauss"]),
            "gauss": float(np_state["gauss"]),
        },
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    py = state["python"]
    random.setstate((py[0], tuple(py[1]), py[2]))
    npst = state["numpy"]
    np.random.set_state({
        "bit_generator": "MT19937",
        "state": {"key": npst["key"].numpy().astype(np.uint32), "pos": npst["pos"]},
        "has_gauss": npst["has_gauss"],
        "gauss": npst["gauss"],
    })
    torch.set_rng_state(state["torch"].cpu())
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all([s.cpu() for s in state["cuda"]])
