"""Which lambda_sync the SyncAttn sweep chose, and whether the En->Fr recipe uses it.

    python studies/sweep_choice.py        # exit 0: recipe uses the best; 1: set it; 2: sweep unfinished

The En->Fr study's SyncAttn runs must use the value the sweep picked on val (never on test),
so ``studies/run_all.sh`` stops before them until the recipe says the sweep's best.
"""

from __future__ import annotations

import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from structnmt.study.runs import read_record  # noqa: E402
from structnmt.study.spec import load_study  # noqa: E402

RECIPE = ROOT / "configs" / "multi30k_en_fr_syncattn.yaml"


def sweep_lambda(study_file: Path) -> tuple[dict[float, float], list[str]]:
    """{lambda_sync: val BLEU} of the finished sweep runs, and the runs still missing."""
    study = load_study(study_file)
    scores, missing = {}, []
    for recipe, seed in study.runs():
        record = read_record(study, recipe, seed)
        if record is None:
            missing.append(f"{recipe} seed {seed}")
            continue
        (method,) = record["config"]["model"]["methods"]
        scores[float(method["lambda_sync"])] = record["scores"]["val"]["bleu"]
    return scores, missing


def recipe_lambda(path: Path = RECIPE) -> float:
    (method,) = yaml.safe_load(path.read_text(encoding="utf-8"))["model"]["methods"]
    return float(method["lambda_sync"])


def main() -> int:
    scores, missing = sweep_lambda(ROOT / "studies" / "syncattn_lambda.yaml")
    if missing:
        print(f"sweep unfinished: {', '.join(missing)}")
        return 2
    best = max(scores, key=lambda k: scores[k])
    table = ", ".join(f"{k:g}: {v:.2f}" for k, v in sorted(scores.items()))
    now = recipe_lambda()
    print(f"val BLEU by lambda_sync: {table}; best {best:g}; {RECIPE.name} has {now:g}")
    if now != best:
        print(f"set lambda_sync: {best:g} in {RECIPE.relative_to(ROOT)} (and its comment), then run again")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
