"""The pictures of ``structnmt report --plots``: training curves and BLEU by source length."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path


def plot_runs(runs: Sequence[str | Path], out: str | Path, test_set: str | None = None) -> list[Path]:
    """``curves.png`` of every run and ``bleu_by_length_<set>.png`` of one test set (default:
    the first, by name, that the first run has in ``eval/``); returns the files written."""
    from structnmt.evaluation.buckets import bleu_by_length
    from structnmt.evaluation.report import run_names
    from structnmt.evaluation.scores import read_text
    from structnmt.visualisation.curves import plot_training_curves
    from structnmt.visualisation.lengths import plot_bleu_by_length

    runs = [Path(r) for r in runs]
    out = Path(out)
    names = run_names(runs)
    written = [plot_training_curves(dict(zip(names, runs)), out / "curves.png")]
    if test_set is None:
        candidates = sorted(p.stem for p in (runs[0] / "eval").glob("*.hyp"))
        test_set = candidates[0] if candidates else None
    if test_set:
        systems = {}
        for name, r in zip(names, runs):
            e = r / "eval"
            systems[name] = bleu_by_length(read_text(e / f"{test_set}.src"), read_text(e / f"{test_set}.hyp"),
                                             [read_text(e / f"{test_set}.ref")])
        written.append(plot_bleu_by_length(systems, out / f"bleu_by_length_{test_set}.png",
                                           title=f"BLEU by length: {test_set}"))
    return written
