"""Studies: the papers' comparison (recipes x seeds at one update budget) in one command.

``structnmt study STUDY.yaml`` prepares each distinct dataset once, trains and tests every
(recipe, seed) not yet recorded, and writes the report; ``--status`` shows where every run
stands; ``--report`` only writes the report. See :mod:`structnmt.study.spec` for the file,
:mod:`structnmt.study.runs` for records, :mod:`structnmt.study.executors` for where runs
execute and :mod:`structnmt.study.report` for the comparison.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

from structnmt.config import check_count
from structnmt.study.spec import Study, is_device, load_study
from structnmt.wording import counted

#: what leaving ``--jobs`` out means, said where 0 is refused
JOBS_NOTE = " (leave it out for the study file's executor.jobs)"

__all__ = ["Study", "format_status", "load_study", "run_study", "study_status"]


def _log_progress(run_dir: Path) -> tuple[int | None, float | None, float | None]:
    """(last step, last validation BLEU, training seconds per update lately) from a run's log.jsonl."""
    from structnmt.training.logger import read_log

    log = run_dir / "log.jsonl"
    if not log.is_file():
        return None, None, None
    step, bleu = None, None
    before = last = None  # (step, elapsed_s) of the last train record and of one before it
    for record in read_log(log):
        if isinstance(record.get("step"), int):
            step = record["step"]
        if record.get("kind") == "valid" and isinstance(record.get("bleu"), (int, float)):
            bleu = float(record["bleu"])
        if record.get("kind") == "train" and isinstance(record.get("elapsed_s"), (int, float)):
            # before: the latest earlier reading whose clock differs (a fast model can log twice in one tick)
            if last is not None and float(record["elapsed_s"]) > last[1]:
                before = last
            last = (record["step"], float(record["elapsed_s"]))
    rate = None
    if before and last and last[0] > before[0] and last[1] > before[1]:
        rate = (last[1] - before[1]) / (last[0] - before[0])
    return step, bleu, rate


def study_status(study: Study | str | Path, seeds: list[int] | None = None) -> list[dict[str, Any]]:
    """One row per run: state (done / held / stale / running / failed / interrupted / pending / damaged), step,
    BLEU, a note, and the study file's ``executor.jobs`` (for the forecast of :func:`format_status`).
    ``seeds``: only these, which may lie beside the study (a seed trained whole before it joins the file)."""
    from structnmt.locks import holder
    from structnmt.study.runs import (
        STUDY_LOCK,
        _read_json,
        adoptable,
        check_own_records,
        read_failure,
        read_record,
        record_damage,
        stale_reason,
        trees_change,
    )

    study = study if isinstance(study, Study) else load_study(study)
    check_own_records(study)
    first_test = (study.test_sets or [None])[0]
    here: list[str | None] = []  # computed once, and only when a run is not done
    rows = []
    for seed in seeds or []:
        check_count(seed, "--seeds", 0)
    for recipe, seed in (study.runs() if seeds is None else study.runs_of_seeds(seeds)):
        row: dict[str, Any] = {"recipe": recipe, "seed": seed, "state": "pending", "step": None, "bleu": None,
                               "note": "", "jobs": study.executor.jobs, "threads_setting": study.executor.threads}
        if (damage := record_damage(study, recipe, seed)) is not None:
            row.update(state="damaged", note=damage)
            rows.append(row)
            continue
        record = read_record(study, recipe, seed)
        run_dir = study.run_dir(recipe, seed)
        if record is not None:
            reason = stale_reason(study, recipe, seed, record)
            test, bleu = _shown_bleu(record, first_test)
            row.update(step=record.get("updates"), bleu=bleu,
                       note=f"{test} BLEU" if test else "", precision=record.get("precision"),
                       **_pace(record))
            if reason is None:
                row["state"] = "done"
                if (change := trees_change(study, recipe, seed, record)) is not None:
                    row["note"] += f"; {change}"
                rows.append(row)
                continue
            row.update(state="stale", note=f"{reason}: will rerun")
        locked = holder(run_dir / STUDY_LOCK) is not None or holder(run_dir) is not None
        failure = read_failure(study, recipe, seed)
        held_note = ""
        if record is None:
            state, held, why = held_state(study, recipe, seed)
            if state == "damaged":
                row.update(state="damaged", note=why)
                rows.append(row)
                continue
            if state == "held" and not locked and failure is None:
                test, bleu = _shown_bleu(held, first_test)
                row.update(state="held", step=held.get("updates"), bleu=bleu,
                           note=f"{test} BLEU; recorded and held in {study.held_dir(recipe, seed)} until seed "
                                f"{seed} is whole (studies/pending/README.md)",
                           **_pace(held))  # a finished run: its time paces the forecast
                rows.append(row)
                continue
            if state != "none":
                held_note = f"; a held record: {why}" if state == "stale" else "; a record of it is held too"
        if not here:
            here.append(precision_here(study, recipe, seed))
        row["precision_here"] = here[0]
        step, valid_bleu, per_update = _log_progress(run_dir)  # only runs without a standing record
        if locked:
            note = ["valid BLEU so far" if valid_bleu is not None else "no validation yet"]
            if per_update and step is not None and step < study.max_steps:
                note.append(f"about {(study.max_steps - step) * per_update / 60:.0f} min of training left")
                row["seconds_left"] = (study.max_steps - step) * per_update
            row.update(state="running", step=step, bleu=valid_bleu, note="; ".join(note))
        elif failure is not None and row["state"] != "stale":
            tail = failure.get("log_tail") or []
            row.update(state="failed", step=step, note=failure.get("error", "")[:200],
                       log_tail=tail[-5:])
        elif row["state"] == "pending" and not step and (source := adoptable(study, recipe, seed)) is not None:
            row["note"] = f"will adopt {source} (the same training digest and test view)"
        elif row["state"] == "pending" and step:
            note = "resumes from its last checkpoint"
            before = (_read_json(run_dir / "run.json", None) or {}).get("precision")
            if before and here[0] and before != here[0]:
                note += f"; it trained in {before}, this machine would go on in {here[0]}"
            row.update(state="interrupted", step=step, bleu=valid_bleu, note=note,
                       share_left=max(0.0, 1 - step / study.max_steps))
        row["note"] += held_note
        rows.append(row)
    return rows


def _shown_bleu(record: dict[str, Any], first_test: str | None) -> tuple[str | None, float | None]:
    """(test set, BLEU) a status row shows for a record: the study's first test set where scored."""
    scores = record.get("scores") or {}
    test = first_test if first_test in scores else next(iter(scores), None)
    return test, scores[test]["bleu"] if test else None


def held_state(study: Study, recipe: str, seed: int) -> tuple[str, dict[str, Any] | None, str]:
    """The record held back for this run (:meth:`Study.held_dir`): ("none", None, ""), ("held",
    record, ""), ("stale", record, why: it no longer stands for the recipe) or ("damaged", None,
    what to do), checked as the study's own records are."""
    from structnmt.study.runs import RECORD, damage_message, read_checked, stale_reason

    folder = study.held_dir(recipe, seed)
    record, why = read_checked(folder, recipe, seed)
    if why is not None:
        return "damaged", None, damage_message(folder / RECORD, why)
    if record is None:
        return "none", None, ""
    if (reason := stale_reason(study, recipe, seed, record)) is not None:
        return "stale", record, reason
    return "held", record, ""


def _held_elsewhere(study: Study, path: str | Path, recipe: str, seed: int, held: dict[str, Any],
                    device: str | None) -> str | None:
    """Why the held record's seed trained on another kind of machine than this run would (None:
    the same kind), so that a seed begun on a CPU and run whole on a GPU trains every recipe there."""
    from structnmt.decoding.translator import resolve_device
    from structnmt.study.same_machine import SAME, check

    where = device or study.executor.device or study.run_config(recipe, seed).training.device
    here = resolve_device(where).type if where == "auto" else where.split(":")[0]
    there = str(held.get("device") or "cpu").split(":")[0]
    if here != there:
        return f"it trained on {there}, this run trains on {here}"
    if here != "cpu":
        return None
    status, line = check(str(path), recipe, seed, study.held_root)
    return None if status == SAME else line


def _pace(record: dict[str, Any]) -> dict[str, Any]:
    """What a finished run's status row carries for the forecast: its seconds and its machine."""
    return {"seconds": (record.get("train_seconds") or 0) + (record.get("test_seconds") or 0),
            "machine": _machine(record)}


def _machine(record: dict[str, Any]) -> tuple[str, int] | None:
    """(CPU model, threads of its last call) a record trained on: runs on one kind of CPU at one
    thread count take about one time, and a study's records can come from several machines."""
    model = (record.get("cpu_info") or {}).get("model")
    calls = record.get("calls") or []
    threads = calls[-1].get("threads") if calls and isinstance(calls[-1], dict) else record.get("threads")
    return (model, threads) if model and isinstance(threads, int) else None


def machine_here(threads_setting: int, jobs: int) -> tuple[str, int]:
    """(this CPU's model, the threads a run would get here with ``jobs`` at once)."""
    from structnmt.study.executors import threads_per_run
    from structnmt.study.provenance import cpu_info

    return cpu_info()["model"], threads_per_run(threads_setting, jobs)


def format_status(rows: list[dict[str, Any]], jobs: int | None = None) -> str:
    """The status table; its last line forecasts the time left with ``jobs`` runs at once
    (``--jobs``; default: the study file's ``executor.jobs``, which each row carries)."""
    if jobs is not None:  # 0 meant "the study file's" silently; say so rather than guess
        check_count(jobs, "--jobs", 1, JOBS_NOTE)
    jobs = jobs or next((r["jobs"] for r in rows if r.get("jobs")), 1)
    lines = [f"{'recipe':<24} {'seed':>4}  {'state':<11} {'step':>6} {'BLEU':>6}  note"]
    for r in rows:
        bleu = f"{r['bleu']:.2f}" if isinstance(r["bleu"], float) else "-"
        lines.append(f"{r['recipe']:<24} {r['seed']:>4}  {r['state']:<11} {r['step'] or '-':>6} {bleu:>6}  "
                     f"{r['note']}")
        for line in r.get("log_tail", []):
            lines.append(f"{'':<24}       | {line[:150]}")
    counts: dict[str, int] = {}
    for r in rows:
        counts[r["state"]] = counts.get(r["state"], 0) + 1
    lines.append(", ".join(f"{n} {state}" for state, n in sorted(counts.items())))
    here = None
    if any(r.get("machine") for r in rows):  # only then is there a record to match
        here = machine_here(next((r["threads_setting"] for r in rows if "threads_setting" in r), 0), jobs)
    if left := _time_left(rows, jobs, here):
        lines.append(left)
    if mix := precision_mix(rows):
        lines.append(mix)
    return "\n".join(lines)


def precision_here(study: Study, recipe: str, seed: int) -> str | None:
    """The precision a run would train in on this machine: ``precision: auto`` picks bf16 only
    where the CPU or GPU has it (on a GPU, for models of d_model 1,024 and more; narrower ones in
    TF32), so machines of one model name can differ."""
    import torch

    from structnmt.training.environment import choose_precision

    try:
        cfg = study.run_config(recipe, seed)
        training = cfg.training
        device = torch.device(training.device if training.device != "auto" else
                              "cuda" if torch.cuda.is_available() else "cpu")
        if device.type == "cuda" and not torch.cuda.is_available():
            return None  # training would stop with its own message
        return choose_precision(training.precision, device, cfg.model.d_model).name
    except Exception:  # noqa: BLE001 (a warning only: never let it break --status)
        return None


def precision_mix(rows: list[dict[str, Any]]) -> str:
    """A warning when runs still to do would train in another precision than the recorded ones
    (a study compares recipes trained alike; the forecast's pace is then the records' machine's)."""
    recorded = sorted({r["precision"] for r in rows if r["state"] == "done" and r.get("precision")})
    here = next((r["precision_here"] for r in rows if r.get("precision_here")), None)
    if not recorded or here is None or recorded == [here]:
        return ""
    return (f"note: this machine would train in {here}; the records trained in {' and '.join(recorded)} "
            "(training.precision auto follows the hardware): runs here would mix precisions within the study")


def _time_left(rows: list[dict[str, Any]], jobs: int = 1, here: tuple[str, int] | None = None) -> str:
    """A rough forecast for planning: each run not done at the finished runs' median time (a
    running run: the training its log's clock says is left; an interrupted one: the share of its
    updates still to do), and the wall-clock time with ``jobs`` runs at once. Where runs were
    recorded on ``here`` (this CPU model at the thread count a run would get), their median
    alone: a study carried across machines has runs of two or three different paces. A held
    record is a finished run too: a seed trained beside the study is paced by its own runs."""
    done = [r for r in rows if r["state"] in ("done", "held") and r.get("seconds")]
    alike = [r for r in done if here is not None and r.get("machine") == here]
    took = sorted(r["seconds"] for r in (alike or done))
    todo = [r for r in rows if r["state"] not in ("done", "damaged", "held")]
    if not took or not todo:
        return ""
    median = took[len(took) // 2] if len(took) % 2 else (took[len(took) // 2 - 1] + took[len(took) // 2]) / 2
    running = [r for r in todo if r["state"] == "running"]
    each = [r["seconds_left"] if r.get("seconds_left") is not None else median * r.get("share_left", 1.0)
            for r in running + [r for r in todo if r["state"] != "running"]]
    # ``jobs`` places: the running runs hold theirs; each run after goes where a place frees first
    places = [0.0] * max(1, jobs)
    for seconds in each:
        places[places.index(min(places))] += seconds
    wall = f", {max(places) / 3600:.1f} h with {jobs} at a time" if jobs > 1 else ""
    busy = ""
    if running:
        from_logs = sum(r.get("seconds_left") is not None for r in running)
        busy = f" ({len(running)} running{f', {from_logs} with its time left from its log' if from_logs else ''})"
    whose = (f"the median of the {counted(len(alike), 'run')} recorded on this CPU at "
             f"{counted(here[1], 'thread')}" if alike else "the finished runs' median")
    return (f"{counted(len(todo), 'run')} not done{busy}; at {whose} of {median / 60:.0f} min each, "
            f"about {sum(each) / 3600:.1f} h of runs{wall} at that pace (less for a run that resumes)")


def _say(text: str) -> None:
    print(f"[study] {time.strftime('%H:%M:%S')} {text}", file=sys.stderr, flush=True)


BUSY_PREFIX = "busy: "


def _pin_trees(study: Study, cfg) -> bool:
    """Pin the dataset's parse cache to the study's trees file (once); True when it was pinned
    now, so that a dataset built from other trees is built again."""
    if study.trees is None:
        return False
    from structnmt.data.dataset import read_meta
    from structnmt.data.parsing.cache import import_trees, pinned_to
    from structnmt.data.prepare import cache_dir_of
    from structnmt.locks import DirectoryLock

    cache, want = cache_dir_of(cfg.data), study.trees.sha256.lower()
    if pinned_to(cache) != want:
        with DirectoryLock(Path(cfg.data.dir), "trees import", messages=_say):
            counts = import_trees(study.trees.file, cache, want)
        _say(f"{cfg.data.dir}: trees pinned to {study.trees.file} ({', '.join(f'{s} {n}' for s, n in counts.items())})")
    if not (Path(cfg.data.dir) / "meta.json").is_file():
        return False
    return (read_meta(cfg.data.dir).get("inputs") or {}).get("trees") != want  # built from other trees: again


def prepare_datasets(study: Study, runs: list[tuple[str, int]]) -> dict[str, str]:
    """Prepare each distinct dataset the given runs need, once; returns {data.dir: error} for
    those that could not be prepared (their runs are recorded as failed)."""
    from structnmt.data.prepare import prepare
    from structnmt.errors import StructNMTError
    from structnmt.locks import LockedError

    done: dict[str, str] = {}
    for recipe, seed in runs:
        cfg = study.run_config(recipe, seed)
        if cfg.data.dir in done:
            continue
        _say(f"dataset {cfg.data.dir} (recipe {recipe})")
        try:
            prepare(cfg, force=_pin_trees(study, cfg), verbose=False)
            done[cfg.data.dir] = ""
        except LockedError as err:  # another process is preparing it: its runs wait for next time
            done[cfg.data.dir] = BUSY_PREFIX + str(err)
            _say(f"{cfg.data.dir} is being prepared by another process ({err}); its runs are skipped")
        except StructNMTError as err:
            done[cfg.data.dir] = str(err)
            _say(f"cannot prepare {cfg.data.dir}: {err}")
    return {d: e for d, e in done.items() if e}


def run_study(path: str | Path, jobs: int | None = None, executor: str | None = None,
              only: list[str] | None = None, report: bool = True, seeds: list[int] | None = None,
              device: str | None = None, commit: bool | None = None) -> dict[str, Any]:
    """Run what is not yet recorded (all of it, or the recipes in ``only`` and the seeds in
    ``seeds``), then report (when nothing was left to run, a standing report is kept as it is).
    ``device`` and ``commit`` stand in for the study file's ``executor.device`` and
    ``executor.commit`` in this call: one seed on a borrowed GPU without editing the file.

    Returns ``{"runs": {"recipe/seedN": status}, "report": path or None}``.
    """
    from structnmt.study.runs import check_own_records

    study = load_study(path)
    check_own_records(study)  # before any record is called stale and trained over
    kind = executor or study.executor.kind
    jobs = study.executor.jobs if jobs is None else jobs  # 0 is no count: refused, not the file's
    _check_call(study, jobs, only, seeds, device, commit)
    results: dict[str, str] = {}
    todo, recorded, adopted = _runs_to_do(study, path, only, seeds, device, results)
    if todo:
        _run(study, todo, kind, jobs, device, recorded, results)
    else:
        held_back = sum(status == "held" for status in results.values())
        _say("every run is recorded and current" + (f" ({held_back} of them held until their seed is whole)"
                                                     if held_back else ""))
    report_path = None
    standing = study.records / "report.md"
    if report and not todo and not adopted and standing.is_file():
        # nothing changed: keep the report (one written where the references were is not
        # replaced by one from a fresh clone that cannot test significance); --report rewrites
        _say(f"the report stands: {standing} (--report writes it again)")
        report_path = standing
    elif report:
        from structnmt.study.report import write_report

        report_path = write_report(study)
        _say(f"report written to {report_path}")
    return {"runs": results, "report": str(report_path) if report_path else None}


def _check_call(study: Study, jobs: int, only: list[str] | None, seeds: list[int] | None, device: str | None,
                commit: bool | None) -> None:
    """Refuse a call's bad arguments before anything runs, each named by its option; then let
    ``device`` and ``commit`` stand in for the study file's for this call."""
    from structnmt.errors import ConfigError

    check_count(jobs, "--jobs", 1, JOBS_NOTE)
    unknown = sorted(set(only or []) - {r.name for r in study.recipes})
    if unknown:
        raise ConfigError(f"not a recipe of the study: {', '.join(unknown)} "
                          f"(recipes: {', '.join(r.name for r in study.recipes)})", "--only")
    all_seeds = sorted({seed for _, seed in study.runs()})
    if strange := sorted(set(seeds or []) - set(all_seeds)):
        raise ConfigError(f"not a seed of the study: {', '.join(map(str, strange))} "
                          f"(seeds: {', '.join(map(str, all_seeds))})", "--seeds")
    if device is not None:
        if not is_device(device):
            raise ConfigError(f"expected auto, cpu, cuda or cuda:N (N a GPU's number), got {device!r}", "--device")
        study.executor.device = device
    if commit is not None:
        study.executor.commit = commit


def _runs_to_do(study: Study, path: str | Path, only: list[str] | None, seeds: list[int] | None,
                device: str | None, results: dict[str, str]) -> tuple[list[tuple[str, int]], list[str | None], int]:
    """(the runs to train, the precisions of the standing records, how many runs were adopted).
    A damaged record, held or not, is named and never trained over; a held one is left held; a
    run that another study trained alike is adopted; each such run's status goes into ``results``."""
    from structnmt.study.runs import adopt, adoptable, read_record, record_damage, stale_reason

    todo, recorded, adopted = [], [], 0
    for recipe, seed in study.runs():
        if (only and recipe not in only) or (seeds and seed not in seeds):
            continue
        if (damage := record_damage(study, recipe, seed)) is not None:  # never trained over: named
            _say(f"{recipe} seed {seed}: {damage}")
            results[f"{recipe}/seed{seed}"] = "damaged"
            continue
        record = read_record(study, recipe, seed)
        if record is not None:
            reason = stale_reason(study, recipe, seed, record)
            if reason is None:
                recorded.append(record.get("precision"))
                continue
            _say(f"{recipe} seed {seed}: {reason}; running it again")
        elif (status := _held_status(study, path, recipe, seed, seeds, device)) is not None:
            results[f"{recipe}/seed{seed}"] = status
            continue
        if (source := adoptable(study, recipe, seed)) is not None:
            adopt(study, recipe, seed, source)
            _say(f"{recipe} seed {seed}: adopted {source} (the same training digest and test view)")
            results[f"{recipe}/seed{seed}"] = "done"
            adopted += 1
            continue
        todo.append((recipe, seed))
    return todo, recorded, adopted


def _held_status(study: Study, path: str | Path, recipe: str, seed: int, seeds: list[int] | None,
                 device: str | None) -> str | None:
    """"damaged" or "held" for a run whose held record stands in for it (it is not trained); None:
    train it (no held record, a stale one, or a call naming its seed on another kind of machine)."""
    state, held, why = held_state(study, recipe, seed)
    where = study.held_dir(recipe, seed)
    if state == "damaged":  # never trained over: named, as a damaged record of the study's is
        _say(f"{recipe} seed {seed}: {why}")
        return "damaged"
    if state == "stale":
        _say(f"{recipe} seed {seed}: the record held in {where} {why}; running it again")
    if state != "held":
        return None
    differs = None
    if seeds and seed in seeds:  # only a call that names the seed trains it whole elsewhere
        try:
            differs = _held_elsewhere(study, path, recipe, seed, held, device)
        except Exception as err:  # noqa: BLE001 (unsure: keep the held record, never crash)
            _say(f"{recipe} seed {seed}: could not tell where its held record trained ({err}); not run again")
    if differs is None:
        _say(f"{recipe} seed {seed}: recorded and held in {where} until seed {seed} is whole: not "
             f"run again (studies/pending/README.md; --seeds {seed} on another kind of machine trains "
             "the seed whole there)")
        return "held"
    _say(f"{recipe} seed {seed}: a record is held in {where}, but {differs}: trained here too, so "
         f"that seed {seed} can be whole on one kind of machine")
    return None


def _run(study: Study, todo: list[tuple[str, int]], kind: str, jobs: int, device: str | None,
         recorded: list[str | None], results: dict[str, str]) -> None:
    """Prepare the datasets the runs read, then train and test them with the executor; each run's
    status goes into ``results`` (a dataset that could not be prepared fails its runs, named)."""
    from structnmt.errors import ConfigError
    from structnmt.study.executors import check_device, run_local, run_submitit
    from structnmt.study.runs import write_failure

    if kind != "slurm":  # a GPU asked for and not here: refused before anything is prepared or run
        try:
            check_device(study, todo)
        except ConfigError as err:
            if device is None:
                raise
            raise ConfigError(err.message, "--device") from None  # the argument's, not the study file's
    bad = prepare_datasets(study, todo)
    runnable = []
    for recipe, seed in todo:
        error = bad.get(study.run_config(recipe, seed).data.dir)
        if error and error.startswith(BUSY_PREFIX):
            results[f"{recipe}/seed{seed}"] = "busy"
        elif error:
            write_failure(study, recipe, seed, f"prepare failed: {error}", None)
            results[f"{recipe}/seed{seed}"] = "failed"
        else:
            runnable.append((recipe, seed))
    _say(f"{counted(len(runnable), 'run')} to do with the {kind} executor"
         + (f", {jobs} at a time" if kind == "local" else ""))
    if runnable and kind == "local":
        rows = [{"state": "done", "precision": p} for p in recorded]
        rows.append({"state": "pending", "precision_here": precision_here(study, *runnable[0])})
        if mix := precision_mix(rows):
            _say(mix)

    def progress(recipe: str, seed: int, status: str) -> None:
        _say(f"{recipe} seed {seed}: {status}")

    if kind == "local":
        outcome = run_local(study, runnable, jobs, progress)
    else:
        outcome = run_submitit(study, runnable, "local" if kind == "submitit-local" else "slurm", progress)
    results.update({f"{r}/seed{s}": status for (r, s), status in outcome.items()})


def status_json(path: str | Path) -> str:
    return json.dumps(study_status(path), indent=2)
