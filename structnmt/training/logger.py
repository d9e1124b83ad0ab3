"""Where training reports go: ``RUN/log.jsonl``, TensorBoard and a tqdm progress bar.

``log.jsonl`` is the record the plotting and report code reads: one JSON object per line,
``{"kind": "train" | "valid" | "event", "step": ..., "epoch": ..., ...}``. It is appended to
(a resumed run continues the same file) and flushed after each line, so a killed run loses
at most the line being written; readers skip a torn last line.
"""

from __future__ import annotations

import json
import math
import sys
import warnings
from pathlib import Path
from typing import Any

from tqdm import tqdm


def _clean(value: Any) -> Any:
    """JSON has no NaN/inf: write them as strings so a bad step is still on record."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    return value


class RunLogger:
    """Writes on the main process only; every other rank gets a silent logger."""

    def __init__(self, run_dir: str | Path, enabled: bool = True, tensorboard: bool = True,
                 progress: bool = True, total_steps: int = 0, initial_step: int = 0) -> None:
        self.enabled = enabled
        self.run_dir = Path(run_dir)
        self._jsonl = None
        self._tb = None
        self._bar = None
        if not enabled:
            return
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self._jsonl = open(self.run_dir / "log.jsonl", "a", encoding="utf-8")
        if tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter

                self._tb = SummaryWriter(log_dir=str(self.run_dir / "tensorboard"))
            except ImportError as err:  # tensorboard is a dependency, but keep training without it
                warnings.warn(f"TensorBoard logging is off: {err}", stacklevel=2)
        if progress and sys.stderr.isatty():
            self._bar = tqdm(total=total_steps or None, initial=initial_step, unit="step",
                             dynamic_ncols=True, leave=False)

    def log(self, kind: str, record: dict[str, Any]) -> None:
        if not self.enabled:
            return
        line = {"kind": kind, **{k: _clean(v) for k, v in record.items()}}
        assert self._jsonl is not None
        self._jsonl.write(json.dumps(line, ensure_ascii=False) + "\n")
        self._jsonl.flush()
        if self._tb is not None and "step" in record:
            for key, value in record.items():
                if key not in ("step", "epoch") and isinstance(value, (int, float)) and math.isfinite(value):
                    self._tb.add_scalar(f"{kind}/{key}", value, record["step"])
        if kind == "valid":
            self.message(" ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}"
                                  for k, v in record.items()))

    def progress(self, steps: int = 1, **postfix: float) -> None:
        if self._bar is not None:
            self._bar.update(steps)
            if postfix:
                self._bar.set_postfix({k: f"{v:.3g}" for k, v in postfix.items()}, refresh=False)

    def message(self, text: str) -> None:
        """A human line on stderr (through tqdm so it does not tear the bar)."""
        if not self.enabled:
            return
        if self._bar is not None:
            self._bar.write(text, file=sys.stderr)
        else:
            print(text, file=sys.stderr, flush=True)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
        if self._tb is not None:
            self._tb.close()
        if self._jsonl is not None:
            self._jsonl.close()
        self._bar = self._tb = self._jsonl = None


def rewind_log(path: str | Path, step: int) -> int:
    """Before a resume from ``step``: move the records of later steps out of ``log.jsonl``.

    A run killed after its last checkpoint logged steps that the resumed run will train (and
    log) again; left in place, every curve and report would see those steps twice. They go
    to ``log.superseded.jsonl`` beside it, so nothing is lost. Returns how many moved.
    """
    path = Path(path)
    if not path.is_file():
        return 0
    from structnmt.io import atomic_write_text

    kept, moved = [], []
    with open(path, encoding="utf-8") as handle:
        for line in handle:
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                continue  # a torn last line
            later = isinstance(record.get("step"), int) and record["step"] > step
            (moved if later else kept).append(json.dumps(record, ensure_ascii=False) + "\n")
    if moved:
        superseded = path.with_name("log.superseded.jsonl")
        with open(superseded, "a", encoding="utf-8") as handle:
            handle.writelines(moved)
    atomic_write_text(path, "".join(kept))
    return len(moved)


def read_log(path: str | Path) -> list[dict[str, Any]]:
    """Records of a ``log.jsonl``; a torn last line (killed run) is skipped."""
    records = []
    with open(path, encoding="utf-8") as handle:
        for line in handle:
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError:
                continue
    return records
