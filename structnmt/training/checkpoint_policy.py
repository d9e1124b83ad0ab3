"""Which checkpoints a run writes, and which one a resume starts from.

* Saving writes ``step_N.pt`` (the newest ``training.keep_last`` are kept) and makes
  ``last.pt`` and, on a validation improvement, ``best.pt`` hard links to it: one
  serialisation, each name replaced atomically. Non-finite weights are never written.
* Resuming starts from the newest checkpoint that still verifies, saying so when it falls
  back past a damaged one; a run directory that already holds a run is not overwritten
  unless a resume was asked for; a checkpoint of another model or of a dataset with other
  vocabularies is refused in one line.

File format, checksums and atomic writes are :mod:`structnmt.training.checkpoint`'s.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import torch
from torch import nn

from structnmt.config import ExperimentConfig, config_differences, to_dict
from structnmt.errors import CheckpointError, ConfigError
from structnmt.training.checkpoint import newest_good_checkpoint, save_checkpoint


def weights_finite(model: nn.Module) -> bool:
    """False if any floating-point weight is NaN or infinite (such a model is never saved)."""
    return all(bool(torch.isfinite(v).all()) for v in model.state_dict().values() if v.is_floating_point())


def write_checkpoints(run_dir: Path, state: dict[str, Any], step: int, keep_last: int, best: bool) -> Path:
    """Write step_N.pt (when kept), last.pt and maybe best.pt; one serialisation, hard links."""
    keep = keep_last > 0
    first = run_dir / (f"step_{step}.pt" if keep else "last.pt")
    save_checkpoint(first, state)
    targets = ([run_dir / "last.pt"] if keep else []) + ([run_dir / "best.pt"] if best else [])
    for target in targets:
        publish_copy(first, target)
    if keep:
        steps = sorted(run_dir.glob("step_*.pt"), key=lambda p: int(p.stem.split("_")[1]))
        for old in steps[:-keep_last]:
            old.unlink(missing_ok=True)
    return run_dir / "last.pt"


def publish_copy(source: Path, target: Path) -> None:
    """Make ``target`` a copy of ``source`` atomically (a hard link where the file system allows)."""
    tmp = target.with_name(f".{target.name}.link.tmp")
    tmp.unlink(missing_ok=True)
    try:
        os.link(source, tmp)
    except OSError:
        shutil.copyfile(source, tmp)
    os.replace(tmp, target)


def resume_point(run_dir: Path, resume: bool) -> tuple[Path | None, str | None]:
    """(the checkpoint to resume from or None, a message when it falls back past damaged ones).

    Without ``resume`` a run directory that holds a run is refused rather than overwritten."""
    start = None
    fallback: str | None = None
    if resume:
        damaged: list[tuple[Path, str]] = []
        start = newest_good_checkpoint(run_dir, damaged, resumable=True)
        if start is None and any(run_dir.glob("*.pt")):
            reasons = "; ".join(reason for _, reason in damaged[:3])
            raise CheckpointError(f"{run_dir}: no checkpoint there can be resumed from ({reasons}); cannot resume")
        skipped = [(p, r) for p, r in damaged if p.name == "last.pt" or p.name.startswith("step_")]
        if start is not None and skipped:
            fallback = (f"not resuming from {', '.join(p.name for p, _ in skipped)}: "
                        f"{'; '.join(r for _, r in skipped)}; falling back to {start.name}")
    elif (run_dir / "last.pt").exists():
        raise ConfigError(f"{run_dir} already holds a run (last.pt); pass --resume to continue it "
                          "or choose another out_dir", "training.out_dir")
    return start, fallback


#: training fields that change what a resumed run learns from the next update on
RESUMED_FIELDS = ("lr", "warmup", "betas", "eps", "weight_decay", "clip_norm", "label_smoothing", "max_tokens",
                  "accumulate", "precision")


def resume_changes(state: dict[str, Any], cfg: ExperimentConfig) -> str | None:
    """A warning naming the training fields that differ from the checkpoint's config (they apply
    from the next update: the run no longer follows one config), or None."""
    old = (state.get("config") or {}).get("training") or {}
    now = to_dict(cfg)["training"]
    changed = [f"training.{k}: {old[k]!r} -> {now[k]!r}" for k in RESUMED_FIELDS if k in old and old[k] != now[k]]
    if old.get("seed", cfg.training.seed) != cfg.training.seed:
        changed.append(f"training.seed: {old['seed']!r} -> {cfg.training.seed!r} (no effect: the random state "
                       "is the checkpoint's)")
    if not changed:
        return None
    return (f"warning: resuming with training fields changed since the checkpoint ({'; '.join(changed)}); "
            "they apply from the next update")


def check_resumable(path: Path, state: dict[str, Any], cfg: ExperimentConfig, vocab: dict[str, Any]) -> None:
    """Refuse, in one line, a checkpoint of another model or another dataset."""
    stored = (state.get("vocab") or {}).get("fingerprint")
    current = vocab.get("fingerprint")
    if stored and current and stored != current:
        raise CheckpointError(
            f"{path}: made on a dataset with vocabulary fingerprint {stored[:12]}, but "
            f"{cfg.data.dir if cfg.data else 'the dataset'} now has {current[:12]} "
            "(re-prepared or another dataset): its embeddings would stand for other pieces; "
            "train a new run instead of resuming")
    raw = state.get("config") or {}
    now = to_dict(cfg)
    differ = config_differences(raw.get("model") or {}, now.get("model") or {}, "model")
    if differ:
        shown = "; ".join(f"{k}: {a!r} in the checkpoint, {b!r} now" for k, a, b in differ[:4])
        more = f" (+{len(differ) - 4} more)" if len(differ) > 4 else ""
        raise CheckpointError(f"{path}: the model changed since this checkpoint ({shown}{more}); "
                              "resume with the run's own config.yaml or start a new run")
