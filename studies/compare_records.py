"""Two records of one run side by side: what changed when the same recipe and seed trained again.

    git archive 82c836a studies/multi30k_en_de_converged/dbsa_src/seed1 | tar -x -C /tmp/old
    python studies/compare_records.py studies/multi30k_en_de_converged.yaml dbsa_src 1 \\
        /tmp/old/studies/multi30k_en_de_converged/dbsa_src/seed1

A rerun on other trees, another machine or another commit gives other translations; whether they
differ by more than seed noise is the question. For each test set of the study this prints both
BLEU scores, sacreBLEU's paired bootstrap p (1,000 resamples, the study's own test) and how many
output lines are identical; with ``--seed-of`` it prints the same for two seeds of the study, the
yardstick for "as much as a seed".
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from structnmt.evaluation.significance import format_p, paired_bootstrap  # noqa: E402
from structnmt.study.report import hypothesis_lines, split_references  # noqa: E402
from structnmt.study.spec import load_study  # noqa: E402


def compare(study, recipe: str, seed: int, a: Path, b: Path, label: str) -> None:
    print(f"## {label}")
    for name, folder in (("A", a), ("B", b)):
        record = json.loads((folder / "record.json").read_text(encoding="utf-8"))
        best = max(record["valid"], key=lambda v: v["bleu"])
        print(f"{name}: {folder} (CPU {record.get('cpu')}; best validation BLEU {best['bleu']:.2f} at "
              f"{best['step']:,} updates, loss {best['loss']:.4f})")
    for test in study.test_sets:
        refs, where = split_references(study, recipe, seed, test)
        if refs is None:
            print(f"{test}: no references on this machine ({where})")
            continue
        hyp_a, hyp_b = hypothesis_lines(a, test), hypothesis_lines(b, test)
        result = paired_bootstrap(hyp_a, hyp_b, [refs])
        same = sum(x == y for x, y in zip(hyp_a, hyp_b))
        print(f"{test}: A {result.baseline_score:.2f}, B {result.system_score:.2f}, "
              f"B − A {result.system_score - result.baseline_score:+.2f}, p = {format_p(result.p_value)}; "
              f"identical lines {same} of {len(hyp_a)} ({same / len(hyp_a):.0%})")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("study")
    parser.add_argument("recipe")
    parser.add_argument("seed", type=int)
    parser.add_argument("other", type=Path, help="the other record folder (A); the study's record is B")
    parser.add_argument("--seed-of", type=int, nargs=2, metavar=("SEED", "SEED"),
                        help="also compare these two seeds of the recipe in the study")
    args = parser.parse_args(argv)
    study = load_study(args.study)
    compare(study, args.recipe, args.seed, args.other, study.record_dir(args.recipe, args.seed),
            f"{args.recipe} seed {args.seed}: {args.other} (A) against the study's record (B)")
    if args.seed_of:
        s, t = args.seed_of
        compare(study, args.recipe, s, study.record_dir(args.recipe, s), study.record_dir(args.recipe, t),
                f"{args.recipe}: seed {s} (A) against seed {t} (B)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
