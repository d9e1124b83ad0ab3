"""``structnmt prepare`` at scale: memory that does not grow with the corpus, shards, speed.

    nice python benchmarks/bench_prepare.py scale --sizes 250000 2000000          # no parser
    nice python benchmarks/bench_prepare.py scale --sizes 20000 80000 --parser auto  # English UD parser
    nice python benchmarks/bench_prepare.py scale --sizes 100000 400000 --parser auto --sample-pairs 100000
    nice python benchmarks/bench_prepare.py shards --sizes 100000 --jobs 4         # merged shards == one go
    nice python benchmarks/bench_prepare.py first-update --sizes 250000 2000000   # training on each dataset
    nice python benchmarks/bench_prepare.py processes --sizes 29000 --parser auto  # 1 and 2 parser processes

Corpora are generated from the Multi30k En->De training pairs (``--data``), repeated with a
counter appended to both sides (``"... 123456"``), so that every pair is distinct and the
sub-word model sees a corpus of that size. Every figure is one fresh command
(``python -m structnmt.cli.main ...``) measured from outside: wall seconds and the command's
own peak resident memory (its ``VmHWM``, sampled every 50 ms; see ``common.run_command``).
Forked parser workers (``data.processes`` > 1) are not counted, so the memory runs use one
process. ``--parser auto`` is the English UD model ``parsers/en_ud/model-best`` (``--ud-parser``)
when it exists, else spaCy's ``en_core_web_sm``. Scratch files go to ``--scratch`` (default:
``benchmarks/envs/bench_prepare``) and are kept for ``first-update``.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import sys
import time
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))

import common  # noqa: E402

UD_PARSER = "parsers/en_ud/model-best"
MULTI30K = common.ROOT.parent / "shared" / "data" / "multi30k"


def make_corpus(data: Path, n: int, out: Path) -> tuple[Path, Path]:
    """``n`` pairs: Multi30k training pairs in turn, each with its running number appended."""
    src, tgt = out / f"corpus{n}.en", out / f"corpus{n}.de"
    if src.is_file() and tgt.is_file():
        return src, tgt
    with gzip.open(data / "train.en.gz", "rt", encoding="utf-8") as handle:
        en = [line.rstrip("\n") for line in handle]
    with gzip.open(data / "train.de.gz", "rt", encoding="utf-8") as handle:
        de = [line.rstrip("\n") for line in handle]
    out.mkdir(parents=True, exist_ok=True)
    with open(f"{src}.part", "w", encoding="utf-8") as fe, open(f"{tgt}.part", "w", encoding="utf-8") as fd:
        for k in range(n):
            fe.write(f"{en[k % len(en)]} {k}\n")
            fd.write(f"{de[k % len(de)]} {k}\n")
    os.replace(f"{src}.part", src)
    os.replace(f"{tgt}.part", tgt)
    return src, tgt


def parser_model(choice: str, ud: str) -> str | None:
    if choice == "none":
        return None
    if choice == "auto":
        return ud if Path(ud).is_dir() else "en_core_web_sm"
    return choice


def write_config(path: Path, src: Path, tgt: Path, dataset: Path, parser: str | None, processes: int = 1,
                 training: dict | None = None, sample_pairs: int | None = None) -> Path:
    side = {"lang": "en"}
    if parser is not None:
        side.update(parser={"backend": "spacy", "model": parser, "convention": "ud" if parser.endswith(
            "model-best") else None}, scenes="dependency")
    raw = {
        "data": {"dir": str(dataset), "src": side, "tgt": {"lang": "de"},
                 "splits": {"train": {"src": str(src), "tgt": str(tgt)}},
                 "subwords": {"kind": "sentencepiece", "model_type": "unigram", "vocab_size": 8000, "joint": True},
                 "clean": {"max_len": 80, "max_ratio": 3.0}, "processes": processes,
                 "cache_dir": str(dataset.parent / f".{dataset.name}.cache")},
    }
    if sample_pairs is not None:
        raw["data"]["subwords"]["sample_pairs"] = sample_pairs
    if training is not None:
        raw["model"] = {"enc_layers": 3, "dec_layers": 3, "d_model": 256, "n_heads": 4, "d_ff": 1024}
        raw["training"] = training
    path.write_text(yaml.safe_dump(raw, sort_keys=False), encoding="utf-8")
    return path


def structnmt(*argv: str, log: Path | None = None) -> common.CommandResult:
    env = {**os.environ, "PYTHONPATH": str(common.ROOT)}  # shard jobs import this checkout too
    result = common.run_command([sys.executable, "-m", "structnmt.cli.main", *argv], cwd=common.ROOT, env=env,
                                log=log)
    if result.returncode != 0:
        raise SystemExit(f"structnmt {' '.join(argv)} failed ({result.returncode}):\n{result.output[-3000:]}")
    return result


def fresh(path: Path) -> None:
    import shutil

    for p in (path, path.parent / f"{path.name}.shards", path.parent / f".{path.name}.cache"):
        shutil.rmtree(p, ignore_errors=True)


def scale(args: argparse.Namespace, scratch: Path) -> tuple[str, str]:
    model = parser_model(args.parser, args.ud_parser)
    rows, peaks = [], []
    for n in args.sizes:
        src, tgt = make_corpus(args.data, n, scratch)
        dataset = scratch / f"dataset{n}{'' if model is None else '_parsed'}"
        fresh(dataset)
        config = write_config(scratch / f"prepare{n}.yaml", src, tgt, dataset, model, sample_pairs=args.sample_pairs)
        result = structnmt("prepare", str(config), log=scratch / f"prepare{n}.log")
        meta = json.loads((dataset / "meta.json").read_text(encoding="utf-8"))
        peaks.append(result.peak_rss)
        rows.append([f"{n:,}", round(result.seconds, 1), f"{n / result.seconds:,.0f}", common.mib(result.peak_rss),
                     f"{result.peak_rss / peaks[0]:.2f}x", meta["subword_sample"]["pairs"],
                     json.dumps(meta["seconds"])])
        print(rows[-1], flush=True)
    header = ["pairs", "seconds", "lines/s", "peak RSS", "peak / first", "sub-word sample", "stages (s)"]
    return f"prepare, parser {model or 'none'}", common.markdown_table(header, rows)


def shards(args: argparse.Namespace, scratch: Path) -> tuple[str, str]:
    sys.path.insert(0, str(common.ROOT))
    from tests.test_prepare_stream import assert_same_dataset

    rows = []
    for n in args.sizes:
        src, tgt = make_corpus(args.data, n, scratch)
        one, merged = scratch / f"one{n}", scratch / f"merged{n}"
        fresh(one)
        fresh(merged)
        first = structnmt("prepare", str(write_config(scratch / f"one{n}.yaml", src, tgt, one, None)))
        second = structnmt("prepare", str(write_config(scratch / f"merged{n}.yaml", src, tgt, merged, None)),
                           "--jobs", str(args.jobs), log=scratch / f"merged{n}.log")
        assert_same_dataset(one, merged)
        rows.append([f"{n:,}", round(first.seconds, 1), args.jobs, round(second.seconds, 1), "yes"])
        print(rows[-1], flush=True)
    header = ["pairs", "one prepare (s)", "shards", "plan + shards + merge (s)", "same dataset, record for record"]
    return "sharded prepare (--jobs) against one prepare", common.markdown_table(header, rows)


def first_update(args: argparse.Namespace, scratch: Path) -> tuple[str, str]:
    rows, base = [], None
    training = {"max_steps": 1, "valid_every": 0, "log_every": 1, "tensorboard": False, "progress": False,
                "max_tokens": 4096, "threads": 1}
    for repeat in range(args.repeats):
        for n in args.sizes:
            dataset = scratch / f"dataset{n}"
            if not (dataset / "meta.json").is_file():
                raise SystemExit(f"{dataset}: run `bench_prepare.py scale --sizes {n}` first")
            src, tgt = make_corpus(args.data, n, scratch)
            run = scratch / f"run{n}"
            fresh(run)
            config = write_config(scratch / f"train{n}.yaml", src, tgt, dataset, None,
                                  training={**training, "out_dir": str(run)})
            result = structnmt("train", str(config))
            base = base or result
            rows.append([repeat + 1, f"{n:,}", round(result.seconds, 2), f"{result.seconds / base.seconds:.2f}x",
                         common.mib(result.peak_rss), f"{result.peak_rss / base.peak_rss:.2f}x"])
            print(rows[-1], flush=True)
    header = ["round", "pairs", "seconds to a 1-update run's end", "/ first", "peak RSS", "/ first"]
    return "training on each dataset: one update (start, open, plan the epoch, update, save)", \
        common.markdown_table(header, rows)


def processes(args: argparse.Namespace, scratch: Path) -> tuple[str, str]:
    model = parser_model(args.parser, args.ud_parser)
    rows = []
    for n in args.sizes:
        src, tgt = make_corpus(args.data, n, scratch)
        for count in (1, 2):
            dataset = scratch / f"proc{count}_{n}"
            fresh(dataset)
            result = structnmt("prepare", str(write_config(scratch / f"proc{count}.yaml", src, tgt, dataset, model,
                                                           processes=count)))
            rows.append([f"{n:,}", count, round(result.seconds, 1), f"{n / result.seconds:,.0f}"])
            print(rows[-1], flush=True)
    return f"prepare with 1 and 2 parser processes, parser {model}", \
        common.markdown_table(["pairs", "processes", "seconds", "lines/s"], rows)


def smoke_corpus(work: Path) -> Path:
    """The synthetic task's training pairs in Multi30k's file layout (what ``--data`` reads)."""
    from structnmt.data.synthetic import write_task

    out = work / "corpus"
    if not (out / "train.de.gz").is_file():
        write_task(work / "task", sizes={"train": 300, "val": 10, "test": 10}, seed=2)
        out.mkdir(parents=True, exist_ok=True)
        for ours, theirs in (("src", "en"), ("tgt", "de")):
            text = (work / "task" / f"train.{ours}").read_text(encoding="utf-8")
            with gzip.open(out / f"train.{theirs}.gz", "wt", encoding="utf-8") as handle:
                handle.write(text)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("mode", choices=["scale", "shards", "first-update", "processes"])
    parser.add_argument("--sizes", type=int, nargs="+", default=[250_000, 2_000_000], help="training pairs")
    parser.add_argument("--parser", default="none", help="none, auto, or a spaCy model (name or directory)")
    parser.add_argument("--ud-parser", default=UD_PARSER, help="the UD model --parser auto prefers")
    parser.add_argument("--sample-pairs", type=int, help="scale: data.subwords.sample_pairs (default: the "
                        "toolkit's 200,000); one value for every size isolates the cost of a larger sample")
    parser.add_argument("--jobs", type=int, default=4, help="shards: how many")
    parser.add_argument("--repeats", type=int, default=2, help="first-update: rounds over the sizes")
    parser.add_argument("--data", type=Path, default=MULTI30K, help="Multi30k directory (default: %(default)s)")
    parser.add_argument("--scratch", type=Path, default=common.ENVS / "bench_prepare")
    parser.add_argument("--name", help="report: benchmarks/results/NAME.md (default: prepare_MODE)")
    parser.add_argument("--smoke", metavar="DIR", type=Path,
                        help=common.SMOKE_HELP + ": the mode on a few hundred pairs in DIR")
    args = parser.parse_args(argv)
    if args.smoke:
        args.data, args.scratch, args.sizes, args.jobs, args.repeats = smoke_corpus(args.smoke), args.smoke, \
            [150, 300], 2, 1
    if not (args.data / "train.en.gz").is_file():
        print(f"error: {args.data}: no Multi30k here (train.en.gz)", file=sys.stderr)
        return 2
    info = common.machine()
    started = time.perf_counter()
    run = {"scale": scale, "shards": shards, "first-update": first_update, "processes": processes}[args.mode]
    title, table = run(args, args.scratch.resolve())
    info["load average (1 min) at the end"] = round(os.getloadavg()[0], 2)
    info["minutes"] = round((time.perf_counter() - started) / 60, 1)
    path = common.write_report(args.name or f"prepare_{args.mode.replace('-', '_')}", "structnmt prepare at scale",
                               [(title, table)], info)
    print(table)
    print(f"report: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
