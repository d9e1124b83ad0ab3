"""``structnmt prepare``: raw parallel text in, a prepared dataset directory out.

The work is streamed (``structnmt/data/stream.py``): memory does not grow with the corpus.
It can run in one go (:func:`prepare`) or split over processes or cluster jobs:

```
structnmt prepare CONFIG --subwords-only   # read, clean, sample, train SentencePiece   -> DIR.shards/plan/
structnmt prepare CONFIG --shard 3/8       # encode lines of slice 3 of 8 of every split -> DIR.shards/shard-003-of-008/
structnmt prepare CONFIG --merge           # check the shards and join them               -> DIR
structnmt prepare CONFIG --jobs 8 [--slurm] # all three, shards as local processes or a SLURM array (submitit)
```

Everything that ends up in ``data.dir`` is built in a temporary directory beside it and
renamed into place only at the end, so a failed or interrupted prepare leaves the previous
dataset (or none), never half of one; a shard is likewise built beside its final place, so a
killed shard is simply run again. The parse cache (default ``<dir>/.parse_cache``) lives
outside that swap: it survives a failed run and is carried into the new dataset directory.
Only one prepare (or merge) writes a ``data.dir`` at a time (:class:`~structnmt.locks.DirectoryLock`).

``data.multitask_parse`` builds the C&H baseline data (Currey & Heafield 2019, as run in
pascal-bugliarello2020): every training pair gets a twin whose source is the tagged
sentence ``<parse> ... <parse>`` and whose target is its linearised dependency parse
(:func:`structnmt.data.pipeline.linearise`); translation sources carry ``<translate>``.
The tags are user-defined SentencePiece symbols, so they stay one piece each. The twins are
stored after all translation pairs of the training split.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from structnmt.config import (
    DATA_FIELDS_WITHOUT_EFFECT,
    DataConfig,
    ExperimentConfig,
    config_differences,
    dataset_differences,
    from_dict,
)
from structnmt.data.dataset import read_meta
from structnmt.data.identity import StaleDatasetError, check_unchanged, input_files
from structnmt.data.parsing.cache import pinned_to
from structnmt.data.pipeline import SIDES
from structnmt.data.stream import assemble, encode_shard, make_plan, task_tag
from structnmt.errors import ConfigError, ParserError, StructNMTError
from structnmt.io import atomic_write_text, make_temp_dir, replace_dir
from structnmt.locks import DirectoryLock

FORMAT_VERSION = 1


class ShardError(StructNMTError):
    """Shards that cannot be merged (missing, repeated, or made from another plan)."""


def _check(data: DataConfig) -> None:
    if data.multitask_parse and data.src.parser.backend == "none":
        raise ConfigError("the C&H multi-task data needs a source parser (data.src.parser)",
                          "data.multitask_parse")


def _data(cfg: ExperimentConfig) -> DataConfig:
    if cfg.data is None:
        raise ConfigError("the config has no data section", "data")
    _check(cfg.data)
    return cfg.data


def _check_inputs_exist(cfg: ExperimentConfig) -> None:
    """Where no dataset is built yet, every input file the config names is here before a folder is
    made: a missing one is named with its field, and a relative path with the folder it was looked
    for in (the current one, not the config's). Only the stages that read the corpus ask (a merge
    reads the shards alone), and a built dataset may have come without its inputs
    (``_keep_existing`` says so)."""
    assert cfg.data is not None
    if (Path(cfg.data.dir) / "meta.json").exists():
        return
    for role, path in input_files(cfg.data).items():
        if not Path(path).exists():
            where = "" if Path(path).is_absolute() else f" (looked for in the current folder, {Path.cwd()})"
            raise ConfigError(f"{path}: file not found{where}", f"data.{role}", cfg.path)


def _named(cfg: ExperimentConfig, run):
    """Run ``run()``; config errors raised deep inside (the sub-word model, a parser) know the
    field, not the file: name the config file too."""
    try:
        return run()
    except ConfigError as err:
        if cfg.path is None or str(err).startswith(f"{cfg.path}: "):
            raise
        named = ConfigError(str(err), path=cfg.path)
        named.field = err.field
        raise named from None
    except ParserError as err:  # a parser model missing names its field (data.src.parser.model): the file too
        if cfg.path is None or not str(err).startswith("data."):
            raise
        raise ParserError(f"{cfg.path}: {err}") from None


def _messages(verbose: bool):
    return print if verbose else (lambda _message: None)


def cache_dir_of(data: DataConfig) -> Path:
    return Path(data.cache_dir) if data.cache_dir else Path(data.dir) / ".parse_cache"


def shards_dir(data: DataConfig) -> Path:
    """Where the sub-word plan and the shards of a sharded prepare live: ``<data.dir>.shards``."""
    out = Path(data.dir)
    return out.parent / f"{out.name}.shards"


# ---------------------------------------------------------------------------
# one go


def prepare(cfg: ExperimentConfig, force: bool = False, verbose: bool = True) -> Path:
    """Build the dataset of ``cfg.data`` in one process; returns its directory.

    An existing dataset prepared from the same data config and the same inputs (files,
    parser models: :mod:`structnmt.data.identity`) is kept as it is; one from a different
    config, or whose inputs changed since, is replaced only with ``force``.
    """
    data = _data(cfg)
    _check_inputs_exist(cfg)

    return _named(cfg, lambda: _locked_build(data, force, verbose, _one_shot)[0])


def _locked_build(data: DataConfig, force: bool, verbose: bool, build) -> tuple[Path, bool]:
    """Under the dataset directory's lock (one prepare at a time: a second is refused at once,
    naming the holder), remove a dead prepare's leftovers, keep an up-to-date dataset, or
    build a new one with ``build`` and swap it in. Returns (directory, whether it was built)."""
    out = Path(data.dir)
    with DirectoryLock(out, "prepare", messages=_messages(verbose)):
        _remove_stale_temporaries(out, verbose)
        if _keep_existing(out, data, force, verbose):
            return out, False
        return _build_and_swap(out, data, verbose, build), True


def _one_shot(data: DataConfig, tmp: Path, verbose: bool) -> dict:
    work = tmp / ".work"
    parsers: dict = {}  # loaded once, for both stages
    plan = make_plan(data, work / "plan", cache_dir_of(data), verbose, parsers=parsers)
    record = encode_shard(data, plan, work / "plan", work / "shard", 0, 1, cache_dir_of(data), verbose,
                          parsers=parsers)
    meta = _finish(data, plan, work / "plan", [(work / "shard", record)], tmp, verbose, move=True)
    shutil.rmtree(work)
    return meta


def _finish(data: DataConfig, plan: dict, plan_dir: Path, shards: list[tuple[Path, dict]], tmp: Path,
            verbose: bool, move: bool = False) -> dict:
    """Assemble the shards into ``tmp``, copy the sub-word models and return meta.json's content."""
    clock = time.perf_counter()
    joined = assemble(data, plan, shards, tmp, verbose, move=move)
    for name in plan["inputs"]["subwords"]:
        shutil.copy2(plan_dir / name, tmp / name)
    seconds = dict(plan["seconds"])
    for _, record in shards:
        for stage, value in record["seconds"].items():
            seconds[stage] = seconds.get(stage, 0.0) + value
    seconds["merge"] = time.perf_counter() - clock
    store = {side: task_tag(data) is None and getattr(data, side).parser.backend != "none" for side in SIDES}
    parser_info = shards[0][1]["parser_info"]
    return {
        "format_version": FORMAT_VERSION,
        "inputs": plan["inputs"],
        "langs": {"src": data.src.lang, "tgt": data.tgt.lang},
        "moses": data.moses,
        "subwords": plan["subwords"],
        "subword_sample": plan["sample"],
        "joint_vocab": data.subwords.joint,
        "task_tag": task_tag(data),
        "parsers": parser_info,
        "structures": store,
        "scenes": {side: getattr(data, side).scenes if store[side] else "none" for side in SIDES},
        "labels": joined["labels"],
        "splits": joined["splits"],
        "data": plan["config"],
        "seconds": {k: round(v, 2) for k, v in seconds.items()},
    }


def _build_and_swap(out: Path, data: DataConfig, verbose: bool, build) -> Path:
    """``build(data, tmp, verbose) -> meta`` in a temporary directory beside ``out``, then swap it in."""
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = make_temp_dir(prefix=f".{out.name}.", suffix=".tmp", dir=out.parent)
    try:
        meta = build(data, tmp, verbose)
        atomic_write_text(tmp / "meta.json", json.dumps(meta, indent=2, ensure_ascii=False) + "\n")
        _swap(tmp, out, cache_dir_of(data))
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


def _changes(recorded: dict | None, data: DataConfig) -> list[tuple[str, Any, Any]] | None:
    """The fields that change what the dataset holds in which its recorded data config differs
    from ``data`` (fields added since take their defaults); None when the record is unreadable."""
    if not isinstance(recorded, dict):
        return None
    try:
        old = from_dict(DataConfig, recorded, "data")
    except ConfigError:
        return None
    return config_differences(asdict(old), asdict(data), "data", DATA_FIELDS_WITHOUT_EFFECT)


def _keep_existing(out: Path, data: DataConfig, force: bool, verbose: bool) -> bool:
    """True when ``out`` already holds this dataset; refuses to replace what is not ours to replace."""
    ours = (out / "meta.json").is_file()
    if out.exists() and not ours and (not out.is_dir() or any(p.name != ".parse_cache" for p in out.iterdir())):
        # prepare replaces data.dir whole: never a directory it did not make (raw corpora, say)
        raise ConfigError(f"{out} exists and is not a structnmt dataset; choose another directory", "data.dir")
    if not ours or force:
        return False
    old = read_meta(out)
    if "inputs" not in old:
        # nothing to check it against, and its data section lacks fields training now compares
        raise StaleDatasetError(f"{out} was prepared by an older structnmt that recorded no input fingerprints; "
                                "rerun with --force to rebuild it")
    changes = _changes(old.get("data"), data)
    if changes is None or changes:
        shown = f" ({dataset_differences(changes)})" if changes else ""
        raise ConfigError(f"{out} holds a dataset prepared from a different config{shown}; "
                          "use --force to replace it", "data.dir")
    absent = check_unchanged(old["inputs"], data, pinned_to(cache_dir_of(data)))
    if verbose and absent:
        more = f" and {len(absent) - 1} more" if len(absent) > 1 else ""
        print(f"{out}: prepared from this config; used as it is: its inputs are not on this machine "
              f"({absent[0]}{more}), so they cannot have changed (meta.json keeps their sizes and SHA-256)")
    elif verbose:
        print(f"{out}: already prepared from this config and these inputs (use --force to rebuild)")
    return True


def _remove_stale_temporaries(out: Path, verbose: bool) -> None:
    """Remove what a prepare that died left beside ``out`` (we hold the lock: nobody else is writing)."""
    if not out.parent.is_dir():
        return
    for path in sorted(out.parent.glob(f".{out.name}.*.tmp")) + sorted(out.parent.glob(f".{out.name}.old.*")):
        if path.is_dir():
            if verbose:
                print(f"{path}: removing what an earlier prepare left behind (it did not finish)")
            shutil.rmtree(path, ignore_errors=True)


def _swap(tmp: Path, out: Path, cache_dir: Path) -> None:
    """Move the finished dataset into place, keeping the parse cache if it lives inside ``out``."""
    inside = out / ".parse_cache"
    if cache_dir.resolve() == inside.resolve() and inside.is_dir():
        os.replace(inside, tmp / ".parse_cache")
    replace_dir(tmp, out)


# ---------------------------------------------------------------------------
# in shards: plan, shards, merge


def shard_name(index: int, count: int) -> str:
    """Directory of shard ``index`` (0-based) of ``count``; shown 1-based, like ``--shard``."""
    return f"shard-{index + 1:03d}-of-{count:03d}"


def prepare_subwords(cfg: ExperimentConfig, force: bool = False, verbose: bool = True) -> Path:
    """Stage 1 of a sharded prepare: read, clean, sample and train the sub-word model(s).

    Writes ``<data.dir>.shards/plan``; a plan for this config whose inputs are unchanged is
    kept (unless ``force``). A new plan removes the shards made against an older one.
    """
    data = _data(cfg)
    _check_inputs_exist(cfg)

    def run() -> Path:
        work = shards_dir(data)
        final = work / "plan"
        with DirectoryLock(final, "prepare sub-words", messages=_messages(verbose)):
            _remove_stale_temporaries(final, verbose)
            if not force and (current := _read_plan(final)) is not None:
                if current.get("config_digest") == make_config_digest(data):
                    try:
                        check_unchanged(current["inputs"], data, pinned_to(cache_dir_of(data)))
                        if verbose:
                            print(f"{final}: sub-word plan already made from this config and these inputs")
                        return final
                    except StructNMTError as err:
                        if verbose:
                            print(f"{final}: {err}; making a new plan")
            work.mkdir(parents=True, exist_ok=True)
            tmp = make_temp_dir(prefix=".plan.", suffix=".tmp", dir=work)
            try:
                make_plan(data, tmp, cache_dir_of(data), verbose)
                replace_dir(tmp, final)
            except BaseException:
                shutil.rmtree(tmp, ignore_errors=True)
                raise
            for old in sorted(work.glob("shard-*")):
                if verbose:
                    print(f"{old}: made against an older plan; removed")
                shutil.rmtree(old, ignore_errors=True)
        return final

    return _named(cfg, run)


def make_config_digest(data: DataConfig) -> str:
    from structnmt.data.identity import config_digest

    return config_digest(asdict(data))


def _read_plan(directory: Path) -> dict | None:
    try:
        return json.loads((directory / "plan.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def current_plan(data: DataConfig) -> tuple[Path, dict]:
    """The plan of a sharded prepare, checked against the config and the inputs as they are now."""
    directory = shards_dir(data) / "plan"
    plan = _read_plan(directory)
    again = "run `structnmt prepare CONFIG --subwords-only` first"
    if plan is None:
        raise ShardError(f"{directory}: no sub-word plan; {again}")
    if plan.get("config_digest") != make_config_digest(data):
        raise ShardError(f"{directory}: the sub-word plan was made from another data config; {again}")
    try:
        check_unchanged(plan["inputs"], data, pinned_to(cache_dir_of(data)))
    except StructNMTError as err:
        raise ShardError(f"{directory}: the sub-word plan is stale ({str(err).split('; rerun')[0]}); "
                         f"{again}") from None
    return directory, plan


def parse_shard(spec: str) -> tuple[int, int]:
    """``"3/8"`` -> (2, 8): 1-based on the command line, 0-based inside."""
    try:
        number, count = (int(part) for part in spec.split("/"))
    except ValueError:
        raise ConfigError(f"expected I/N (shard I of N, 1 <= I <= N), got {spec!r}", "--shard") from None
    if not 1 <= number <= count:
        raise ConfigError(f"expected I/N with 1 <= I <= N, got {spec!r}", "--shard")
    return number - 1, count


def prepare_shard(cfg: ExperimentConfig, index: int, count: int, verbose: bool = True) -> Path:
    """Stage 2: encode shard ``index`` (0-based) of ``count`` against the plan; a finished shard is kept."""
    data = _data(cfg)
    _check_inputs_exist(cfg)

    def run() -> Path:
        plan_dir, plan = current_plan(data)
        final = shards_dir(data) / shard_name(index, count)
        with DirectoryLock(final, "prepare shard", messages=_messages(verbose)):
            _remove_stale_temporaries(final, verbose)
            done = read_shard_record(final)
            if done is not None and done.get("config_digest") == plan["config_digest"] \
                    and done.get("subwords") == plan["inputs"]["subwords"]:
                if verbose:
                    print(f"{final}: already encoded")
                return final
            tmp = make_temp_dir(prefix=f".{final.name}.", suffix=".tmp", dir=final.parent)
            try:
                encode_shard(data, plan, plan_dir, tmp, index, count, cache_dir_of(data), verbose)
                replace_dir(tmp, final)
            except BaseException:
                shutil.rmtree(tmp, ignore_errors=True)
                raise
        return final

    return _named(cfg, run)


def read_shard_record(directory: Path) -> dict | None:
    try:
        return json.loads((directory / "shard.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def merge_shards(cfg: ExperimentConfig, force: bool = False, verbose: bool = True, keep: bool = False) -> Path:
    """Stage 3: check that every shard is there once, from this plan, with the lines it should
    have, and join them into ``data.dir`` (the shards are removed afterwards unless ``keep``)."""
    data = _data(cfg)

    def build(data: DataConfig, tmp: Path, verbose: bool) -> dict:
        plan_dir, plan = current_plan(data)
        shards = check_shards(data, plan, shards_dir(data))
        meta = _finish(data, plan, plan_dir, shards, tmp, verbose)
        meta["shards"] = len(shards)
        return meta

    def run() -> Path:
        out, built = _locked_build(data, force, verbose, build)
        if built and not keep:
            shutil.rmtree(shards_dir(data), ignore_errors=True)
        return out

    return _named(cfg, run)


def check_shards(data: DataConfig, plan: dict, work: Path) -> list[tuple[Path, dict]]:
    """The shards in order, or a :class:`ShardError` saying what is wrong with them."""
    from structnmt.data.stream import line_range

    found: dict[int, list[tuple[Path, dict]]] = {}
    counts: set[int] = set()
    for directory in sorted(p for p in work.glob("shard-*") if p.is_dir()):
        record = read_shard_record(directory)
        if record is None:
            raise ShardError(f"{directory}: not a finished shard (no readable shard.json); run it again")
        if record.get("subwords") != plan["inputs"]["subwords"]:
            raise ShardError(f"{directory}: made with another sub-word model "
                             f"({_digests(record.get('subwords'))}, the plan has "
                             f"{_digests(plan['inputs']['subwords'])}); run it again")
        if record.get("config_digest") != plan["config_digest"]:
            raise ShardError(f"{directory}: made from another data config; run it again")
        if record.get("parsers") != plan["inputs"]["parsers"]:
            raise ShardError(f"{directory}: made with another parser; run it again")
        counts.add(record["count"])
        found.setdefault(record["index"], []).append((directory, record))
    if not found:
        raise ShardError(f"{work}: no shards; run `structnmt prepare CONFIG --shard I/N` for I = 1..N")
    if len(counts) > 1:
        raise ShardError(f"{work}: shards of different counts ({sorted(counts)}) are mixed; remove the extra ones")
    (count,) = counts
    for index in range(count):
        if index not in found:
            raise ShardError(f"shard {index + 1}/{count} is missing (run `structnmt prepare CONFIG "
                             f"--shard {index + 1}/{count}`)")
        if len(found[index]) > 1:
            names = ", ".join(str(d) for d, _ in found[index])
            raise ShardError(f"shard {index + 1}/{count} is there {len(found[index])} times ({names}); keep one")
    shards = [found[index][0] for index in range(count)]
    for directory, record in shards:
        for split, info in plan["splits"].items():
            first, stop = line_range(info["lines"], record["index"], count)
            got = record["splits"].get(split)
            if got is None or got["lines"] != [first, stop] or got["read"] != stop - first:
                have = f"{got['read']} lines" if got else "nothing"
                raise ShardError(f"{directory}: {split} should have lines {first}..{stop - 1} "
                                 f"({stop - first} lines) but has {have}; run it again")
        if record["splits"].keys() != plan["splits"].keys():
            raise ShardError(f"{directory}: has splits {sorted(record['splits'])}, the plan {sorted(plan['splits'])}")
    return shards


def _digests(subwords: dict | None) -> str:
    return ", ".join(f"{name} {digest[:12]}…" for name, digest in sorted((subwords or {}).items())) or "none"


def shard_job(cfg: ExperimentConfig, index: int, count: int) -> str | None:
    """What a shard job runs: one shard. A user-facing error comes back as its one-line message."""
    try:
        prepare_shard(cfg, index, count, verbose=True)
    except StructNMTError as err:
        return str(err)
    return None


def run_shards(cfg: ExperimentConfig, count: int, slurm: bool = False, params: dict | None = None,
               verbose: bool = True) -> None:
    """Run every shard not yet encoded from the current plan (as jobs), and wait for all of them."""
    from structnmt.data.shards import run_jobs

    data = _data(cfg)
    if count < 1:
        raise StructNMTError(f"--jobs: expected at least 1 shard, got {count}")
    work = shards_dir(data)
    _, plan = current_plan(data)
    todo = []
    for index in range(count):
        record = read_shard_record(work / shard_name(index, count))
        if not (record and record.get("config_digest") == plan["config_digest"]
                and record.get("subwords") == plan["inputs"]["subwords"]):
            todo.append(index)
    for stale in sorted(work.glob("shard-*")):
        if not stale.name.endswith(f"-of-{count:03d}"):  # from a run with another shard count
            if verbose:
                print(f"{stale}: from a run with another number of shards; removed")
            shutil.rmtree(stale, ignore_errors=True)
    if todo:
        run_jobs(shard_job, cfg, todo, count, work / "jobs", slurm, params, verbose)


def prepare_sharded(cfg: ExperimentConfig, jobs: int, slurm: bool = False, params: dict | None = None,
                    force: bool = False, verbose: bool = True) -> Path:
    """All three stages: the plan here, ``jobs`` shards as local processes or a SLURM array, the merge here."""
    data = _data(cfg)
    out = Path(data.dir)
    if out.exists() and not force:
        with DirectoryLock(out, "prepare", messages=_messages(verbose)):
            if _named(cfg, lambda: _keep_existing(out, data, force, verbose)):
                return out
    prepare_subwords(cfg, verbose=verbose)
    _named(cfg, lambda: run_shards(cfg, jobs, slurm, params or {}, verbose))
    return merge_shards(cfg, force=force, verbose=verbose)
