"""Two records of one run side by side: what changed when the same recipe and seed trained again.

    git archive 82c836a studies/multi30k_en_de_converged/dbsa_src/seed1 | tar -x -C /tmp/old
    structnmt study compare studies/multi30k_en_de_converged.yaml dbsa_src 1 \\
        /tmp/old/studies/multi30k_en_de_converged/dbsa_src/seed1 --seed-of 2 3

A rerun on other trees, another machine or another commit gives other translations; whether they
differ by more than seed noise is the question. For each test set of the study this prints both
BLEU scores, sacreBLEU's paired bootstrap p (1,000 resamples, the study's own test) and how many
output lines are identical; with ``--seed-of`` it prints the same for two seeds of the study, the
yardstick for "as much as a seed".

Both records go through the record schema (:mod:`structnmt.study.schema`), and the other one
must be a record of the same run: the recipe named, trained from the config the study gives it
today (its training digest). A record of another recipe or config is refused, saying which and
what; ``any_recipe`` (``--any-recipe``) compares it knowingly.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from structnmt.errors import ConfigError, DataError
from structnmt.study.runs import RECORD, damage_message, read_checked, training_differences
from structnmt.study.spec import Study, config_digest, load_study


def _study_record(study: Study, recipe: str, seed: int, argument: str) -> tuple[Path, dict[str, Any]]:
    """The study's record of a run, or an error naming the argument that asked for it."""
    folder = study.record_dir(recipe, seed)
    record, why = read_checked(folder, recipe, seed)
    if why is not None:
        raise DataError(damage_message(folder / RECORD, why))
    if record is None:
        raise ConfigError(f"{recipe} seed {seed} has no record in {folder}: run the study first "
                          f"(structnmt study {study.path})", argument)
    return folder, record


def _other_record(other: Path) -> dict[str, Any]:
    """The other record folder's record, through the same schema (its place is not the study's)."""
    if not other.exists():
        raise ConfigError(f"{other}: no such folder (the other run's record folder, with {RECORD} and hyps/)",
                          "OTHER_RECORD")
    if not other.is_dir():
        raise ConfigError(f"{other} is not a folder (give the record folder, with {RECORD} and hyps/)",
                          "OTHER_RECORD")
    record, why = read_checked(other)
    if why is not None:
        raise DataError(f"{other / RECORD} is damaged: {why}")
    if record is None:
        raise ConfigError(f"{other} holds no {RECORD}: not a study record folder", "OTHER_RECORD")
    return record


def _not_the_run(study: Study, recipe: str, seed: int, record: dict[str, Any]) -> str | None:
    """Why ``record`` is not a record of the study's ``recipe`` seed ``seed`` (recipe, then digest), or None."""
    if record["recipe"] != recipe:
        return f"it is a record of recipe {record['recipe']!r}, not {recipe!r}"
    cfg = study.run_config(recipe, seed)
    fields = training_differences(cfg, record)
    if fields is None:
        return None
    differ = f" ({', '.join(fields)} differ)" if fields else ""
    return (f"it was trained from another config than the study gives {recipe} seed {seed}{differ}: "
            f"training digest {record['digest'][:12]}…, the study's {config_digest(cfg)[:12]}…")


def _describe(name: str, folder: Path, record: dict[str, Any]) -> str:
    valid = [v for v in record["valid"] if isinstance(v.get("bleu"), (int, float))]
    if not valid:
        return f"{name}: {folder} (CPU {record.get('cpu')}; no validation BLEU recorded)"
    best = max(valid, key=lambda v: v["bleu"])
    loss = f", loss {best['loss']:.4f}" if isinstance(best.get("loss"), (int, float)) else ""
    step = f"{best['step']:,}" if isinstance(best.get("step"), int) else "?"
    return (f"{name}: {folder} (CPU {record.get('cpu')}; best validation BLEU {best['bleu']:.2f} at "
            f"{step} updates{loss})")


def _check_hypotheses(study: Study, recipe: str, seed: int, folders: list[Path]
                      ) -> dict[str, tuple[list[str] | None, str]]:
    """Each test set's references (None and why when not on this machine), once every record
    given has a line for each reference: checked before the first line is printed."""
    from structnmt.study.report import hypothesis_lines, split_references

    references = {}
    for test in study.test_sets:
        refs, where = references[test] = split_references(study, recipe, seed, test)
        for folder in folders:
            path = folder / "hyps" / f"{test}.hyp"
            if not path.is_file():
                raise DataError(f"no hypotheses of the study's test set {test} in this record (tested on other "
                                "sets?)", path)
            if refs is not None and len(lines := hypothesis_lines(folder, test)) != len(refs):
                raise DataError(f"{len(lines)} lines for the {len(refs)} references of {test}: truncated, or "
                                "of another test set", path)
    return references


def _compare(references: dict[str, tuple[list[str] | None, str]], a: tuple[Path, dict[str, Any]],
             b: tuple[Path, dict[str, Any]], label: str, say: Callable[[str], None]) -> None:
    from structnmt.evaluation.significance import format_p, paired_bootstrap
    from structnmt.study.report import hypothesis_lines

    say(f"## {label}")
    for name, (folder, record) in (("A", a), ("B", b)):
        say(_describe(name, folder, record))
    for test, (refs, where) in references.items():
        if refs is None:
            say(f"{test}: no references on this machine ({where})")
            continue
        if not refs:
            say(f"{test}: no sentences")
            continue
        hyp_a, hyp_b = hypothesis_lines(a[0], test), hypothesis_lines(b[0], test)
        result = paired_bootstrap(hyp_a, hyp_b, [refs])
        same = sum(x == y for x, y in zip(hyp_a, hyp_b))
        say(f"{test}: A {result.baseline_score:.2f}, B {result.system_score:.2f}, "
            f"B − A {result.system_score - result.baseline_score:+.2f}, p = {format_p(result.p_value)}; "
            f"identical lines {same} of {len(hyp_a)} ({same / len(hyp_a):.0%})")


def compare_records(study_file: str | Path, recipe: str, seed: int, other: str | Path,
                    seed_of: tuple[int, int] | list[int] | None = None, any_recipe: bool = False,
                    say: Callable[[str], None] | None = None) -> list[str]:
    """Compare the record folder ``other`` (A) with the study's record of ``recipe`` seed ``seed``
    (B), and with ``seed_of`` two seeds of the study; returns the lines (each also given to
    ``say`` as it is ready: a paired bootstrap per test set takes a while).

    Every check comes before the first line: the study file, the recipe, the seeds and their
    records, the other record and that it is a record of the same run (``any_recipe``: compare
    one of another recipe or config anyway, with a note saying so)."""
    lines: list[str] = []

    def out(line: str) -> None:
        lines.append(line)
        if say is not None:
            say(line)

    if seed_of is not None and len(seed_of) != 2:
        raise ConfigError(f"expected two seeds, got {list(seed_of)}", "--seed-of")
    study = load_study(study_file)
    names = [r.name for r in study.recipes]
    if recipe not in names:
        raise ConfigError(f"{recipe!r} is not a recipe of {study.path} (recipes: {', '.join(names)})", "RECIPE")
    seeds = study.seeds_of(recipe)
    asked = [("SEED", seed)] + [("--seed-of", s) for s in (seed_of or [])]
    for argument, s in asked:
        if s not in seeds:
            raise ConfigError(f"{recipe} has no seed {s} in {study.path} (seeds: {', '.join(map(str, seeds))})",
                              argument)
    records = {s: _study_record(study, recipe, s, argument) for argument, s in asked}
    other = Path(other)
    theirs = _other_record(other)
    notes = []
    for whose, record, argument in ((f"{other} (A)", theirs, "OTHER_RECORD"),
                                    (f"the study's record {records[seed][0]} (B)", records[seed][1], "SEED")):
        if (why := _not_the_run(study, recipe, seed, record)) is not None:
            if not any_recipe:
                raise ConfigError(f"{whose}: {why}; not the same run, so not compared "
                                  "(--any-recipe compares it knowingly)", argument)
            notes.append(f"note: {whose}: {why}; compared as asked (--any-recipe)")
    pairs = [(other, theirs), records[seed]] + [records[s] for s in seed_of or []]
    references = _check_hypotheses(study, recipe, seed, [folder for folder, _ in pairs])
    for note in notes:
        out(note)
    _compare(references, (other, theirs), records[seed],
             f"{recipe} seed {seed}: {other} (A) against the study's record (B)", out)
    if seed_of:
        s, t = seed_of
        _compare(references, records[s], records[t], f"{recipe}: seed {s} (A) against seed {t} (B)", out)
    return lines
