"""Training curves of several runs on one figure: train loss, valid loss and valid BLEU by step."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from structnmt.errors import DataError
from structnmt.evaluation.report import read_log_numbered
from structnmt.visualisation.attention import DPI, figure_format, new_figure, save_figure

PANELS = (("train", "loss", "train loss"), ("valid", "loss", "valid loss"), ("valid", "bleu", "valid BLEU"))
#: how the training logger writes a non-finite value (JSON has none): a diverged step, still a number
_NON_FINITE = frozenset({"nan", "inf", "-inf"})

#: a record of a log with the 1-based line it was read from
Numbered = tuple[int, dict[str, Any]]


def _number(record: dict[str, Any], key: str, log: Path, line: int) -> float | None:
    """``record[key]`` as a number; None when absent or null (not measured). Anything else is
    refused naming the file and line: it used to be left out of the picture without a word."""
    value = record.get(key)
    if value is None:
        return None
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    if isinstance(value, str) and value.strip().lower() in _NON_FINITE:
        return float(value)
    raise DataError(f"{key!r} of this {record.get('kind')} record is {value!r}, not a number", log, line)


def _series(records: Sequence[Numbered], kind: str, key: str, log: Path) -> tuple[list[float], list[float]]:
    steps, values = [], []
    for line, record in records:
        if record.get("kind") != kind:
            continue
        step, value = _number(record, "step", log, line), _number(record, key, log, line)
        if step is not None and value is not None:
            steps.append(step)
            values.append(value)
    return steps, values


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
    figure_format(out)  # a name that cannot be written is refused before the logs are read
    items = list(runs.items()) if isinstance(runs, Mapping) else [(Path(r).name, r) for r in runs]
    if not items:
        raise ValueError("no runs to plot")
    fig = new_figure(figsize, dpi)
    axes = [fig.add_subplot(1, 3, k + 1) for k in range(3)]
    drawn = 0
    for colour, (label, where) in enumerate(items):
        path = Path(where)
        log = path / "log.jsonl" if path.is_dir() else path
        if not path.exists():
            raise DataError("no such run folder or log file", path)
        if not log.exists():
            raise DataError("no training log here (a run folder holds log.jsonl once training has begun)", log)
        records = read_log_numbered(log)
        for ax, (kind, key, _) in zip(axes, PANELS):
            steps, values = _series(records, kind, key, log)
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
    return save_figure(fig, out)
