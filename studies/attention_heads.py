"""What the encoder heads of a study's finished runs learned about the source trees.

    python studies/attention_heads.py studies/multi30k_en_de.yaml [--split test_2016_flickr]

For every run with a record and a last checkpoint on this machine, ``structnmt inspect heads``
(teacher-forced, on the split's stored parser trees): per encoder layer, the head whose most
attended other word is most often the word's parent, that share, and the attention the parent
gets from it. Each run's scores are kept beside its record (``RECORDS/RECIPE/seedN/heads/``,
small, committed), so the table survives the checkpoints; the table goes to
``RECORDS/attention_heads.md`` and to the screen.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from structnmt.api import inspect  # noqa: E402
from structnmt.io import atomic_write_text  # noqa: E402
from structnmt.study.runs import read_record  # noqa: E402
from structnmt.study.spec import load_study  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("study")
    parser.add_argument("--split", help="default: the study's first test set")
    parser.add_argument("--redo", action="store_true", help="score runs that already have scores again")
    args = parser.parse_args(argv)
    study = load_study(args.study)
    split = args.split or study.test_sets[0]
    rows, layers = [], 0
    for recipe, seed in study.runs():
        record = read_record(study, recipe, seed)
        if record is None:
            continue
        kept = study.record_dir(recipe, seed) / "heads" / f"{split}.json"
        checkpoint = study.run_dir(recipe, seed) / "last.pt"
        if args.redo or not kept.is_file():
            if not checkpoint.is_file():
                print(f"{recipe} seed {seed}: no checkpoint here and no kept scores: skipped", file=sys.stderr)
                continue
            with tempfile.TemporaryDirectory() as scratch:  # inspect's own copy is not kept
                found = inspect(study.run_dir(recipe, seed), "heads", checkpoint=checkpoint, split=split,
                                out=scratch)
            found["checkpoint_step"] = record.get("updates")
            atomic_write_text(kept, json.dumps(found, indent=1) + "\n")
        found = json.loads(kept.read_text(encoding="utf-8"))
        layers = max(layers, len(found["accuracy"]))
        rows.append((recipe, seed, found))
    if not rows:
        print("no finished run with a checkpoint or kept scores", file=sys.stderr)
        return 1
    offset = rows[0][2]
    head = "| run | " + " | ".join(f"layer {k + 1}: best head" for k in range(layers)) + \
           " | heads over the offset baseline |"
    lines = [f"# Encoder heads and the source trees ({study.name}, {split})", "",
             f"`python studies/attention_heads.py {args.study} --split {split}`: per layer, the head "
             "whose most attended other word is most often the word's parent (share of "
             f"{offset['words']:,} non-root words; in brackets, the mean attention that head gives the "
             "parent), teacher-forced on the split's stored `en_ud` trees. Baseline: always the word at "
             f"offset {offset['best_offset']:+d}, right for {100 * offset['best_offset_accuracy']:.1f}% "
             "of words.", "", head, "|---|" + "---:|" * (layers + 1)]
    for recipe, seed, found in rows:
        cells = []
        for k in range(len(found["accuracy"])):
            best = found["best_head_per_layer"][k]
            cells.append(f"h{best['head']} {100 * best['accuracy']:.1f}% ({best['mass']:.2f})")
        above = sum(a > found["best_offset_accuracy"] for row in found["accuracy"] for a in row)
        total = sum(len(row) for row in found["accuracy"])
        lines.append(f"| {recipe} seed {seed} | " + " | ".join(cells) + f" | {above} of {total} |")
    text = "\n".join(lines) + "\n"
    atomic_write_text(study.records / "attention_heads.md", text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
