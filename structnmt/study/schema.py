"""The schema of a study record (``record.json`` and its ``hyps/``): one check for every reader.

The status, the study, the report and ``structnmt study compare`` index a record's fields
unguarded. Each checks the record here first, so that one that breaks the schema (an editor,
a merge, a hand-made record) is listed as damaged with the reason: never half-read, never
dropped from the tables while counted as recorded, never a traceback. A digest other than
today's is not damage: that record is stale (:func:`structnmt.study.runs.stale_reason`).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

Check = tuple[Callable[[Any], bool], str]


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _objects(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(v, dict) for v in value)


def _object_or_none(value: Any) -> bool:
    return value is None or isinstance(value, dict)


#: keys every record ever written has, and what each must be
REQUIRED: dict[str, Check] = {
    "recipe": (lambda v: isinstance(v, str) and v != "", "a recipe name"),
    "seed": (lambda v: isinstance(v, int) and not isinstance(v, bool), "an integer"),
    "digest": (lambda v: isinstance(v, str) and v != "", "the training digest (a string)"),
    "config": (lambda v: isinstance(v, dict), "an object (the training view)"),
    "test": (lambda v: isinstance(v, dict), "an object (the test view)"),
    "updates": (_count, "a count of updates"),
    "train_seconds": (lambda v: _number(v) and v >= 0, "seconds (a number)"),
    "test_seconds": (lambda v: _number(v) and v >= 0, "seconds (a number)"),
    "valid": (_objects, "a list of validation objects"),
    "scores": (lambda v: isinstance(v, dict), "an object of test sets"),
}
#: keys later records added, checked where present
OPTIONAL: dict[str, Check] = {
    "finished": (lambda v: isinstance(v, str), "a time (a string)"),
    "calls": (_objects, "a list of call objects"),
    "reads_trees": (lambda v: isinstance(v, bool), "true or false"),
    "dataset": (_object_or_none, "an object"),
    "trees": (_object_or_none, "an object"),
    "references": (_object_or_none, "an object"),
    "cpu_info": (_object_or_none, "an object"),
}
#: a test set's scores: BLEU and chrF always, these where present
SCORE_OPTIONAL: dict[str, Check] = {
    "signature": (lambda v: isinstance(v, dict), "an object"),
    # its ratio is None where sacreBLEU has none (no reference words); the report reads it as no ratio
    "bleu_parts": (lambda v: isinstance(v, dict) and (v.get("ratio") is None or _number(v.get("ratio"))),
                   "an object with a numeric ratio"),
    "subset_of": (lambda v: isinstance(v, str) and v != "", "a test set's name"),
    "lines": (lambda v: isinstance(v, list) and all(_count(n) and n > 0 for n in v), "a list of line numbers"),
}


def _shown(value: Any) -> str:
    text = json.dumps(value, ensure_ascii=False)
    return f"{type(value).__name__} {text if len(text) <= 40 else text[:37] + '...'}"


def record_problem(record: Any, folder: Path, recipe: str | None = None, seed: int | None = None) -> str | None:
    """The first way a parsed ``record.json`` in ``folder`` breaks the schema, or None.

    Required keys and their types, every test set's numeric BLEU and chrF and its hypotheses
    (``hyps/<test set>.hyp``), and, when given, the recipe and seed of the place it sits in.
    """
    if not isinstance(record, dict):
        return f"valid JSON but a {type(record).__name__}, not an object"
    missing = [key for key in REQUIRED if key not in record]
    if missing:
        return f"no {', '.join(missing)} (missing key{'s' if len(missing) > 1 else ''})"
    for key, (check, what) in [*REQUIRED.items(), *OPTIONAL.items()]:
        if key in record and not check(record[key]):
            return f"{key}: expected {what}, got {_shown(record[key])}"
    if recipe is not None and record["recipe"] != recipe:
        return f"recipe: {record['recipe']!r}, but the record sits in recipe {recipe!r}'s folder"
    if seed is not None and record["seed"] != seed:
        return f"seed: {record['seed']}, but the record sits in seed {seed}'s folder"
    if not record["scores"]:
        return "scores: no test set scored (an empty object)"
    for name, scores in record["scores"].items():
        if not isinstance(scores, dict):
            return f"scores.{name}: expected an object, got {_shown(scores)}"
        for metric in ("bleu", "chrf"):
            if metric not in scores:
                return f"scores.{name}: no {metric}"
            if not _number(scores[metric]):
                return f"scores.{name}.{metric}: expected a number, got {_shown(scores[metric])}"
        for key, (check, what) in SCORE_OPTIONAL.items():
            if key in scores and not check(scores[key]):
                return f"scores.{name}.{key}: expected {what}, got {_shown(scores[key])}"
        if not (folder / "hyps" / f"{name}.hyp").is_file():
            return f"scores.{name}: its hypotheses hyps/{name}.hyp are missing"
        # one hypothesis per scored sentence: a file cut short, emptied or written twice was read
        # as done, and the report then failed comparing systems (naming no file)
        want = scores.get("sentences", len(scores["lines"]) if "lines" in scores else None)
        if _count(want) and (have := hypothesis_count(folder / "hyps" / f"{name}.hyp")) != want:
            what = "are not valid UTF-8" if have is None else f"have {have} line{'s' * (have != 1)}"
            return (f"scores.{name}: its hypotheses {folder / 'hyps' / f'{name}.hyp'} {what}, but the record "
                    f"scored {want} sentences")
    return None


_COUNTS: dict[tuple[str, int, int], int | None] = {}  # (file, size, mtime): read once while it stands


def hypothesis_count(path: Path) -> int | None:
    """Hypotheses in a file as the evaluation writes it (each line newline-ended, so an empty file
    holds none), or None when it is not UTF-8 text."""
    stat = path.stat()
    key = (str(path.resolve()), stat.st_size, stat.st_mtime_ns)
    if key not in _COUNTS:
        data = path.read_bytes()
        try:
            data.decode("utf-8")
            _COUNTS[key] = 0 if not data else data.count(b"\n") + (not data.endswith(b"\n"))
        except UnicodeDecodeError:
            _COUNTS[key] = None
    return _COUNTS[key]
