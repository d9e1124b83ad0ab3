"""BLEU by source-length bucket for several systems, as grouped bars (deps-san-peng Fig. 5)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from structnmt.evaluation.buckets import Bucket
from structnmt.visualisation.attention import DPI, figure_format, new_figure, save_figure


def plot_bleu_by_length(
    systems: Mapping[str, Sequence[Bucket]],
    out: str | Path,
    title: str | None = None,
    figsize: tuple[float, float] = (8.0, 4.5),
    dpi: int = DPI,
) -> Path:
    """One group of bars per length bucket, one bar per system; the x labels give each
    bucket's sentence count (all systems must share the same buckets, i.e. the same test set)."""
    figure_format(out)  # a name that cannot be written is refused before the drawing
    if not systems:
        raise ValueError("no systems to plot")
    names = list(systems)
    reference = systems[names[0]]
    for name in names[1:]:
        if [(b.low, b.high, b.n) for b in systems[name]] != [(b.low, b.high, b.n) for b in reference]:
            raise ValueError(f"system {name!r} was bucketed differently from {names[0]!r}")
    fig = new_figure(figsize, dpi)
    ax = fig.add_subplot(1, 1, 1)
    x = np.arange(len(reference))
    width = 0.8 / len(names)
    for k, name in enumerate(names):
        values = [b.bleu if b.bleu is not None else np.nan for b in systems[name]]
        ax.bar(x - 0.4 + width * (k + 0.5), values, width, label=name, color=f"C{k % 10}")
    ax.set_xticks(x, labels=[f"{b.label}\n(n={b.n})" for b in reference], fontsize=8)
    ax.set_xlabel("source length (words)")
    ax.set_ylabel("BLEU")
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize=8)
    if title:
        ax.set_title(title)
    fig.subplots_adjust(bottom=0.2)
    return save_figure(fig, out)
