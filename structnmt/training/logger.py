"""Where training reports go: ``RUN/log.jsonl``, TensorBoard, a tqdm progress bar, and the
run's own record (``config.yaml``, ``run.json``).

``log.jsonl`` is the record the plotting and report code reads: one JSON object per line,
``{"kind": "train" | "valid" | "event", "step": ..., "epoch": ..., ...}``. It is appended to
(a resumed run continues the same file) and flushed after each line, so a killed run loses
at most the line being written; readers skip a torn last line.
"""

from __future__ import annotations

import json
import math
import platform
import sys
import time
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tqdm import tqdm

if TYPE_CHECKING:
    from structnmt.config import ExperimentConfig
    from structnmt.training.updater import UpdateStats


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
        from structnmt.training.cpu import StallWatch

        self._stall = StallWatch()  # says when the update rate collapses (busy cores) and what to do
        if progress and sys.stderr.isatty():
            self._bar = tqdm(total=total_steps or None, initial=initial_step, unit="step",
                             dynamic_ncols=True, leave=False)

    def log(self, kind: str, record: dict[str, Any], best_of: str | None = None) -> None:
        """One record to log.jsonl and TensorBoard; a validation's also as a line on stderr, with
        ``best`` printed as the metric it is the best of (``best_of``: "bleu" or "loss")."""
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
        if kind == "train" and "step" in record and "elapsed_s" in record:
            warning = self._stall.add(int(record["step"]), float(record["elapsed_s"]))
            if warning:
                self.message(f"warning: {warning}")
        if kind == "valid":
            self._stall.restart()  # a validation is a pause, not a slow stretch
            # BLEU in points with two decimals (sacreBLEU's own), never 3.444e-68 from an early model
            points = {"bleu", "best"} if best_of == "bleu" else {"bleu"}
            self.message(" ".join(f"{k}={v:.2f}" if isinstance(v, float) and k in points else
                                  f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}"
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


class TrainWindow:
    """The updates since the last ``train`` record: token-weighted sums of the losses, the
    tokens, the skipped updates, and the rate and gradient norm of the latest update."""

    def __init__(self) -> None:
        self.sums: dict[str, float] = {}
        self.started = time.monotonic()

    def __bool__(self) -> bool:
        return bool(self.sums)

    def add(self, stats: UpdateStats) -> None:
        w = self.sums
        w["updates"] = w.get("updates", 0) + 1
        w["skipped"] = w.get("skipped", 0) + (0 if stats.applied else 1)
        w["tokens"] = w.get("tokens", 0) + stats.tokens
        if math.isfinite(stats.loss):
            w["loss_sum"] = w.get("loss_sum", 0.0) + stats.loss * stats.tokens
            w["nll_sum"] = w.get("nll_sum", 0.0) + stats.nll * stats.tokens
            w["good_tokens"] = w.get("good_tokens", 0) + stats.tokens
            for name, value in stats.aux.items():
                w[f"aux:{name}"] = w.get(f"aux:{name}", 0.0) + value * stats.tokens
        w["lr"] = stats.lr
        w["grad_norm"] = stats.grad_norm

    def record(self, step: int, epoch: int) -> dict[str, Any]:
        """The ``train`` record: losses per target token of the updates that had a finite loss."""
        w = self.sums
        seconds = time.monotonic() - self.started
        good = max(w.get("good_tokens", 0), 1)
        record = {
            "step": step,
            "epoch": epoch,
            "loss": w.get("loss_sum", float("nan")) / good,
            "nll": w.get("nll_sum", float("nan")) / good,
            "lr": w["lr"],
            "grad_norm": w["grad_norm"],
            "tgt_tokens_per_s": w["tokens"] / max(seconds, 1e-9),
            "skipped": int(w["skipped"]),
        }
        for key, value in w.items():
            if key.startswith("aux:"):
                record[key[4:]] = value / good
        return record


def _version(package: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(package)
    except PackageNotFoundError:
        return "-"


def dataset_parsers(cfg: ExperimentConfig) -> dict[str, Any] | None:
    """Which parser made the trees of the run's dataset (as its meta.json records it)."""
    meta_file = Path(cfg.data.dir) / "meta.json" if cfg.data is not None else None
    if meta_file is None or not meta_file.is_file():
        return None
    return json.loads(meta_file.read_text(encoding="utf-8")).get("parsers")


def _command(run_dir: Path) -> list[str]:
    """The command line that trained the run: ``structnmt``'s own when it was that, else (a script,
    a notebook, a study's run) the one that trains it again from the config written beside it."""
    entry = Path(sys.argv[0]) if sys.argv and sys.argv[0] else Path()
    if entry.name == "structnmt" or entry.parts[-3:] == ("structnmt", "cli", "main.py"):
        return list(sys.argv)
    return ["structnmt", "train", str(run_dir / "config.yaml")]


def write_run_files(run_dir: Path, cfg: ExperimentConfig, parameters: int, device: str, world_size: int,
                    precision: str, resumed_from: Path | None) -> None:
    """``config.yaml`` (the resolved config) and ``run.json`` (command, versions, sizes, where it ran)."""
    import torch

    import structnmt
    from structnmt.config import dump_yaml, to_dict
    from structnmt.io import atomic_write_text

    raw = to_dict(cfg)
    raw.pop("path", None)
    atomic_write_text(run_dir / "config.yaml", dump_yaml(raw))
    info = {
        "command": _command(run_dir),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "structnmt": structnmt.__version__,
        "sacrebleu": _version("sacrebleu"),
        "parameters": parameters,
        "dataset": cfg.data.dir if cfg.data is not None else None,
        "parsers": dataset_parsers(cfg),
        "methods": [m.name for m in cfg.model.methods],
        "device": device,
        "world_size": world_size,
        "precision": precision,
        "config_file": cfg.path,
        "resumed_from": str(resumed_from) if resumed_from else None,
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    atomic_write_text(run_dir / "run.json", json.dumps(info, indent=2) + "\n")
