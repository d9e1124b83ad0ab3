"""One run of a study: train (or resume) to the study's budget, test, leave a record.

A *record* is a small folder of text files, meant to be committed, that lets a study go on
on another machine without redoing the run: ``record.json`` (recipe digest, dataset
identity, seed, updates, wall time, device, every test score and its sacreBLEU signature),
``log.jsonl`` (the training curve) and ``hyps/<test set>.hyp`` (detokenised translations).
It is written into a temporary folder and renamed into place, so a record exists whole or
not at all. A run that fails leaves ``failed.json`` with the error and the last lines of its
log instead, and the study goes on with the others.

A record is current when its ``digest`` (the run's config after overrides) and the identity
of the dataset parts its model reads (sub-word model; the parser's recipe when the model
reads trees) equal today's; otherwise the run is done again and the status says why.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import socket
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

from structnmt.config import config_differences
from structnmt.data.identity import parser_recipe_identity
from structnmt.errors import StructNMTError
from structnmt.io import atomic_write_text
from structnmt.study.provenance import (
    corpora_digests,
    cpu_info,
    cpu_name,
    git_commit,
    lines_digest,
    machine,
    outside_methods,
    read_calls,
    resume_step,
    start_call,
    trees_digest,
    versions,
)
from structnmt.study.spec import Study, added_at_default, config_digest, train_view

RECORD = "record.json"
FAILED = "failed.json"
DIGEST_FILE = "study_digest.txt"  # in the work folder of a run: whose checkpoints these are
STUDY_LOCK = "study-run"  # DirectoryLock(run_dir / STUDY_LOCK): the process that owns the run
LOG_TAIL = 20

#: how the parts of a run end
DONE, FAILED_STATUS, INTERRUPTED, BUSY = "done", "failed", "interrupted", "busy"


# ---------------------------------------------------------------------------
# identity of what a run reads


def dataset_identity(cfg: Any, model_reads_trees: bool) -> dict[str, Any]:
    """The sub-word model(s) of the run's dataset and, when its model reads trees, its parsers."""
    directory = Path(cfg.data.dir)
    from structnmt.data.dataset import check_meta, read_meta

    meta = check_meta(read_meta(directory), directory)  # damaged or incomplete: named, not a traceback
    subwords = {}
    for side, info in meta["subwords"].items():
        digest = hashlib.sha256((directory / info["file"]).read_bytes()).hexdigest()
        subwords[side] = digest
    out: dict[str, Any] = {"subwords": subwords}
    if model_reads_trees:
        out["parsers"] = {side: _parser_recipe(cfg, side, meta) for side in ("src", "tgt")}
    return out


def _parser_recipe(cfg: Any, side: str, meta: dict[str, Any]) -> dict[str, Any] | None:
    """The recipe of the parser whose trees a side of the dataset holds: the one its pinned trees
    file names, as the dataset recorded it (so a machine without that parser keeps the records
    current), else the model's."""
    from structnmt.data.parsing.cache import pin_of
    from structnmt.data.prepare import cache_dir_of

    parser = getattr(cfg.data, side).parser
    if parser.backend != "spacy":
        return (meta.get("parsers") or {}).get(side)
    inputs = meta.get("inputs") or {}
    if inputs.get("trees") and ((inputs.get("parsers") or {}).get(side) or {}).get("recipe"):
        return inputs["parsers"][side]["recipe"]
    pin = pin_of(cache_dir_of(cfg.data) / side)  # a dataset prepared before meta.json kept it
    return pin["recipe"] if pin and pin.get("recipe") else parser_recipe_identity(parser.model)


def reads_trees(cfg: Any) -> bool:
    from structnmt.model.transformer import Transformer

    model = Transformer(cfg.model, 8, 8)
    needs = model.structure_needs()
    return bool(needs["src"] or needs["tgt"])


# ---------------------------------------------------------------------------
# records


def _json_damage(path: Path) -> str | None:
    """Why a JSON file that should hold an object does not (None when it does or is absent)."""
    if not path.is_file():
        return None
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as err:
        return f"not valid JSON ({str(err).split(':')[0]}; truncated?)"
    if not isinstance(value, dict):
        return f"valid JSON but a {type(value).__name__}, not an object"
    return None


def _read_json(path: Path, unreadable: dict[str, Any] | None) -> dict[str, Any] | None:
    if not path.is_file():
        return None
    if _json_damage(path) is not None:
        return unreadable
    return json.loads(path.read_text(encoding="utf-8"))


def read_checked(folder: Path, recipe: str | None = None, seed: int | None = None
                 ) -> tuple[dict[str, Any] | None, str | None]:
    """(the record in ``folder``, None); (None, why it is damaged); (None, None) when there is none.

    ``recipe`` and ``seed``: the run the folder stands for (see
    :func:`structnmt.study.schema.record_problem`, the one check every reader goes through)."""
    from structnmt.study.schema import record_problem

    path = folder / RECORD
    if not path.is_file():
        return None, None
    if (why := _json_damage(path)) is not None:
        return None, why
    record = json.loads(path.read_text(encoding="utf-8"))
    why = record_problem(record, folder, recipe, seed)
    return (None, why) if why is not None else (record, None)


def read_record(study: Study, recipe: str, seed: int) -> dict[str, Any] | None:
    """The run's record; a damaged one (see :func:`record_damage`) reads as none."""
    return read_checked(study.record_dir(recipe, seed), recipe, seed)[0]


def damage_message(path: Path, why: str) -> str:
    """A damaged record named with what to do: its folder, as a missing hypothesis file is damage too."""
    return (f"{path} is damaged: {why}; restore it from version control (git checkout -- {path.parent}), "
            f"or delete {path.parent} to run it again")


def record_damage(study: Study, recipe: str, seed: int) -> str | None:
    """What is wrong with a run's record and what to do, or None when it is whole or absent.

    A record is written whole or not at all, so a damaged one was damaged afterwards (an editor,
    a merge, a copy cut short, a hand-made record): it is named, never taken for a run not yet
    done and trained over, never read in part.
    """
    folder = study.record_dir(recipe, seed)
    _, why = read_checked(folder, recipe, seed)
    return None if why is None else damage_message(folder / RECORD, why)


def read_failure(study: Study, recipe: str, seed: int) -> dict[str, Any] | None:
    return _read_json(study.record_dir(recipe, seed) / FAILED, {"error": "unreadable failed.json"})


def clear_failure(study: Study, recipe: str, seed: int) -> None:
    """Forget a run's failure when it starts again: the new try decides its state (done,
    interrupted, failed anew), and a failed.json left from before would outlive it in --status."""
    (study.record_dir(recipe, seed) / FAILED).unlink(missing_ok=True)


def _study_of_report(path: Path) -> str | None:
    """The study a report.md was written for (its first line: ``# Study `NAME` ``)."""
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            first = handle.readline().strip()
    except OSError:
        return None
    return first[len("# Study `"):-1] if first.startswith("# Study `") and first.endswith("`") else None


def check_own_records(study: Study) -> None:
    """Refuse a records folder that holds another study's records (or report): two study files
    given the same ``records:`` would take each other's records for stale runs of their own,
    train over them and replace the other's report. Records without a study name (hand-made,
    very old) say nothing either way; adopted records carry this study's name."""
    from structnmt.errors import ConfigError

    found = [(p, (_read_json(p, None) or {}).get("study")) for p in sorted(study.records.glob(f"*/seed*/{RECORD}"))]
    found += [(p, _study_of_report(p)) for p in sorted(study.records.glob("report*.md"))]
    for path, other in found:
        if isinstance(other, str) and other != study.name:
            raise ConfigError(f"{study.records} holds the records of study {other!r} ({path}); give this study its "
                              f"own records folder (or, if this study was renamed from {other!r}, name it so again)",
                              "records", study.path)


def training_differences(cfg: Any, record: dict[str, Any]) -> list[str] | None:
    """None when ``record`` was trained from ``cfg`` (its digest, or a view that differs only in
    fields added since at their defaults); else up to three fields that differ (maybe none named)."""

    if record.get("digest") == config_digest(cfg) or added_at_default(record.get("config") or {}, train_view(cfg)):
        return None
    fields = [k for k, _, _ in config_differences(record.get("config") or {}, train_view(cfg), "config")][:3]
    return [f.removeprefix("config.") for f in fields]


def stale_reason(study: Study, recipe: str, seed: int, record: dict[str, Any]) -> str | None:
    """Why a record no longer stands for today's run, or None when it does.

    Three things decide it: the training view of the config (what the final weights depend
    on), the test view (decoding, test sets: a change re-tests the tested checkpoint when it is
    still there), and, when the dataset is on this machine, the identity of what the run reads.
    """
    cfg = study.run_config(recipe, seed)
    if (fields := training_differences(cfg, record)) is not None:
        return "recipe changed" + (f" ({', '.join(fields)})" if fields else "")
    if record.get("test") != study.test_view(cfg):
        fields = [k for k, _, _ in config_differences(record.get("test") or {}, study.test_view(cfg), "test")][:3]
        return f"testing changed ({', '.join(f.removeprefix('test.') for f in fields)})"
    if (Path(cfg.data.dir) / "meta.json").is_file():
        now = dataset_identity(cfg, bool(record.get("reads_trees")))
        if now != record.get("dataset"):
            parts = [k for k in now if now.get(k) != (record.get("dataset") or {}).get(k)]
            return f"dataset changed ({', '.join(parts)})"
    return None


_TREES: dict[str, dict[str, str] | None] = {}  # data dir -> its trees' digest, once per process


def trees_change(study: Study, recipe: str, seed: int, record: dict[str, Any]) -> str | None:
    """When the run reads trees and today's dataset holds other trees than the record's, say so.

    The parser is named by its recipe (:func:`parser_recipe_identity`), so a parser retrained on
    another machine keeps the records current, but its trees may differ in a few arcs; a rerun
    would then train on other trees. Records made before tree digests were kept are checked by
    their long-dependency subsets, which were chosen from the trees."""
    if not record.get("reads_trees"):
        return None
    data_dir = study.run_config(recipe, seed).data.dir
    if not (Path(data_dir) / "meta.json").is_file():
        return None
    advice = ("a rerun here would train on other trees (bring the parser or the dataset the record was made "
              "with, or its trees file)") if study.trees is None else \
        f"the study's trees file {study.trees.file} holds other trees: a rerun (delete the record) would read them"
    if record.get("trees"):
        if data_dir not in _TREES:
            _TREES[data_dir] = trees_digest(data_dir)
        now = _TREES[data_dir] or {}
        sides = [side for side, digest in record["trees"].items() if now.get(side) != digest]
        return f"today's trees in {data_dir} differ from the record's ({', '.join(sides)} side): {advice}" \
            if sides else None
    # older records keep no digest, but their long-dependency subsets were chosen from the trees
    threshold = (record.get("test") or {}).get("long_dependency")
    for scores in (record.get("scores") or {}).values() if isinstance(threshold, int) and threshold > 0 else ():
        if "lines" in scores and "subset_of" in scores:
            today = _long_dependency_lines(data_dir, scores["subset_of"], threshold)
            if today is not None and today != scores["lines"]:
                return (f"today's trees in {data_dir} differ from the record's (the long-dependency subset of "
                        f"{scores['subset_of']}: {len(scores['lines'])} sentences then, {len(today)} today): {advice}")
    return None


def _long_dependency_lines(data_dir: str, split: str, threshold: int) -> list[int] | None:
    """The 1-based lines of a split's long-dependency subset, chosen from today's stored source trees."""
    from structnmt.data.dataset import ParallelDataset
    from structnmt.evaluation.challenge import long_dependency_subset

    key = f"{data_dir}\0{split}\0{threshold}"
    if key not in _SUBSETS:
        _SUBSETS[key] = None
        with contextlib.suppress(StructNMTError, OSError):
            data = ParallelDataset(data_dir, split)
            if data.has("src", "heads"):
                heads = [data.side_arrays(i, "src")["heads"].tolist() for i in range(len(data))]
                places = data.scored_positions()  # as `test` numbers them: in the scored set
                _SUBSETS[key] = [places[i] + 1 for i in long_dependency_subset(heads, threshold)]
    return _SUBSETS[key]


_SUBSETS: dict[str, list[int] | None] = {}


def adoptable(study: Study, recipe: str, seed: int) -> Path | None:
    """A record of another study that stands for this run: the same training digest (so the same
    config, seed and budget), the same test view, and where the dataset is here its identity.

    Studies keep their records side by side (``studies/<name>/``); the other studies' folders
    beside this one's are searched. Adopting a record is copying it: the run is not trained twice.
    """
    cfg = study.run_config(recipe, seed)
    digest, test = config_digest(cfg), study.test_view(cfg)
    here = (Path(cfg.data.dir) / "meta.json").is_file()
    for path, record in other_records(study):
        if record.get("digest") != digest or record.get("test") != test or record.get("seed") != seed:
            continue
        if here and dataset_identity(cfg, bool(record.get("reads_trees"))) != record.get("dataset"):
            continue
        return path.parent
    return None


_OTHERS: dict[tuple[str, int, int], list[tuple[Path, dict[str, Any]]]] = {}


def other_records(study: Study) -> list[tuple[Path, dict[str, Any]]]:
    """The records of the studies kept beside this one (read once per process while their
    folder stands unchanged)."""
    root = study.records.parent
    files = sorted(root.glob(f"*/*/seed*/{RECORD}"))
    key = (str(root.resolve()), len(files), max((p.stat().st_mtime_ns for p in files), default=0))
    if key not in _OTHERS:
        own = study.records.resolve()
        found = []
        for path in files:
            if own not in path.resolve().parents:
                seed = path.parent.name.removeprefix("seed")
                record, _ = read_checked(path.parent, path.parent.parent.name, int(seed) if seed.isdigit() else None)
                if record is not None:  # a damaged record is adopted by nobody
                    found.append((path, record))
        _OTHERS[key] = found
    return _OTHERS[key]


def adopt(study: Study, recipe: str, seed: int, source: Path) -> None:
    """Copy another study's record of the same run into this study's records, saying whence."""
    from structnmt.io import replace_dir

    final = study.record_dir(recipe, seed)
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.", suffix=".tmp", dir=final.parent))
    try:
        shutil.copytree(source, tmp, dirs_exist_ok=True)
        record = json.loads((tmp / RECORD).read_text(encoding="utf-8"))
        record.update(adopted_from={"study": record.get("study"), "recipe": record.get("recipe"),
                                    "record": str(source)}, study=study.name, recipe=recipe,
                      recipe_file=study.recipe(recipe).config)
        atomic_write_text(tmp / RECORD, json.dumps(record, indent=2, ensure_ascii=False) + "\n")
        (tmp / FAILED).unlink(missing_ok=True)
        replace_dir(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    (final / FAILED).unlink(missing_ok=True)


def _tail(path: Path, n: int = LOG_TAIL) -> list[str]:
    if not path.is_file():
        return []
    with open(path, encoding="utf-8", errors="replace") as handle:
        return [line.rstrip("\n") for line in handle.readlines()[-n:]]


def _trained_threads(run_dir: Path) -> int:
    """The threads of the last call that trained the run (a resumed run notes one call each)."""
    calls = [c for c in read_calls(run_dir) if isinstance(c.get("threads"), int) and c["threads"] > 0]
    return calls[-1]["threads"] if calls else _torch_threads()


def write_failure(study: Study, recipe: str, seed: int, error: str, log: Path | None) -> None:
    record_dir = study.record_dir(recipe, seed)
    cfg_digest = None
    with contextlib.suppress(StructNMTError):
        cfg_digest = config_digest(study.run_config(recipe, seed))
    info = {"recipe": recipe, "seed": seed, "digest": cfg_digest, "error": error,
            "log_tail": _tail(log) if log else [], "when": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "host": socket.gethostname()}
    atomic_write_text(record_dir / FAILED, json.dumps(info, indent=2, ensure_ascii=False) + "\n")


def _write_record(study: Study, recipe: str, seed: int, record: dict[str, Any], hyps: dict[str, Path],
                  log: Path) -> None:
    from structnmt.io import current_umask, replace_dir

    final = study.record_dir(recipe, seed)
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.", suffix=".tmp", dir=final.parent))
    try:
        (tmp / "hyps").mkdir()
        for name, path in hyps.items():
            shutil.copyfile(path, tmp / "hyps" / f"{name}.hyp")
        if log.is_file():
            shutil.copyfile(log, tmp / "log.jsonl")
        atomic_write_text(tmp / RECORD, json.dumps(record, indent=2, ensure_ascii=False) + "\n")
        os.chmod(tmp, 0o777 & ~current_umask())
        replace_dir(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def remove_stale_temporaries(study: Study, recipe: str, seed: int) -> None:
    """Record folders half-written by a killed run (``.seedN.*.tmp``, ``.seedN.old.*``); the
    caller holds the run's study lock, so nobody else is writing them."""
    final = study.record_dir(recipe, seed)
    if final.parent.is_dir():
        for path in final.parent.glob(f".{final.name}.*"):
            if path.name.endswith(".tmp") or ".old." in path.name:
                shutil.rmtree(path, ignore_errors=True)


# ---------------------------------------------------------------------------
# one run


def _torch_threads() -> int:
    import torch

    return torch.get_num_threads()


def share_compile_cache(study: Study) -> Path:
    """Point inductor's cache at the study's work directory (unless the user set one), so that the
    kernel compilation of a compiled recipe (most of its warm-up) is paid once per study and
    graph, not once per run: the runs of a recipe compile the same graphs, and SLURM jobs on
    other nodes see the same directory (inductor's default lies in each node's /tmp)."""
    cache = Path(os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str((study.work_dir / "compile_cache").resolve())))
    return cache


def execute_run(study: Study, recipe: str, seed: int) -> str:
    """Train (resuming when a checkpoint of the same digest is there), test, write the record.

    Returns ``done``, ``interrupted`` (a signal stopped training after a checkpoint: run it
    again to go on), ``busy`` (another process holds the run) or ``failed`` (written to
    ``failed.json``; the exception is not raised, so the other runs go on).
    """
    from structnmt.locks import LockedError

    run_dir = study.run_dir(recipe, seed)
    log_file = run_dir / "worker.log"
    share_compile_cache(study)
    try:
        return _execute(study, recipe, seed, run_dir)
    except LockedError as err:
        print(f"[study] {recipe} seed {seed}: {err}", file=sys.stderr)
        return BUSY
    except Exception as err:  # noqa: BLE001 (a failed run is recorded, never fatal to the study)
        message = str(err) if isinstance(err, StructNMTError) else "".join(
            traceback.format_exception_only(type(err), err)).strip()
        print(f"[study] {recipe} seed {seed} failed: {message}", file=sys.stderr)
        if not isinstance(err, StructNMTError):
            traceback.print_exc()
        write_failure(study, recipe, seed, message, log_file)
        return FAILED_STATUS


def _execute(study: Study, recipe: str, seed: int, run_dir: Path) -> str:
    """Under the run's study lock from start to record: one process owns a run at a time,
    through training, testing and writing its record."""
    from structnmt.locks import DirectoryLock

    with DirectoryLock(run_dir / STUDY_LOCK, "study run", messages=lambda m: print(m, file=sys.stderr)):
        remove_stale_temporaries(study, recipe, seed)
        clear_failure(study, recipe, seed)  # this try's outcome stands, not an earlier one's
        return _train_test_record(study, recipe, seed, run_dir)


def _claim_run_dir(run_dir: Path, owner: str) -> bool:
    """Make ``run_dir`` this run's; whether it holds a checkpoint of this very run to resume.

    A folder whose marker names another owner (recipe, config or data) is cleared first.
    """
    marker = run_dir / DIGEST_FILE
    resume = False
    if run_dir.exists():
        if marker.is_file() and marker.read_text().strip() == owner:
            resume = any(run_dir.glob("*.pt"))
        else:
            _clear_run_dir(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    atomic_write_text(marker, owner + "\n")
    return resume


def _record(study: Study, recipe: str, seed: int, cfg: Any, *, digest: str, trees: bool, identity: dict,
            summary: dict, scores: dict, run_dir: Path, checkpoint: str, test_seconds: float) -> dict:
    """The run's record: what it was (config, data as named before training, machine, calls)
    and what it scored."""
    run_info = json.loads((run_dir / "run.json").read_text(encoding="utf-8"))
    from structnmt.training.logger import read_log

    valid = [r for r in read_log(run_dir / "log.jsonl") if r.get("kind") == "valid"]
    return {
        "study": study.name, "recipe": recipe, "seed": seed, "digest": digest,
        "config": train_view(cfg), "test": study.test_view(cfg), "recipe_file": study.recipe(recipe).config,
        "reads_trees": trees, "dataset": identity,
        "updates": summary["step"], "epochs": summary["epoch"], "status": summary["status"],
        "train_seconds": summary["train_seconds"], "test_seconds": round(test_seconds, 1),
        "device": run_info.get("device"), "precision": run_info.get("precision"), "cpu": cpu_name(),
        # the threads it trained with (the config's 0 means "the executor's share": read the calls)
        "threads": cfg.training.threads or _trained_threads(run_dir),
        **machine(on_gpu=str(run_info.get("device") or "").startswith("cuda")),
        "host": socket.gethostname(), "torch": run_info.get("torch"),
        "structnmt": run_info.get("structnmt"), "sacrebleu": run_info.get("sacrebleu"),
        "parameters": run_info.get("parameters"),
        # what a reader needs to redo the run (see structnmt.study.provenance)
        "calls": read_calls(run_dir), "cpu_info": cpu_info(), "versions": versions(), "git_commit": git_commit(),
        "corpora": corpora_digests(cfg.data.dir), "references": reference_digests(cfg.data.dir, scores),
        "trees": trees_digest(cfg.data.dir) if trees else None,
        "checkpoint": checkpoint,
        **({"methods_outside": outside} if (outside := outside_methods()) else {}),
        "valid": [{"step": r["step"], "loss": r.get("loss"), "bleu": r.get("bleu")} for r in valid],
        "scores": {name: {k: s[k] for k in ("bleu", "chrf", "signature", "bleu_parts", "sentences", "truncated_lines",
                                              "subset_of", "lines") if k in s}
                   for name, s in scores.items()},
        "finished": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }


def _train_test_record(study: Study, recipe: str, seed: int, run_dir: Path) -> str:
    from structnmt.evaluation.run_eval import evaluate_run
    from structnmt.training.trainer import train

    cfg = study.run_config(recipe, seed)
    digest = config_digest(cfg)
    trees = reads_trees(cfg)
    identity = dataset_identity(cfg, trees)
    # whose checkpoints these are: the training view and the data it read; anything else and
    # the folder (the study's own) is cleared, so that no checkpoint of another recipe or of
    # other trees is resumed and then recorded as today's run
    owner = json.dumps({"digest": digest, "dataset": identity}, sort_keys=True)
    resume = _claim_run_dir(run_dir, owner)
    start_call(run_dir, cfg.training.threads or _torch_threads(), resume_step(run_dir) if resume else 0)
    summary = train(cfg, resume=resume)  # its train_seconds sum every resumed call, not only this one
    if summary["status"] == "interrupted":
        return INTERRUPTED
    if summary["status"] == "diverged":
        raise RuntimeError(f"training diverged at step {summary['step']}")
    if summary["step"] < study.max_steps:
        raise RuntimeError(f"training stopped at step {summary['step']} ({summary['status']}), "
                           f"before the study's {study.max_steps} updates")
    started = time.time()
    checkpoint = f"{study.test_checkpoint}.pt"
    if not (run_dir / checkpoint).is_file():
        raise RuntimeError(f"{run_dir / checkpoint} is missing: the study tests every run on its "
                           f"{study.test_checkpoint} checkpoint")
    scores = evaluate_run(run_dir, checkpoint=str(run_dir / checkpoint), splits=study.test_sets, quiet=True,
                          long_dependency=study.long_dependency, decoding=cfg.decoding)
    test_seconds = time.time() - started
    record = _record(study, recipe, seed, cfg, digest=digest, trees=trees, identity=identity, summary=summary,
                     scores=scores, run_dir=run_dir, checkpoint=checkpoint, test_seconds=test_seconds)
    hyps = {name: run_dir / "eval" / f"{name}.hyp" for name in scores}
    _write_record(study, recipe, seed, record, hyps, run_dir / "log.jsonl")
    (study.record_dir(recipe, seed) / FAILED).unlink(missing_ok=True)
    return DONE


def reference_digests(data_dir: str | Path, scores: dict[str, Any]) -> dict[str, str]:
    """The digest of every tested split's references (a long-dependency subset is named by its
    split's and its ``lines``), so that a report can use references from elsewhere once they
    are shown to be the same."""
    from structnmt.data.dataset import ParallelDataset

    out = {}
    for split in sorted({s.get("subset_of", name) for name, s in scores.items()}):
        with contextlib.suppress(StructNMTError):  # a dataset without raw references: no digest, not no record
            out[split] = lines_digest(ParallelDataset(data_dir, split).scored_raw("tgt"))
    return out


def _clear_run_dir(run_dir: Path) -> None:
    from structnmt.locks import DirectoryLock

    with DirectoryLock(run_dir, "study reset", messages=lambda _m: None):
        for path in run_dir.iterdir():
            if path.name in ("worker.log", f".{STUDY_LOCK}.lock"):
                continue
            if path.is_dir():
                shutil.rmtree(path)
            else:
                path.unlink()


def main(argv: list[str] | None = None) -> int:
    """``python -m structnmt.study.runs STUDY.yaml RECIPE SEED``: one run, as its own process."""
    from structnmt.study.spec import load_study

    args = sys.argv[1:] if argv is None else argv
    usage = "usage: python -m structnmt.study.runs STUDY.yaml RECIPE SEED [THREADS]"
    if len(args) not in (3, 4) or not all(a.isdecimal() and a.isascii() for a in args[2:]):
        print(usage, file=sys.stderr)
        return 2
    try:
        study = load_study(args[0])
        study.recipe(args[1])  # a name the study does not have is an error here, not a traceback
    except StructNMTError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    if len(args) > 3:  # threads for this run, chosen by the executor (not part of the digest)
        study.executor.threads = int(args[3])
    from structnmt.study.provenance import select_gpu

    with contextlib.suppress(Exception):  # so that the record names the GPU it trained on; errors: execute_run's
        select_gpu(study.run_config(args[1], int(args[2])).training.device)
    status = execute_run(study, args[1], int(args[2]))
    return {DONE: 0, INTERRUPTED: 75, BUSY: 3}.get(status, 1)


if __name__ == "__main__":
    sys.exit(main())
