"""Sentences per second of ``structnmt prepare`` (clean + parse + sub-words + store), with one
and with two processes.

    python benchmarks/bench_prepare.py                     # all 29,000 Multi30k training pairs
    python benchmarks/bench_prepare.py --sentences 300 --vocab-size 1000       # smoke run

The input is the first ``--sentences`` Multi30k En->De training pairs, prepared as the base
recipe prepares them (English parsed, dependency scenes, joint SentencePiece), except that the
parser is the English UD model (``parsers/en_ud/model-best``, from ``structnmt parser train
--preset en_ud``) when it exists and spaCy's ``en_core_web_sm`` otherwise. Every run starts
with an empty parse cache and a new dataset directory, so nothing is reused between runs;
the time covers the whole ``prepare`` call, parser loading and SentencePiece training included.
"""

from __future__ import annotations

import argparse
import gzip
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import common  # noqa: E402
from bench_train import BASE_CONFIG  # noqa: E402

UD_PARSER = "parsers/en_ud/model-best"
MULTI30K = common.ROOT.parent / "shared" / "data" / "multi30k"
#: the stages ``prepare`` times (meta.json "seconds"); parsing happens inside the third
STAGES = ["read_clean", "subwords_train", "tokenise_parse_encode", "store"]


def head_gz(source: Path, target: Path, n: int) -> int:
    """The first ``n`` lines of a gzipped file into another; how many there were."""
    with gzip.open(source, "rt", encoding="utf-8") as fin, gzip.open(target, "wt", encoding="utf-8") as fout:
        count = 0
        for line in fin:
            if count == n:
                break
            fout.write(line)
            count += 1
    return count


def time_prepare(src: Path, tgt: Path, parser: str, processes: int, vocab_size: int,
                 scratch: Path) -> tuple[float, dict[str, float]]:
    """Seconds of one cold ``prepare`` (fresh cache and output directory), and of its stages."""
    import json

    from structnmt.config import load_config
    from structnmt.data.prepare import prepare

    out = scratch / f"dataset_p{processes}"
    cache = scratch / f"cache_p{processes}"
    for path in (out, cache):
        shutil.rmtree(path, ignore_errors=True)
    backend = "none" if parser == "none" else "spacy"
    overrides = {
        "data.dir": str(out), "data.cache_dir": str(cache), "data.processes": processes,
        "data.splits": {"train": {"src": str(src), "tgt": str(tgt)}},
        "data.src.parser.backend": backend, "data.src.parser.model": None if parser == "none" else parser,
        "data.src.parser.convention": "ud" if parser == UD_PARSER else None,
        "data.src.scenes": "none" if parser == "none" else "dependency",
        "data.subwords.vocab_size": vocab_size,
    }
    cfg = load_config(BASE_CONFIG, overrides)
    started = time.perf_counter()
    prepare(cfg, verbose=False)
    seconds = time.perf_counter() - started
    return seconds, json.loads((out / "meta.json").read_text(encoding="utf-8")).get("seconds", {})


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sentences", type=int, default=29000, help="training pairs to prepare")
    parser.add_argument("--processes", type=int, nargs="+", default=[1, 2], help="process counts to time")
    parser.add_argument("--parser", help=f"spaCy model (default: {UD_PARSER} if present, else en_core_web_sm); "
                                         "'none' times sub-words only")
    parser.add_argument("--vocab-size", type=int, default=8000, help="SentencePiece vocabulary (smaller for "
                                                                      "a few hundred sentences)")
    parser.add_argument("--data", type=Path, default=MULTI30K, help="Multi30k directory (default: %(default)s)")
    parser.add_argument("--name", default="prepare", help="report: benchmarks/results/NAME.md")
    args = parser.parse_args(argv)

    from structnmt.errors import StructNMTError

    if not (args.data / "train.en.gz").is_file():
        print(f"error: {args.data}: no Multi30k here (train.en.gz)", file=sys.stderr)
        return 2
    model = args.parser or (UD_PARSER if Path(UD_PARSER).is_dir() else "en_core_web_sm")
    info = common.machine()
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench_prepare.", dir=common.ENVS if common.ENVS.is_dir() else None) \
            as tmp:
        scratch = Path(tmp)
        src, tgt = scratch / "train.en.gz", scratch / "train.de.gz"
        n = head_gz(args.data / "train.en.gz", src, args.sentences)
        head_gz(args.data / "train.de.gz", tgt, args.sentences)
        for processes in args.processes:
            try:
                seconds, stages = time_prepare(src, tgt, model, processes, args.vocab_size, scratch)
            except StructNMTError as err:
                print(f"error: {err}", file=sys.stderr)
                return 2
            print(f"{processes} process(es): {n} sentences in {seconds:.1f}s = {n / seconds:.0f} sentences/s; "
                  f"stages (s): {stages}")
            rows.append([processes, n, round(seconds, 1), round(n / seconds)]
                        + [stages.get(k, "") for k in STAGES])
    speedup = [[r[0], f"{r[3] / rows[0][3]:.2f}x"] for r in rows]
    sections = [
        ("Setup", f"First {n} Multi30k En->De training pairs; parser `{model}`; scenes from the trees; joint "
                  f"SentencePiece of {args.vocab_size}; cold parse cache every run."),
        ("prepare throughput (stages in seconds, from the dataset's meta.json)", common.markdown_table(
            ["processes", "sentences", "seconds", "sentences/s", *STAGES], rows)),
        (f"Speed-up over {rows[0][0]} process(es)", common.markdown_table(["processes", "speed-up"], speedup)),
    ]
    path = common.write_report(args.name, "Preprocessing throughput", sections, info)
    print(f"report: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
