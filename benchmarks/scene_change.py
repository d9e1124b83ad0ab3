"""How many sentences' scenes change with the "conj of a predicate" rule (issue 14).

Until this rule, any ``conj`` of a clause head started a scene, so in "A man and a woman
sitting on a bench" (root "man") the conjoined noun "woman" had a scene of its own.
``structnmt.data.scenes.clause_heads`` now lets only predicates start one. This script
counts the sentences whose scenes differ:

    python benchmarks/scene_change.py data/multi30k_en_de           # one dataset: its stored trees
    python benchmarks/scene_change.py data/before data/after        # two datasets: their stored scenes
    python benchmarks/scene_change.py parses.conllu                 # CoNLL-U trees

With one dataset, every stored tree of ``--side`` is re-derived with the old and the current
rule ("old -> new"), and its stored scenes are compared with the current rule ("stored ->
new": the sentences a fresh ``prepare`` would change) and with the old one ("stored -> old":
0 on a dataset the old code prepared, a check that re-deriving reproduces what ``prepare``
stored). With two datasets (prepared from the same text), their stored scenes are compared
sentence by sentence ("a -> b"). Prints one line per split, and ``--examples N`` changed
sentences with the words that start a scene only under one rule.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's structnmt
from structnmt.data.example import DepTree, Scenes  # noqa: E402
from structnmt.data.scenes import (  # noqa: E402
    CLAUSE_RELATIONS,
    clause_heads,
    derive_scenes,
    scenes_from_clause_heads,
)
from structnmt.errors import DataError, StructNMTError  # noqa: E402


def old_clause_heads(tree: DepTree) -> list[bool]:
    """The rule before issue 14: the root, clause relations, and any conj of a clause head."""
    heads = tree.heads
    is_head = [False] * len(heads)
    todo = [tree.root]
    while todo:
        w = todo.pop()
        rel = tree.labels[w].split(":", 1)[0].lower()
        h = heads[w]
        is_head[w] = h == w or rel in CLAUSE_RELATIONS or (rel == "conj" and is_head[h])
        todo.extend(d for d, hd in enumerate(heads) if hd == w and d != w)
    return is_head


def old_scenes(tree: DepTree) -> Scenes:
    tree.check()
    return scenes_from_clause_heads(tree, old_clause_heads(tree))


def same(a: Scenes | None, b: Scenes | None) -> bool:
    if a is None or b is None:
        return a is b
    return sorted(map(tuple, a.members)) == sorted(map(tuple, b.members)) and list(a.parent) == list(b.parent)


@dataclass
class Count:
    """One comparison over one split: sentences, how many changed, scenes on each side."""

    name: str
    sentences: int = 0
    changed: int = 0
    scenes_before: int = 0
    scenes_after: int = 0
    examples: list[str] = field(default_factory=list)

    def add(self, before: Scenes | None, after: Scenes | None, example: str | None = None,
            keep: int = 0) -> None:
        self.sentences += 1
        self.scenes_before += before.n_scenes if before is not None else 0
        self.scenes_after += after.n_scenes if after is not None else 0
        if not same(before, after):
            self.changed += 1
            if example is not None and len(self.examples) < keep:
                self.examples.append(example)

    def line(self) -> str:
        share = 100.0 * self.changed / max(self.sentences, 1)
        return (f"{self.name}: {self.changed} of {self.sentences} sentences change ({share:.2f}%); "
                f"scenes {self.scenes_before} -> {self.scenes_after}")


def _describe(tree: DepTree, line: int) -> str:
    old, new = old_clause_heads(tree), clause_heads(tree)
    lost = [tree.words[i] for i in range(len(tree)) if old[i] and not new[i]]
    gained = [tree.words[i] for i in range(len(tree)) if new[i] and not old[i]]
    return f"  line {line}: {' '.join(tree.words)}\n    no longer a scene: {lost}  newly a scene: {gained}"


# ---------------------------------------------------------------------------
# reading trees and scenes


def _scenes(arrays: dict[str, np.ndarray]) -> Scenes | None:
    if "scene_parent" not in arrays:
        return None
    return Scenes(members=[(int(w), int(s)) for w, s in np.asarray(arrays["scene_members"]).reshape(-1, 2)],
                  parent=[int(p) for p in arrays["scene_parent"]])


def stored(dataset: Path, split: str, side: str) -> Iterator[tuple[int, DepTree | None, Scenes | None]]:
    """(line, tree, scenes) of every sentence of a prepared split; the tree is None when the
    side has no stored structure. Words come from the stored character spans when the dataset
    was not Moses-tokenised (the spans point into the raw text), else they are placeholders."""
    from structnmt.data.dataset import ParallelDataset

    data = ParallelDataset(dataset, split)
    label_names = data.meta.get("labels") or []
    raw = data.raw(side) if (data.path / f"raw.{side}.txt").exists() else None
    moses = bool(data.meta.get("moses"))
    for i in range(len(data)):
        arrays = data.side_arrays(i, side)
        tree = None
        if "heads" in arrays:
            heads = [int(h) for h in arrays["heads"]]
            labels = [label_names[int(k)] if 0 <= int(k) < len(label_names) else str(int(k))
                      for k in arrays["labels"]]
            spans = [(int(a), int(b)) for a, b in np.asarray(arrays["word_spans"]).reshape(-1, 2)]
            if raw is not None and not moses:
                text, words = raw[i], [raw[i][a:b] for a, b in spans]
            else:
                text, words, spans = _placeholder(len(heads))
            tree = DepTree(text, words, spans, heads, labels)
        yield i + 1, tree, _scenes(arrays)


def _placeholder(n: int) -> tuple[str, list[str], list[tuple[int, int]]]:
    words = [f"w{k + 1}" for k in range(n)]
    starts = np.cumsum([0] + [len(w) + 1 for w in words[:-1]])
    return " ".join(words), words, [(int(a), int(a) + len(w)) for a, w in zip(starts, words)]


def conllu_trees(path: Path) -> Iterator[tuple[int, DepTree]]:
    """(sentence number, tree) of a CoNLL-U file, read with the project's CoNLL-U reader."""
    import conllu

    with open(path, encoding="utf-8") as handle:
        for k, sentence in enumerate(conllu.parse_incr(handle), 1):
            tokens = [t for t in sentence if isinstance(t["id"], int)]
            words = [t["form"] for t in tokens]
            heads = [t["head"] - 1 if t["head"] else t["id"] - 1 for t in tokens]
            labels = [t["deprel"] for t in tokens]
            spans, pos = [], 0
            for w in words:
                spans.append((pos, pos + len(w)))
                pos += len(w) + 1
            yield k, DepTree(" ".join(words), words, spans, heads, labels)


def _splits(dataset: Path, wanted: list[str] | None) -> list[str]:
    found = sorted(p.name for p in dataset.iterdir() if p.is_dir() and (p / "src.ids.data.npy").exists())
    return [s for s in found if wanted is None or s in wanted]


# ---------------------------------------------------------------------------
# the three comparisons


def one_dataset(dataset: Path, side: str, splits: list[str] | None, examples: int) -> list[Count]:
    out = []
    for split in _splits(dataset, splits):
        rules = Count(f"{split} old -> new")
        fresh, check = Count(f"{split} stored -> new"), Count(f"{split} stored -> old")
        for line, tree, scenes in stored(dataset, split, side):
            if tree is None:
                raise DataError(f"no stored {side} trees to re-derive scenes from", dataset / split)
            old, new = old_scenes(tree), derive_scenes(tree)
            rules.add(old, new, _describe(tree, line) if examples else None, examples)
            fresh.add(scenes, new)
            check.add(scenes, old)
        out += [rules, fresh, check]
    return out


def two_datasets(a: Path, b: Path, side: str, splits: list[str] | None, examples: int) -> list[Count]:
    out = []
    from structnmt.data.dataset import ParallelDataset

    for split in sorted(set(_splits(a, splits)) & set(_splits(b, splits))):
        n_a, n_b = len(ParallelDataset(a, split)), len(ParallelDataset(b, split))
        if n_a != n_b:
            raise DataError(f"split {split!r} has {n_a} sentences in {a} and {n_b} in {b}", b / split)
        count = Count(f"{split} a -> b")
        for (line, tree, before), (_, _, after) in zip(stored(a, split, side), stored(b, split, side), strict=True):
            count.add(before, after, _describe(tree, line) if examples and tree is not None else None, examples)
        out.append(count)
    return out


def conllu_file(path: Path, examples: int) -> list[Count]:
    count = Count(f"{path.name} old -> new")
    for k, tree in conllu_trees(path):
        count.add(old_scenes(tree), derive_scenes(tree), _describe(tree, k) if examples else None, examples)
    return [count]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("inputs", nargs="+", type=Path, help="a dataset dir, two dataset dirs, or CoNLL-U files")
    parser.add_argument("--side", default="src", choices=("src", "tgt"))
    parser.add_argument("--splits", nargs="*", help="only these splits (default: all)")
    parser.add_argument("--examples", type=int, default=0, help="print this many changed sentences per split")
    args = parser.parse_args(argv)
    try:
        if all(p.is_file() for p in args.inputs):
            counts = [c for p in args.inputs for c in conllu_file(p, args.examples)]
        elif len(args.inputs) == 1:
            counts = one_dataset(args.inputs[0], args.side, args.splits, args.examples)
        elif len(args.inputs) == 2:
            counts = two_datasets(args.inputs[0], args.inputs[1], args.side, args.splits, args.examples)
        else:
            parser.error("give one or two dataset directories, or CoNLL-U files")
    except StructNMTError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    for count in counts:
        print(count.line())
        for example in count.examples:
            print(example)
    return 0


if __name__ == "__main__":
    sys.exit(main())
