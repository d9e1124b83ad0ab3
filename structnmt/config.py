"""YAML experiment configs, validated on load.

One file describes one experiment: ``data`` (how ``prepare`` builds the dataset),
``model``, ``training`` and ``decoding``. Every section is a dataclass; loading
checks unknown fields, types and impossible values and raises :class:`ConfigError`
naming the field path (``model.n_heads``), so a typo never silently falls back to a
default.
"""

from __future__ import annotations

import copy
import dataclasses
import difflib
import json
import math
import re
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml

from structnmt.errors import ConfigError
from structnmt.method_config import METHOD_PARAMS, MethodParams

# ---------------------------------------------------------------------------
# generic dataclass validation


def _type_name(tp: Any) -> str:
    return getattr(tp, "__name__", None) or str(tp).replace("typing.", "")


def _convert_union(args: tuple[Any, ...], value: Any, where: str) -> Any:
    """The first option of a union that ``value`` fits; else the error that says most."""
    if value is None and type(None) in args:
        return None
    options = [arg for arg in args if arg is not type(None)]
    if len(options) == 1:  # ``X | None``: X's own error names the field inside (data.clean.foo)
        return convert(options[0], value, where)
    errors: dict[Any, ConfigError] = {}
    for arg in options:
        try:
            return convert(arg, value, where)
        except ConfigError as err:
            errors[arg] = err
    # a word where a word is wanted, or a list where a list is: that option's own error says more
    # (``stack: encodr`` -> "must be one of ['encoder', 'decoder']") than a list of type names
    # (a word only where every other option is a list: ``int | Literal["auto"]`` says both)
    lists = [arg for arg in errors if typing.get_origin(arg) in (list, tuple)]
    if isinstance(value, str) and len(errors) - len(lists) == 1:
        shaped = [err for arg, err in errors.items() if typing.get_origin(arg) is Literal]
        if shaped:
            raise shaped[0]
    if isinstance(value, (list, tuple)) and len(lists) == 1:
        raise errors[lists[0]]
    raise ConfigError(f"expected {' or '.join(_type_name(a) for a in args)}, got {value!r}", where)


def _convert_scalar(tp: Any, value: Any, where: str) -> Any:
    """A bool, int, float or str as YAML gave it (a bool is no number; a float is finite)."""
    if tp is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"expected true or false, got {value!r}", where)
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"expected an integer, got {value!r}", where)
        return value
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"expected a number, got {value!r}", where)
        if not math.isfinite(value):  # .nan passes every "must be positive" test by failing none
            raise ConfigError(f"expected a finite number, got {value!r}", where)
        return float(value)
    if tp is str:
        if not isinstance(value, str):
            raise ConfigError(f"expected a string, got {value!r}", where)
        return value
    return value


def convert(tp: Any, value: Any, where: str) -> Any:
    """Check ``value`` against the annotation ``tp`` and build nested dataclasses."""
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if tp is Any:
        return value
    if origin in (typing.Union, types.UnionType):
        return _convert_union(args, value, where)
    if origin is Literal:
        if isinstance(value, bool) and {"on", "off"} <= set(args):  # YAML 1.1 reads on/off as booleans
            value = "on" if value else "off"
        if value not in args:
            raise ConfigError(f"must be one of {list(args)}, got {value!r}", where)
        return value
    if origin in (list, tuple):
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"expected a list, got {value!r}", where)
        item = args[0] if args else Any
        return [convert(item, v, f"{where}[{i}]") for i, v in enumerate(value)]
    if origin is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"expected a mapping, got {value!r}", where)
        ktp, vtp = args if args else (Any, Any)
        return {convert(ktp, k, where): convert(vtp, v, f"{where}.{k}") for k, v in value.items()}
    if isinstance(tp, type) and issubclass(tp, MethodParams):
        return method_params(value, where)
    if dataclasses.is_dataclass(tp):
        return from_dict(tp, value, where)
    return _convert_scalar(tp, value, where)


def from_dict(cls: type, data: Any, where: str = "") -> Any:
    """Build dataclass ``cls`` from a mapping, refusing unknown fields by name."""
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"expected a mapping, got {data!r}", where or None)
    hints = typing.get_type_hints(cls)
    known = {f.name: f for f in dataclasses.fields(cls) if f.init}
    unknown = sorted(set(data) - set(known))
    if unknown:
        name = f"{where}.{unknown[0]}" if where else unknown[0]
        listed = sorted(n for n, f in known.items() if not f.metadata.get("internal"))
        if cls is ExperimentConfig and unknown[0] != "base":
            listed = sorted([*listed, "base"])  # read (and removed) by the YAML loader
        close = difflib.get_close_matches(unknown[0], listed, n=1)
        guess = f"did you mean {close[0]!r}? " if close else ""
        raise ConfigError(f"unknown field ({guess}known fields: {', '.join(listed)})", name)
    kwargs = {}
    for name, value in data.items():
        path = f"{where}.{name}" if where else name
        kwargs[name] = convert(hints[name], value, path)
    missing = [
        n for n, f in known.items()
        if n not in kwargs and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
    ]
    if missing:
        name = f"{where}.{missing[0]}" if where else missing[0]
        raise ConfigError("required field is missing", name)
    obj = cls(**kwargs)
    check = getattr(obj, "validate", None)
    if check is not None:
        check(where)
    return obj


def _flatten(node: Any, prefix: str) -> dict[str, Any]:
    if isinstance(node, dict):
        out: dict[str, Any] = {}
        for key, value in node.items():
            out.update(_flatten(value, f"{prefix}.{key}"))
        return out
    return {prefix: node}


def config_differences(a: dict[str, Any], b: dict[str, Any], prefix: str,
                       ignore: tuple[str, ...] = ()) -> list[tuple[str, Any, Any]]:
    """(field, a's value, b's value) for each leaf field that differs, e.g. ("model.d_model", 256, 512)."""
    fa, fb = _flatten(json.loads(json.dumps(a)), prefix), _flatten(json.loads(json.dumps(b)), prefix)
    return [(k, fa.get(k), fb.get(k)) for k in sorted(set(fa) | set(fb))
            if fa.get(k) != fb.get(k) and k not in ignore]


#: data fields that do not change what a prepared dataset holds
DATA_FIELDS_WITHOUT_EFFECT = ("data.processes", "data.cache_dir", "data.dir", "data.clean.allow_misaligned")


def dataset_differences(differ: list[tuple[str, Any, Any]]) -> str:
    """``config_differences(recorded, asked)`` in words, the first three: what a dataset was
    prepared with against what a config asks for."""
    shown = "; ".join(f"{k}: {b!r} asked, {a!r} in the dataset" for k, a, b in differ[:3])
    return shown + (f" (+{len(differ) - 3} more)" if len(differ) > 3 else "")


def to_dict(obj: Any) -> Any:
    """A config (or a section) as plain data; a method's parameters as the entry it was read from."""
    if isinstance(obj, MethodParams):
        return obj.entry()
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: to_dict(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, (list, tuple)):
        return type(obj)(to_dict(v) for v in obj)
    if isinstance(obj, dict):
        return {k: to_dict(v) for k, v in obj.items()}
    return copy.deepcopy(obj)


def method_params(entry: Any, where: str) -> MethodParams:
    """One ``model.methods`` entry as its method's typed ``Params`` (older spellings read),
    checked field by field; the model-bound checks run in :meth:`ModelConfig.validate`."""
    if isinstance(entry, MethodParams):  # built in code: the same checks as an entry read from a file
        if METHOD_PARAMS.get(entry.name) is not type(entry):
            raise ConfigError(f"{type(entry).__name__} with name {entry.name!r} is not a registered method's "
                              f"parameters (known: {', '.join(sorted(METHOD_PARAMS))})", f"{where}.name")
        entry.validate(where)
        return entry
    if not isinstance(entry, dict) or "name" not in entry:
        raise ConfigError(f"expected a mapping with the method's name, got {entry!r}", where)
    from structnmt.model.methods import broken_entry_points, discover  # the registry types the entries

    discover()
    name = entry["name"]
    cls = METHOD_PARAMS.get(name) if isinstance(name, str) else None
    if cls is None:
        broken = "".join(f"; it may be one of a package that failed: {what}" for what in broken_entry_points)
        raise ConfigError(f"unknown method {name!r} (known: {', '.join(sorted(METHOD_PARAMS))}; a method defined "
                          f"outside structnmt is found when STRUCTNMT_METHODS names its module){broken}",
                          f"{where}.name")
    try:
        params = from_dict(cls, cls.respell(entry, where), where)
    except ConfigError as err:
        raise cls.as_written(err, entry, where) from None
    params._entry = copy.deepcopy(entry)
    return params


def _need(cond: bool, message: str, where: str) -> None:
    if not cond:
        raise ConfigError(message, where)


def _at_least(obj: Any, where: str, minimum: float, *names: str) -> None:
    """Each field in ``names`` is at least ``minimum``: a negative count or budget means nothing."""
    for name in names:
        value = getattr(obj, name)
        if minimum == 0:
            _need(value >= 0, f"must not be negative, got {value!r}", f"{where}.{name}")
        else:
            _need(value >= minimum, f"must be at least {minimum:g}, got {value!r}", f"{where}.{name}")


# ---------------------------------------------------------------------------
# data: what ``structnmt prepare`` does


@dataclass
class ParserConfig:
    """Which parser produces the word-level trees of one side."""

    backend: Literal["spacy", "stanza", "udpipe", "conllu", "none"] = "none"
    model: str | None = None  # spaCy model name or path, Stanza language, UDPipe model file
    conllu: dict[str, str] = field(default_factory=dict)  # split name -> CoNLL-U file (backend conllu)
    convention: Literal["ud", "clearnlp", "other"] | None = None  # recorded in the dataset
    batch_size: int = 256

    def validate(self, where: str) -> None:
        if self.backend in ("spacy", "stanza", "udpipe"):
            _need(bool(self.model), f"the {self.backend} back end needs a model name", f"{where}.model")
        if self.backend == "conllu":
            _need(bool(self.conllu), "the conllu back end needs a CoNLL-U file per split", f"{where}.conllu")
        _at_least(self, where, 1, "batch_size")


@dataclass
class SideConfig:
    lang: str
    parser: ParserConfig = field(default_factory=ParserConfig)
    scenes: Literal["none", "dependency", "ucca"] = "none"
    ucca: dict[str, str] = field(default_factory=dict)  # split name -> directory of UCCA XML passages


@dataclass
class SplitFiles:
    """One split: two plain/gzipped files, or one TSV of pairs."""

    src: str | None = None
    tgt: str | None = None
    tsv: str | None = None

    def validate(self, where: str) -> None:
        _need(
            (self.tsv is not None) != (self.src is not None and self.tgt is not None),
            "give either src and tgt files or one tsv file",
            where,
        )


@dataclass
class SubwordConfig:
    kind: Literal["sentencepiece", "none"] = "sentencepiece"
    model_type: Literal["unigram", "bpe"] = "unigram"
    vocab_size: int = 8000
    joint: bool = True
    character_coverage: float = 1.0
    sample_pairs: int = 200_000  # training pairs (a fixed random sample) the model learns from; 0: all

    def validate(self, where: str) -> None:
        _need(self.vocab_size >= 16, "must be at least 16", f"{where}.vocab_size")
        _need(self.sample_pairs >= 0, "must not be negative (0: all training pairs)", f"{where}.sample_pairs")
        _need(0.0 < self.character_coverage <= 1.0, "must be in (0, 1]", f"{where}.character_coverage")


@dataclass
class CleanConfig:
    max_len: int = 250  # words (whitespace tokens) per side
    max_ratio: float = 3.0  # longer/shorter side, in words
    drop_bad_lines: bool = False  # drop (and count) undecodable or control-character lines instead of failing
    allow_misaligned: bool = False  # go on (with a warning) where source and target lines slip against each other

    def validate(self, where: str) -> None:
        _need(self.max_len > 0, "must be positive", f"{where}.max_len")
        _need(self.max_ratio >= 1.0, "must be at least 1", f"{where}.max_ratio")


@dataclass
class DataConfig:
    src: SideConfig
    tgt: SideConfig
    splits: dict[str, SplitFiles]
    dir: str  # the dataset directory prepare writes and train reads
    train_split: str = "train"
    valid_split: str = "val"
    moses: bool = False  # Moses-tokenise before sub-words (and detokenise translations)
    subwords: SubwordConfig = field(default_factory=SubwordConfig)
    clean: CleanConfig = field(default_factory=CleanConfig)
    processes: int = 1
    cache_dir: str | None = None  # parse cache; default: <dir>/.parse_cache
    multitask_parse: bool = False  # C&H: add linearised-parse examples to training (baselines)

    def validate(self, where: str) -> None:
        _need(self.train_split in self.splits,
              f"the training split is missing (data.train_split is {self.train_split!r}; "
              f"data.splits has {sorted(self.splits)})", f"{where}.splits.{self.train_split}")
        # without a split named "val" a run does not validate; a split named otherwise must exist
        _need(self.valid_split in self.splits or self.valid_split == "val",
              f"{self.valid_split!r} is not one of data.splits ({', '.join(self.splits)})", f"{where}.valid_split")
        _need(self.processes >= 1, "must be at least 1", f"{where}.processes")


# ---------------------------------------------------------------------------
# model


@dataclass
class ModelConfig:
    enc_layers: int = 3
    dec_layers: int = 3
    d_model: int = 256
    n_heads: int = 4
    d_ff: int = 1024
    dropout: float = 0.1
    attention_dropout: float = 0.0
    activation_dropout: float = 0.0
    norm: Literal["pre", "post"] = "pre"
    share_embeddings: bool = True  # source/target embeddings (needs a joint vocabulary)
    tie_output: bool = True  # decoder input embedding = output projection
    positional: Literal["sinusoidal", "learned", "none"] = "sinusoidal"
    max_positions: int = 1024
    methods: list[MethodParams] = field(default_factory=list)  # structure-aware plug-ins, see model.methods
    # the route attention prefers (the same function on every route; structnmt/model/attention.py):
    # auto = SDPA where the plug-ins' effects allow it, except on a CPU for bf16/fp16 and for
    # layers that scale scores or weights, where the explicit (B, H, I, J) path is as fast or
    # faster; explicit / sdpa / flex ask for one route, and a layer that cannot take it falls
    # back along flex -> sdpa -> explicit. "fused" is the older name of "sdpa".
    attention_kernel: Literal["auto", "explicit", "sdpa", "flex", "fused"] = "auto"

    def validate(self, where: str) -> None:
        _need(self.enc_layers >= 1, "must be at least 1", f"{where}.enc_layers")
        _need(self.dec_layers >= 1, "must be at least 1", f"{where}.dec_layers")
        _need(self.n_heads >= 1, "must be at least 1", f"{where}.n_heads")
        _at_least(self, where, 1, "d_model", "d_ff", "max_positions")
        _need(self.d_model % self.n_heads == 0,
              f"n_heads ({self.n_heads}) must divide d_model ({self.d_model})", f"{where}.n_heads")
        for name in ("dropout", "attention_dropout", "activation_dropout"):
            value = getattr(self, name)
            _need(0.0 <= value < 1.0, "must be in [0, 1)", f"{where}.{name}")
        for i, method in enumerate(self.methods):  # each read and checked field by field already
            try:
                method.check_model(self, f"{where}.methods[{i}]")
            except ConfigError as err:
                raise method.as_written(err, method.entry(), f"{where}.methods[{i}]") from None

    def __post_init__(self) -> None:
        # a ModelConfig built in code may list entries as mappings: they are typed here, as on load
        self.methods = [method_params(m, f"model.methods[{i}]") for i, m in enumerate(self.methods)]


# ---------------------------------------------------------------------------
# training


@dataclass
class TrainingConfig:
    out_dir: str = "runs/experiment"
    seed: int = 1
    max_tokens: int = 4096  # target tokens per batch (per process)
    accumulate: int = 1  # gradient accumulation steps
    max_steps: int = 0  # optimiser updates; 0: no limit
    max_epochs: int = 0  # 0: no limit
    max_minutes: float = 0.0  # wall-clock budget; 0: no limit
    lr: float = 7e-4
    warmup: int = 4000
    betas: list[float] = field(default_factory=lambda: [0.9, 0.98])
    eps: float = 1e-9
    weight_decay: float = 0.0
    clip_norm: float = 0.0
    label_smoothing: float = 0.1
    valid_every: int = 1000  # steps; 0: once per epoch, or never where the dataset has no valid_split
    valid_bleu: bool = True
    valid_beam: int = 1  # greedy by default: cheaper during training
    early_stopping: int = 0  # validations without improvement; 0: off
    early_stopping_metric: Literal["bleu", "loss"] = "bleu"
    keep_last: int = 3  # step checkpoints kept besides best.pt and last.pt
    log_every: int = 100
    # processes collating training batches ahead (structnmt/data/prefetch.py); auto: 2 on a CUDA GPU
    # where this process has 3 or more cores of its own (at most `threads` where set), else 0 (on a
    # CPU they take the update's cores)
    num_workers: int | Literal["auto"] = "auto"
    device: str = "auto"  # auto | cpu | cuda | cuda:N
    # auto: on a CPU bf16 where it is native, else fp32; on a GPU fp32 with TF32 matmuls for
    # d_model < 1024 (launch-bound), else bf16 (fp16 + gradient scaler without bf16); fp32 is
    # plain fp32 (structnmt/training/environment.py, docs/training.md)
    precision: Literal["fp32", "bf16", "fp16", "auto"] = "auto"
    # torch.compile of forward + loss (structnmt/training/compiled.py); auto: on CUDA GPUs only
    compile: Literal["auto", "on", "off"] = "auto"
    # the compiled step replayed as CUDA graphs, batches padded to bucketed shapes; auto: where
    # training is compiled on CUDA; off on a CPU (on says so and trains without them)
    cuda_graphs: Literal["auto", "on", "off"] = "auto"
    # batch lengths rounded up to a multiple of this; 0: auto = 8 where training is compiled on
    # CUDA (inductor specialises its kernels on length % 8 there, so mixed lengths compile one
    # graph per combination), else 1 (every CPU result unchanged); never past
    # model.max_positions, and validation batches are not padded
    pad_to_multiple: int = 0
    threads: int = 0  # torch intra-op threads; 0: library default
    deterministic: bool = False
    max_bad_steps: int = 10  # non-finite losses tolerated before the run stops
    bucket_width: int = 0  # >0: batch by length rounded down to a multiple of it (data/batching.py); 0: exact
    tensorboard: bool = True
    progress: bool = True

    def validate(self, where: str) -> None:
        _need(self.max_tokens > 0, "must be positive", f"{where}.max_tokens")
        _need(self.accumulate >= 1, "must be at least 1", f"{where}.accumulate")
        _need(self.lr > 0, "must be positive", f"{where}.lr")
        _need(self.warmup >= 0, "must not be negative", f"{where}.warmup")
        _need(len(self.betas) == 2 and all(0 <= b < 1 for b in self.betas), "must be two numbers in [0, 1)",
              f"{where}.betas")
        _need(0.0 <= self.label_smoothing < 1.0, "must be in [0, 1)", f"{where}.label_smoothing")
        _need(self.eps > 0, "must be positive", f"{where}.eps")
        _at_least(self, where, 0, "max_steps", "max_epochs", "max_minutes", "weight_decay", "clip_norm",
                  "valid_every", "early_stopping", "keep_last", "log_every", "threads",
                  "max_bad_steps", "bucket_width", "pad_to_multiple")
        if self.num_workers != "auto":
            _at_least(self, where, 0, "num_workers")
        _at_least(self, where, 1, "valid_beam")
        check_beam(self.valid_beam, f"{where}.valid_beam")


# ---------------------------------------------------------------------------
# decoding

#: the widest beam accepted (``decoding.beam``, ``--beam``, ``beam=``, ``nbest``): search memory and
#: time grow with the beam, and a beam of 10**6 once ran for over ten minutes into 14 GB. A beam is
#: also cut to the target vocabulary when searching (:func:`structnmt.model.search.translate_batch`).
MAX_BEAM = 1000


def check_count(value: Any, where: str, least: int, note: str = "") -> None:
    """An integer argument (a command's option, an API argument) of at least ``least``, or a
    :class:`ConfigError` naming ``where``; ``note`` says what the smallest values mean."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"expected an integer, got {value!r}", where)
    if value < least:
        raise ConfigError(f"must be at least {least}, got {value}{note}", where)


def check_beam(beam: int, where: str) -> None:
    """Refuse a beam over :data:`MAX_BEAM` naming ``where``, before a search that would not end."""
    _need(beam <= MAX_BEAM, f"must be at most {MAX_BEAM}, got {beam} (search memory and time grow with the "
                            "beam; one wider than the target vocabulary finds nothing more)", where)


@dataclass
class DecodingConfig:
    beam: int = 5
    length_penalty: float = 0.6  # GNMT alpha; 0 disables
    max_len_a: float = 1.5  # max target length = a * source length + b
    max_len_b: int = 10
    nbest: int = 1
    max_tokens: int = 8000  # source tokens per decoding batch

    def validate(self, where: str) -> None:
        _at_least(self, where, 1, "beam")
        check_beam(self.beam, f"{where}.beam")
        _need(1 <= self.nbest <= self.beam, f"must be between 1 and the beam size ({self.beam}), got {self.nbest}",
              f"{where}.nbest")
        _at_least(self, where, 0, "length_penalty", "max_len_a", "max_len_b")
        _at_least(self, where, 1, "max_tokens")


@dataclass
class ExperimentConfig:
    data: DataConfig | None = None
    model: ModelConfig = field(default_factory=ModelConfig)
    training: TrainingConfig = field(default_factory=TrainingConfig)
    decoding: DecodingConfig = field(default_factory=DecodingConfig)
    # set by load_config: where it came from (not a field a user writes)
    path: str | None = field(default=None, repr=False, metadata={"internal": True})


class YamlLoader(yaml.SafeLoader):
    """YAML as configs are written: PyYAML follows YAML 1.1, which reads ``1e-3`` and ``.5e3``
    (no dot, or no digit before it) as strings; here they are the numbers a user means."""


class YamlDumper(yaml.SafeDumper):
    """Writes what :class:`YamlLoader` reads back as written: a string such as ``"1e5"`` quoted."""


_E_FLOAT = re.compile(r"^[-+]?(?:[0-9][0-9_]*(?:\.[0-9_]*)?|\.[0-9_]+)[eE][-+]?[0-9]+$")
for _cls in (YamlLoader, YamlDumper):
    _cls.add_implicit_resolver("tag:yaml.org,2002:float", _E_FLOAT, list("-+.0123456789"))


def dump_yaml(data: Any) -> str:
    """``data`` as YAML that :func:`parse_yaml` reads back unchanged (configs a run writes)."""
    return yaml.dump(data, Dumper=YamlDumper, sort_keys=False, allow_unicode=True)


def parse_yaml(text: str, path: str | Path | None = None, what: str = "not valid YAML") -> Any:
    """``text`` read as YAML; a syntax error is one line naming its line and column."""
    try:
        return yaml.load(text, Loader=YamlLoader)
    except yaml.YAMLError as err:
        raise ConfigError(yaml_problem(err, what), path=path) from None


def yaml_problem(err: yaml.YAMLError, what: str = "not valid YAML") -> str:
    """One line for a YAML error: where (1-based line and column) and what PyYAML found."""
    mark = getattr(err, "problem_mark", None)
    where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
    problem = getattr(err, "problem", None) or str(err)
    return " ".join(f"{where}{what}: {problem}".split())


def _read_yaml(path: Path, chain: tuple[Path, ...] = ()) -> dict[str, Any]:
    """Read one YAML file, following ``base:`` (a recipe it extends, relative to this file)."""
    if path.resolve() in chain:
        raise ConfigError("configs extend each other in a circle", "base", path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError("config file not found", path=path) from None
    except IsADirectoryError:
        raise ConfigError("is a directory, not a config file", path=path) from None
    except UnicodeDecodeError as err:
        raise ConfigError(f"not valid UTF-8 ({err.reason})", path=path) from None
    try:
        _refuse_duplicate_keys(yaml.compose(text, Loader=YamlLoader), path)
    except yaml.YAMLError as err:
        raise ConfigError(yaml_problem(err), path=path) from None
    raw = parse_yaml(text, path)
    if raw is None:  # an empty file (or only comments) would otherwise fail later, naming no file
        raise ConfigError("the config file is empty", path=path)
    if not isinstance(raw, dict):
        raise ConfigError("the config must be a mapping of sections", path=path)
    base = raw.pop("base", None)
    if base is None:
        return raw
    if not isinstance(base, str):
        raise ConfigError(f"expected the path of a config, got {base!r}", "base", path)
    return _merge(_read_yaml(path.parent / base, chain + (path.resolve(),)), raw)


def _refuse_duplicate_keys(node: yaml.Node | None, path: Path, where: str = "") -> None:
    """YAML lets a later key silently replace an earlier one; a config with a key twice is refused,
    naming both lines (1-based), since either could be the one meant."""
    if isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            _refuse_duplicate_keys(item, path, f"{where}[{i}]")
    if not isinstance(node, yaml.MappingNode):
        return
    seen: dict[str, int] = {}
    for key, value in node.value:
        name = str(key.value)
        dotted = f"{where}.{name}" if where else name
        line = key.start_mark.line + 1
        if name in seen:
            raise ConfigError(f"duplicate key {name!r} on lines {seen[name]} and {line}: keep one", dotted, path)
        seen[name] = line
        _refuse_duplicate_keys(value, path, dotted)


def _merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    """Deep-merge mappings; lists and scalars of ``over`` replace those of ``base``, and ``null``
    removes the base's key (a split or section the extending config does not want; a field so
    removed takes its default, which for every optional field is null anyway)."""
    out = dict(base)
    for key, value in over.items():
        if value is None:
            out.pop(key, None)
        elif isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _merge(out[key], value)
        else:
            out[key] = value
    return out


def load_config(path: str | Path, overrides: dict[str, Any] | None = None) -> ExperimentConfig:
    """Read and validate a YAML config.

    A config may extend another with ``base: other.yaml`` (its mappings merged key by key,
    ``key: null`` removing one of the base's); ``overrides`` are dotted keys
    (``training.max_steps``) set after loading. Relative paths inside are taken from the
    directory the command runs in (the recipes assume the project's root).

    Every field is checked, each ``model.methods`` entry as its method's typed parameters.
    """
    path = Path(path)
    raw = _read_yaml(path)
    raw.pop("path", None)
    for key, value in (overrides or {}).items():
        set_dotted(raw, key, value)
    try:
        cfg = from_dict(ExperimentConfig, raw)
    except ConfigError as err:
        raise ConfigError(str(err), path=path) from None
    cfg.path = str(path)
    return cfg


def config_from_dict(raw: dict[str, Any]) -> ExperimentConfig:
    """An :class:`ExperimentConfig` from a mapping of sections (fields checked as in :func:`load_config`)."""
    return from_dict(ExperimentConfig, dict(raw))


def with_overrides(cfg: ExperimentConfig, overrides: dict[str, Any] | None) -> ExperimentConfig:
    """``cfg`` with dotted keys (``{"training.lr": 1e-3}``) set, checked again; ``cfg`` is left as it is."""
    if not overrides:
        return cfg
    raw = to_dict(cfg)
    path = raw.pop("path", None)
    for key, value in overrides.items():
        set_dotted(raw, key, value)
    try:
        new = config_from_dict(raw)
    except ConfigError as err:
        raise ConfigError(str(err), path=path) from None
    new.path = path
    return new


def set_dotted(raw: dict[str, Any], key: str, value: Any) -> None:
    """``raw["a"]["b"]["c"] = value`` for ``key = "a.b.c"``, making missing sections; a number
    indexes a list (``model.methods.0.heads`` or ``model.methods[0].heads``)."""
    parts = re.sub(r"\[(\d+)\]", r".\1", key).split(".")
    if not all(parts):
        raise ConfigError("not a dotted field name (like training.lr or model.methods.0.heads)", key)
    if parts[0] in ("base", "path"):  # neither is a field of the config: both belong to its file
        raise ConfigError("not a field to set: a config's base is written at the top of its YAML file, and its "
                          "path is where it was read from", key)
    node: Any = raw
    for i, part in enumerate(parts):
        where = ".".join(parts[:i]) or key
        last = i == len(parts) - 1
        if isinstance(node, list):
            if not part.isdigit() or int(part) >= len(node):
                raise ConfigError(f"a list of {len(node)}: index with 0..{len(node) - 1}, not {part!r}" if node
                                  else f"an empty list: it has no item {part!r}", where)
            if last:
                node[int(part)] = value
            else:
                node = node[int(part)]
        elif isinstance(node, dict):
            if last:
                node[part] = value
            else:
                if node.get(part) is None and parts[i + 1].isdigit():  # missing, or left empty (YAML null)
                    raise ConfigError(f"has no entries: an index reaches into a list the config gives (set the "
                                      f"whole list with {'.'.join(parts[:i + 1])}=[...])", ".".join(parts[:i + 1]))
                if node.get(part) is None:
                    node[part] = {}
                node = node[part]
        else:
            raise ConfigError(f"is {node!r}, not a section: it has no field {part!r}", where)


def parse_overrides(items: list[str], where: str = "--set") -> dict[str, Any]:
    """``["training.lr=1e-3", ...]`` (the command line's ``--set``) -> ``{"training.lr": 0.001}``.

    Values are read as YAML, so numbers, booleans and lists get their types."""
    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ConfigError(f"expected KEY=VALUE, got {item!r}", where)
        try:
            out[key] = yaml.load(value, Loader=YamlLoader)
        except yaml.YAMLError as err:
            raise ConfigError(yaml_problem(err, "the value is not valid YAML"), f"{where} {key}") from None
    return out
