"""A study file: which recipes, which seeds, one update budget, which test sets, which baseline.

```yaml
name: multi30k_en_de
baseline: transformer
seeds: [1, 2]
max_steps: 1200                # every run trains exactly this many updates (no wall-clock stop)
test_sets: [test_2016_flickr]  # default: every split but train and valid
test_checkpoint: last          # last | best (the checkpoint its validation BLEU picks)
trees: {file: trees.jsonl.gz, sha256: 3f5c...}   # optional: the trees the runs read (structnmt trees export)
overrides: {training.valid_every: 400}          # for every run
recipes:
  - {name: transformer, config: configs/multi30k_en_de_transformer.yaml}
  - {name: pascal, config: configs/multi30k_en_de_pascal.yaml, overrides: {model.dropout: 0.3}}
  - {name: sasa, config: configs/multi30k_en_de_sasa.yaml, seeds: [1, 2, 3]}   # its own seeds
executor: {kind: local, jobs: 1, threads: 2, nice: 10}   # device: cuda, commit: true (see docs/studies.md)
slurm: {partition: gpu, time_min: 240, gpus_per_run: 1, cpus_per_run: 8, options: {account: nmt}}
```

Paths of recipes are taken from the directory the command runs in, as the recipes' own
data paths are. Records go to ``records`` (default: the study file's path without
``.yaml``), meant to be committed; checkpoints go to ``work_dir`` (default
``runs/study_<name>``), never committed. The whole file, every recipe with its overrides
included, is validated before anything runs.
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import json
import types
import typing
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

from structnmt.config import ExperimentConfig, config_differences, from_dict, load_config, parse_yaml, to_dict
from structnmt.errors import ConfigError


def _check_name(value: str, where: str) -> None:
    if not value or "/" in value:
        raise ConfigError(f"expected a name without '/', got {value!r}", where)


def _check_seeds(seeds: list[int] | None, where: str) -> None:
    if seeds is None:
        return
    if not seeds:
        raise ConfigError("expected a non-empty list of integers", where)
    for i, seed in enumerate(seeds):
        if seed < 0:
            raise ConfigError(f"must not be negative, got {seed}", f"{where}[{i}]")
    if len(set(seeds)) != len(seeds):
        raise ConfigError(f"a seed is listed twice: {seeds}", where)


def _at_least(value: int | None, minimum: int, where: str) -> None:
    if value is not None and value < minimum:
        raise ConfigError(f"must be at least {minimum}, got {value}", where)


@dataclass
class Recipe:
    name: str
    config: str
    overrides: dict[str, Any] = field(default_factory=dict)
    seeds: list[int] | None = None  # its own seeds (a baseline often gets more); None: the study's

    def validate(self, where: str) -> None:
        _check_name(self.name, f"{where}.name")
        if not Path(self.config).is_file():
            raise ConfigError(f"no such recipe file: {self.config!r}", f"{where}.config")
        _check_seeds(self.seeds, f"{where}.seeds")


@dataclass
class ExecutorSpec:
    kind: Literal["local", "slurm", "submitit-local"] = "local"  # slurm and submitit-local: through submitit
    jobs: int = 1  # local: runs at once
    threads: int = 0  # threads of each run; 0: the machine's cores divided by jobs
    nice: int = 10  # local: niceness of the run processes
    # where every run trains: auto | cpu | cuda | cuda:N; None: each recipe's training.device.
    # Where a run goes, like its threads: not part of the training digest (see Study.run_config)
    device: str | None = None
    commit: bool = False  # git-commit each run's record folder as soon as it is written

    def validate(self, where: str) -> None:
        _at_least(self.jobs, 1, f"{where}.jobs")
        _at_least(self.threads, 0, f"{where}.threads")
        _at_least(self.nice, 0, f"{where}.nice")
        if self.device is not None and not is_device(self.device):
            raise ConfigError(f"expected auto, cpu, cuda or cuda:N (N a GPU's number), got {self.device!r}",
                              f"{where}.device")


def is_device(value: str) -> bool:
    kind, colon, index = value.partition(":")
    if not colon:
        return value in ("auto", "cpu", "cuda")
    return kind == "cuda" and index.isdigit() and index.isascii()


@dataclass
class SlurmSpec:
    partition: str | None = None
    time_min: int = 240
    gpus_per_run: int = 0
    cpus_per_run: int = 4
    mem_gb: int | None = None
    options: dict[str, Any] = field(default_factory=dict)  # more sbatch options (account, qos, ...)
    max_requeue: int = 5

    def validate(self, where: str) -> None:
        for name in ("time_min", "gpus_per_run", "cpus_per_run", "max_requeue"):
            _at_least(getattr(self, name), 0, f"{where}.{name}")
        _at_least(self.mem_gb, 1, f"{where}.mem_gb")


@dataclass
class TreesSpec:
    """The trees every run of the study reads, as a file made by ``structnmt trees export``
    (it keeps no words, so it is committed beside the study), pinned by its SHA-256."""

    file: str
    sha256: str

    def validate(self, where: str) -> None:
        if len(self.sha256) != 64 or any(c not in "0123456789abcdef" for c in self.sha256.lower()):
            raise ConfigError(f"expected a SHA-256 (64 hex digits), got {self.sha256!r}", f"{where}.sha256")


@dataclass
class StudyFile:
    """A study file as written, read with the config loader's typed machinery (unknown fields,
    types and ranges refused naming the field)."""

    name: str
    baseline: str
    seeds: list[int]
    max_steps: int
    recipes: list[Recipe]
    test_sets: list[str] | None = None
    overrides: dict[str, Any] = field(default_factory=dict)
    records: str | None = None
    work_dir: str | None = None
    executor: ExecutorSpec = field(default_factory=ExecutorSpec)
    slurm: SlurmSpec = field(default_factory=SlurmSpec)
    long_dependency: int = 7
    test_checkpoint: Literal["last", "best"] = "last"  # best: the checkpoint its validation picks
    trees: TreesSpec | None = None  # the trees the runs read travel with the study

    def validate(self, where: str) -> None:
        _check_name(self.name, "name")
        _check_seeds(self.seeds, "seeds")
        _at_least(self.max_steps, 1, "max_steps")
        _at_least(self.long_dependency, 0, "long_dependency")
        if not self.recipes:
            raise ConfigError("expected a non-empty list of {name, config, overrides}", "recipes")
        names: set[str] = set()
        for i, recipe in enumerate(self.recipes):
            if recipe.name in names:
                raise ConfigError(f"duplicate recipe name {recipe.name!r}", f"recipes[{i}].name")
            names.add(recipe.name)
        _check_baseline(self.baseline, self.recipes)


@dataclass
class Study(StudyFile):
    """A loaded study: the file's fields, where the file is, and where records and runs go."""

    path: Path = Path(".")
    records: Path = Path(".")  # type: ignore[assignment]  # the file's, or the file's path without .yaml
    work_dir: Path = Path(".")  # type: ignore[assignment]  # the file's, or runs/study_<name>

    def recipe(self, name: str) -> Recipe:
        for r in self.recipes:
            if r.name == name:
                return r
        raise ConfigError(f"no recipe {name!r}: the study's recipes are {', '.join(r.name for r in self.recipes)}",
                          "recipes", self.path)

    def with_baseline(self, name: str) -> Study:
        """The same study compared against another of its recipes (a control against the
        method it controls, say)."""
        try:
            _check_baseline(name, self.recipes)
        except ConfigError as err:
            raise ConfigError(err.message, err.field, self.path) from None
        return replace(self, baseline=name)

    def seeds_of(self, recipe: str) -> list[int]:
        return self.recipe(recipe).seeds or self.seeds

    def runs(self) -> list[tuple[str, int]]:
        """(recipe, seed) in the order they run: seed by seed, the baseline first, so that the
        first finished runs already give one full comparison; seeds only some recipes have
        come after the study's."""
        order = self._recipe_order()
        seeds = list(self.seeds)
        seeds += sorted({s for r in self.recipes for s in r.seeds or []} - set(seeds))
        return [(name, seed) for seed in seeds for name in order if seed in self.seeds_of(name)]

    def _recipe_order(self) -> list[str]:
        """The baseline first, then the recipes as the study file lists them."""
        return [self.baseline] + [r.name for r in self.recipes if r.name != self.baseline]

    def runs_of_seeds(self, seeds: list[int]) -> list[tuple[str, int]]:
        """(recipe, seed) of these seeds, in the order given, each once: a seed of the study as
        :meth:`runs` has it, a seed beside the study (trained whole before it joins ``seeds``) with
        every recipe that has no seeds of its own."""
        known = {seed for _, seed in self.runs()}
        return [(name, seed) for seed in dict.fromkeys(seeds) for name in self._recipe_order()
                if seed in self.seeds_of(name) or (seed not in known and self.recipe(name).seeds is None)]

    def run_dir(self, recipe: str, seed: int) -> Path:
        return self.work_dir / recipe / f"seed{seed}"

    def record_dir(self, recipe: str, seed: int) -> Path:
        return self.records / recipe / f"seed{seed}"

    @property
    def held_root(self) -> Path:
        """The ``pending/`` folder beside the records' folder, where a seed-major study holds
        finished runs' records until their seed is whole (``studies/pinned_lane.sh`` puts them
        there for a study whose records lie in ``studies/``; ``same_machine`` reads it)."""
        return self.records.parent / "pending"

    def held_dir(self, recipe: str, seed: int) -> Path:
        return self.held_root / self.records.name / recipe / f"seed{seed}"

    def test_view(self, cfg: ExperimentConfig) -> dict[str, Any]:
        """What decides a run's test scores once its weights are fixed: decoding and test sets."""
        view = {"decoding": json.loads(json.dumps(to_dict(cfg.decoding), default=str)),
                "test_sets": self.test_sets, "long_dependency": self.long_dependency}
        if self.test_checkpoint != "last":  # absent at the default: older records keep their view
            # validation then picks the tested weights, so how it validates is part of testing
            t = cfg.training
            view["checkpoint"] = {"rule": self.test_checkpoint, "valid_every": t.valid_every,
                                  "valid_beam": t.valid_beam, "metric": t.early_stopping_metric}
        return view

    def run_config(self, recipe: str, seed: int) -> ExperimentConfig:
        """The recipe's config with the study's and the recipe's overrides, its seed and the
        study's fixed update budget. Read once per study object (a report asks for each run's
        several times, and reading the YAML chain was a quarter of its time); a copy each call.
        The thread count is set on the copy: a worker learns its share of the cores after the
        study file was loaded (and its configs cached), and it must train with that share.
        So is the executor's ``device``: where a run trains, not what it is, so the training
        digest keeps the recipe's own ``training.device`` (:func:`train_view`), and the records
        of seeds trained on a CPU stand beside those of seeds trained on a GPU."""
        cache = self.__dict__.setdefault("_run_configs", {})
        if (recipe, seed) not in cache:
            cache[recipe, seed] = self._read_run_config(recipe, seed)
        cfg = copy.deepcopy(cache[recipe, seed])
        if self.executor.threads:
            cfg.training.threads = self.executor.threads
        if self.executor.device is not None and self.executor.device != cfg.training.device:
            setattr(cfg, RECIPE_DEVICE, cfg.training.device)
            cfg.training.device = self.executor.device
        return cfg

    def _read_run_config(self, recipe: str, seed: int) -> ExperimentConfig:
        r = self.recipe(recipe)
        overrides = {**self.overrides, **r.overrides,
                     "training.seed": seed, "training.max_steps": self.max_steps, "training.max_minutes": 0,
                     "training.out_dir": str(self.run_dir(recipe, seed)), "training.progress": False}
        return load_config(r.config, overrides)


def _check_baseline(baseline: str, recipes: list[Recipe]) -> None:
    if baseline not in {r.name for r in recipes}:
        raise ConfigError(f"{baseline!r} is not one of the study's recipes ({', '.join(r.name for r in recipes)})",
                          "baseline")


def _check_folder(folder: Path, field: str, path: Path) -> None:
    """Refuse a folder field that names a file, or lies under one: it cannot hold the study's runs."""
    for place in (folder, *folder.parents):
        if place.exists():
            if not place.is_dir():
                what = f"{folder} is a file" if place == folder else f"{folder} lies under {place}, a file"
                raise ConfigError(f"{what}, not a folder; name a folder for the study's "
                                  f"{'records' if field == 'records' else 'runs'}", field, path)
            return


def load_study(path: str | Path) -> Study:
    """Read and validate a study file; every recipe's config is loaded with its overrides."""
    path = Path(path)
    try:
        raw = parse_yaml(path.read_text(encoding="utf-8"), path)
    except FileNotFoundError:
        raise ConfigError("study file not found", path=path) from None
    except IsADirectoryError:
        raise ConfigError("is a directory, not a study file", path=path) from None
    except UnicodeDecodeError as err:
        raise ConfigError(f"not valid UTF-8 ({err.reason})", path=path) from None
    if not isinstance(raw, dict):
        raise ConfigError("a study file is a mapping (name, baseline, seeds, max_steps, recipes)", path=path)
    # an ``overrides:`` key left empty reads as YAML null: no overrides
    if raw.get("overrides", {}) is None:
        raw["overrides"] = {}
    for item in raw.get("recipes") or []:
        if isinstance(item, dict) and "overrides" in item and item["overrides"] is None:
            item["overrides"] = {}
    try:
        spec = from_dict(StudyFile, raw)
    except ConfigError as err:
        raise ConfigError(err.message, err.field, path) from None
    study = Study(**{**vars(spec), "path": path, "records": Path(spec.records or path.with_suffix("")),
                     "work_dir": Path(spec.work_dir or f"runs/study_{spec.name}")})
    for name in ("records", "work_dir"):  # a file there failed later, run by run, in OS words
        _check_folder(getattr(study, name), name, path)
    recipes, seeds = spec.recipes, spec.seeds
    # every run's config, validated now: an unknown field in an override names its recipe
    datasets: dict[str, tuple[str, dict]] = {}
    for i, r in enumerate(recipes):
        try:
            cfg = study.run_config(r.name, seeds[0])
        except ConfigError as err:
            raise ConfigError(f"recipe {r.name!r}: {err}", f"recipes[{i}]", path) from None
        if cfg.data is None:
            raise ConfigError(f"recipe {r.name!r} has no data section", f"recipes[{i}].config", path)
        data = json.loads(json.dumps(asdict(cfg.data)))
        for key in ("processes", "cache_dir"):
            data.pop(key, None)
        if cfg.data.dir in datasets and datasets[cfg.data.dir][1] != data:
            raise ConfigError(f"recipe {r.name!r} builds {cfg.data.dir} from another data section than recipe "
                              f"{datasets[cfg.data.dir][0]!r}: one would overwrite the other", f"recipes[{i}]", path)
        datasets.setdefault(cfg.data.dir, (r.name, data))
        # a misspelt test set would otherwise be found only after every run has trained
        unknown = [name for name in study.test_sets or () if name not in cfg.data.splits]
        if unknown:
            raise ConfigError(f"{unknown[0]!r} is not one of the splits of recipe {r.name!r} "
                              f"(data.splits: {', '.join(cfg.data.splits)})", "test_sets", path)
    return study


#: on a run config whose device the study's executor set: the recipe's own ``training.device``
RECIPE_DEVICE = "_recipe_device"

#: training fields that change neither the weights a run ends with nor what it reads
TRAINING_FIELDS_WITHOUT_EFFECT = ("out_dir", "threads", "progress", "tensorboard", "num_workers", "valid_every",
                                  "valid_beam", "valid_bleu", "log_every", "keep_last")
#: training fields added to the config since run folders keep a digest, at the value that trains
#: on a CPU as before they existed: left out of the view there, so that a run half done keeps its
#: checkpoints (a folder whose marker differs is cleared)
TRAINING_FIELDS_ADDED = {"cuda_graphs": "auto"}


def train_view(cfg: ExperimentConfig) -> dict[str, Any]:
    """What decides a run's final weights: the config after overrides, less where things go,
    how fast, how often it is watched (validation does not touch the weights or the random
    streams) and how it is tested (``decoding``: see :meth:`Study.test_view`)."""
    raw = json.loads(json.dumps(to_dict(cfg), default=str))
    raw.pop("path", None)
    raw.pop("decoding", None)
    if (recipe_device := getattr(cfg, RECIPE_DEVICE, None)) is not None:  # the executor's device is not the recipe's
        raw["training"]["device"] = recipe_device
    for key in TRAINING_FIELDS_WITHOUT_EFFECT:
        raw.get("training", {}).pop(key, None)
    for key, default in TRAINING_FIELDS_ADDED.items():
        if raw.get("training", {}).get(key) == default:
            del raw["training"][key]
    for key in ("processes", "cache_dir"):
        (raw.get("data") or {}).pop(key, None)
    return raw


def config_digest(cfg: ExperimentConfig) -> str:
    """The training digest of a run (:func:`train_view` hashed)."""
    return hashlib.sha256(json.dumps(train_view(cfg), sort_keys=True).encode()).hexdigest()


_NO_DEFAULT = object()


def field_default(dotted: str) -> Any:
    """The default of a config field named ``data.clean.max_len`` (JSON-shaped), or a sentinel
    when it has none (a required field, one inside a mapping, an unknown name)."""
    tp: Any = ExperimentConfig
    names = dotted.split(".")
    for depth, name in enumerate(names):
        fields = {f.name: f for f in dataclasses.fields(tp)} if dataclasses.is_dataclass(tp) else {}
        if name not in fields:
            return _NO_DEFAULT
        if depth == len(names) - 1:
            f = fields[name]
            if f.default is not dataclasses.MISSING:
                value = f.default
            elif f.default_factory is not dataclasses.MISSING:
                value = f.default_factory()
                value = to_dict(value) if dataclasses.is_dataclass(value) else value
            else:
                return _NO_DEFAULT
            return json.loads(json.dumps(value, default=str))
        tp = typing.get_type_hints(tp)[name]
        if isinstance(tp, types.UnionType) or typing.get_origin(tp) is typing.Union:  # X | None
            tp = next((a for a in typing.get_args(tp) if a is not type(None)), None)
    return _NO_DEFAULT


def added_at_default(recorded: dict[str, Any], today: dict[str, Any]) -> bool:
    """Whether the only differences between a record's training view and today's are fields
    added to the config since the record was made, at their defaults: such a record stands
    (a new option that is off changes nothing that was trained)."""

    differ = config_differences(recorded, today, "")
    return bool(differ) and all(old is None and new == field_default(key.lstrip(".")) for key, old, new in differ)
