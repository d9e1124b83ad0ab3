"""Helpers that the source-side methods share (PASCAL, Deps-SAN, UDISCAL, SASA, SACrA, the baselines).

They sit beside :mod:`~structnmt.model.methods.base` rather than inside one method, so that
no method imports another: the normal density of the distance-weighted methods, the head
mask that selects a plug-in's heads, the mask of cells between two real sub-words, and the
checks of a method's site and parameter ranges.
"""

from __future__ import annotations

import functools
import math

import torch
from torch import Tensor

from structnmt.errors import ConfigError
from structnmt.model.methods.base import MethodParams


def at_least_float32(t: Tensor) -> Tensor:
    """``t`` in float32, or float64 if it is float64: sums of probabilities in bf16 lose too
    much, and a float64 model (the exactness tests) must not be rounded to float32 midway."""
    return t if t.dtype == torch.float64 else t.float()


def normal_density(x: Tensor, variance: float) -> Tensor:
    """N(x; σ²) = exp(−x²/2σ²)/√(2πσ²), the weighting function of PASCAL, Deps-SAN and UDISCAL."""
    return torch.exp(-x.square() / (2.0 * variance)) / math.sqrt(2.0 * math.pi * variance)


def head_mask(heads: list[int], n_heads: int, device: torch.device) -> Tensor:
    """(1, H, 1, 1) bool, True for the heads a plug-in owns: the ``torch.where`` selector.

    Built once per (heads, device) and kept: making it anew would copy a host tensor to the
    GPU, and wait for it, in every attention call. Under ``torch.compile`` it is built inside the
    graph instead (traced once; the compiler would bypass the cache, and warn that it does)."""
    if torch.compiler.is_compiling():
        return _make_head_mask(tuple(heads), n_heads, torch.device(device))
    return _kept_head_mask(tuple(heads), n_heads, torch.device(device))


def _make_head_mask(heads: tuple[int, ...], n_heads: int, device: torch.device) -> Tensor:
    mask = torch.zeros(n_heads, dtype=torch.bool, device=device)
    mask[list(heads)] = True
    return mask.view(1, n_heads, 1, 1)


_kept_head_mask = functools.lru_cache(maxsize=256)(_make_head_mask)


def valid_pairs(valid: Tensor) -> Tensor:
    """(B, 1, I, J) bool, True where both query and key are real sub-words.

    Cells that involve EOS, BOS or padding are never changed by a method; this is the mask
    that keeps them out.
    """
    return (valid[:, :, None] & valid[:, None, :])[:, None]


def check_site(p: MethodParams, stack: str, attention: str, where: str) -> None:
    """The source-side methods read source structure: refuse a site whose rows are not source tokens."""
    if p.stacks() != [stack]:
        raise ConfigError(f"{p.name} works on the {stack} only", f"{where}.stack")
    if p.attention != attention:
        raise ConfigError(f"{p.name} works on {attention}-attention only", f"{where}.attention")


def check_range(value: float, low: float, high: float, where: str, low_open: bool = False) -> None:
    """Refuse a parameter outside ``[low, high]`` (``(low, high]`` with ``low_open``), naming its field."""
    ok = (low < value if low_open else low <= value) and value <= high
    if not ok:
        raise ConfigError(f"must be in {'(' if low_open else '['}{low}, {high}], got {value}", where)
