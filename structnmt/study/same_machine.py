"""Whether this machine is of the kind a seed's runs already trained on.

A seed's runs are compared recipe against recipe, so they should all train on one kind of
machine (a CPU model with its instruction set) in one precision (``auto`` picks bf16 where the
CPU multiplies it natively, fp32 elsewhere: two CPUs of one model name can differ). The report
warns after the fact when a seed pools kinds; this check lets a lane of CPU runs
(``studies/pinned_lane.sh``) refuse before it spends hours on RECIPE's run of SEED:

    python -m structnmt.study.same_machine STUDY.yaml RECIPE SEED [HELD_DIR]

It reads the seed's records in the study's records folder and, with ``HELD_DIR`` (the
``studies/pending`` of a seed-major study), those held back. Exit 0 when every one trained on
this machine's kind in the precision RECIPE would train in here (or there is none yet), 3 naming
what differs otherwise, 2 on a bad argument, an unreadable study file or record, or any other
error (a crash must not read as "another machine", so 1 is never used).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from structnmt.study import precision_here
from structnmt.study.report import cpu_kind, machine_kinds
from structnmt.study.spec import Study, load_study
from structnmt.wording import counted


def kind_here() -> str:
    """This machine's kind for a CPU run, named as the report names a record's."""
    from structnmt.study.provenance import cpu_info, cpu_name

    return cpu_kind({"cpu": cpu_name(), "cpu_info": cpu_info()})


def seed_records(study: Study, seed: int, held: Path | None = None) -> dict[str, dict[str, Any]]:
    """The seed's records by recipe: the study's, then those held back in ``held`` (same layout,
    ``held/<records folder name>/<recipe>/seed<N>``) for recipes the study has not recorded."""
    found: dict[str, dict[str, Any]] = {}
    recipes = {recipe.name for recipe in study.recipes}
    roots = [Path(study.records)] + ([Path(held) / Path(study.records).name] if held is not None else [])
    for root in roots:
        for path in sorted(root.glob(f"*/seed{seed}/record.json")):
            recipe = path.parent.parent.name
            if recipe in found or recipe not in recipes:  # a folder the study does not name: not its run
                continue
            try:
                record = json.loads(path.read_text(encoding="utf-8"))
            except (OSError, ValueError) as err:  # named, and the lane stops (status 2)
                raise ValueError(f"{path}: not a readable record ({err})") from err
            if not isinstance(record, dict):
                raise ValueError(f"{path}: not a readable record (a JSON {type(record).__name__}, not an object)")
            found[recipe] = record
    return found


def other_kinds(records: dict[str, dict[str, Any]], here: str, precision: str | None = None) -> dict[str, list[str]]:
    """{kind: recipes} for the records that trained (in any call) on another kind than ``here``,
    or, given ``precision``, in another precision (the kind then names it)."""
    other: dict[str, list[str]] = {}
    for recipe, record in records.items():
        for kind in machine_kinds(record):
            if kind != here:
                other.setdefault(kind, []).append(recipe)
        if precision is not None and record.get("precision") not in (None, precision):
            other.setdefault(f"{record['precision']}, not {precision}", []).append(recipe)
    return other


SAME, ERROR, DIFFERS = 0, 2, 3


def check(study: str, recipe: str, seed: int, held: Path | None) -> tuple[int, str]:
    """(status, the line that says why) for RECIPE's run of SEED on this machine."""
    spec = load_study(study)
    spec.recipe(recipe)  # an unknown recipe is refused, not checked
    here = kind_here()
    precision = precision_here(spec, recipe, seed)  # None: not known here
    records = seed_records(spec, seed, held)
    other = other_kinds(records, here, precision)
    if not records:  # the first run of its seed: this machine sets the seed's kind
        return SAME, (f"seed {seed}: no records yet, so any kind of machine will do (this one: {here}"
                      + (f", {precision})" if precision else ")"))
    if not other:
        return SAME, (f"seed {seed}: {counted(len(records), 'record')}, all on {here}"
                      + (f", none in another precision than {precision}" if precision else ""))
    named = "; ".join(f"{kind}: {', '.join(recipes)}" for kind, recipes in other.items())
    in_precision = f"in {precision}" if precision else "precision unknown"
    return DIFFERS, (f"seed {seed} trained on another kind of machine than this one "
                     f"({here}, {recipe} {in_precision}): {named}")


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) not in (3, 4) or not args[2].isdigit():
        print(__doc__.split("\n\n")[2].strip(), file=sys.stderr)
        return ERROR
    try:
        status, line = check(args[0], args[1], int(args[2]), Path(args[3]) if len(args) == 4 else None)
    except Exception as err:  # an unreadable study file or record, an unknown recipe, a crash: one line
        print(f"error: {err}", file=sys.stderr)
        return ERROR
    print(line)
    return status


if __name__ == "__main__":
    raise SystemExit(main())
