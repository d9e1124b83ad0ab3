"""How much a long spaCy run grows from words it has not seen before, with and without memory zones.

    python benchmarks/spacy_vocab_growth.py CORPUS.en [--model parsers/en_ud/model-best] [--zone]

Tokenises the file's lines in chunks of 4,000 (as ``prepare`` hands them to the parser) and
prints the process's resident memory above its start about every 50k lines, with the size of
spaCy's ``StringStore``. With ``--zone`` each chunk runs inside ``nlp.memory_zone()``, as
:mod:`structnmt.data.parsing.spacy_backend` now does. Only the tokenizer runs: it is where
new words enter the vocabulary, and it is fast enough to cover a large file.
"""

from __future__ import annotations

import argparse
import contextlib


def rss_mib() -> int:
    with open("/proc/self/status") as handle:
        for line in handle:
            if line.startswith("VmRSS"):
                return int(line.split()[1]) // 1024
    return 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("corpus")
    parser.add_argument("--model", default="parsers/en_ud/model-best")
    parser.add_argument("--zone", action="store_true", help="one memory zone per chunk")
    parser.add_argument("--chunk", type=int, default=4000)
    parser.add_argument("--lines", type=int, default=0, help="only the first N lines (0: all)")
    args = parser.parse_args()
    import spacy

    nlp = spacy.load(args.model)
    with open(args.corpus, encoding="utf-8") as handle:
        lines = [line.rstrip("\n") for line in handle]
    if args.lines:
        lines = lines[:args.lines]
    start = rss_mib()
    print(f"{len(lines):,} lines, zone={args.zone}, resident at start {start} MiB", flush=True)
    every = max(1, 50_000 // args.chunk)
    for n, i in enumerate(range(0, len(lines), args.chunk), start=1):
        with nlp.memory_zone() if args.zone else contextlib.nullcontext():
            for text in lines[i:i + args.chunk]:
                [token.text for token in nlp.tokenizer(text)]
        if n % every == 0 or i + args.chunk >= len(lines):
            print(f"{min(i + args.chunk, len(lines)):>9,} lines: +{rss_mib() - start} MiB, "
                  f"{len(nlp.vocab.strings):,} strings", flush=True)


if __name__ == "__main__":
    main()
