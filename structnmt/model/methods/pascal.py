"""PASCAL: parent-scaled self-attention (Bugliarello & Okazaki 2020).

In the chosen heads of the first encoder layer every score of query ``i`` is multiplied
by a Gaussian centred on the middle sub-word of ``i``'s dependency parent:

    S̃_ij = S_ij · N(j − parent_mid[i]; ν)

so that, after the softmax, the head looks mostly at the parent and its neighbours while
still letting a very high score elsewhere through (the density is never 0). *Parent
ignoring* regularises against parser noise: in training, each row of each PASCAL head is
left unscaled with probability ``q``.

This module also holds the three small helpers that all the parameter-free source-side
methods (Deps-SAN, UDISCAL, SASA, SACrA) share: the normal density, the head mask and
the mask of cells between two real sub-words.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field

import torch
from torch import Tensor

from structnmt.errors import ConfigError
from structnmt.model.methods.base import (
    AttentionContext,
    AttentionPlugin,
    Method,
    MethodParams,
    Site,
    register,
)

# ---------------------------------------------------------------------------
# helpers shared by the parameter-free source-side methods


def normal_density(x: Tensor, variance: float) -> Tensor:
    """N(x; σ²) = exp(−x²/2σ²)/√(2πσ²), the weighting function of PASCAL, Deps-SAN and UDISCAL."""
    return torch.exp(-x.square() / (2.0 * variance)) / math.sqrt(2.0 * math.pi * variance)


def head_mask(heads: list[int], n_heads: int, device: torch.device) -> Tensor:
    """(1, H, 1, 1) bool, True for the heads a plug-in owns: the ``torch.where`` selector.

    Built once per (heads, device) and kept: making it anew would copy a host tensor to the
    GPU, and wait for it, in every attention call."""
    return _head_mask(tuple(heads), n_heads, torch.device(device))


@functools.lru_cache(maxsize=256)
def _head_mask(heads: tuple[int, ...], n_heads: int, device: torch.device) -> Tensor:
    mask = torch.zeros(n_heads, dtype=torch.bool)
    mask[list(heads)] = True
    return mask.view(1, n_heads, 1, 1).to(device)


def valid_pairs(valid: Tensor) -> Tensor:
    """(B, 1, I, J) bool, True where both query and key are real sub-words.

    Cells that involve EOS, BOS or padding are never changed by a method; this is the mask
    that keeps them out.
    """
    return (valid[:, :, None] & valid[:, None, :])[:, None]


def check_site(p: MethodParams, stack: str, attention: str, where: str) -> None:
    """The source-side methods read source structure: refuse a site whose rows are not source tokens."""
    if p.stack != stack:
        raise ConfigError(f"{p.name} works on the {stack} only", f"{where}.stack")
    if p.attention != attention:
        raise ConfigError(f"{p.name} works on {attention}-attention only", f"{where}.attention")


def check_range(value: float, low: float, high: float, where: str, low_open: bool = False) -> None:
    ok = (low < value if low_open else low <= value) and value <= high
    if not ok:
        raise ConfigError(f"must be in {'(' if low_open else '['}{low}, {high}], got {value}", where)


# ---------------------------------------------------------------------------
# PASCAL


@dataclass
class PascalParams(MethodParams):
    """Defaults: the paper's layer 1 and ν = 1.

    ``heads = 2``: the paper tuned 2–8 PASCAL heads of 8 per task (median 7, but 2 on the
    low-resource NC11 En→De task). In a 4-head model one head is a quarter of the layer, so
    we take the middle of the tuned range, half the heads (4 of 8 ↔ 2 of 4), and leave two
    heads free to learn whatever the parse misses.
    """

    layers: list[int] = field(default_factory=lambda: [1])
    heads: list[int] | int | str = 2
    variance: float = 1.0  # ν of the Gaussian around the parent's middle position
    parent_ignoring: float = 0.0  # q: probability that a row is left unscaled in training

    def validate(self, where: str) -> None:
        check_site(self, "encoder", "self", where)
        check_range(self.variance, 0.0, math.inf, f"{where}.variance", low_open=True)
        check_range(self.parent_ignoring, 0.0, 1.0, f"{where}.parent_ignoring")


class PascalPlugin(AttentionPlugin):
    def __init__(self, heads: list[int], variance: float, parent_ignoring: float) -> None:
        super().__init__(heads)
        self.variance = variance
        self.parent_ignoring = parent_ignoring

    def scores(self, s: Tensor, ctx: AttentionContext) -> Tensor:
        src = ctx.side("src")
        # positions in float32: bf16 cannot tell 130.5 from 130 (scores may be bf16 under autocast)
        parent = src["parent_mid"].float()  # (B, I)
        keys = torch.arange(s.size(-1), device=s.device, dtype=torch.float32)
        weight = normal_density(keys[None, None, :] - parent[:, :, None], self.variance).to(s.dtype)  # (B, I, J)
        # Rows of real sub-words are scaled over every key, EOS included: PASCAL's Gaussian is
        # positional, and an unscaled EOS column would otherwise out-score every scaled key.
        # Rows of EOS/padding stay as they are; padding keys are masked after this hook.
        apply = src["valid"][:, None, :, None] & head_mask(self.heads, s.size(1), s.device)
        if ctx.training and self.parent_ignoring > 0.0:
            b, h, i, _ = s.shape
            ignored = torch.rand(b, h, i, 1, device=s.device) < self.parent_ignoring
            apply = apply & ~ignored
        return torch.where(apply, s * weight[:, None], s)


@register("pascal")
class Pascal(Method):
    Params = PascalParams
    needs = {"src": ("parent_mid",)}
    needs_at_inference = {"src": ("parent_mid",)}

    def make_plugin(self, site: Site) -> AttentionPlugin:
        p: PascalParams = self.p  # type: ignore[assignment]
        return PascalPlugin(self.head_list(), p.variance, p.parent_ignoring)
