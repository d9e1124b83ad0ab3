"""structnmt from Python: one function for each step of an experiment.

Every ``structnmt`` command is argument parsing around one of these functions, so a
notebook or a script can do whatever the command line does::

    import structnmt

    cfg = structnmt.load_config("configs/multi30k_en_de_pascal.yaml", {"training.max_steps": 2000})
    structnmt.prepare(cfg)
    summary = structnmt.train(cfg)                 # {"status": "max_steps", "step": 2000, ...}
    scores = structnmt.test("runs/multi30k_en_de_pascal")
    translator = structnmt.load("runs/multi30k_en_de_pascal/best.pt")
    translator.translate(["A man is riding a bike."], beam=5)

Problems with what was given raise :class:`~structnmt.errors.StructNMTError` subclasses,
never ``SystemExit``: :class:`~structnmt.errors.ConfigError` (a config field or an argument,
named), :class:`~structnmt.errors.DataError` (a file and line),
:class:`~structnmt.errors.CheckpointError`, :class:`~structnmt.errors.ParserError`. The
command line prints their message as one line and exits with status 2.

Heavy modules (torch, spaCy) are imported inside the functions, so that importing
``structnmt`` stays cheap.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from structnmt.arguments import checked
from structnmt.config import ExperimentConfig, check_count, parse_overrides, with_overrides
from structnmt.config import load_config as _read_config
from structnmt.errors import ConfigError

if TYPE_CHECKING:
    import torch

    from structnmt.decoding.translator import Translator
    from structnmt.evaluation.alignment import GoldFormat

Overrides = Mapping[str, Any] | Sequence[str] | None
ConfigLike = ExperimentConfig | str | Path


def _overrides(overrides: Overrides) -> dict[str, Any]:
    """Dotted keys as a mapping (``{"training.lr": 1e-3}``) or as ``--set`` strings (``"training.lr=1e-3"``)."""
    if overrides is None:
        return {}
    if isinstance(overrides, Mapping):
        return dict(overrides)
    return parse_overrides(list(overrides), "overrides")  # a list of str: checked by @checked


# ---------------------------------------------------------------------------
# configs, data, training


@checked
def load_config(path: str | Path, overrides: Overrides = None) -> ExperimentConfig:
    """Read a YAML experiment config and check all of it, ``model.methods`` entries included.

    ``overrides`` are dotted keys set after reading: ``{"training.max_steps": 100}`` or
    ``["training.max_steps=100"]``. Errors name the file and the field.
    """
    return _read_config(_path(path, "path"), _overrides(overrides))  # type: ignore[arg-type]


def _path(value: Any, argument: str, optional: bool = False) -> Path | None:
    """``value`` as a path, or a :class:`ConfigError` naming the argument (not a ``TypeError`` from deep inside)."""
    if value is None and optional:
        return None
    if isinstance(value, (str, Path)) and str(value):
        return Path(value)
    raise ConfigError(f"expected a path (str or pathlib.Path), got {value!r}", argument)


def _paths(values: Sequence[Any], argument: str) -> list[Path]:
    """A list of paths (a list already: ``@checked`` made one string a list of one)."""
    return [_path(value, f"{argument}[{i}]") for i, value in enumerate(values)]  # type: ignore[misc]


#: what ``long_dependency`` 0 means, said where a negative one is refused
LONG_DEPENDENCY_OFF = " (0 turns the long-dependency sets off)"


def _config(config: ConfigLike, overrides: Overrides = None) -> ExperimentConfig:
    """A checked config from a path or an :class:`ExperimentConfig` (with ``overrides`` applied)."""
    if isinstance(config, (str, Path)):
        return load_config(config, overrides)
    if not isinstance(config, ExperimentConfig):
        raise ConfigError(f"expected a config path or an ExperimentConfig, got {config!r}", "config")
    return with_overrides(config, _overrides(overrides))


@checked
def prepare(config: ConfigLike, overrides: Overrides = None, force: bool = False, verbose: bool = True) -> Path:
    """Build the dataset a config's ``data`` section describes (clean, parse, sub-words,
    structures) and return its directory (``data.dir``). An existing dataset built from the
    same settings is kept unless ``force``."""
    from structnmt.data.prepare import prepare as build

    cfg = _config(config, overrides)
    if cfg.data is None:
        raise ConfigError("this config has no data section", "data", cfg.path)
    return build(cfg, force=force, verbose=verbose)


@checked
def prepare_stage(config: ConfigLike, overrides: Overrides = None, *, subwords_only: bool = False,
                  shard: str | None = None, merge: bool = False, jobs: int = 0, slurm: bool = False,
                  slurm_params: dict[str, Any] | None = None, force: bool = False, verbose: bool = True) -> Path:
    """One stage of a sharded prepare (``docs/corpora.md``), or all of them: ``subwords_only``
    (sample and train the sub-word model into ``DIR.shards/plan``), ``shard="I/N"`` (encode slice
    I of N of every split), ``merge`` (check the shards and join them into ``data.dir``), or
    ``jobs=N`` (all three, the shards as local processes or, with ``slurm``, a SLURM job array
    with submitit's ``slurm_params``). Returns the directory the stage wrote."""
    from structnmt.data import prepare as stages

    if sum(map(bool, (subwords_only, shard, merge, jobs))) != 1:
        raise ConfigError("choose one of --subwords-only, --shard, --merge and --jobs", "prepare")
    cfg = _config(config, overrides)
    if cfg.data is None:
        raise ConfigError("this config has no data section", "data", cfg.path)
    if subwords_only:
        return stages.prepare_subwords(cfg, force=force, verbose=verbose)
    if shard:
        return stages.prepare_shard(cfg, *stages.parse_shard(shard), verbose=verbose)
    if merge:
        return stages.merge_shards(cfg, force=force, verbose=verbose)
    return stages.prepare_sharded(cfg, jobs, slurm=slurm, params=slurm_params, force=force, verbose=verbose)


@checked
def download(corpus: str, out: str | Path, source: str | Path | None = None,
             base_url: str | None = None) -> dict[str, int]:
    """Write ``wmt14-en-de`` or ``iwslt14-de-en`` into ``out`` in the layout its recipes read
    (``docs/corpora.md``), from the public archives, a mirror holding them under their names
    (``base_url``, default ``$STRUCTNMT_DOWNLOAD_URL``) or a local copy of them (``source``);
    returns the line count of each file written."""
    from structnmt.data.corpora import download as fetch
    from structnmt.io import check_output_path

    check_output_path(_path(out, "out"), "--out", directory=True)  # type: ignore[arg-type]  # before any fetch
    return fetch(corpus, out, source, base_url)


@checked
def prepare_multi30k(pair: str = "en-de", source: str | Path | None = None, out: str | Path | None = None,
                     parser: str | None = None, force: bool = False, verbose: bool = True,
                     base_url: str | None = None) -> Path:
    """Prepare Multi30k ``pair`` from a local copy of its raw files (``source``), or from its
    public home (or the mirror ``base_url``, default ``$STRUCTNMT_DOWNLOAD_URL``) when ``source``
    is None; ``parser`` is a spaCy model for the source trees."""
    from structnmt.data.multi30k import build_multi30k, raw_dir
    from structnmt.data.prepare import prepare as build
    from structnmt.io import check_output_path

    out = check_output_path(out or f"data/multi30k_{pair.replace('-', '_')}", "--out", directory=True)
    # the data config written beside the raw files names this dataset (``out``) and its parser
    data = build_multi30k(pair, raw_dir(out), Path(source) if source else None, base_url, dataset=out,
                          parser=parser)
    data.dir = str(out)
    return build(ExperimentConfig(data=data), force=force, verbose=verbose)


@checked
def train(config: ConfigLike, overrides: Overrides = None, resume: bool = False,
          prepare_missing: bool = False) -> dict[str, Any]:
    """Train the model a config describes on its prepared dataset; return the run's summary.

    The summary's ``status`` says why training stopped: ``max_steps``, ``max_epochs``,
    ``time_budget``, ``early_stopped``, ``interrupted`` (a signal; continue with
    ``resume=True``) or ``diverged`` (too many non-finite updates; the last good checkpoint is
    kept). ``prepare_missing`` prepares the dataset first when it does not exist yet.
    """
    from structnmt.training.trainer import train as run

    cfg = _config(config, overrides)
    if prepare_missing and cfg.data is not None and not (Path(cfg.data.dir) / "meta.json").exists():
        prepare(cfg)
    return run(cfg, resume=resume)


@checked
def average(checkpoints: Sequence[str | Path], out: str | Path, across_runs: bool = False) -> Path:
    """Average the weights of several checkpoints of one run into ``out`` (a model that ``load`` reads).

    Checkpoints of different runs (another seed or ``out_dir``) are refused unless ``across_runs``:
    their mean is a worse model than either run's."""
    from structnmt.io import check_output_path, same_file
    from structnmt.training.checkpoint import write_averaged_checkpoint

    paths = _paths(checkpoints, "checkpoints")
    if not paths:
        raise ConfigError("no checkpoint to average", "checkpoints")
    target = check_output_path(_path(out, "out"), "--out")  # type: ignore[arg-type]
    for n, path in enumerate(paths):
        if same_file(path, target):  # through links too
            raise ConfigError(f"{target} is also checkpoint {n + 1} to average: it would be replaced; "
                              "choose another output", "--out")
        twin = next((earlier for earlier in paths[:n] if same_file(path, earlier)), None)
        if twin is not None:  # it would count twice in the mean
            linked = twin.resolve() != path.resolve()  # one file under two names, not one name spelt twice
            also = (f" as {twin} (one file under two names: the trainer links last.pt and best.pt to a step's "
                    "checkpoint)") if linked else ""
            raise ConfigError(f"{path} is given more than once{also}: give each checkpoint once", "checkpoints")
    return write_averaged_checkpoint(paths, target, across_runs)  # type: ignore[arg-type]


@checked
def export_ctranslate2(checkpoint: str | Path, out_dir: str | Path, dataset: str | Path | None = None,
                       quantization: str | None = None, force: bool = False) -> Path:
    """Write a checkpoint's model as a CTranslate2 model directory (``structnmt export ctranslate2``).

    Models whose translation-time network is a plain Transformer export (vanilla, and methods whose
    plug-ins fold into plain weights); the others are refused with the reason. ``quantization``:
    CTranslate2's weight type on disk (``int8``, ``float16``, ...; None keeps float32).
    """
    from structnmt.decoding.ctranslate2_export import export_ctranslate2 as export

    return export(_path(checkpoint, "checkpoint"), _path(out_dir, "out_dir"),  # type: ignore[arg-type]
                  dataset=dataset, quantization=quantization, force=force)


@checked
def demo(work: str | Path = "demo", minutes: float = 0.0, train_size: int = 20000, seed: int = 1,
         overrides: Overrides = None, verbose: bool = True, valid_size: int = 300,
         test_size: int = 500, steps: int | None = None, force: bool = False) -> dict[str, Any]:
    """The whole pipeline on the built-in synthetic task (``structnmt demo``): the task written
    to ``WORK/data``, the dataset to ``WORK/dataset``, the run to ``WORK/run``; returns the test
    scores with the ``run`` directory and the training ``summary``. Trains ``steps`` updates
    (default :data:`structnmt.demo_pipeline.DEMO_STEPS`), stopping early after ``minutes`` if that is > 0.
    A ``work`` directory holding files the demo did not write is refused unless ``force``."""
    from structnmt.demo_pipeline import DEMO_STEPS, run_demo  # not structnmt.demo: that name is this function

    return run_demo(work, minutes, train_size, seed, _overrides(overrides), verbose, valid_size, test_size,
                    DEMO_STEPS if steps is None else steps, force=force)


# ---------------------------------------------------------------------------
# translating and scoring


@checked
def load(checkpoint: str | Path, device: str | torch.device | None = None,
         dataset: str | Path | None = None) -> Translator:
    """A :class:`~structnmt.decoding.translator.Translator` for a checkpoint.

    ``device``: ``"cpu"``, ``"cuda"``, ``"cuda:1"``...; None takes the GPU when there is one.
    ``dataset``: the prepared dataset whose preprocessing (sub-words, parser) the model reads
    with; default the one it was trained on. Then::

        translator.translate(sentences, beam=5)  -> list[str], as ``structnmt translate`` gives
        translator.nbest(sentences, 4)           -> list[list[str]]
        translator.attention(source, target)     -> AttentionMaps (arrays of every layer and head)
        translator.score(sources, references)    -> list[float], log-probabilities of the references
    """
    from structnmt.decoding.translator import load_translator

    if device is not None and not isinstance(device, str) and type(device).__name__ != "device":
        raise ConfigError(f"expected a device name such as 'cpu' or 'cuda:0', got {device!r}", "device")
    return load_translator(_path(checkpoint, "checkpoint"), device,  # type: ignore[arg-type]
                           _path(dataset, "dataset", optional=True))


@checked
def test(run: str | Path, checkpoint: str | Path | None = None, splits: Sequence[str] | None = None,
         beam: int | None = None, device: str | torch.device | None = None, long_dependency: int | None = 7,
         verbose: bool = False) -> dict[str, dict[str, Any]]:
    """Translate a run's test splits and score them (``structnmt test``).

    Uses ``checkpoint``, else the run's ``best.pt``, else its ``last.pt``; writes
    ``RUN/eval/<set>.{hyp,ref,src,json}``; returns ``{set: {"bleu": ..., "chrf": ...,
    "signature": {...}, ...}}``, with ``<split>_longdep`` sets for the sentences whose source
    parse has an arc of ``long_dependency`` words or more (0: off).
    """
    from structnmt.evaluation.run_eval import evaluate_run

    long_dependency = 0 if long_dependency is None else long_dependency  # None: off, as before
    check_count(long_dependency, "--long-dependency", 0, LONG_DEPENDENCY_OFF)  # named as the caller's (arguments.py)
    return evaluate_run(_path(run, "run"), _path(checkpoint, "checkpoint", optional=True),  # type: ignore[arg-type]
                        list(splits) if splits else None, device, beam,
                        quiet=not verbose, long_dependency=long_dependency)


@checked(own=("metrics", "hypotheses", "references"))  # their own messages say more
def evaluate(hypotheses: str | Path | Sequence[str], references: str | Path | Sequence[Any],
             metrics: str | Sequence[str] = ("bleu", "chrf"), tokenize: str | None = None,
             allow_empty: bool = False) -> dict[str, Any]:
    """sacreBLEU scores of detokenised hypotheses (``structnmt evaluate``).

    ``hypotheses`` and ``references`` are files (``str`` or ``Path``; ``-`` is standard input)
    or lists of sentences; several references are a list of ``Path`` objects or of sentence
    lists. ``metrics``: one or a list of ``bleu``, ``chrf``, ``ter``, ``ribes`` (NLTK's: 0 for a
    sentence of one word, which has no word pair to order). Returns
    ``{"bleu": 34.1, ..., "signature": {"bleu": ...}}``. An empty hypothesis is refused unless ``allow_empty``.
    """
    from structnmt.evaluation.scores import check_metrics, check_tokenize, corpus_scores, read_parallel

    chosen = check_metrics(metrics)  # settings before the files: a typo costs no reading
    check_tokenize(tokenize, "--tokenize")
    hyps, refs = read_parallel(hypotheses, references, allow_empty=allow_empty)
    return corpus_scores(hyps, refs, metrics=chosen, tokenize=tokenize)


# ---------------------------------------------------------------------------
# reports, pictures, analyses


@checked
def report(runs: Sequence[str | Path], baseline: str | None = None, test_sets: Sequence[str] | None = None,
           out: str | Path | None = None, samples: int = 1000, plots: str | Path | None = None) -> str:
    """The Markdown table of several tested runs (``structnmt report``): scores per test set,
    paired-bootstrap significance against ``baseline`` (a run's name: its directory's name, with
    parent folders where two runs share one), parameters,
    speed, commands and versions. Written to ``out`` when given; ``plots`` also draws the
    training curves and BLEU by length into that directory."""
    from structnmt.evaluation.report import build_report
    from structnmt.io import check_output_path

    check_count(samples, "--samples", 1)
    if out:  # before the bootstrap, not after it
        check_output_path(out, "--out")
    if plots:
        check_output_path(plots, "--plots", directory=True)
    paths = [Path(r) for r in runs]
    text = build_report(paths, baseline, list(test_sets) if test_sets else None, Path(out) if out else None,
                        n_samples=samples)
    if plots:
        from structnmt.visualisation.run_plots import plot_runs

        plot_runs(paths, plots, test_sets[0] if test_sets else None)
    return text


@checked
def plot_attention(checkpoint: str | Path, out: str | Path, sentence: str | None = None, line: int | None = None,
                   split: str = "test", attention: Literal["encoder", "cross"] = "encoder", layer: int = 1,
                   head: int = 0, dataset: str | Path | None = None, device: str | torch.device | None = "cpu") -> Path:
    """Heat map of one head (0-based) in one layer (1-based) on raw ``sentence`` or on line
    ``line`` (1-based) of a prepared ``split``, with its dependency arcs or scenes on top."""
    from structnmt.visualisation.attention import check_figure_path
    from structnmt.visualisation.model_attention import plot_model_attention

    check_figure_path(_path(out, "out"), "--out")  # type: ignore[arg-type]  # its format too, before the model loads
    return plot_model_attention(load(checkpoint, device, dataset), out, sentence=sentence, split=split, line=line,
                                attention=attention, layer=layer, head=head)


@checked
def plot_curves(runs: Sequence[str | Path], out: str | Path) -> Path:
    """Training curves (loss, validation BLEU) of several runs in one picture."""
    from structnmt.evaluation.report import run_names
    from structnmt.visualisation.attention import check_figure_path
    from structnmt.visualisation.curves import plot_training_curves

    target = check_figure_path(_path(out, "out"), "--out")  # type: ignore[arg-type]  # its format too
    if not runs:
        raise ConfigError("no run to plot", "runs")
    return plot_training_curves(dict(zip(run_names(runs), map(Path, runs))), target)


@checked
def inspect(run: str | Path, what: Literal["trees", "phrases", "align", "heads"], checkpoint: str | Path | None = None,
            split: str = "test", side: Literal["src", "tgt"] = "src", layer: int | None = None,
            gold: str | Path | None = None, gold_format: GoldFormat = "auto",
            boundary: Literal["auto", "before", "after"] = "auto", dataset: str | Path | None = None,
            out: str | Path | None = None, device: str | torch.device | None = "cpu", conllu: str | Path | None = None,
            src: str | Path | None = None, tgt: str | Path | None = None, *, parser_uas: bool = False,
            parser: Any = None, without_src: bool = False) -> dict[str, Any]:
    """Read learned structure out of a run and score it (``structnmt inspect``).

    ``trees``: DBSA/SISA heads -> dependency trees, UAS against the split's trees;
    ``phrases``: LPSI distances -> phrase trees, unlabeled F1 against ``gold`` brackets;
    ``align``: cross-attention -> word alignments, AER against ``gold`` links, written as
    Pharaoh (0-based) or talp (1-based, ``ipj`` possible links) files, ``gold_format`` telling
    which or ``auto``; ``heads``: every encoder head's attention to each word's parent in the
    split's trees (any model, vanilla included). ``layer`` is 1-based. Outputs go to ``out`` (default ``RUN/inspect``).

    Without a prepared dataset: ``trees`` with ``conllu`` scores the head against any CoNLL-U
    file's trees (projected onto the run's sub-words; ``src`` gives the sources when ``side`` is
    tgt, or ``without_src`` reads a head that provably does not read them), ``align`` with
    ``src``, ``tgt`` and ``gold`` against any alignment test set. With ``conllu``,
    ``parser_uas`` also scores the parser the run's dataset was prepared with on ``side`` (or
    ``parser``: a model path or name, or a loaded spaCy pipeline) on exactly the same sentences
    and words: the head's UAS beside the UAS of the trees it learned from.
    """
    from structnmt.evaluation.inspect_run import inspect_run

    return inspect_run(run, what, checkpoint, split, side, layer, gold, gold_format, boundary, dataset, out, device,
                       conllu, src, tgt, parser_uas=parser_uas, parser=parser, without_src=without_src)


@checked
def methods() -> dict[str, dict[str, Any]]:
    """Every structure-aware method and baseline: its one-line description, the structure
    fields it reads (in training and at translation time) and its parameters' defaults."""
    from structnmt.config import ModelConfig
    from structnmt.model.methods import METHODS, discover, method_params_doc

    discover()
    out = {}
    for name in sorted(METHODS):
        cls = METHODS[name]
        # what an instance with the default parameters reads: some methods set it per instance,
        # from the stacks they are configured for
        built = cls(cls.Params(name=name), ModelConfig())
        out[name] = {"doc": (cls.__doc__ or "").strip().splitlines()[0] if cls.__doc__ else "",
                     "needs": dict(built.needs), "needs_at_inference": dict(built.needs_at_inference),
                     "defaults": method_params_doc(name)}
    return out


# ---------------------------------------------------------------------------
# studies


@checked
def run_study(study: str | Path, jobs: int | None = None,
              executor: Literal["local", "slurm", "submitit-local"] | None = None,
              only: Sequence[str] | None = None, report: bool = True, seeds: Sequence[int] | None = None,
              device: str | None = None, commit: bool | None = None) -> dict[str, Any]:
    """Run a study file (``structnmt study``): every recipe x seed not yet recorded is trained
    and tested at the study's update budget, then the report is written. ``executor``:
    ``local`` (``jobs`` at once), ``slurm`` or ``submitit-local``; ``only`` names recipes and
    ``seeds`` seeds; ``device`` and ``commit``: the study file's ``executor.device`` and
    ``executor.commit`` for this call. Returns ``{"runs": {"recipe/seedN": status}, "report": path or None}``
    (``runs`` holds the runs this call trained or took in: empty when every run was recorded)."""
    from structnmt.study import run_study as run

    return run(study, jobs=jobs, executor=executor, only=list(only) if only else None, report=report,
               seeds=list(seeds) if seeds else None, device=device, commit=commit)


@checked
def study_status(study: str | Path, seeds: Sequence[int] | None = None) -> list[dict[str, Any]]:
    """Where every run of a study stands: one row per recipe and seed (``state``: done, held,
    stale, running, failed, interrupted or pending; ``step``; ``bleu``; ``note``); ``seeds``:
    only these, also seeds that train beside the study before they join its file (none or an
    empty list: the study's own, as :func:`run_study` reads them)."""
    from structnmt.study import study_status as status

    return status(study, list(seeds) if seeds else None)


@checked
def study_report(study: str | Path, out: str | Path | None = None, baseline: str | None = None) -> Path:
    """Write a study's report from its records (default ``RECORDS/report.md``); returns its path.
    ``baseline``: against another of its recipes instead (``RECORDS/report_vs_BASELINE.md``)."""
    from structnmt.io import check_output_path

    if out:  # the report, and the picture and summary written beside it under its name; before any work
        for path in (Path(out), Path(out).with_suffix(".png"), Path(out).with_suffix(".json")):
            check_output_path(path, "--out")
    from structnmt.study import load_study
    from structnmt.study.report import write_report

    return write_report(load_study(study), out, baseline)


@checked
def study_compare(study: str | Path, recipe: str, seed: int, other: str | Path,
                  seed_of: Sequence[int] | None = None, any_recipe: bool = False,
                  say: Any = None) -> list[str]:
    """Another record of a study's run (``structnmt study compare``) beside the study's: BLEU,
    paired bootstrap p and identical lines per test set; ``seed_of``: two seeds of the study as
    the yardstick. A record of another recipe or config is refused unless ``any_recipe``.
    Returns the lines; ``say(line)`` gets each as it is ready."""
    from structnmt.study.compare import compare_records

    return compare_records(study, recipe, seed, other, list(seed_of) if seed_of else None, any_recipe, say)


# ---------------------------------------------------------------------------
# parsers


@checked
def export_trees(config: ConfigLike, out: str | Path, overrides: Overrides = None) -> tuple[str, int]:
    """Every tree of the dataset's parse cache as one file (``structnmt trees export``), so a study
    can be redone elsewhere on exactly its trees; returns (the file's SHA-256, number of trees)."""
    from structnmt.data.dataset import read_meta
    from structnmt.data.identity import parser_identity, parser_recipe_identity
    from structnmt.data.parsing.cache import export_trees as export
    from structnmt.data.parsing.cache import pin_of
    from structnmt.data.prepare import cache_dir_of
    from structnmt.io import check_output_path

    cfg = _config(config, overrides)
    if cfg.data is None:
        raise ConfigError("the config has no data section", "data")
    check_output_path(_path(out, "out"), "file")  # type: ignore[arg-type]
    # the header names the parser's recipe and label convention, so that importing the file needs
    # no parser: a cache pinned to a file passes on that file's header (the parser here did not make
    # its trees); otherwise the model's recipe, and the convention the prepared dataset recorded
    made = (read_meta(cfg.data.dir).get("parsers") or {}) if (Path(cfg.data.dir) / "meta.json").is_file() else {}
    about = {}
    for side in ("src", "tgt"):
        parser, pin = getattr(cfg.data, side).parser, pin_of(cache_dir_of(cfg.data) / side)
        if pin:
            about[side] = {"recipe": pin.get("recipe"), "convention": pin.get("convention")}
            continue
        here = parser.backend == "spacy" and parser_identity(parser)["digest"] is not None  # the model is here
        about[side] = {"recipe": parser_recipe_identity(parser.model) if here else None,
                       "convention": (made.get(side) or {}).get("convention")}
    return export(cache_dir_of(cfg.data), _path(out, "out"), about)  # type: ignore[arg-type]


@checked
def import_trees(config: ConfigLike, file: str | Path, sha256: str | None = None,
                 overrides: Overrides = None) -> dict[str, int]:
    """Pin the dataset's parse cache to a trees file (``structnmt trees import``): ``prepare``
    then builds the dataset from exactly those trees, whatever parser this machine has, and a
    sentence the file lacks is an error. Returns the number of trees per side."""
    from structnmt.data.parsing.cache import import_trees as pin
    from structnmt.data.prepare import cache_dir_of
    from structnmt.locks import DirectoryLock

    cfg = _config(config, overrides)
    if cfg.data is None:
        raise ConfigError("the config has no data section", "data")
    with DirectoryLock(Path(cfg.data.dir), "trees import"):  # never under a running prepare
        return pin(_path(file, "file"), cache_dir_of(cfg.data), sha256)  # type: ignore[arg-type]


@checked
def train_parser(lang: str | None = None, conllu: Sequence[str | Path] | None = None, out: str | Path | None = None,
                 dev: str | Path | None = None, preset: str | None = None, shared: str | Path = "../shared/data/ud",
                 steps: int | None = None, eval_frequency: int = 500) -> Path:
    """Train a UD dependency parser on CoNLL-U files with spaCy; ``preset`` (``en_ud``,
    ``de_ud``) fills in the recipes' language, files (under ``shared``), output, size and
    number of updates (``steps``; default the preset's, else 1500)."""
    import sys

    from structnmt.io import check_output_path
    from structnmt.parsers.ud_train import EN_UD_SIZE, PARSER_PRESETS, PRESET_STEPS, ParserSize, train_ud_parser

    if preset:
        if preset not in PARSER_PRESETS:
            raise ConfigError(f"unknown preset {preset!r} (known: {', '.join(sorted(PARSER_PRESETS))})", "preset")
        p_lang, files, p_dev, p_out = PARSER_PRESETS[preset]
        lang = lang or p_lang
        conllu = conllu or [Path(shared) / f for f in files]
        dev = dev or (Path(shared) / p_dev if p_dev else None)
        out = out or p_out
    if preset == "de_ud":
        print("note: German has no UD training file here beyond GSD dev (720 sentences): expect about 72 UAS "
              "(docs/parsers.md). Target-side recipes with UD trees are on En->Fr (configs/multi30k_en_fr_*).",
              file=sys.stderr)
    given = {"lang": lang, "conllu": conllu, "out": out}
    missing = [name for name, value in given.items() if not value]
    if missing:
        raise ConfigError("missing (give it or use a preset)", f"--{missing[0]}")
    for option, value in (("--steps", steps), ("--eval-frequency", eval_frequency)):
        if value is not None:  # named here, not as the trainer's max_steps
            check_count(value, option, 1)
    check_output_path(out, "--out", directory=True)  # type: ignore[arg-type]  # before the training
    size = EN_UD_SIZE if preset == "en_ud" else ParserSize()
    steps = steps or PRESET_STEPS.get(preset or "", 1500)
    return train_ud_parser(lang, [Path(p) for p in conllu], Path(dev) if dev else None,  # type: ignore[arg-type]
                           Path(out), max_steps=steps, eval_frequency=eval_frequency,  # type: ignore[arg-type]
                           size=size)


@checked
def evaluate_parser(model: str | Path, conllu: str | Path) -> dict[str, Any]:
    """UAS and LAS (and their punctuation-free variants) of a spaCy parser against gold CoNLL-U."""
    from structnmt.parsers.ud_eval import evaluate_parser as score

    return score(str(model), Path(conllu), quiet=True)
