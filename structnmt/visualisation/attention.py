"""Attention heat maps with the structure that guided them drawn on top.

The matrix is drawn with one row per query token and one column per key token; above it, a
strip shows the dependency arcs among the column tokens (curves from head to dependent, an
arrow tip at the dependent) or the scenes (one coloured band per scene over its members), so
one can see at a glance whether a head follows the tree.

All figures are drawn on a bare :class:`matplotlib.figure.Figure` with the Agg canvas (no
pyplot global state, no display needed) and written atomically in the format the output
file's extension names (``.png``, ``.pdf``, ``.svg``, ...): :func:`figure_format`.
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.patches import Arc, Rectangle

from structnmt.io import OutputError, atomic_write_bytes, check_output_path

DPI = 100
#: formats matplotlib lists that need more than matplotlib itself: pgf runs LaTeX (a traceback without it)
_NEEDS_MORE = frozenset({"pgf"})


def new_figure(figsize: tuple[float, float], dpi: int = DPI) -> Figure:
    """A figure on its own Agg canvas (safe in threads and on machines without a display)."""
    fig = Figure(figsize=figsize, dpi=dpi)
    FigureCanvasAgg(fig)
    return fig


def figure_formats() -> list[str]:
    """The picture formats a figure can be written in (file extensions, lower case)."""
    return sorted(set(FigureCanvasAgg.get_supported_filetypes()) - _NEEDS_MORE)


def figure_format(out: str | Path, argument: str = "--out") -> str:
    """The format ``out``'s extension names (``map.PDF`` -> ``pdf``). A name without an
    extension, or with one matplotlib cannot write, is refused naming ``argument``: the file's
    contents must be what its name says (it was PNG data whatever the name)."""
    suffix = Path(out).suffix.lower().removeprefix(".")
    formats = figure_formats()
    if suffix in formats:
        return suffix
    if not suffix:
        raise OutputError(f"{argument}: {out} has no extension to say the picture's format; add one of "
                          f".{', .'.join(formats)}")
    raise OutputError(f"{argument}: {out}: cannot write a .{suffix} picture; the formats are "
                      f".{', .'.join(formats)}")


def check_figure_path(out: str | Path, argument: str = "--out") -> Path:
    """A picture's output path checked before any work: that it can be written (named as every
    output path is: a directory, a device), then that its extension names a format."""
    path = check_output_path(out, argument)
    figure_format(out, argument)
    return path


def save_figure(fig: Figure, out: str | Path) -> Path:
    """Render ``fig`` in memory in the format ``out``'s extension names and write it atomically;
    a raster's pixel size is ``figsize × dpi`` exactly (no tight bounding box), so callers can
    rely on it."""
    buffer = io.BytesIO()
    fig.savefig(buffer, format=figure_format(out), dpi=fig.dpi)
    atomic_write_bytes(out, buffer.getvalue())
    return Path(out)


def _draw_arcs(ax, arcs: Sequence[tuple[int, int]], n: int) -> None:
    longest = max((abs(d - h) for d, h in arcs), default=1) or 1
    for dep, head in arcs:
        if not (0 <= dep < n and 0 <= head < n):
            raise ValueError(f"arc ({dep}, {head}) is outside the {n} column tokens")
        if dep == head:  # the root: a vertical stub
            ax.plot([dep, dep], [0, 1.0], color="black", lw=1)
            ax.text(dep, 1.02, "root", ha="center", va="bottom", fontsize=7)
            continue
        width = abs(dep - head)
        ax.add_patch(Arc(((dep + head) / 2, 0), width, 2 * width / longest * 0.95, theta1=0, theta2=180,
                         color="tab:blue", lw=1.2))
        ax.plot([dep], [0.02], marker="v", color="tab:blue", markersize=4)
    ax.set_ylim(0, 1.2)


def _draw_scenes(ax, scenes: Sequence[Sequence[int]], n: int) -> None:
    colours = [f"C{k % 10}" for k in range(len(scenes))]
    height = 1.0 / max(len(scenes), 1)
    for k, members in enumerate(scenes):
        y = k * height
        for token in members:
            if not 0 <= token < n:
                raise ValueError(f"scene {k} has token {token}, outside the {n} column tokens")
            ax.add_patch(Rectangle((token - 0.45, y + 0.1 * height), 0.9, 0.8 * height,
                                   color=colours[k], alpha=0.7))
        if members:
            ax.plot([min(members), max(members)], [y + height / 2] * 2, color=colours[k], lw=1)
            ax.text(min(members) - 0.5, y + height / 2, f"s{k + 1}", ha="right", va="center", fontsize=7)
    ax.set_ylim(0, 1)


def plot_attention(
    weights: np.ndarray,
    row_tokens: Sequence[str],
    col_tokens: Sequence[str],
    out: str | Path,
    arcs: Sequence[tuple[int, int]] | None = None,
    scenes: Sequence[Sequence[int]] | None = None,
    title: str | None = None,
    figsize: tuple[float, float] | None = None,
    dpi: int = DPI,
) -> Path:
    """Heat map of an (I × J) attention matrix, rows = queries, columns = keys.

    ``arcs`` are ``(dependent, head)`` pairs of column-token indices (a root arc has
    dependent == head); ``scenes`` lists the column tokens of each scene. Give one or the
    other (or neither). The default size grows with the number of tokens.
    """
    figure_format(out)  # a name that cannot be written is refused before the drawing
    weights = np.asarray(weights, dtype=np.float64)
    if weights.shape != (len(row_tokens), len(col_tokens)):
        raise ValueError(f"weights have shape {weights.shape} but there are {len(row_tokens)} row and "
                         f"{len(col_tokens)} column tokens")
    strip = arcs is not None or scenes is not None
    if figsize is None:
        figsize = (2.5 + 0.4 * len(col_tokens), 2.0 + 0.4 * len(row_tokens) + (1.5 if strip else 0.0))
    fig = new_figure(figsize, dpi)
    if strip:
        grid = fig.add_gridspec(2, 2, height_ratios=[1, max(len(row_tokens), 1) / 3], width_ratios=[30, 1],
                                hspace=0.02, wspace=0.05)
        top = fig.add_subplot(grid[0, 0])
        ax = fig.add_subplot(grid[1, 0], sharex=top)
        cax = fig.add_subplot(grid[1, 1])
    else:
        grid = fig.add_gridspec(1, 2, width_ratios=[30, 1], wspace=0.05)
        top = None
        ax = fig.add_subplot(grid[0, 0])
        cax = fig.add_subplot(grid[0, 1])
    image = ax.imshow(weights, cmap="viridis", aspect="auto", interpolation="nearest")
    fig.colorbar(image, cax=cax)
    ax.set_xticks(range(len(col_tokens)), labels=list(col_tokens), rotation=90, fontsize=8)
    ax.set_yticks(range(len(row_tokens)), labels=list(row_tokens), fontsize=8)
    if top is not None:
        if arcs is not None:
            _draw_arcs(top, arcs, len(col_tokens))
        if scenes is not None:
            _draw_scenes(top, scenes, len(col_tokens))
        top.set_xlim(-0.5, len(col_tokens) - 0.5)
        top.axis("off")
        if title:
            top.set_title(title)
    elif title:
        ax.set_title(title)
    fig.subplots_adjust(left=0.15, right=0.92, top=0.95, bottom=0.15)
    return save_figure(fig, out)
