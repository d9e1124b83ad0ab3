"""How much a new parser changes the trees of a corpus: the share of words whose head moved.

    python benchmarks/parser_change.py OLD_MODEL NEW_MODEL --text ../shared/data/multi30k/train.en.gz

Both models parse every line through the toolkit's spaCy back end (the same tokenisation,
so the words line up one to one); a word counts as changed when its head is another word
(or it became, or stopped being, the root). Lines whose words differ between the two
parses are counted apart and left out of the share.
"""

from __future__ import annotations

import argparse
import json
import time

from structnmt.data.corpus import read_lines
from structnmt.data.parsing.spacy_backend import SpacyParser


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("old")
    ap.add_argument("new")
    ap.add_argument("--text", required=True)
    ap.add_argument("--processes", type=int, default=1)
    ap.add_argument("--limit", type=int, default=0, help="only the first N lines (0: all)")
    args = ap.parse_args()
    lines = read_lines(args.text)
    if args.limit:
        lines = lines[: args.limit]
    numbers = list(range(1, len(lines) + 1))
    trees = {}
    for name in ("old", "new"):
        started = time.perf_counter()
        parser = SpacyParser(getattr(args, name), convention="ud", processes=args.processes)
        trees[name] = parser.parse(lines, numbers)
        print(f"{name}: parsed {len(lines)} lines in {time.perf_counter() - started:.0f}s")
    words = changed = root_changed = mismatched = 0
    for a, b in zip(trees["old"], trees["new"]):
        if a.words != b.words:
            mismatched += 1
            continue
        words += len(a.words)
        changed += sum(h1 != h2 for h1, h2 in zip(a.heads, b.heads))
        root_changed += int(a.root != b.root)
    result = {"lines": len(lines), "words": words, "head_changed": changed,
              "share_changed": round(100 * changed / max(words, 1), 2),
              "sentences_with_another_root": root_changed, "lines_with_other_words": mismatched}
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
