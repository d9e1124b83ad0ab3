"""What a run needs from the machine, and what an exact resume puts back.

The device a process trains on (its own GPU under DDP), the autocast precision and whether
a gradient scaler is needed, and every random-number generator's state in a form a
checkpoint can hold (``torch.load(weights_only=True)`` accepts it).
"""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import torch

from structnmt.errors import ConfigError
from structnmt.training import distributed as D


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


def pick_precision(spec: str, device: torch.device) -> tuple[torch.dtype | None, bool]:
    """(autocast dtype or None for fp32, whether a gradient scaler is needed)."""
    if spec == "auto":
        if device.type == "cpu":
            # CPUs with native bf16 (AVX512-BF16, AMX) multiply bf16 about twice as fast as fp32
            # (measured here: 174 vs 79 GFLOP/s); elsewhere bf16 is emulated and slower
            native = bool(getattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", lambda: False)())
            return (torch.bfloat16, False) if native else (None, False)
        if device.type != "cuda":
            return None, False
        return (torch.bfloat16, False) if torch.cuda.is_bf16_supported() else (torch.float16, True)
    if spec == "bf16":
        return torch.bfloat16, False
    if spec == "fp16":
        # float16 autocast with a gradient scaler runs on the CPU too (slowly): the path of a GPU
        # without bf16 (V100, T4), so that its overflows show up in tests on any machine
        return torch.float16, True
    return None, False


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
