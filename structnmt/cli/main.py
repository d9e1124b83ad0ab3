"""The ``structnmt`` command: one sub-command per step of an experiment.

Each sub-command parses its arguments and calls one function of :mod:`structnmt.api`,
which a notebook or script can call the same way.

Every user-facing failure is a :class:`StructNMTError`; it is printed as one line
(``error: FILE:LINE: what is wrong``) with exit status 2, never as a traceback.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import yaml

from structnmt import api
from structnmt.arguments import command_line
from structnmt.config import parse_overrides
from structnmt.errors import ConfigError, DataError, StructNMTError
from structnmt.parsers.ud_train import PARSER_PRESETS
from structnmt.wording import counted

# ---------------------------------------------------------------------------
# prepare / train


def _output_dir(path: str | Path | None, argument: str) -> None:
    """A directory the user named for a command's outputs, refused before any work if it cannot be one."""
    from structnmt.io import check_output_path

    if path is not None:
        check_output_path(path, argument, directory=True)


def cmd_prepare(args: argparse.Namespace) -> int:
    if args.config == "multi30k":
        path = api.prepare_multi30k(args.pair, args.from_dir, args.out, args.parser, force=args.force,
                                    base_url=args.base_url)
    else:
        stages = (args.subwords_only, args.shard, args.merge, args.jobs)
        if any(stages):
            path = api.prepare_stage(args.config, parse_overrides(args.set), subwords_only=args.subwords_only,
                                     shard=args.shard, merge=args.merge, jobs=args.jobs or 0, slurm=args.slurm,
                                     slurm_params=parse_overrides(args.slurm_set, "--slurm-set"), force=args.force)
        else:
            path = api.prepare(args.config, parse_overrides(args.set), force=args.force)
    what = "sub-word plan" if args.subwords_only else "shard" if args.shard else "dataset"
    print(f"{what} ready: {path}")
    if args.config == "multi30k":  # the data: section describing it, for experiment configs
        from structnmt.data.multi30k import config_path, raw_dir

        print(f"data config written to {config_path(raw_dir(path), args.pair)}")
    return 0


def cmd_download(args: argparse.Namespace) -> int:
    api.download(args.corpus, args.out, args.from_dir, args.base_url)
    return 0


def cmd_train(args: argparse.Namespace) -> int:
    """Exit status: 0 done, 1 diverged, 75 stopped by a signal (resumable with --resume)."""
    from structnmt.training.trainer import exit_status

    summary = api.train(args.config, parse_overrides(args.set), resume=args.resume, prepare_missing=args.prepare)
    print(yaml.safe_dump(summary, sort_keys=False), end="")
    return exit_status(summary)


def cmd_average(args: argparse.Namespace) -> int:
    out = api.average(args.checkpoints, args.out, across_runs=args.across_runs)
    count = len(args.checkpoints)
    print(f"averaged {count} checkpoint{'s' if count != 1 else ''} into {out}")
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    _output_dir(args.out_dir, "OUT_DIR")
    out = api.export_ctranslate2(args.checkpoint, args.out_dir, dataset=args.dataset,
                                 quantization=args.quantization, force=args.force)
    print(f"CTranslate2 model written to {out}")
    return 0


# ---------------------------------------------------------------------------
# translate / test / evaluate


def _read_input(path: str | None) -> list[str]:
    """Input lines, standard input read like a file (strict UTF-8, lines split on "\\n" only,
    control characters refused), so that output line n always translates input line n."""
    from structnmt.data.corpus import read_lines

    # output line n translates input line n, so a bad line cannot be dropped: it is to be mended
    hint = "remove it from the input: translate writes one output line for each input line"
    if path not in (None, "-"):
        return read_lines(path, hint=hint)
    try:
        return read_lines("/dev/stdin", hint=hint)
    except DataError as err:  # name it as the user knows it
        raise DataError(str(err).replace("/dev/stdin", "<stdin>", 1)) from None


def cmd_translate(args: argparse.Namespace) -> int:
    from structnmt.io import atomic_open, check_output_path, output_error, same_file

    if args.output == "-":  # as for --input: the standard stream, not a file named "-"
        args.output = None
    if args.output and args.input not in (None, "-") and same_file(args.input, args.output):
        raise ConfigError(f"{args.output} is the input file: translating would replace it; "
                          "choose another output", "--output")
    if args.output:
        check_output_path(args.output, "--output")  # before the model is loaded, not after the work
    _check_beams(args)
    translator = api.load(args.checkpoint, args.device, args.dataset)
    lines = _read_input(args.input)
    settings = {"beam": args.beam, "length_penalty": args.length_penalty, "max_len_a": args.max_len_a,
                "max_len_b": args.max_len_b}
    started = time.perf_counter()
    source = args.input if args.input not in (None, "-") else "<stdin>"
    if args.nbest and args.nbest > 1:
        best = translator.nbest(lines, args.nbest, source=source, **settings)
        text = "".join(f"{i}\t{hyp}\n" for i, hyps in enumerate(best) for hyp in hyps)
    else:
        text = "".join(f"{hyp}\n" for hyp in translator.translate(lines, source=source, **settings))
    seconds = time.perf_counter() - started
    if args.output:
        try:
            with atomic_open(args.output) as handle:
                handle.write(text)
        except OSError as err:  # a full disk, or a path that changed while translating
            raise output_error(args.output, err) from None
    else:
        sys.stdout.write(text)
    rate = len(lines) / max(seconds, 1e-9)
    print(f"translated {counted(len(lines), 'sentence')} in {seconds:.1f}s ({rate:.1f} sent/s)", file=sys.stderr)
    return 0


def _check_beams(args: argparse.Namespace) -> None:
    """``--beam``/``--nbest`` below 1, over :data:`structnmt.config.MAX_BEAM` or an n-best list wider
    than the beam, named as typed, before the model loads."""
    from structnmt.config import check_beam, check_count

    for option in ("beam", "nbest"):
        if getattr(args, option, None) is not None:
            check_count(getattr(args, option), f"--{option}", 1)
            check_beam(getattr(args, option), f"--{option}")
    beam, nbest = getattr(args, "beam", None), getattr(args, "nbest", None)
    if beam is not None and nbest is not None and nbest > beam:
        raise ConfigError(f"{nbest} best need a beam of at least {nbest}, got --beam {beam}", "--nbest")


def cmd_test(args: argparse.Namespace) -> int:
    _check_beams(args)
    api.test(args.run, args.checkpoint, args.splits, args.beam, args.device, long_dependency=args.long_dependency,
             verbose=True)
    return 0


def cmd_evaluate(args: argparse.Namespace) -> int:
    from structnmt.evaluation.scores import STDIN

    if [args.hyp, *args.ref].count(STDIN) > 1:
        raise ConfigError("standard input ('-') can be read only once: give a file to all but one of "
                          "--hyp and --ref", "--ref")
    scores = api.evaluate(Path(args.hyp), [Path(r) for r in args.ref], metrics=args.metrics, tokenize=args.tokenize,
                          allow_empty=args.allow_empty)
    for name in args.metrics:
        print(f"{name.upper()} = {scores[name]:.2f}   {scores['signature'].get(name, '')}")
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    """Synthetic data -> prepare -> train -> beam search -> BLEU, in a few minutes on a CPU."""
    api.demo(args.work, args.minutes, args.train_size, args.seed, parse_overrides(args.set), steps=args.steps,
             force=args.force)
    return 0


# ---------------------------------------------------------------------------
# reports, pictures, analyses, parsers


def cmd_report(args: argparse.Namespace) -> int:
    text = api.report(args.runs, args.baseline, args.test_sets, args.out, samples=args.samples, plots=args.plots)
    print(text if not args.out else f"report written to {args.out}")
    if args.plots:
        print(f"pictures written to {args.plots}")
    return 0


def cmd_plot_attention(args: argparse.Namespace) -> int:
    api.plot_attention(args.checkpoint, args.out, sentence=args.sentence, line=args.line, split=args.split,
                       attention=args.attention, layer=args.layer, head=args.head, dataset=args.dataset)
    print(f"attention map written to {args.out}")
    return 0


def cmd_plot_curves(args: argparse.Namespace) -> int:
    api.plot_curves(args.runs, args.out)
    print(f"training curves written to {args.out}")
    return 0


def cmd_parser_train(args: argparse.Namespace) -> int:
    path = api.train_parser(args.lang, args.conllu, args.out, args.dev, args.preset, args.shared, steps=args.steps,
                            eval_frequency=args.eval_frequency)
    print(f"parser written to {path}")
    return 0


def cmd_trees(args: argparse.Namespace) -> int:
    if args.what == "export":
        digest, count = api.export_trees(args.config, args.file, parse_overrides(args.set))
        print(f"{count} trees written to {args.file}\nsha256 {digest}")
    else:
        counts = api.import_trees(args.config, args.file, args.sha256, parse_overrides(args.set))
        print(f"pinned to {args.file}: " + ", ".join(f"{side} {n} trees" for side, n in counts.items()))
        print("prepare the dataset again (structnmt prepare CONFIG --force) to build it from these trees")
    return 0


def cmd_parser_evaluate(args: argparse.Namespace) -> int:
    from structnmt.parsers.ud_eval import format_scores

    print(format_scores(api.evaluate_parser(args.model, args.conllu)))
    return 0


def cmd_inspect(args: argparse.Namespace) -> int:
    from structnmt.evaluation.inspect_run import inspect_out_dir

    out = inspect_out_dir(args.run, args.out)  # checked here, before any work; --out defaults to RUN/inspect
    scores = api.inspect(args.run, args.what, args.checkpoint, args.split, args.side, args.layer, args.gold,
                         args.gold_format, args.boundary, args.dataset, out, args.device, args.conllu, args.src,
                         args.tgt, parser_uas=args.parser_uas or args.parser is not None, parser=args.parser,
                         without_src=args.without_src)
    print(json.dumps(scores, indent=2))
    print(f"written to {out}", file=sys.stderr)
    return 0


def cmd_study(args: argparse.Namespace) -> int:
    from structnmt.study import format_status

    if args.status and args.report:  # one of them would be ignored
        raise ConfigError("--status and --report are two commands: give one of them")
    if args.baseline and not args.report:
        raise ConfigError("--baseline only changes a report: give --report with it")
    if args.out and not args.report:  # it was ignored: a run's report went to RECORDS/report.md instead
        raise ConfigError("--out only names a report's file: give --report with it")
    if args.status:  # --jobs: the forecast's runs at once (default: the study file's executor.jobs)
        print(format_status(api.study_status(args.study, seeds=args.seeds), jobs=args.jobs))
        return 0
    if args.report:
        print(f"report written to {api.study_report(args.study, args.out, args.baseline)}")
        _no_damaged_records(args.study)
        return 0
    result = api.run_study(args.study, jobs=args.jobs, executor=args.executor, only=args.only, seeds=args.seeds,
                           device=args.device, commit=True if args.commit else None)
    print(format_status(api.study_status(args.study)))
    left = {run: status for run, status in result["runs"].items() if status not in ("done", "held")}
    if left:  # exit 1 says that much; the line says which runs and what to do
        shown = ", ".join(f"{run} ({status}: {STUDY_STATUS_HINTS.get(status, 'see --status')})"
                          for run, status in list(left.items())[:5])
        more = f" and {len(left) - 5} more" if len(left) > 5 else ""
        print(f"study: {len(left)} of {len(result['runs'])} runs did not finish here: {shown}{more}; "
              f"`structnmt study {args.study} --status` shows where each stands", file=sys.stderr)
    return 0 if not left else 1


def _no_damaged_records(study_file: str) -> None:
    """The report lists damaged records; the command also ends with one error line (status 2)
    naming the first, so that a damaged record is not passed over in a report's small print."""
    from structnmt.study import load_study
    from structnmt.study.runs import record_damage

    study = load_study(study_file)
    damaged = [why for recipe, seed in study.runs() if (why := record_damage(study, recipe, seed)) is not None]
    if damaged:
        raise DataError(f"{counted(len(damaged), 'damaged record')}, listed in the report; the first: {damaged[0]}")


def cmd_study_compare(args: argparse.Namespace) -> int:
    api.study_compare(args.study, args.recipe, args.seed, args.other, seed_of=args.seed_of,
                      any_recipe=args.any_recipe, say=lambda line: print(line, flush=True))
    return 0


def study_compare_parser() -> argparse.ArgumentParser:
    """``structnmt study compare``: its own parser, as ``structnmt study`` takes a study file first."""
    from structnmt.study import compare

    s = argparse.ArgumentParser(prog="structnmt study compare", description=compare.__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    s.add_argument("study", metavar="STUDY", help="study file (YAML)")
    s.add_argument("recipe", metavar="RECIPE", help="a recipe of the study")
    s.add_argument("seed", metavar="SEED", type=int, help="the seed whose study record is B")
    s.add_argument("other", metavar="OTHER_RECORD", help="the other record folder (A): record.json and hyps/")
    s.add_argument("--seed-of", dest="seed_of", type=int, nargs=2, metavar=("SEED", "SEED"),
                   help="also compare these two seeds of the recipe in the study (the yardstick)")
    s.add_argument("--any-recipe", dest="any_recipe", action="store_true",
                   help="compare a record of another recipe or config (another training digest) knowingly")
    s.set_defaults(func=cmd_study_compare)
    return s


#: what a study run that did not end "done" means for the user
STUDY_STATUS_HINTS = {
    "busy": "another process is running it; its record appears when that one ends",
    "damaged": "its record is damaged: --status names the file and what to do",
    "failed": "its error is in the status table",
    "interrupted": "the same command resumes it",
}


def cmd_methods(args: argparse.Namespace) -> int:
    for name, about in api.methods().items():
        print(f"{name}: {about['doc']}")
        if args.verbose:
            print(f"    needs {about['needs'] or '-'}; at translation {about['needs_at_inference'] or '-'}")
            print(f"    defaults {about['defaults']}")
    return 0


# ---------------------------------------------------------------------------


def _decoding_options(s: argparse.ArgumentParser) -> None:
    """Beam search options shared by the commands that translate."""
    s.add_argument("--beam", type=int)
    s.add_argument("--length-penalty", dest="length_penalty", type=float)
    s.add_argument("--nbest", type=int)
    s.add_argument("--max-len-a", dest="max_len_a", type=float)
    s.add_argument("--max-len-b", dest="max_len_b", type=int)
    s.add_argument("--device", default="auto")


def _demo_commands(sub: argparse._SubParsersAction) -> None:
    """The demo and the list of methods: what a new user runs first."""
    s = sub.add_parser("demo", help="the whole pipeline on the built-in synthetic task")
    s.add_argument("--work", default="demo", help="working directory (data, dataset, run)")
    s.add_argument("--steps", type=int, help="updates to train (default 1000: about 96 BLEU, three minutes "
                                             "on two idle cores)")
    s.add_argument("--minutes", type=float, default=0.0, help="also stop after this many minutes (0: no limit; "
                                                              "fewer updates give a poor model, and it says so)")
    s.add_argument("--train-size", dest="train_size", type=int, default=20000)
    s.add_argument("--seed", type=int, default=1)
    s.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    s.add_argument("--force", action="store_true",
                   help="use --work even though it holds files the demo did not write (its data/, dataset/ "
                        "and run/ are replaced)")
    s.set_defaults(func=cmd_demo)

    s = sub.add_parser("methods", help="list the structure-aware methods and their defaults")
    s.add_argument("-v", "--verbose", action="store_true")
    s.set_defaults(func=cmd_methods)


def _data_commands(sub: argparse._SubParsersAction) -> None:
    """Raw text to a prepared dataset, and its trees carried between machines."""
    s = sub.add_parser("prepare", help="raw parallel text -> parsed, sub-worded dataset directory")
    s.add_argument("config", help="experiment YAML, or the word 'multi30k'")
    s.add_argument("--pair", default="en-de", help="multi30k: language pair (en-de, en-fr)")
    s.add_argument("--from", dest="from_dir", help="multi30k: local copy of the raw files (else download)")
    s.add_argument("--base-url", help="multi30k: a mirror holding the raw files under their names "
                   "(default: $STRUCTNMT_DOWNLOAD_URL, else the corpus's public repository)")
    s.add_argument("--out", help="multi30k: dataset directory")
    s.add_argument("--parser", help="multi30k: spaCy model (name or path) for the source trees")
    s.add_argument("--force", action="store_true", help="rebuild even if the dataset exists")
    s.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    s.add_argument("--subwords-only", action="store_true", help="sharded prepare, stage 1: sample and train "
                                                                "the sub-word model(s) into DIR.shards/plan")
    s.add_argument("--shard", metavar="I/N", help="stage 2: encode slice I of N (1-based) of every split")
    s.add_argument("--merge", action="store_true", help="stage 3: check the N shards and join them into DIR")
    s.add_argument("--jobs", type=int, metavar="N", help="all stages, N shards as local processes (submitit)")
    s.add_argument("--slurm", action="store_true", help="with --jobs: the shards as a SLURM job array")
    s.add_argument("--slurm-set", action="append", default=[], metavar="KEY=VALUE",
                   help="with --slurm: a submitit parameter, e.g. slurm_partition=cpu, timeout_min=720")
    s.set_defaults(func=cmd_prepare)

    s = sub.add_parser("download", help="the papers' corpora in the recipes' layout (docs/corpora.md)")
    s.add_argument("corpus", choices=["wmt14-en-de", "iwslt14-de-en"])
    s.add_argument("--out", required=True, help="e.g. data/raw/wmt14_en_de")
    s.add_argument("--from", dest="from_dir", help="a local copy of the public archives (no download)")
    s.add_argument("--base-url", help="a mirror holding the archives under their names "
                   "(default: $STRUCTNMT_DOWNLOAD_URL, else the public servers)")
    s.set_defaults(func=cmd_download)

    s = sub.add_parser("trees", help="carry a dataset's trees to another machine (export, then import there)")
    tsub = s.add_subparsers(dest="what", required=True)
    t = tsub.add_parser("export", help="every tree of the dataset's parse cache into one file; prints its SHA-256")
    t.add_argument("config")
    t.add_argument("file", help="output, e.g. trees.jsonl.gz")
    t.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    t.set_defaults(func=cmd_trees)
    t = tsub.add_parser("import", help="pin the dataset's parse cache to a trees file (then prepare --force)")
    t.add_argument("config")
    t.add_argument("file")
    t.add_argument("--sha256", help="refuse the file unless it has this digest")
    t.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    t.set_defaults(func=cmd_trees)


def _parser_commands(sub: argparse._SubParsersAction) -> None:
    """The UD parsers whose trees the structure-aware methods read."""
    s = sub.add_parser("parser", help="train and evaluate Universal Dependencies parsers")
    psub = s.add_subparsers(dest="what", required=True)
    t = psub.add_parser("train")
    t.add_argument("--preset", choices=sorted(PARSER_PRESETS),
                   help="the recipes' parsers, trained on the UD files of ../shared/data/ud")
    t.add_argument("--shared", default="../shared/data/ud")
    t.add_argument("--lang")
    t.add_argument("--conllu", nargs="+")
    t.add_argument("--dev", help="held-out CoNLL-U for model selection (default: every 10th training sentence)")
    t.add_argument("--eval-frequency", dest="eval_frequency", type=int, default=500)
    t.add_argument("--out")
    t.add_argument("--steps", type=int, help="default: the preset's (en_ud 2500, de_ud 1500), else 1500")
    t.set_defaults(func=cmd_parser_train)
    e = psub.add_parser("evaluate")
    e.add_argument("model")
    e.add_argument("--conllu", required=True)
    e.set_defaults(func=cmd_parser_evaluate)


def _training_commands(sub: argparse._SubParsersAction) -> None:
    """Training and checkpoint averaging."""
    s = sub.add_parser("train", help="train a model from an experiment YAML")
    s.add_argument("config")
    s.add_argument("--resume", action="store_true", help="continue from the newest good checkpoint")
    s.add_argument("--prepare", action="store_true", help="run prepare first if the dataset is missing")
    s.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override a field, e.g. training.max_steps=100")
    s.set_defaults(func=cmd_train)

    s = sub.add_parser("average", help="average checkpoints")
    s.add_argument("checkpoints", nargs="+")
    s.add_argument("--out", required=True)
    s.add_argument("--across-runs", dest="across_runs", action="store_true",
                   help="average checkpoints of different runs (seeds) too: the mean is usually a worse model")
    s.set_defaults(func=cmd_average)


def _decoding_commands(sub: argparse._SubParsersAction) -> None:
    """Translation, scoring and export to another engine."""
    s = sub.add_parser("translate", help="translate a file or standard input")
    s.add_argument("--checkpoint", required=True)
    s.add_argument("--input", help="raw source text, one sentence a line (default: standard input)")
    s.add_argument("--output", help="default (or '-'): standard output")
    s.add_argument("--dataset", help="dataset directory (default: the one the model was trained on)")
    _decoding_options(s)
    s.set_defaults(func=cmd_translate)

    s = sub.add_parser("test", help="translate and score a run's test splits (writes RUN/eval/)")
    s.add_argument("run")
    s.add_argument("--checkpoint")
    s.add_argument("--splits", nargs="*")
    s.add_argument("--beam", type=int)
    s.add_argument("--device", default="auto")
    s.add_argument("--long-dependency", dest="long_dependency", type=int, default=7, metavar="N",
                   help="also score the sentences whose source parse has an arc of N+ words (0: off)")
    s.set_defaults(func=cmd_test)

    s = sub.add_parser("evaluate", help="score detokenised hypotheses with sacreBLEU")
    s.add_argument("--hyp", required=True, help="hypothesis file ('-': standard input)")
    s.add_argument("--ref", required=True, action="append", help="reference file, one per --ref ('-': standard input)")
    s.add_argument("--metrics", nargs="+", default=["bleu", "chrf"], choices=["bleu", "chrf", "ter", "ribes"])
    s.add_argument("--tokenize", help="sacreBLEU tokeniser (default: 13a)")
    s.add_argument("--allow-empty", action="store_true", help="accept empty hypothesis lines")
    s.set_defaults(func=cmd_evaluate)

    s = sub.add_parser("export", help="a checkpoint for another engine (CTranslate2)")
    esub = s.add_subparsers(dest="engine", required=True)
    x = esub.add_parser("ctranslate2", help="a CTranslate2 model directory (plain-Transformer models only)")
    x.add_argument("checkpoint")
    x.add_argument("out_dir")
    x.add_argument("--dataset", help="the dataset the model was trained on (default: as its config names it)")
    x.add_argument("--quantization", help="weights on disk: int8, int8_float32, float16, ... (default float32)")
    x.add_argument("--force", action="store_true", help="replace OUT_DIR if it exists")
    x.set_defaults(func=cmd_export)


def _study_commands(sub: argparse._SubParsersAction) -> None:
    """Several runs compared: a report over runs, and studies (recipes x seeds)."""
    s = sub.add_parser("report", help="one Markdown table over several runs, with significance marks")
    s.add_argument("runs", nargs="+")
    s.add_argument("--baseline", help="the run the others are tested against: its directory's name (with "
                                      "its parent folders where two runs share one)")
    s.add_argument("--test-sets", dest="test_sets", nargs="*")
    s.add_argument("--out")
    s.add_argument("--plots", help="also draw training curves and BLEU by length into this directory")
    s.add_argument("--samples", type=int, default=1000, help="bootstrap samples")
    s.set_defaults(func=cmd_report)

    s = sub.add_parser("study", help="recipes x seeds at one update budget: train, test, records, report",
                       epilog="structnmt study compare STUDY RECIPE SEED OTHER_RECORD [--seed-of S T]: another "
                              "record of a run beside the study's (structnmt study compare -h)")
    s.add_argument("study", help="study file (YAML; see structnmt/study/spec.py)")
    s.add_argument("--status", action="store_true", help="print where every run stands and exit")
    s.add_argument("--report", action="store_true", help="write the report from the records and exit")
    s.add_argument("--out", help="with --report: where to write it (default RECORDS/report.md)")
    s.add_argument("--baseline", metavar="RECIPE",
                   help="with --report: compare against this recipe instead of the study's baseline "
                        "(default out: RECORDS/report_vs_RECIPE.md)")
    s.add_argument("--jobs", type=int, help="local executor: runs at once (threads are split between them); "
                   "with --status: the forecast's")
    s.add_argument("--executor", choices=["local", "slurm", "submitit-local"],
                   help="default: the study file's executor.kind; submitit-local runs the SLURM path here")
    s.add_argument("--only", nargs="+", metavar="RECIPE", help="run only these recipes")
    s.add_argument("--seeds", nargs="+", type=int, metavar="SEED",
                   help="run only these seeds; with --status: show only these, also seeds that "
                        "train beside the study before they join its file (studies/pending/README.md)")
    s.add_argument("--device", help="train every run here (auto, cpu, cuda, cuda:N): the study file's "
                   "executor.device for this call")
    s.add_argument("--commit", action="store_true",
                   help="git-commit each record as it is written (executor.commit: true for this call)")
    s.set_defaults(func=cmd_study)


def _inspection_commands(sub: argparse._SubParsersAction) -> None:
    """What a model learned: attention pictures, training curves, read-outs scored."""
    s = sub.add_parser("plot", help="pictures")
    psub = s.add_subparsers(dest="what", required=True)
    a = psub.add_parser("attention", help="attention heat map of one sentence, with arcs or scenes")
    a.add_argument("--checkpoint", required=True)
    which = a.add_mutually_exclusive_group(required=True)
    which.add_argument("--sentence", help="raw source text")
    which.add_argument("--line", type=int, help="1-based line of a prepared split, as RUN/eval/SPLIT.* number them "
                       "(uses its stored trees)")
    a.add_argument("--split", default="test", help="with --line")
    a.add_argument("--attention", choices=["encoder", "cross"], default="encoder")
    a.add_argument("--layer", type=int, default=1, help="1-based")
    a.add_argument("--head", type=int, default=0, help="0-based")
    a.add_argument("--dataset")
    a.add_argument("--out", required=True, help="the picture; its extension names the format (.png, .pdf, .svg, ...)")
    a.set_defaults(func=cmd_plot_attention)
    c = psub.add_parser("curves", help="training curves of several runs")
    c.add_argument("runs", nargs="+")
    c.add_argument("--out", required=True, help="the picture; its extension names the format (.png, .pdf, .svg, ...)")
    c.set_defaults(func=cmd_plot_curves)

    s = sub.add_parser("inspect", help="read learned structure out (trees, phrase trees, alignments) and score it")
    s.add_argument("what", choices=["trees", "phrases", "align", "heads"],
                   help="trees: DBSA heads -> UAS; phrases: LPSI distances -> UF; align: cross-attention -> AER; "
                        "heads: every encoder head's attention to each word's parent (any model)")
    s.add_argument("run", help="run directory (its best.pt, else last.pt)")
    s.add_argument("--checkpoint")
    s.add_argument("--split", default="test")
    s.add_argument("--side", choices=["src", "tgt"], default="src")
    s.add_argument("--layer", type=int, help="1-based; default: the method's first layer, penultimate for align")
    s.add_argument("--gold", help="gold brackets (JSON lines) for phrases, gold alignments for align")
    s.add_argument("--gold-format", dest="gold_format", choices=["auto", "pharaoh", "talp"], default="auto",
                   help="align: pharaoh (0-based; i-j sure, i?j possible) or talp (1-based; i-j sure, ipj "
                        "possible: the standard test sets' format); auto: recognised from the file")
    s.add_argument("--boundary", choices=["auto", "before", "after"], default="auto",
                   help="phrases: the word boundary a token's LPSI distance marks: before it (PRPN) or after "
                        "it (the paper's wording); auto: before on the source side, after on the target side")
    s.add_argument("--conllu", help="trees: score against this CoNLL-U file's trees instead of a prepared split")
    s.add_argument("--parser-uas", dest="parser_uas", action="store_true",
                   help="trees --conllu: also score the parser the run's dataset was prepared with on the same "
                        "sentences and words (the trees the head learned from)")
    s.add_argument("--parser", metavar="MODEL", help="trees --conllu: score this spaCy parser (path or package) "
                                                     "instead of the dataset's (implies --parser-uas)")
    s.add_argument("--without-src", dest="without_src", action="store_true",
                   help="trees --side tgt --conllu: empty sources, for a head that does not read them (checked: "
                        "refused when its trees change with the source)")
    s.add_argument("--src", help="align: source sentences of --gold (with --tgt); trees --side tgt: the sources")
    s.add_argument("--tgt", help="align: target sentences of --gold (with --src)")
    s.add_argument("--dataset")
    s.add_argument("--out", metavar="DIR", help="directory for the outputs: SPLIT.WHAT.json (the scores) and what "
                                                "was read out (default: RUN/inspect)")
    s.add_argument("--device", default="cpu")
    s.set_defaults(func=cmd_inspect)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="structnmt", description="Structure-aware neural machine translation.")
    sub = p.add_subparsers(dest="command", required=True)
    for add_commands in (_demo_commands, _data_commands, _parser_commands, _training_commands, _decoding_commands,
                         _study_commands, _inspection_commands):
        add_commands(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:2] == ["study", "compare"]:  # `structnmt study FILE` takes a study file where this takes a word
        args = study_compare_parser().parse_args(argv[2:])
    else:
        args = build_parser().parse_args(argv)
    try:
        with command_line():  # errors name the options given, not the API's arguments
            return int(args.func(args) or 0)
    except StructNMTError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as stop:  # Ctrl-C; a study's SIGTERM too (structnmt.study.executors.Terminated)
        print("interrupted", file=sys.stderr)
        return getattr(stop, "exit_status", 130)
    except OSError as err:  # the last net: a file the system would not read or write, in one line
        where = f"{err.filename}: " if err.filename else ""
        print(f"error: {where}{err.strerror or err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
