"""The figures a study's write-up quotes from its records that its report does not print.

    python studies/record_figures.py studies/multi30k_en_de_converged.yaml [--also DIR ...]

The report (``structnmt study STUDY --report``) gives scores, gaps, p-values and provenance. A
write-up also says how long runs took, where validation loss bottomed out, which update the
best-validation rule picked, each recipe against the baseline's run of the same seed (the same
machine kind and commit where the seed ran whole on one), and how far each run's own
long-dependency subset is from the fixed one: this prints those, from the committed records
alone (plus the prepared dataset's source sentences for the fixed subsets, where they are on
this machine), so that each such figure has a command beside it. ``--also`` adds record
folders held outside the study's (e.g. ``studies/pending/multi30k_en_de_converged``), marked
as held.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from structnmt.study.spec import load_study  # noqa: E402

LONGDEP = "_longdep"


def read_records(folders: list[tuple[Path, bool]]) -> list[tuple[str, int, dict[str, Any], bool]]:
    """(recipe, seed, record, held) for every ``RECIPE/seedN/record.json`` under each folder."""
    out = []
    for folder, held in folders:
        for file in sorted(folder.glob("*/seed*/record.json")):
            record = json.loads(file.read_text(encoding="utf-8"))
            out.append((record["recipe"], int(record["seed"]), record, held))
    return sorted(out, key=lambda item: (item[1], item[0]))


def machine(record: dict[str, Any]) -> str:
    cpu = (record.get("cpu_info") or {}).get("model") or record.get("cpu") or "?"
    return f"{cpu} + {record['gpu']}" if record.get("gpu") else cpu


def by_recipe(records: list[tuple[str, int, dict[str, Any], bool]]) -> dict[str, dict[int, dict[str, Any]]]:
    """recipe -> seed -> record."""
    by: dict[str, dict[int, dict[str, Any]]] = {}
    for recipe, seed, record, _ in records:
        by.setdefault(recipe, {})[seed] = record
    return by


def runs_table(records: list[tuple[str, int, dict[str, Any], bool]]) -> list[str]:
    lines = ["## Runs", "", "| seed | recipe | machine | threads | precision | train min | resumed at | "
             "best val BLEU (update) | finished |", "|---:|---|---|---:|---|---:|---|---|---|"]
    for recipe, seed, record, held in records:
        calls = [c for c in record.get("calls") or [] if isinstance(c, dict)]
        resumes = ", ".join(f"restarted at {c.get('from_step')}" if not c.get("from_step") else str(c.get("from_step"))
                            for c in calls[1:]) or "–"
        threads = sorted({c.get("threads") for c in calls if c.get("threads")} or {record.get("threads")})
        best = max(record.get("valid") or [{}], key=lambda v: v.get("bleu", float("-inf")))
        lines.append(f"| {seed} | {recipe}{' (held)' if held else ''} | {machine(record)} | "
                     f"{'/'.join(map(str, threads))} | {record.get('precision')} | "
                     f"{record.get('train_seconds', 0) / 60:.1f} | {resumes} | "
                     f"{best.get('bleu', float('nan')):.2f} ({best.get('step')}) | "
                     f"{record.get('finished', '?')[:16]} |")
    return lines


def validation(records: list[tuple[str, int, dict[str, Any], bool]], late: int) -> list[str]:
    lines = ["## Validation", "", "Each run's greedy validation BLEU / label-smoothed loss at every check; the "
             "update of its lowest loss and of its best BLEU (the checkpoint tested).", ""]
    minima, best_last, moves = [], 0, []
    for recipe, seed, record, held in records:
        valid = record.get("valid") or []
        if not valid:
            continue
        curve = "  ".join(f"{v['step']}: {v['bleu']:.2f}/{v['loss']:.4f}" for v in valid)
        low = min(valid, key=lambda v: v["loss"])
        best = max(valid, key=lambda v: v["bleu"])
        minima.append((low["loss"], low["step"]))
        best_last += best["step"] == valid[-1]["step"]
        later = [v for v in valid if v["step"] >= late]
        moves += [(b["bleu"] - a["bleu"], f"{recipe} seed {seed}, {a['step']}→{b['step']}")
                  for a, b in zip(later, later[1:], strict=False)]
        later_losses = [v["loss"] for v in valid if v["step"] > low["step"]]
        after = ("the last check" if not later_losses else "higher at every later check"
                 if all(loss > low["loss"] for loss in later_losses) else "not higher at every later check")
        lines.append(f"- {recipe} seed {seed}{' (held)' if held else ''}: {curve}; lowest loss at {low['step']} "
                     f"({low['loss']:.4f}, {after}), best BLEU at {best['step']}")
    if minima:
        lines += ["", f"Lowest losses {min(m[0] for m in minima):.4f}–{max(m[0] for m in minima):.4f}, at updates "
                      f"{', '.join(map(str, sorted({m[1] for m in minima})))}; best BLEU at the last check in "
                      f"{best_last} of {len(minima)} runs."]
    if moves:
        up, down = max(moves), min(moves)
        lines.append(f"Largest move between checks from update {late} on: {up[0]:+.2f} ({up[1]}), "
                     f"{down[0]:+.2f} ({down[1]}).")
    return lines


def same_seed(study, records: list[tuple[str, int, dict[str, Any], bool]]) -> list[str]:
    """Each recipe minus the baseline's run of the same seed, per whole test set: a seed's runs
    share the seed's data order and initialisation, and, where the seed ran whole on one machine,
    its machine kind, so these gaps are not confounded with machine across seeds as pooled means are."""
    by = by_recipe(records)
    base = by.get(study.baseline, {})
    sets = [s for s in study.test_sets if any(s in r["scores"] for runs in by.values() for r in runs.values())]
    lines = ["## Same seed", "", f"BLEU minus `{study.baseline}`'s run of the same seed, per test set "
             f"({' / '.join(sets)}); the mean over the seeds both have, and in how many of them the recipe "
             "is above.", "", "| recipe | per seed | mean | seeds above |", "|---|---|---|---|"]
    for recipe, runs in by.items():
        if recipe == study.baseline:
            continue
        shared = sorted(set(runs) & set(base))
        if not shared:
            continue
        gaps = {s: [runs[seed]["scores"][s]["bleu"] - base[seed]["scores"][s]["bleu"] for seed in shared]
                for s in sets}
        per_seed = ", ".join(f"s{seed}: " + " / ".join(f"{gaps[s][i]:+.2f}" for s in sets)
                             for i, seed in enumerate(shared))
        mean = " / ".join(f"{sum(gaps[s]) / len(shared):+.2f}" for s in sets)
        above = " / ".join(f"{sum(g > 0 for g in gaps[s])} of {len(shared)}" for s in sets)
        lines.append(f"| {recipe} | {per_seed} | {mean} | {above} |")
    return lines


def subsets(study, records: list[tuple[str, int, dict[str, Any], bool]]) -> list[str]:
    from structnmt.study.report import long_dependency_subsets

    by = by_recipe(records)
    fixed = long_dependency_subsets(study, by)
    lines = ["## Long-dependency subsets", ""]
    if fixed.get("note"):
        lines += [fixed["note"], ""]
    splits = list(fixed["lines"])
    if not splits:
        return lines
    lines += ["Fixed subsets (the study's trees file): " + " / ".join(f"{s} {len(fixed['lines'][s])}" for s in splits),
              "", "Each record's own subset: its size, and the sentences it does not share with the fixed one "
              "(symmetric difference).", ""]
    for recipe, seed, record, held in records:
        cells = []
        for split in splits:
            own = (record["scores"].get(split + LONGDEP) or {}).get("lines")
            if own is None:
                cells.append("–")
            else:
                cells.append(f"{len(own)} (±{len(set(own) ^ set(fixed['lines'][split]))})")
        lines.append(f"- {recipe} seed {seed}{' (held)' if held else ''}: {' / '.join(cells)}")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("study", help="the study file (YAML)")
    parser.add_argument("--also", action="append", default=[], metavar="DIR",
                        help="a folder of held records (RECIPE/seedN/record.json), e.g. studies/pending/NAME")
    parser.add_argument("--late", type=int, default=2000, help="moves between checks are counted from this update")
    args = parser.parse_args(argv)
    study = load_study(args.study)
    folders = [(Path(study.records), False)] + [(Path(d), True) for d in args.also]
    records = read_records(folders)
    if not records:
        print(f"no records under {', '.join(str(f) for f, _ in folders)}", file=sys.stderr)
        return 1
    print("\n".join(runs_table(records) + [""] + validation(records, args.late) + [""] + same_seed(study, records)
                    + [""] + subsets(study, records)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
