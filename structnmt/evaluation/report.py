"""One Markdown results table from several experiment directories.

Each run directory holds ``run.json`` (command, versions, parameter count, method list),
``log.jsonl`` (training log) and ``eval/<testset>.{hyp,ref,src,json}``. The table has one
row per run and BLEU / chrF per test set; a dagger marks a BLEU score significantly better
than the baseline run's on the same test set, a double dagger one significantly worse
(sacreBLEU's paired bootstrap, two-sided p < 0.05, computed here from the ``.hyp``/``.ref``
files so the mark never depends on a number copied by hand). Below the table come the
commands and library versions that produced each run.
"""

from __future__ import annotations

import json
import os
import shlex
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from structnmt.errors import DataError
from structnmt.evaluation.scores import check_parallel, corpus_scores
from structnmt.evaluation.significance import paired_bootstrap
from structnmt.io import atomic_write_text

SIGNIFICANT = "†"
SIGNIFICANTLY_WORSE = "‡"
ALPHA = 0.05
VERSION_KEYS = ("python", "torch", "sacrebleu", "structnmt")


def _read_json(path: Path) -> dict[str, Any] | None:
    if not path.exists():
        return None
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise DataError(f"not valid JSON ({err})", path) from None
    if not isinstance(value, dict):
        raise DataError("expected a JSON object", path)
    return value


def read_log(path: str | Path) -> list[dict[str, Any]]:
    """The records of a ``log.jsonl`` training log (blank lines skipped)."""
    return [record for _, record in read_log_numbered(path)]


def read_log_numbered(path: str | Path) -> list[tuple[int, dict[str, Any]]]:
    """(1-based line, record) of a ``log.jsonl``, so that a bad value can be named where it is."""
    path = Path(path)
    records = []
    try:
        lines = path.read_text(encoding="utf-8").split("\n")
    except FileNotFoundError:
        raise DataError("file not found", path) from None
    except UnicodeDecodeError as err:
        raise DataError(f"not valid UTF-8 ({err.reason})", path) from None
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as err:
            raise DataError(f"not valid JSON ({err.msg})", path, number) from None
        if not isinstance(record, dict):
            raise DataError("expected a JSON object", path, number)
        records.append((number, record))
    return records


def run_names(paths: Sequence[str | Path]) -> list[str]:
    """Each run's name in tables and legends: its folder's name, with as many parent folders as
    it takes to tell apart runs of one name (``a/run``, ``b/run``); a run given twice is refused."""
    parts = [Path(os.path.abspath(p)).parts for p in paths]  # as given: a linked run keeps its link's name
    real = [Path(p).resolve() for p in paths]
    for n, path in enumerate(real):
        if path in real[:n]:
            raise DataError(f"run {paths[n]} is given more than once")
    depth = [1] * len(parts)
    while True:
        names = ["/".join(p[-d:]) for p, d in zip(parts, depth)]
        clashes = {n for n in names if names.count(n) > 1}
        if not clashes:
            return names
        for i, name in enumerate(names):
            if name in clashes:
                depth[i] += 1  # distinct real paths: their absolute parts differ somewhere


class _Run:
    """What the report needs from one run directory."""

    def __init__(self, path: Path, name: str):
        if not path.is_dir():
            raise DataError("run directory not found", path)
        self.path = path
        self.name = name
        self.info = _read_json(path / "run.json") or {}
        eval_dir = path / "eval"
        self.test_sets = sorted(p.stem for p in eval_dir.glob("*.hyp")) if eval_dir.is_dir() else []
        if not self.test_sets:
            raise DataError("no evaluation outputs (expected eval/<testset>.hyp and .ref; "
                            "run `structnmt test` first)", path)
        log = path / "log.jsonl"
        speeds = []
        if log.exists():
            speeds = [r["tgt_tokens_per_s"] for r in read_log(log)
                      if r.get("kind") == "train" and isinstance(r.get("tgt_tokens_per_s"), (int, float))]
        self.speed = sum(speeds) / len(speeds) if speeds else None
        self._texts: dict[str, tuple[list[str], list[list[str]]]] = {}

    def texts(self, test_set: str) -> tuple[list[str], list[list[str]]]:
        if test_set not in self._texts:
            base = self.path / "eval" / test_set
            self._texts[test_set] = check_parallel(base.with_suffix(".hyp"), [base.with_suffix(".ref")],
                                                   allow_empty=True)
        return self._texts[test_set]

    def scores(self, test_set: str) -> dict[str, Any]:
        """BLEU/chrF from ``eval/<t>.json`` when written, else computed from the text files."""
        stored = _read_json(self.path / "eval" / f"{test_set}.json")
        if stored and all(isinstance(stored.get(k), (int, float)) for k in ("bleu", "chrf")):
            return stored
        return corpus_scores(*self.texts(test_set), metrics=("bleu", "chrf"))

    def bleu_signature(self, test_set: str) -> str | None:
        stored = _read_json(self.path / "eval" / f"{test_set}.json") or {}
        signature = stored.get("signature")
        if isinstance(signature, dict):
            signature = signature.get("bleu")
        return str(signature) if signature else None

    @property
    def methods(self) -> str:
        method = self.info.get("methods", self.info.get("method"))  # the trainer writes "methods"
        if isinstance(method, list):
            return ", ".join(str(m) for m in method) or "transformer"
        return str(method) if method else "–"


def _format_params(n: Any) -> str:
    if not isinstance(n, (int, float)):
        return "–"
    return f"{n / 1e6:.1f}M" if n >= 1e5 else f"{int(n):,}"


def _score_rows(runs: list[_Run], base: _Run | None, test_sets: list[str], n_samples: int,
                seed: int) -> list[list[str]]:
    """The results table: header, alignment row, one row a run (BLEU marked against ``base``)."""
    header = ["Run", "Methods"]
    for t in test_sets:
        header += [f"{t} BLEU", f"{t} chrF"]
    header += ["Params", "Train tgt tok/s"]
    rows = [header, ["---"] * 2 + ["---:"] * (len(header) - 2)]
    for run in runs:
        row = [run.name + (" (baseline)" if run is base else ""), run.methods]
        for t in test_sets:
            if t not in run.test_sets:
                row += ["–", "–"]
                continue
            scores = run.scores(t)
            mark = _significance_mark(run, base, t, n_samples, seed)
            row += [f"{scores['bleu']:.2f}{mark}", f"{scores['chrf']:.2f}"]
        row += [_format_params(run.info.get("parameters")),
                f"{run.speed:,.0f}" if run.speed is not None else "–"]
        rows.append(row)
    return rows


def _significance_mark(run: _Run, base: _Run | None, test_set: str, n_samples: int, seed: int) -> str:
    """The mark of a BLEU significantly better or worse than the baseline's (paired bootstrap)."""
    if base is None or run is base or test_set not in base.test_sets:
        return ""
    hyps, refs = run.texts(test_set)
    base_hyps, base_refs = base.texts(test_set)
    if base_refs != refs:
        raise DataError(f"run {run.name} and baseline {base.name} have different references "
                        f"for test set {test_set!r}", run.path / "eval" / f"{test_set}.ref")
    result = paired_bootstrap(base_hyps, hyps, refs, n_samples=n_samples, seed=seed)
    return {"better": SIGNIFICANT, "worse": SIGNIFICANTLY_WORSE}.get(result.direction(ALPHA), "")


def _provenance_lines(runs: list[_Run]) -> list[str]:
    """Each run's command and the versions it ran with, so that a reader can rerun it."""
    lines = ["## Commands", ""]
    for run in runs:
        command = run.info.get("command", "–")
        lines.append(f"- {run.name}: `{shlex.join(command) if isinstance(command, list) else command}`")
    lines += ["", "## Versions", ""]
    lines.append("| Run | " + " | ".join(VERSION_KEYS) + " |")
    lines.append("|---" * (len(VERSION_KEYS) + 1) + "|")
    for run in runs:
        # the trainer writes the versions at the top level of run.json
        versions = run.info.get("versions") or {k: run.info[k] for k in VERSION_KEYS if k in run.info}
        lines.append(f"| {run.name} | " + " | ".join(str(versions.get(k, "–")) for k in VERSION_KEYS) + " |")
    return lines


def build_report(
    run_dirs: list[Path],
    baseline: str | None = None,
    test_sets: list[str] | None = None,
    out: Path | None = None,
    n_samples: int = 1000,
    seed: int = 12345,
) -> str:
    """The Markdown report of ``run_dirs``; written atomically to ``out`` when given.

    ``baseline`` is the name of one of the runs (its directory's name, with parent folders where
    two runs share one: :func:`run_names`); ``test_sets`` defaults to
    every test set any run has. A run missing a test set shows "–" in its cells.
    """
    if not run_dirs:
        raise DataError("no run directories given")
    runs = [_Run(Path(d), name) for d, name in zip(run_dirs, run_names(run_dirs))]
    names = [r.name for r in runs]
    by_name = dict(zip(names, runs))
    if baseline is not None and baseline not in by_name:
        raise DataError(f"baseline run {baseline!r} is not among the runs ({', '.join(names)})")
    available = sorted({t for r in runs for t in r.test_sets})
    if test_sets is None:
        test_sets = available
    for t in test_sets:
        if t not in available:
            raise DataError(f"test set {t!r} has no eval/{t}.hyp in any run (found: {', '.join(available)})")
    base = by_name.get(baseline) if baseline else None

    lines = ["# Results", ""]
    lines += ["| " + " | ".join(row) + " |" for row in _score_rows(runs, base, test_sets, n_samples, seed)]
    lines.append("")
    if base is not None:
        lines.append(f"{SIGNIFICANT} / {SIGNIFICANTLY_WORSE}: BLEU better / worse than the baseline "
                     f"({base.name}) with p < {ALPHA} (sacreBLEU paired bootstrap, two-sided, "
                     f"{n_samples} resamples, seed {seed}).")
        lines.append("")
    signatures = sorted({sig for run in runs for t in test_sets if (sig := run.bleu_signature(t))})
    if signatures:
        lines += ["BLEU signature: " + "; ".join(f"`{s}`" for s in signatures), ""]
    lines += _provenance_lines(runs)
    text = "\n".join(lines) + "\n"
    if out is not None:
        atomic_write_text(out, text)
    return text
