"""Checkpoints that are atomic, self-checking and enough to rebuild the model.

File layout (one file, so one atomic rename publishes it)::

    STRUCTNMT-CHECKPOINT 1\\n
    {"sha256": ..., "length": ..., "step": ..., "kind": ...}\\n
    <torch.save payload of ``length`` bytes>

The header's checksum covers the payload, so a flipped byte or a truncated copy is caught
before unpickling, and ``newest_good_checkpoint`` can pick a resume point by the step in
the header without loading anything big. Payloads are loaded with ``weights_only=True``: a
checkpoint holds tensors and plain Python values only (no pickled objects), so opening one
from elsewhere cannot run code.

A checkpoint ``state`` is a dict; the trainer stores ``model``, ``optimizer``, ``scheduler``,
``scaler``, ``rng``, ``progress``, ``config`` (the resolved config as a dict) and ``vocab``
(``src_vocab_size``, ``tgt_vocab_size``, ``fingerprint`` of the dataset's vocabularies).
"""

from __future__ import annotations

import errno
import hashlib
import io
import json
import os
from pathlib import Path
from typing import Any

import torch

from structnmt.errors import CheckpointError
from structnmt.io import atomic_write_bytes

MAGIC = b"STRUCTNMT-CHECKPOINT 1\n"
_MAX_HEADER = 4096


def save_checkpoint(path: str | Path, state: dict[str, Any]) -> Path:
    """Write ``state`` atomically with its checksum; never publishes non-finite weights.

    On a full disk the temporary file is removed, the previous file at ``path`` stays as it
    was, and a :class:`CheckpointError` says so.
    """
    path = Path(path)
    model = state.get("model")
    if isinstance(model, dict):
        bad = [k for k, v in model.items() if torch.is_tensor(v) and v.is_floating_point()
               and not bool(torch.isfinite(v).all())]
        if bad:
            raise CheckpointError(f"{path}: refusing to save non-finite weights ({', '.join(bad[:3])} ...)")
    buffer = io.BytesIO()
    torch.save(state, buffer)
    payload = buffer.getvalue()
    header = {
        "sha256": hashlib.sha256(payload).hexdigest(),
        "length": len(payload),
        "step": int(state.get("progress", {}).get("step", 0)),
        # weights only (``average``): a model to translate with, not a point to resume training from
        "kind": "training" if "optimizer" in state else "model",
    }
    blob = MAGIC + json.dumps(header).encode("ascii") + b"\n" + payload
    try:
        atomic_write_bytes(path, blob)
    except OSError as err:
        if err.errno == errno.ENOSPC:
            raise CheckpointError(
                f"{path}: no space left on the device while saving the checkpoint; "
                "the previous checkpoint there (if any) is intact"
            ) from None
        raise CheckpointError(f"{path}: cannot write the checkpoint ({err.strerror or err})") from None
    return path


def read_header(path: str | Path) -> tuple[dict[str, Any], int]:
    """The header and the byte offset where the payload starts; checks the magic only."""
    path = Path(path)
    try:
        with open(path, "rb") as handle:
            head = handle.read(len(MAGIC) + _MAX_HEADER)
    except FileNotFoundError:
        raise CheckpointError(f"{path}: checkpoint not found") from None
    except OSError as err:
        raise CheckpointError(f"{path}: cannot read the checkpoint ({err.strerror or err})") from None
    if not head.startswith(MAGIC):
        raise CheckpointError(f"{path}: not a structnmt checkpoint (no structnmt header)")
    end = head.find(b"\n", len(MAGIC))
    try:
        header = json.loads(head[len(MAGIC):end].decode("ascii")) if end > 0 else None
    except (UnicodeDecodeError, json.JSONDecodeError):
        header = None
    if not isinstance(header, dict) or not {"sha256", "length"} <= set(header):
        raise CheckpointError(f"{path}: not a structnmt checkpoint (damaged header)")
    return header, end + 1


def verify_checkpoint(path: str | Path) -> dict[str, Any]:
    """Check length and checksum; returns the header. Raises :class:`CheckpointError`."""
    path = Path(path)
    header, start = read_header(path)
    size = path.stat().st_size - start
    if size < header["length"]:
        raise CheckpointError(f"{path}: truncated checkpoint ({size} of {header['length']} payload bytes)")
    if size > header["length"]:
        raise CheckpointError(f"{path}: checksum mismatch (trailing bytes after the payload)")
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        handle.seek(start)
        while block := handle.read(1 << 20):
            digest.update(block)
    if digest.hexdigest() != header["sha256"]:
        raise CheckpointError(f"{path}: checksum mismatch (the file is corrupt)")
    return header


def load_checkpoint(path: str | Path, map_location: str | torch.device = "cpu") -> dict[str, Any]:
    """Verify and load a checkpoint written by :func:`save_checkpoint`."""
    path = Path(path)
    _, start = read_header(path)
    verify_checkpoint(path)
    with open(path, "rb") as handle:
        handle.seek(start)
        payload = handle.read()
    try:
        state = torch.load(io.BytesIO(payload), map_location=map_location, weights_only=True)
    except Exception as err:  # checksum was right, so this is a version or writer problem
        raise CheckpointError(f"{path}: checkpoint payload cannot be loaded ({err})") from None
    if not isinstance(state, dict):
        raise CheckpointError(f"{path}: not a structnmt checkpoint (payload is not a dict)")
    return state


def newest_good_checkpoint(directory: str | Path, damaged: list[tuple[Path, str]] | None = None,
                           resumable: bool = False) -> Path | None:
    """The verified checkpoint with the highest step in ``directory`` (``last.pt`` wins ties).

    Used by ``--resume``: when ``last.pt`` was damaged (a copy cut short, a bad disk) the run
    continues from the newest step checkpoint that still verifies instead of failing. Each
    checkpoint that does not verify is appended to ``damaged`` with the reason, so that the
    caller can say why it fell back. With ``resumable`` a checkpoint of weights only (``average
    --out RUN/last.pt``) is passed over the same way: it has no optimiser state to resume.
    """
    directory = Path(directory)
    if not directory.is_dir():
        return None
    found: list[tuple[int, int, Path]] = []
    for path in sorted(directory.glob("*.pt")):
        try:
            header = verify_checkpoint(path)
        except CheckpointError as err:
            if damaged is not None:
                damaged.append((path, str(err)))
            continue
        if resumable and header.get("kind") == "model":
            if damaged is not None:
                damaged.append((path, f"{path}: holds model weights only (averaged or exported), no optimiser "
                                      "state to resume"))
            continue
        preference = {"last.pt": 2, "best.pt": 0}.get(path.name, 1)
        found.append((int(header.get("step", 0)), preference, path))
    if not found:
        return None
    return max(found, key=lambda item: (item[0], item[1]))[2]


def average_checkpoints(paths: list[str | Path], across_runs: bool = False) -> dict[str, torch.Tensor]:
    """Parameter-wise mean of the models in ``paths`` (Vaswani et al. average the last few).

    Floating tensors are averaged in float64 and cast back; integer buffers (counters) are
    taken from the last checkpoint. Models with different parameter names or shapes are
    refused: their mean means nothing. So are checkpoints of different runs unless
    ``across_runs`` (:func:`_refuse_other_run`).
    """
    if not paths:
        raise CheckpointError("no checkpoints to average")
    total: dict[str, torch.Tensor] = {}
    reference: dict[str, torch.Tensor] = {}
    first = Path(paths[0])
    first_state: dict[str, Any] = {}
    for i, path in enumerate(paths):
        state = load_checkpoint(path)
        if not isinstance(state.get("model"), dict):
            raise CheckpointError(f"{path}: not a model checkpoint (no model weights)")
        model = state["model"]
        if i == 0:
            first_state = state
            reference = model
            total = {k: v.double().clone() if v.is_floating_point() else v.clone() for k, v in model.items()}
            continue
        _refuse_other_origin(Path(path), state, first, first_state)
        if not across_runs:
            _refuse_other_run(Path(path), state, first, first_state)
        if set(model) != set(reference):
            diff = sorted(set(model) ^ set(reference))
            raise CheckpointError(
                f"{path}: different architecture from {first} (parameters differ: {', '.join(diff[:3])})"
            )
        for name, value in model.items():
            if value.shape != reference[name].shape:
                raise CheckpointError(
                    f"{path}: different architecture from {first} ({name} has shape {tuple(value.shape)}, "
                    f"not {tuple(reference[name].shape)})"
                )
            if value.is_floating_point():
                total[name] += value.double()
            else:
                total[name] = value.clone()
    n = len(paths)
    return {k: (v / n).to(reference[k].dtype) if v.is_floating_point() else v for k, v in total.items()}


#: model fields that change training, not the weights' meaning: averaging across them is fine
_MODEL_FIELDS_WITHOUT_EFFECT = ("model.dropout", "model.attention_dropout", "model.activation_dropout",
                                "model.attention_kernel")


def _refuse_other_origin(path: Path, state: dict[str, Any], first: Path, first_state: dict[str, Any]) -> None:
    """Checkpoints of other vocabularies, datasets or model configs may have the same shapes, but
    their mean means nothing (the same row stands for another piece): refuse, naming what differs."""
    from structnmt.config import DATA_FIELDS_WITHOUT_EFFECT, config_differences

    mine, theirs = state.get("vocab") or {}, first_state.get("vocab") or {}
    if mine.get("fingerprint") != theirs.get("fingerprint"):
        raise CheckpointError(f"{path}: trained on another vocabulary than {first} (fingerprint "
                              f"{str(mine.get('fingerprint'))[:12]}, not {str(theirs.get('fingerprint'))[:12]}); "
                              "average checkpoints of one run")
    config, first_config = state.get("config") or {}, first_state.get("config") or {}
    for section, ignore in (("data", DATA_FIELDS_WITHOUT_EFFECT), ("model", _MODEL_FIELDS_WITHOUT_EFFECT)):
        differ = config_differences(first_config.get(section) or {}, config.get(section) or {}, section, ignore)
        if differ:
            shown = "; ".join(f"{k}: {b!r} here, {a!r} in {first.name}" for k, a, b in differ[:3])
            what = "dataset" if section == "data" else "model config"
            raise CheckpointError(f"{path}: another {what} than {first} ({shown}); average checkpoints of one run")


def run_identity(state: dict[str, Any]) -> tuple[Any, str | None]:
    """What tells one run from another: its ``training.seed`` and ``training.out_dir`` as stored.

    Every checkpoint of a run carries the run's resolved config, and these two fields do not
    change along it (a resume continues in the same ``out_dir`` with the run's config), whereas
    budget fields (``max_steps``, ``max_minutes``, threads) may. Two runs of one recipe differ in
    one of them: seeds of a study differ in both, and a second run into one ``out_dir`` is
    refused by ``train`` (``last.pt`` is there), so it needs another ``out_dir``. The path is
    compared as written (normalised: ``./runs/x`` is ``runs/x``), not resolved: the run may
    have been moved since.
    """
    training = (state.get("config") or {}).get("training") or {}
    out_dir = training.get("out_dir")
    return training.get("seed"), os.path.normpath(out_dir) if isinstance(out_dir, str) and out_dir else None


def _refuse_other_run(path: Path, state: dict[str, Any], first: Path, first_state: dict[str, Any]) -> None:
    """Two runs of one config (seeds 1 and 2) have the same shapes and origin, but their units are
    not aligned (a hidden unit of one is another unit's twin, or none, in the other): the mean
    of their weights is a much worse model than either. Refuse, naming what differs."""
    (seed, out_dir), (first_seed, first_out) = run_identity(state), run_identity(first_state)
    differ = [f"training.{name}: {here!r} here, {there!r} in {first.name}"
              for name, here, there in (("seed", seed, first_seed), ("out_dir", out_dir, first_out))
              if here != there]
    if differ:
        raise CheckpointError(f"{path}: another run than {first} ({'; '.join(differ)}); averaging the weights of "
                              "two runs gives a worse model than either: average checkpoints of one run, or "
                              "pass --across-runs (across_runs=True) to do it anyway")


def write_averaged_checkpoint(paths: list[str | Path], out: str | Path, across_runs: bool = False) -> Path:
    """Save the average of ``paths`` as a model-only checkpoint that ``load_model`` reads."""
    averaged = average_checkpoints(paths, across_runs)
    last = load_checkpoint(paths[-1])
    state = {
        "model": averaged,
        "config": last.get("config"),
        "vocab": last.get("vocab"),
        "progress": dict(last.get("progress", {})),
        "averaged_from": [str(p) for p in paths],
    }
    return save_checkpoint(out, state)


def dataset_fingerprint(dataset_dir: str | Path) -> str:
    """A hash of what fixes the meaning of the ids: the sub-word models and the label list.

    Splits and their statistics are left out on purpose: a model trained on one dataset may
    translate another split (or a re-prepared test set) built with the same vocabularies.
    """
    directory = Path(dataset_dir)
    digest = hashlib.sha256()
    models = sorted(directory.glob("spm*.model"))
    for path in models:
        digest.update(path.name.encode())
        digest.update(path.read_bytes())
    meta_path = directory / "meta.json"
    if meta_path.exists():
        try:
            meta = json.loads(meta_path.read_text(encoding="utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as err:
            raise CheckpointError(f"{meta_path}: cannot read the dataset description ({err})") from None
        labels = meta.get("labels") if isinstance(meta, dict) else None
        digest.update(json.dumps(labels, sort_keys=True).encode())
        if not models and isinstance(meta, dict):
            digest.update(json.dumps(meta.get("vocab"), sort_keys=True).encode())
    elif not models:
        raise CheckpointError(f"{directory}: no dataset here (no meta.json or spm*.model)")
    return digest.hexdigest()


def load_model(path: str | Path, device: str | torch.device = "cpu",
               dataset_dir: str | Path | None = None) -> tuple[torch.nn.Module, Any, dict[str, Any]]:
    """Rebuild the Transformer of a checkpoint: ``(model in eval mode, ExperimentConfig, info)``.

    With ``dataset_dir`` the dataset's vocabulary fingerprint must equal the one stored at
    training time; ids from another vocabulary would translate into nonsense silently.
    ``info`` holds ``step``, ``epoch``, ``vocab`` and the checkpoint's path.
    """
    from structnmt.config import config_from_dict
    from structnmt.errors import ConfigError
    from structnmt.model.transformer import Transformer

    path = Path(path)
    state = load_checkpoint(path, map_location="cpu")
    if "model" not in state or "config" not in state or "vocab" not in state:
        raise CheckpointError(f"{path}: not a model checkpoint (needs model, config and vocab entries)")
    try:
        cfg = config_from_dict(state["config"])
    except ConfigError as err:
        raise CheckpointError(f"{path}: the stored config cannot be read here ({err})") from None
    vocab = state["vocab"]
    if dataset_dir is not None:
        current = dataset_fingerprint(dataset_dir)
        stored = vocab.get("fingerprint")
        if stored != current:
            raise CheckpointError(
                f"{path}: trained with vocabulary fingerprint {str(stored)[:12]} but dataset {dataset_dir} "
                f"has {current[:12]}: the checkpoint and the dataset do not belong together"
            )
    model = Transformer(cfg.model, int(vocab["src_vocab_size"]), int(vocab["tgt_vocab_size"]))
    own = model.state_dict()
    wrong = [k for k, v in state["model"].items() if k in own and tuple(v.shape) != tuple(own[k].shape)]
    if wrong:
        raise CheckpointError(
            f"{path}: weights do not fit the model its config describes ({wrong[0]}: "
            f"{tuple(state['model'][wrong[0]].shape)} stored, {tuple(own[wrong[0]].shape)} expected)"
        )
    missing, unexpected = model.load_state_dict(state["model"], strict=False)
    if missing or unexpected:
        raise CheckpointError(
            f"{path}: weights do not fit the model its config describes "
            f"(missing: {', '.join(missing[:3]) or '-'}; unexpected: {', '.join(unexpected[:3]) or '-'})"
        )
    model.to(device).eval()
    progress = state.get("progress", {})
    info = {
        "path": str(path),
        "step": int(progress.get("step", 0)),
        "epoch": int(progress.get("epoch", 0)),
        "vocab": dict(vocab),
        "averaged_from": state.get("averaged_from"),
    }
    for value in state["model"].values():
        if torch.is_tensor(value) and value.is_floating_point() and not bool(torch.isfinite(value).all()):
            raise CheckpointError(f"{path}: the checkpoint holds non-finite weights")
    return model, cfg, info
