"""The ``structnmt`` command: one sub-command per step of an experiment.

Every user-facing failure is a :class:`StructNMTError`; it is printed as one line
(``error: FILE:LINE: what is wrong``) with exit status 2, never as a traceback.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import yaml

from structnmt.errors import ConfigError, DataError, StructNMTError


def _overrides(items: list[str]) -> dict[str, Any]:
    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep:
            raise ConfigError(f"expected KEY=VALUE, got {item!r}", "--set")
        out[key] = yaml.safe_load(value)
    return out


def _device(spec: str):
    import torch

    if spec == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(spec)


# ---------------------------------------------------------------------------
# prepare / train


def cmd_prepare(args: argparse.Namespace) -> int:
    from structnmt.config import ExperimentConfig, load_config
    from structnmt.data.prepare import prepare

    if args.config == "multi30k":
        from structnmt.data.multi30k import build_multi30k

        out = Path(args.out or f"data/multi30k_{args.pair.replace('-', '_')}")
        data = build_multi30k(args.pair, out.parent / f"{out.name}_raw", Path(args.from_dir) if args.from_dir else None)
        data.dir = str(out)
        if args.parser:
            data.src.parser.backend, data.src.parser.model = "spacy", args.parser
        cfg = ExperimentConfig(data=data)
    else:
        cfg = load_config(args.config, _overrides(args.set))
        if cfg.data is None:
            raise ConfigError("this config has no data section", "data", args.config)
    path = prepare(cfg, force=args.force)
    print(f"dataset ready: {path}")
    return 0


def cmd_train(args: argparse.Namespace) -> int:
    from structnmt.config import load_config
    from structnmt.training.trainer import train

    cfg = load_config(args.config, _overrides(args.set))
    if args.prepare and cfg.data is not None and not (Path(cfg.data.dir) / "meta.json").exists():
        from structnmt.data.prepare import prepare

        prepare(cfg)
    summary = train(cfg, resume=args.resume)
    print(yaml.safe_dump(summary, sort_keys=False), end="")
    return exit_status(summary)


#: ``structnmt train``'s exit status when a signal stopped it after saving a checkpoint:
#: EX_TEMPFAIL ("try again later"), so that ``train && test`` stops and a scheduler can tell a
#: resumable interruption (rerun with --resume) from a finished run (0) or a diverged one (1)
EXIT_INTERRUPTED = 75


def exit_status(summary: dict) -> int:
    status = summary.get("status")
    return {"diverged": 1, "interrupted": EXIT_INTERRUPTED}.get(status, 0)


def cmd_average(args: argparse.Namespace) -> int:
    from structnmt.training.checkpoint import write_averaged_checkpoint

    out = write_averaged_checkpoint(args.checkpoints, args.out)
    print(f"averaged {len(args.checkpoints)} checkpoints into {out}")
    return 0


# ---------------------------------------------------------------------------
# translate / test / evaluate


def _load(checkpoint: str, dataset: str | None, device):
    from structnmt.data.pipeline import Preprocessor
    from structnmt.training.checkpoint import load_model

    if dataset is None:
        from structnmt.training.checkpoint import load_checkpoint

        dataset = load_checkpoint(checkpoint)["config"]["data"]["dir"]
    model, cfg, info = load_model(checkpoint, device, dataset_dir=dataset)
    return model, cfg, Preprocessor.from_dataset(dataset), Path(dataset)


def _decoding(cfg, args: argparse.Namespace):
    import dataclasses

    d = cfg.decoding
    changes = {k: getattr(args, k) for k in ("beam", "length_penalty", "nbest", "max_len_a", "max_len_b")
               if getattr(args, k, None) is not None}
    out = dataclasses.replace(d, **changes)
    out.validate("decoding")
    return out


def _labels(dataset_dir: Path) -> list[str]:
    meta = json.loads((dataset_dir / "meta.json").read_text(encoding="utf-8"))
    return meta.get("labels") or []


def cmd_translate(args: argparse.Namespace) -> int:
    from structnmt.data.corpus import read_lines
    from structnmt.decoding.translate import translate_lines
    from structnmt.io import atomic_open, same_file

    if args.output and args.input not in (None, "-") and same_file(args.input, args.output):
        raise ConfigError(f"{args.output} is the input file: translating would replace it; "
                          "choose another output", "--output")
    device = _device(args.device)
    model, cfg, pre, dataset = _load(args.checkpoint, args.dataset, device)
    dcfg = _decoding(cfg, args)
    # standard input is read like a file (strict UTF-8, lines split on "\n" only, control
    # characters refused), so output line n always translates input line n
    stdin = args.input in (None, "-")
    try:
        lines = read_lines("/dev/stdin" if stdin else args.input)
    except DataError as err:
        if stdin:  # name it as the user knows it
            raise DataError(str(err).replace("/dev/stdin", "<stdin>", 1)) from None
        raise
    started = time.perf_counter()
    outputs = translate_lines(model, pre, lines, dcfg, device, labels=_labels(dataset),
                              source=args.input if args.input not in (None, "-") else "<stdin>")
    seconds = time.perf_counter() - started
    text = "".join(
        "".join((f"{i}\t{hyp}\n" if dcfg.nbest > 1 else f"{hyp}\n") for hyp in hyps)
        for i, hyps in enumerate(outputs)
    )
    if args.output:
        with atomic_open(args.output) as handle:
            handle.write(text)
    else:
        sys.stdout.write(text)
    print(f"translated {len(lines)} sentences in {seconds:.1f}s ({len(lines) / max(seconds, 1e-9):.1f} sent/s)",
          file=sys.stderr)
    return 0


def evaluate_run(run_dir: Path, checkpoint: str | None = None, splits: list[str] | None = None,
                 device: str = "auto", beam: int | None = None, quiet: bool = False,
                 long_dependency: int = 7) -> dict[str, dict]:
    """Translate a run's test splits; write ``eval/<split>.{hyp,ref,src,json}``; return scores."""
    import dataclasses

    from structnmt.data.dataset import ParallelDataset
    from structnmt.decoding.translate import translate_split
    from structnmt.evaluation.scores import corpus_scores
    from structnmt.io import atomic_write_text

    if not run_dir.is_dir():
        raise DataError("no such run directory", run_dir)
    if checkpoint:
        ckpt = Path(checkpoint)
        if not ckpt.exists():
            from structnmt.errors import CheckpointError

            raise CheckpointError(f"{ckpt}: no such checkpoint")
    else:
        ckpt = run_dir / "best.pt" if (run_dir / "best.pt").exists() else run_dir / "last.pt"
    dev = _device(device)
    model, cfg, pre, dataset_dir = _load(str(ckpt), None, dev)
    dcfg = cfg.decoding if beam is None else dataclasses.replace(cfg.decoding, beam=beam)
    meta = json.loads((dataset_dir / "meta.json").read_text(encoding="utf-8"))
    names = splits or [s for s in meta["splits"] if s not in (cfg.data.train_split, cfg.data.valid_split)]
    results = {}
    for split in names:
        data = ParallelDataset(dataset_dir, split)
        started = time.perf_counter()
        truncated: list[int] = []
        hyps = translate_split(model, data, pre, dcfg, dev, labels=meta.get("labels") or [], truncated=truncated)
        seconds = time.perf_counter() - started
        refs = data.raw("tgt")
        scores = corpus_scores(hyps, [refs], metrics=("bleu", "chrf"))
        scores.update({"checkpoint": str(ckpt), "beam": dcfg.beam, "sentences": len(hyps), "seconds": seconds,
                       "truncated_lines": truncated})
        out = run_dir / "eval"
        atomic_write_text(out / f"{split}.hyp", "".join(h + "\n" for h in hyps))
        atomic_write_text(out / f"{split}.ref", "".join(r + "\n" for r in refs))
        atomic_write_text(out / f"{split}.src", "".join(s + "\n" for s in data.raw("src")))
        atomic_write_text(out / f"{split}.json", json.dumps(scores, indent=2) + "\n")
        results[split] = scores
        if not quiet:
            print(f"{split}: BLEU {scores['bleu']:.2f}  chrF {scores['chrf']:.2f}  ({len(hyps)} sentences, "
                  f"{seconds:.1f}s)  {scores['signature']['bleu']}")
        if long_dependency and data.has("src", "heads"):
            results.update(_long_dependency(run_dir, split, data, hyps, refs, long_dependency, quiet))
    return results


def _long_dependency(run_dir: Path, split: str, data, hyps: list[str], refs: list[str], threshold: int,
                     quiet: bool) -> dict[str, dict]:
    """Score the sentences whose source parse has an arc of ``threshold`` words or more as a
    test set of its own (``<split>_longdep``), chosen from the stored parse, so reproducibly."""
    from structnmt.evaluation.challenge import long_dependency_subset
    from structnmt.evaluation.scores import corpus_scores
    from structnmt.io import atomic_write_text

    heads = [data.side_arrays(i, "src")["heads"].tolist() for i in range(len(data))]
    chosen = long_dependency_subset(heads, threshold)
    if not chosen:
        return {}
    name = f"{split}_longdep"
    sources = data.raw("src")
    out = run_dir / "eval"
    sub_hyps, sub_refs = [hyps[i] for i in chosen], [refs[i] for i in chosen]
    scores = corpus_scores(sub_hyps, [sub_refs], metrics=("bleu", "chrf"))
    scores.update({"subset_of": split, "threshold": threshold, "sentences": len(chosen),
                   "lines": [i + 1 for i in chosen]})
    atomic_write_text(out / f"{name}.hyp", "".join(h + "\n" for h in sub_hyps))
    atomic_write_text(out / f"{name}.ref", "".join(r + "\n" for r in sub_refs))
    atomic_write_text(out / f"{name}.src", "".join(sources[i] + "\n" for i in chosen))
    atomic_write_text(out / f"{name}.json", json.dumps(scores, indent=2) + "\n")
    if not quiet:
        print(f"{name}: BLEU {scores['bleu']:.2f}  chrF {scores['chrf']:.2f}  ({len(chosen)} sentences with an "
              f"arc of {threshold}+ words)")
    return {name: scores}


def cmd_test(args: argparse.Namespace) -> int:
    evaluate_run(Path(args.run), args.checkpoint, args.splits, args.device, args.beam,
                 long_dependency=args.long_dependency)
    return 0


def cmd_evaluate(args: argparse.Namespace) -> int:
    from structnmt.evaluation.scores import check_parallel, corpus_scores

    hyps, refs = check_parallel(args.hyp, args.ref, allow_empty=args.allow_empty)
    scores = corpus_scores(hyps, refs, metrics=tuple(args.metrics), tokenize=args.tokenize)
    for name in args.metrics:
        print(f"{name.upper()} = {scores[name]:.2f}   {scores['signature'].get(name, '')}")
    return 0


# ---------------------------------------------------------------------------
# demo


def cmd_demo(args: argparse.Namespace) -> int:
    """Synthetic data -> prepare -> train -> beam search -> BLEU, in a few minutes on a CPU."""
    import logging

    from structnmt.config import config_from_dict
    from structnmt.data.prepare import prepare
    from structnmt.data.synthetic import demo_config, write_task
    from structnmt.training.trainer import train

    # the synthetic text is tokenised by design ("... the clock ."): sacreBLEU's warning about
    # undetokenised output would only confuse here
    logging.getLogger("sacrebleu").setLevel(logging.ERROR)
    work = Path(args.work)
    started = time.perf_counter()
    sizes = {"train": args.train_size, "val": 300, "test": 500}
    print(f"[demo] writing the synthetic task to {work / 'data'}")
    write_task(work / "data", sizes=sizes, seed=args.seed)
    raw = demo_config(work, args.minutes)
    raw["training"]["seed"] = args.seed
    raw["training"]["progress"] = sys.stderr.isatty()
    for key, value in _overrides(args.set).items():
        node = raw
        *parents, last = key.split(".")
        for part in parents:
            node = node.setdefault(part, {})
        node[last] = value
    cfg = config_from_dict(raw)
    print("[demo] preparing the dataset (gold trees from CoNLL-U, SentencePiece)")
    prepare(cfg, force=True)
    run_dir = Path(cfg.training.out_dir)
    if run_dir.exists():
        import shutil

        shutil.rmtree(run_dir)
    print(f"[demo] training for up to {args.minutes:g} minutes")
    train(cfg)
    print("[demo] translating the test set with beam search")
    results = evaluate_run(run_dir, splits=["test"], device=cfg.training.device)
    bleu = results["test"]["bleu"]
    print(f"[demo] done in {(time.perf_counter() - started) / 60:.1f} min: test BLEU {bleu:.2f} "
          f"(hypotheses in {run_dir / 'eval' / 'test.hyp'})")
    return 0


# ---------------------------------------------------------------------------
# reports, pictures, analyses, parsers


def cmd_report(args: argparse.Namespace) -> int:
    from structnmt.evaluation.report import build_report

    text = build_report([Path(r) for r in args.runs], args.baseline, args.test_sets,
                        Path(args.out) if args.out else None, n_samples=args.samples)
    if not args.out:
        print(text)
    else:
        print(f"report written to {args.out}")
    if args.plots:
        _report_plots(args, Path(args.plots))
    return 0


def _report_plots(args: argparse.Namespace, out: Path) -> None:
    from structnmt.evaluation.buckets import bleu_by_length
    from structnmt.evaluation.scores import read_text
    from structnmt.visualisation.curves import plot_training_curves
    from structnmt.visualisation.lengths import plot_bleu_by_length

    runs = [Path(r) for r in args.runs]
    plot_training_curves({r.name: r for r in runs}, out / "curves.png")
    test_set = (args.test_sets or [None])[0]
    if test_set is None:
        candidates = sorted(p.stem for p in (runs[0] / "eval").glob("*.hyp"))
        test_set = candidates[0] if candidates else None
    if test_set:
        systems = {}
        for r in runs:
            e = r / "eval"
            systems[r.name] = bleu_by_length(read_text(e / f"{test_set}.src"), read_text(e / f"{test_set}.hyp"),
                                             [read_text(e / f"{test_set}.ref")])
        plot_bleu_by_length(systems, out / f"bleu_by_length_{test_set}.png", title=f"BLEU by length: {test_set}")
    print(f"pictures written to {out}")


def cmd_plot_attention(args: argparse.Namespace) -> int:
    import numpy as np
    import torch

    from structnmt.data.batch import BOS_ID, Batch
    from structnmt.data.batching import collate, collate_examples
    from structnmt.data.dataset import ParallelDataset
    from structnmt.decoding.search import beam_search
    from structnmt.visualisation.attention import plot_attention

    model, cfg, pre, dataset = _load(args.checkpoint, args.dataset, _device("cpu"))
    fields = model.structure_needs(inference=True)
    fields = {"src": fields["src"] | {"word_index"}, "tgt": set()}
    heads = scenes_members = None
    if args.sentence is not None:  # raw text: parsed if a method needs it and the parser can
        parser_ok = pre.side_cfg("src").parser.backend not in ("none", "conllu")
        if fields["src"] - {"word_index"} and not parser_ok:
            raise ConfigError("this model needs source trees and the dataset's parser cannot parse new text; "
                              "use --split and --line", "--sentence")
        ex = pre.encode_sources([args.sentence], with_structure=parser_ok)[0]
        if ex.src.word_index is None:
            fields["src"].discard("word_index")
        batch = collate_examples([ex], fields, _labels(dataset))
        if ex.src.tree is not None:
            heads, word_index = ex.src.tree.heads, np.asarray(ex.src.word_index)
            scenes_members = ex.src.scenes.members if ex.src.scenes is not None else None
    else:  # a sentence of a prepared split, with its stored structure
        data = ParallelDataset(dataset, args.split)
        if not 1 <= args.line <= len(data):
            raise DataError(f"line {args.line} is outside 1..{len(data)}", data.path)
        i = args.line - 1
        full = collate(data, np.array([i]), fields)
        batch = Batch(full.src, struct={"src": full.struct["src"], "tgt": {}})
        arrays = data.side_arrays(i, "src")
        if "heads" in arrays:
            heads, word_index = arrays["heads"].tolist(), np.asarray(arrays["word_index"])
            if "scene_members" in arrays:
                scenes_members = [tuple(m) for m in np.asarray(arrays["scene_members"]).reshape(-1, 2)]
    layer = args.layer - 1
    key = ("encoder", layer, "self", "probs") if args.attention == "encoder" else ("decoder", layer, "cross", "probs")
    hyp = beam_search(model, batch, beam=cfg.decoding.beam)[0][0]
    tgt_in = torch.tensor([[BOS_ID] + hyp.tokens])
    with torch.no_grad():
        out = model(Batch(batch.src, tgt_in, tgt_in, struct=batch.struct), record={key})
    weights = out.records[key][0, args.head].float().numpy()
    src_tokens = [pre.subwords["src"].piece(int(t)) for t in batch.src[0]]
    tgt_tokens = ["<s>"] + [pre.subwords["tgt"].piece(int(t)) for t in hyp.tokens]
    arcs = scenes = None
    if heads is not None and args.attention == "encoder":
        first = {int(w): int(np.flatnonzero(word_index == w)[0]) for w in np.unique(word_index)}
        arcs = [(first[d], first[h]) for d, h in enumerate(heads) if d != h]
        if scenes_members:
            groups: dict[int, list[int]] = {}
            for word, scene in scenes_members:
                groups.setdefault(int(scene), []).extend(np.flatnonzero(word_index == word).tolist())
            scenes = [sorted(g) for g in groups.values()]
    rows = src_tokens if args.attention == "encoder" else tgt_tokens
    plot_attention(weights, rows, src_tokens, Path(args.out), arcs=arcs, scenes=scenes,
                   title=f"{args.attention} layer {args.layer} head {args.head}")
    print(f"attention map written to {args.out}")
    return 0


def cmd_plot_curves(args: argparse.Namespace) -> int:
    from structnmt.visualisation.curves import plot_training_curves

    plot_training_curves({Path(r).name: Path(r) for r in args.runs}, Path(args.out))
    print(f"training curves written to {args.out}")
    return 0


def cmd_parser_train(args: argparse.Namespace) -> int:
    from structnmt.parsers import train_ud_parser

    if args.preset:
        lang, files, dev, out = PARSER_PRESETS[args.preset]
        shared = Path(args.shared)
        args.lang = args.lang or lang
        args.conllu = args.conllu or [str(shared / f) for f in files]
        args.dev = args.dev or (str(shared / dev) if dev else None)
        args.out = args.out or out
    if args.preset == "de_ud":
        print("note: German has no UD training file here beyond GSD dev (720 sentences): expect about 72 UAS "
              "(docs/parsers.md). Target-side recipes with UD trees are on En->Fr (configs/multi30k_en_fr_*).",
              file=sys.stderr)
    missing = [name for name in ("lang", "conllu", "out") if not getattr(args, name)]
    if missing:
        raise ConfigError("missing (give it or use --preset)", f"--{missing[0]}")
    from structnmt.parsers.ud_train import EN_UD_SIZE, ParserSize

    size = EN_UD_SIZE if args.preset == "en_ud" else ParserSize()
    steps = args.steps or (PRESET_STEPS.get(args.preset, 1500) if args.preset else 1500)
    path = train_ud_parser(args.lang, [Path(p) for p in args.conllu], Path(args.dev) if args.dev else None,
                           Path(args.out), max_steps=steps, eval_frequency=args.eval_frequency, size=size)
    print(f"parser written to {path}")
    return 0


def cmd_parser_evaluate(args: argparse.Namespace) -> int:
    from structnmt.parsers.ud_eval import evaluate_parser, format_scores

    scores = evaluate_parser(args.model, Path(args.conllu), quiet=True)
    print(format_scores(scores))
    return 0


#: updates of each preset (docs/parsers.md: what they reach and what they cost)
PRESET_STEPS = {"en_ud": 2000, "de_ud": 1500}

#: training data of the UD parsers the recipes use (files under ../shared/data/ud)
PARSER_PRESETS = {
    # EWT's training file plus GUM's dev and test for training, EWT dev to choose the checkpoint
    "en_ud": ("en", ["en_ewt-ud-train.conllu", "en_gum-ud-dev.conllu", "en_gum-ud-test.conllu"],
              "en_ewt-ud-dev.conllu", "parsers/en_ud"),
    "de_ud": ("de", ["de_gsd-ud-dev.conllu"], None, "parsers/de_ud"),
}


def cmd_inspect(args: argparse.Namespace) -> int:
    from structnmt.data.dataset import ParallelDataset
    from structnmt.evaluation.inspect_run import inspect_split

    run = Path(args.run)
    checkpoint = args.checkpoint or str(run / "best.pt" if (run / "best.pt").exists() else run / "last.pt")
    model, cfg, pre, dataset = _load(checkpoint, args.dataset, _device(args.device))
    data = ParallelDataset(dataset, args.split)
    out = Path(args.out or run / "inspect")
    layer = None if args.layer is None else args.layer - 1
    scores = inspect_split(model, data, args.what, out, side=args.side, layer=layer, gold=args.gold,
                           boundary=args.boundary)
    print(json.dumps(scores, indent=2))
    print(f"written to {out}", file=sys.stderr)
    return 0


def cmd_study(args: argparse.Namespace) -> int:
    from structnmt.study import format_status, load_study, run_study, study_status

    if args.status:
        print(format_status(study_status(args.study)))
        return 0
    if args.report:
        from structnmt.study.report import write_report

        print(f"report written to {write_report(load_study(args.study), args.out)}")
        return 0
    result = run_study(args.study, jobs=args.jobs, executor=args.executor, only=args.only)
    print(format_status(study_status(args.study)))
    return 0 if all(s == "done" for s in result["runs"].values()) else 1


def cmd_methods(args: argparse.Namespace) -> int:
    from structnmt.model.methods import METHODS, _discover, method_params_doc

    _discover()
    for name in sorted(METHODS):
        cls = METHODS[name]
        doc = (cls.__doc__ or "").strip().splitlines()[0] if cls.__doc__ else ""
        print(f"{name}: {doc}")
        if args.verbose:
            print(f"    needs {dict(cls.needs) or '-'}; at translation {dict(cls.needs_at_inference) or '-'}")
            print(f"    defaults {method_params_doc(name)}")
    return 0


# ---------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="structnmt", description="Structure-aware neural machine translation.")
    sub = p.add_subparsers(dest="command", required=True)

    s = sub.add_parser("prepare", help="raw parallel text -> parsed, sub-worded dataset directory")
    s.add_argument("config", help="experiment YAML, or the word 'multi30k'")
    s.add_argument("--pair", default="en-de", help="multi30k: language pair (en-de, en-fr)")
    s.add_argument("--from", dest="from_dir", help="multi30k: local copy of the raw files (else download)")
    s.add_argument("--out", help="multi30k: dataset directory")
    s.add_argument("--parser", help="multi30k: spaCy model (name or path) for the source trees")
    s.add_argument("--force", action="store_true", help="rebuild even if the dataset exists")
    s.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    s.set_defaults(func=cmd_prepare)

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
    s.set_defaults(func=cmd_average)

    def decoding_options(s: argparse.ArgumentParser) -> None:
        s.add_argument("--beam", type=int)
        s.add_argument("--length-penalty", dest="length_penalty", type=float)
        s.add_argument("--nbest", type=int)
        s.add_argument("--max-len-a", dest="max_len_a", type=float)
        s.add_argument("--max-len-b", dest="max_len_b", type=int)
        s.add_argument("--device", default="auto")

    s = sub.add_parser("translate", help="translate a file or standard input")
    s.add_argument("--checkpoint", required=True)
    s.add_argument("--input", help="raw source text, one sentence a line (default: standard input)")
    s.add_argument("--output", help="default: standard output")
    s.add_argument("--dataset", help="dataset directory (default: the one the model was trained on)")
    decoding_options(s)
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
    s.add_argument("--hyp", required=True)
    s.add_argument("--ref", required=True, action="append")
    s.add_argument("--metrics", nargs="+", default=["bleu", "chrf"], choices=["bleu", "chrf", "ter"])
    s.add_argument("--tokenize", help="sacreBLEU tokeniser (default: 13a)")
    s.add_argument("--allow-empty", action="store_true", help="accept empty hypothesis lines")
    s.set_defaults(func=cmd_evaluate)

    s = sub.add_parser("demo", help="the whole pipeline on the built-in synthetic task")
    s.add_argument("--work", default="demo", help="working directory (data, dataset, run)")
    s.add_argument("--minutes", type=float, default=3.0)
    s.add_argument("--train-size", dest="train_size", type=int, default=20000)
    s.add_argument("--seed", type=int, default=1)
    s.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    s.set_defaults(func=cmd_demo)

    s = sub.add_parser("report", help="one Markdown table over several runs, with significance marks")
    s.add_argument("runs", nargs="+")
    s.add_argument("--baseline", help="the run (directory name) the others are tested against")
    s.add_argument("--test-sets", dest="test_sets", nargs="*")
    s.add_argument("--out")
    s.add_argument("--plots", help="also draw training curves and BLEU by length into this directory")
    s.add_argument("--samples", type=int, default=1000, help="bootstrap samples")
    s.set_defaults(func=cmd_report)

    s = sub.add_parser("plot", help="pictures")
    psub = s.add_subparsers(dest="what", required=True)
    a = psub.add_parser("attention", help="attention heat map of one sentence, with arcs or scenes")
    a.add_argument("--checkpoint", required=True)
    which = a.add_mutually_exclusive_group(required=True)
    which.add_argument("--sentence", help="raw source text")
    which.add_argument("--line", type=int, help="1-based line of a prepared split (uses its stored trees)")
    a.add_argument("--split", default="test", help="with --line")
    a.add_argument("--attention", choices=["encoder", "cross"], default="encoder")
    a.add_argument("--layer", type=int, default=1, help="1-based")
    a.add_argument("--head", type=int, default=0, help="0-based")
    a.add_argument("--dataset")
    a.add_argument("--out", required=True)
    a.set_defaults(func=cmd_plot_attention)
    c = psub.add_parser("curves", help="training curves of several runs")
    c.add_argument("runs", nargs="+")
    c.add_argument("--out", required=True)
    c.set_defaults(func=cmd_plot_curves)

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
    t.add_argument("--steps", type=int, help="default: the preset's (en_ud 2000, de_ud 1500), else 1500")
    t.set_defaults(func=cmd_parser_train)
    e = psub.add_parser("evaluate")
    e.add_argument("model")
    e.add_argument("--conllu", required=True)
    e.set_defaults(func=cmd_parser_evaluate)

    s = sub.add_parser("inspect", help="read learned structure out (trees, phrase trees, alignments) and score it")
    s.add_argument("what", choices=["trees", "phrases", "align"],
                   help="trees: DBSA heads -> UAS; phrases: LPSI distances -> UF; align: cross-attention -> AER")
    s.add_argument("run", help="run directory (its best.pt, else last.pt)")
    s.add_argument("--checkpoint")
    s.add_argument("--split", default="test")
    s.add_argument("--side", choices=["src", "tgt"], default="src")
    s.add_argument("--layer", type=int, help="1-based; default: the method's first layer, penultimate for align")
    s.add_argument("--gold", help="gold brackets (JSON lines) for phrases, gold alignments (Pharaoh) for align")
    s.add_argument("--boundary", choices=["auto", "before", "after"], default="auto",
                   help="phrases: the word boundary a token's LPSI distance marks: before it (PRPN) or after "
                        "it (the paper's wording); auto: before on the source side, after on the target side")
    s.add_argument("--dataset")
    s.add_argument("--out", help="default: RUN/inspect")
    s.add_argument("--device", default="cpu")
    s.set_defaults(func=cmd_inspect)

    s = sub.add_parser("study", help="recipes x seeds at one update budget: train, test, records, report")
    s.add_argument("study", help="study file (YAML; see structnmt/study/spec.py)")
    s.add_argument("--status", action="store_true", help="print where every run stands and exit")
    s.add_argument("--report", action="store_true", help="write the report from the records and exit")
    s.add_argument("--out", help="with --report: where to write it (default RECORDS/report.md)")
    s.add_argument("--jobs", type=int, help="local executor: runs at once (threads are split between them)")
    s.add_argument("--executor", choices=["local", "slurm", "submitit-local"],
                   help="default: the study file's executor.kind; submitit-local runs the SLURM path here")
    s.add_argument("--only", nargs="+", metavar="RECIPE", help="run only these recipes")
    s.set_defaults(func=cmd_study)

    s = sub.add_parser("methods", help="list the structure-aware methods and their defaults")
    s.add_argument("-v", "--verbose", action="store_true")
    s.set_defaults(func=cmd_methods)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except StructNMTError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
