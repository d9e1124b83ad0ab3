"""Training curves of several runs on one figure: train loss, valid loss and valid BLEU by step."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from structnmt.errors import DataError
from structnmt.evaluation.report import read_log
from structnmt.visualisation.attention import DPI, new_figure, save_png

PANELS = (("train", "loss", "train loss"), ("valid", "loss", "valid loss"), ("valid", "bleu", "valid BLEU"))


def _series(records: Sequence[dict[str, Any]], kind: str, key: str) -> tuple[list[float], list[float]]:
    points = [(r["step"], r[key]) for r in records
              if r.get("kind") == kind and isinstance(r.get("step"), (int, float))
              and isinstance(r.get(key), (int, float))]
    return [p[0] for p in points], [p[1] for p in points]


def plot_training_curves(
    runs: Sequence[str | Path] | Mapping[str, str | Path],
    out: str | Path,
    title: str | None = None,
    figsize: tuple[float, float] = (13.0, 4.0),
    dpi: int = DPI,
) -> Path:
    """Three panels side by side, one line per run.

    ``runs`` are run directories (their ``log.jsonl`` is read; the label is the directory
    name) or a mapping ``label -> run directory or log file``.
    """
    items = list(runs.items()) if isinstance(runs, Mapping) else [(Path(r).name, r) for r in runs]
    if not items:
        raise ValueError("no runs to plot")
    fig = new_figure(figsize, dpi)
    axes = [fig.add_subplot(1, 3, k + 1) for k in range(3)]
    drawn = 0
    for colour, (label, where) in enumerate(items):
        path = Path(where)
        log = path / "log.jsonl" if path.is_dir() else path
        if not log.exists():
            raise DataError("training log not found", log)
        records = read_log(log)
        for ax, (kind, key, _) in zip(axes, PANELS):
            steps, values = _series(records, kind, key)
            if steps:
                ax.plot(steps, values, label=label, color=f"C{colour % 10}",
                        marker="o" if kind == "valid" else None, markersize=3)
                drawn += 1
    if not drawn:
        raise DataError(f"no train or valid records in the logs of {', '.join(str(w) for _, w in items)}")
    for ax, (_, _, name) in zip(axes, PANELS):
        ax.set_title(name)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    if title:
        fig.suptitle(title)
    fig.subplots_adjust(left=0.05, right=0.98, wspace=0.25, bottom=0.15)
    return save_png(fig, out)
