"""The study report: Markdown tables from the records, significance against the baseline, one picture.

Everything is computed from the records (committed text files) and, for significance, the
test sets' references: the prepared dataset's, or where it is absent (a fresh clone) the
corpus file the study's config names (``data.splits.<set>.tgt``), used only once shown to be
the references the run was tested on (the digest its record keeps; for records made before
digests were kept, its recorded BLEU rescored exactly). A report that cannot test
significance still has every score and says why, and never replaces one that could.

The verdict is the pre-declared rule (every seed pair, :data:`~structnmt.evaluation.significance.SEED_RULE`);
the seed-pooled bootstrap (beside it its p adjusted by Holm's correction over every recipe ×
test-set comparison of the report) and ASO are secondary and said to be suggestive. Where the
study pins its trees, every run's long-dependency subset is one fixed set of sentences per test
set, chosen from that trees file and scored from the run's hypotheses of the whole test set
(:func:`long_dependency_subsets`). Each run's machine, commit, threads and trees are listed by
seed, and a seed that pools runs of different machine kinds or commits, or a run that read other
trees than the study's, is named in a warning (:func:`provenance_warnings`).
"""

from __future__ import annotations

import gzip
import json
import math
import statistics
from collections import Counter
from pathlib import Path
from typing import Any

from structnmt.errors import StructNMTError
from structnmt.evaluation.significance import format_p, holm, mean_sd, order_by_chance
from structnmt.io import atomic_write_text
from structnmt.study.provenance import known_calls, lines_digest
from structnmt.study.runs import read_failure, read_record, record_damage, stale_reason
from structnmt.study.spec import Study
from structnmt.wording import counted

NOT_TESTED = "not tested"
LONGDEP = "_longdep"  # a test set's long-dependency subset is the test set ``<split>_longdep``
ALPHA = 0.05


class ReportError(StructNMTError):
    """A report that would lose what the standing one has."""


def _mean_sd(values: list[float], digits: int = 2) -> str:
    """A table cell: the seeds are listed beside it, so mean (± sd) without the count."""
    if not values:
        return "-"
    mean, sd = mean_sd(values)
    return f"{mean:.{digits}f}" if math.isnan(sd) else f"{mean:.{digits}f} ± {sd:.{digits}f}"


def _seeds_so_far(have: tuple[int, int], want: tuple[int, int]) -> str:
    """"1 of 2 seeds" when both recipes want as many; else each side's count."""
    if want[0] == want[1]:
        return f"{min(have)} of {want[0]} seeds"
    return f"{have[0]} of {want[0]} seeds, baseline {have[1]} of {want[1]}"


def split_references(study: Study, recipe: str, seed: int, split: str) -> tuple[list[str] | None, str]:
    """A split's references and where they came from: the run's prepared dataset, else the
    corpus file its config names (``data.splits.<split>.tgt``); (None, what to do) when neither
    is on this machine."""
    return _split_lines(study, recipe, seed, split, "tgt")


def _split_lines(study: Study, recipe: str, seed: int, split: str, side: str) -> tuple[list[str] | None, str]:
    """One side of a split, as :func:`split_references` finds the references (``side`` "tgt")."""
    from structnmt.data.corpus import read_lines
    from structnmt.data.dataset import ParallelDataset

    cfg = study.run_config(recipe, seed)
    if (Path(cfg.data.dir) / split / f"raw.{side}.txt").is_file():
        return ParallelDataset(cfg.data.dir, split).scored_raw(side), f"{cfg.data.dir}/{split}"
    files = cfg.data.splits.get(split)
    file = getattr(files, side, None) if files is not None else None
    if file and Path(file).is_file():
        return read_lines(file), file
    where = f" or put `{file}` there" if file else ""
    what = "references" if side == "tgt" else "source sentences"
    return None, f"no {what} on this machine (prepare `{cfg.data.dir}` first{where})"


def _subset(refs: list[str], scores: dict[str, Any]) -> list[str]:
    return [refs[n - 1] for n in scores["lines"]] if "lines" in scores else refs


def run_references(study: Study, recipe: str, seed: int, test: str, scores: dict[str, Any]) -> list[str] | None:
    """The test set's references (a long-dependency subset: its lines), unchecked; see
    :func:`references_mismatch` for the check against a record."""
    refs, _ = split_references(study, recipe, seed, scores.get("subset_of", test))
    return None if refs is None else _subset(refs, scores)


def references_mismatch(record: dict[str, Any], test: str, refs: list[str], hyps: list[str]) -> str | None:
    """Why ``refs`` (the whole split) are not the references ``record`` was tested on, or None.

    Records keep each split's digest; older ones are checked by rescoring their hypotheses, which
    must give the recorded BLEU exactly (other references would not, short of a miracle)."""
    from structnmt.evaluation.scores import corpus_scores

    scores = record["scores"][test]
    split = scores.get("subset_of", test)
    digest = (record.get("references") or {}).get(split)
    if digest is not None:
        return None if lines_digest(refs) == digest else f"their digest is not the one {split} was tested with"
    subset = _subset(refs, scores)
    if len(subset) != len(hyps):
        return f"{len(subset)} references for {len(hyps)} hypotheses"
    bleu = corpus_scores(hyps, [subset], metrics=("bleu",))["bleu"]
    return None if abs(bleu - scores["bleu"]) < 1e-9 else f"they give BLEU {bleu:.2f}, the record {scores['bleu']:.2f}"


def hypothesis_lines(record_dir: Path, test: str) -> list[str]:
    """A record's hypotheses of one test set, lines as written (an empty line stays a line)."""
    text = (record_dir / "hyps" / f"{test}.hyp").read_text(encoding="utf-8")
    return text.split("\n")[:-1] if text.endswith("\n") else text.split("\n")


def run_hypotheses(study: Study, recipe: str, seed: int, test: str) -> list[str]:
    return hypothesis_lines(study.record_dir(recipe, seed), test)


def collect(study: Study) -> dict[str, Any]:
    """Current records by recipe and seed, and what is missing or failed."""
    records: dict[str, dict[int, dict]] = {}
    missing, failed, stale, damaged = [], [], [], []
    for recipe, seed in study.runs():
        if (damage := record_damage(study, recipe, seed)) is not None:
            damaged.append((recipe, seed, damage))
            continue
        record = read_record(study, recipe, seed)
        if record is not None and (reason := stale_reason(study, recipe, seed, record)) is not None:
            stale.append((recipe, seed, reason))
            record = None
        if record is None:
            failure = read_failure(study, recipe, seed)
            if failure is not None:
                failed.append((recipe, seed, failure))
            else:
                missing.append((recipe, seed))
            continue
        records.setdefault(recipe, {})[seed] = record
    return {"records": records, "missing": missing, "failed": failed, "stale": stale, "damaged": damaged,
            "subsets": long_dependency_subsets(study, records)}


# ---------------------------------------------------------------------------
# long-dependency subsets: one fixed set of sentences per test set

_SOURCE_HEADS: dict[tuple[str, str], dict[str, list[int]]] = {}  # (trees file, its SHA-256) -> heads by key


def _source_heads(file: Path, sha256: str) -> dict[str, list[int]]:
    """The heads of every source tree of a trees file (``structnmt trees export``), by its key
    (a prefix of its sentence's SHA-256); read once per process."""
    key = (str(file.resolve()), sha256)
    if key not in _SOURCE_HEADS:
        heads: dict[str, list[int]] = {}
        with gzip.open(file, "rt", encoding="utf-8") as lines:
            for text in lines:
                item = json.loads(text)
                if item.get("side") == "src" and "key" in item:
                    heads[item["key"]] = [int(h) for h in item["tree"]["heads"]]
        _SOURCE_HEADS[key] = heads
    return _SOURCE_HEADS[key]


def _pinned_source_heads(file: Path, sha256: str) -> tuple[dict[str, list[int]] | None, str]:
    """The source heads of a study's pinned trees file by sentence key; else None and why not."""
    from structnmt.io import sha256_file

    if not file.is_file():
        return None, f"the study's trees file `{file}` is not on this machine"
    if sha256_file(file) != sha256:
        return None, f"`{file}` is not the study's trees file (its SHA-256 is not the study file's {sha256[:12]}…)"
    try:
        return _source_heads(file, sha256), ""
    except (OSError, EOFError, ValueError, KeyError, TypeError) as err:
        return None, f"`{file}` is not a readable trees file ({type(err).__name__})"


def long_dependency_subsets(study: Study, records: dict[str, dict[int, dict]]) -> dict[str, Any]:
    """The sentences of each test set's long-dependency subset, one set for every run.

    A run's record keeps the subset chosen from the trees its dataset held, and runs that read
    other trees chose other sentences, whose scores do not compare. Where the study pins its
    trees (``trees:``), the subset is chosen once from that file instead: the sentences whose
    source tree has an arc of ``long_dependency`` words or more (as ``structnmt test`` chooses,
    :func:`~structnmt.evaluation.challenge.long_dependency_subset`), each sentence looked up by the
    SHA-256 of its (tokenised) text. Returns ``{"lines": {split: 1-based lines}, "note": what the
    report says}``; a split left out of ``lines`` (no pinned trees, no file or no source sentences
    here) keeps each run's own subset, and the note says why.
    """
    from structnmt.data.parsing.cache import TREES_FILE_KEY_BYTES, text_key
    from structnmt.data.tokenisation import MosesTokeniser
    from structnmt.evaluation.challenge import long_dependency_subset

    splits = list(dict.fromkeys(scores["subset_of"] for by_seed in records.values() for record in by_seed.values()
                                for scores in record["scores"].values() if "subset_of" in scores))
    if not splits or not study.long_dependency:
        return {"lines": {}, "note": ""}
    own = ("each run's long-dependency subset is its own, chosen from the trees its dataset held, as its record "
           "keeps it; runs whose subsets are other sentences are not compared")
    if study.trees is None:
        return {"lines": {}, "note": f"Long-dependency subsets: the study pins no trees file, so {own}."}
    file, sha256 = Path(study.trees.file), study.trees.sha256.lower()
    heads_of, why_not = _pinned_source_heads(file, sha256)
    if heads_of is None:
        return {"lines": {}, "note": f"Long-dependency subsets: {why_not}, so {own}."}
    seed = study.seeds_of(study.baseline)[0]
    cfg = study.run_config(study.baseline, seed)
    moses = MosesTokeniser(cfg.data.src.lang) if cfg.data.moses else None  # the text the parser was given
    lines: dict[str, list[int]] = {}
    left: list[str] = []
    for split in splits:
        sources, where = _split_lines(study, study.baseline, seed, split, "src")
        if sources is None:
            left.append(f"{split}: {where}")
            continue
        heads = [heads_of.get(text_key(moses.tokenise(s) if moses else s)[:TREES_FILE_KEY_BYTES].hex())
                 if s.split() else [] for s in sources]  # an empty source (scored as such) has no arc
        if None in heads:
            left.append(f"{split}: line {heads.index(None) + 1} has no tree in the file")
            continue
        lines[split] = [n + 1 for n in long_dependency_subset(heads, study.long_dependency)]  # type: ignore[arg-type]
    note = ""
    if lines:
        sizes = ", ".join(f"{split} {len(chosen)}" for split, chosen in lines.items())
        note = (f"Long-dependency subsets (`<test set>{LONGDEP}`): one fixed set of sentences per test set, the same "
                f"for every run: those whose source tree in the study's trees file (`{file}`, SHA-256 "
                f"{sha256[:12]}…) has an arc of {study.long_dependency} or more words ({sizes} sentences). Each "
                "run is scored on them from its hypotheses of the whole test set; the subset its record keeps, "
                "chosen from the trees its dataset held, is not used.")
        note += _own_subsets_note(records, lines)
    if left:
        note += (" " if note else "Long-dependency subsets: ") + (
            f"not fixed for {'; '.join(left)}: there {own}.")
    return {"lines": lines, "note": note}



def _own_subsets_note(records: dict[str, dict[int, dict]], lines: dict[str, list[int]]) -> str:
    """The runs whose records keep other sentences than the fixed subsets, or none: the report says whose
    own subset it set aside."""
    other: dict[str, list[str]] = {}  # their subsets' sizes -> runs
    none = []
    for recipe, by_seed in records.items():
        for seed, record in sorted(by_seed.items()):
            own_lines = [record["scores"].get(split + LONGDEP, {}).get("lines") for split in lines]
            if all(chosen is None for chosen in own_lines):
                none.append(f"{recipe} s{seed}")
            elif any(mine is not None and mine != chosen for mine, chosen in zip(own_lines, lines.values())):
                sizes = " / ".join("-" if m is None else str(len(m)) for m in own_lines)
                other.setdefault(sizes, []).append(f"{recipe} s{seed}")
    note = ""
    if other:
        note += (" Runs whose records chose other sentences, scored here on the fixed ones (by their subsets' "
                 f"sizes): {_runs_by(other)}.")
    if none:
        note += f" Runs whose records keep no subset of their own, scored on them too: {', '.join(none)}."
    return note

class _Runs:
    """What a report reads of a study's runs for its tables and tests, each read once: the
    references of each dataset's splits, whether a run can be tested on a test set here, its
    hypotheses (of a fixed subset, from those of the whole test set), length ratios."""

    def __init__(self, study: Study, records: dict[str, dict[int, dict]], fixed: dict[str, list[int]]) -> None:
        self.study, self.records, self.fixed = study, records, fixed
        self._splits: dict[tuple[str, str], tuple[list[str] | None, str]] = {}
        self._checked: dict[tuple[str, int, str], str | None] = {}

    def whole_split(self, recipe: str, seed: int, split: str) -> tuple[list[str] | None, str]:
        key = (str(self.study.run_config(recipe, seed).data.dir), split)
        if key not in self._splits:
            self._splits[key] = split_references(self.study, recipe, seed, split)
        return self._splits[key]

    def references(self, recipe: str, seed: int, test: str, scores: dict[str, Any]) -> list[str] | None:
        refs, _ = self.whole_split(recipe, seed, scores.get("subset_of", test))
        return None if refs is None else _subset(refs, scores)

    def untestable(self, runs: list[tuple[str, int]], test: str) -> str | None:
        """Why these runs cannot be tested on ``test`` here (no references, or other ones), or None."""
        for recipe, seed in runs:
            if (recipe, seed, test) not in self._checked:
                self._checked[(recipe, seed, test)] = self._check(recipe, seed, test)
            if self._checked[(recipe, seed, test)]:
                return self._checked[(recipe, seed, test)]
        return None

    def _check(self, recipe: str, seed: int, test: str) -> str | None:
        study, record = self.study, self.records[recipe][seed]
        refs, where = self.whole_split(recipe, seed, record["scores"][test].get("subset_of", test))
        if refs is None:
            return where
        # records that keep no sentence count (hand-made, older) are checked against the test set
        # here (the schema checks the others): a misaligned file named, not a bootstrap's error
        hyps, want = run_hypotheses(study, recipe, seed, test), len(record["scores"][test].get("lines", refs))
        if len(hyps) != want:
            path = study.record_dir(recipe, seed) / "hyps" / f"{test}.hyp"
            return (f"{path} has {len(hyps)} lines for the {want} sentences of {test} at `{where}`: damaged, restore "
                    f"it from version control (git checkout -- {path})")
        in_dataset = where.startswith(f"{study.run_config(recipe, seed).data.dir}/")
        if in_dataset and "references" not in record:  # the dataset the run read (its identity is checked)
            return None
        why = references_mismatch(record, test, refs, hyps)
        return why and f"the references at `{where}` are not the ones {recipe} seed {seed} was tested on ({why})"

    def ratio(self, recipe: str, seed: int, test: str, scores: dict[str, Any]) -> float | None:
        """From the record (runs tested since BLEU's parts are kept), else from hypotheses and references."""
        from structnmt.evaluation.scores import length_ratio

        if "bleu_parts" in scores:
            return scores["bleu_parts"]["ratio"]
        refs = self.references(recipe, seed, test, scores)
        try:
            return None if refs is None else length_ratio(run_hypotheses(self.study, recipe, seed, test), [refs])
        except (OSError, StructNMTError):  # a missing or misaligned hypothesis file: no ratio, not no report
            return None

    def fixed_scores(self, recipe: str, seed: int, split: str) -> dict[str, Any]:
        """A run's scores on the study's fixed subset of ``split``, from its hypotheses of the whole split."""
        from structnmt.evaluation.scores import corpus_scores

        refs, _ = self.whole_split(recipe, seed, split)
        hyps = run_hypotheses(self.study, recipe, seed, split)
        assert refs is not None  # checked before (untestable)
        if len(hyps) != len(refs):
            raise StructNMTError(f"{recipe} seed {seed}: {len(hyps)} hypotheses of {split} for {len(refs)} references")
        lines = self.fixed[split]
        scores = corpus_scores([hyps[n - 1] for n in lines], [[refs[n - 1] for n in lines]], metrics=("bleu", "chrf"))
        return {**scores, "subset_of": split, "lines": lines, "sentences": len(lines)}

    def hypotheses(self, recipe: str, seed: int, test: str, split: str | None) -> list[str]:
        if split is None:
            return run_hypotheses(self.study, recipe, seed, test)
        whole = run_hypotheses(self.study, recipe, seed, split)
        return [whole[n - 1] for n in self.fixed[split]]


def _report_tests(records: dict[str, dict[int, dict]], fixed: dict[str, list[int]]) -> list[str]:
    """The test sets the records were scored on, in their order, each fixed long-dependency subset
    after its test set (scored for every run that has the whole test set)."""
    tests: list[str] = []
    for by_seed in records.values():
        for record in by_seed.values():
            tests += [t for t in record["scores"] if t not in tests]
    for split in fixed:
        if split in tests and split + LONGDEP not in tests:
            tests.insert(tests.index(split) + 1, split + LONGDEP)
    return tests


def compare(study: Study, data: dict[str, Any]) -> dict[str, dict[str, dict[str, Any]]]:
    """For each test set and recipe: scores per seed, mean ± sd, and the verdict against the baseline.

    A long-dependency subset whose sentences the study fixed (``data["subsets"]``, see
    :func:`long_dependency_subsets`) is scored on them from each run's hypotheses of the whole
    test set and its references (every run that has the test set, whether or not its record
    keeps a subset); where those references are not here, each run's own subset as recorded,
    untested. Its rows say which (``subset``)."""
    records = data["records"]
    fixed: dict[str, list[int]] = (data.get("subsets") or {}).get("lines") or {}
    runs = _Runs(study, records, fixed)
    order = [study.baseline] + [r.name for r in study.recipes if r.name != study.baseline]
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for test in _report_tests(records, fixed):
        # the fixed subset of a long-dependency test set, where its references are here to score it
        split: str | None = test.removesuffix(LONGDEP) if test.endswith(LONGDEP) else None
        not_fixed = None
        if split is not None and split in fixed:
            not_fixed = runs.untestable([(r, s) for r in order for s, record in sorted(records.get(r, {}).items())
                                         if split in record["scores"]], split)
        if split not in fixed or not_fixed:
            split = None
        scored = {recipe: {s: runs.fixed_scores(recipe, s, split) if split else r["scores"][test]
                           for s, r in sorted(records.get(recipe, {}).items())
                           if (split or test) in r["scores"]} for recipe in order}
        out[test] = {recipe: _row(runs, recipe, test, split, not_fixed, scored)
                     for recipe in order if scored[recipe]}
    return out


def _row(runs: _Runs, recipe: str, test: str, split: str | None, not_fixed: str | None,
         scored: dict[str, dict[int, dict[str, Any]]]) -> dict[str, Any]:
    """One recipe's cell of a test set: its scores by seed and, beside the baseline's, the verdict."""
    study, by_seed, base = runs.study, scored[recipe], scored[runs.study.baseline]
    row: dict[str, Any] = {
        "bleu": {s: scores["bleu"] for s, scores in by_seed.items()},
        "chrf": {s: scores["chrf"] for s, scores in by_seed.items()},
        "signature": next(iter(by_seed.values())).get("signature", {}),
        "ratio": {s: runs.ratio(recipe, s, test, scores) for s, scores in by_seed.items()},
    }
    if any("lines" in scores for scores in by_seed.values()):
        row["subset"] = {"fixed": split is not None,
                         "sentences": sorted({len(scores.get("lines", ())) for scores in by_seed.values()})}
        if not_fixed:
            row["subset"]["why"] = not_fixed
    if recipe == study.baseline or not base:
        return row
    subsets = {json.dumps(scores.get("lines")) for scores in [*by_seed.values(), *base.values()]}
    if len(subsets) > 1 and not not_fixed:
        # a long-dependency subset chosen from other trees: not the same sentences
        row["verdict"] = {"verdict": "not compared (the subset's sentences differ between runs)", "p": {}}
        return row
    row["verdict"] = _verdict_against_baseline(runs, recipe, test, split, not_fixed, sorted(by_seed), sorted(base),
                                               by_seed)
    if len(subsets) == 1:  # across trainings, from the scores alone: needs no references
        from structnmt.evaluation.significance import aso_seeds

        row["verdict"]["aso"] = aso_seeds(list(row["bleu"].values()), [base[s]["bleu"] for s in sorted(base)])
    return row


def _verdict_against_baseline(runs: _Runs, recipe: str, test: str, split: str | None, not_fixed: str | None,
                              seeds: list[int], base_seeds: list[int],
                              by_seed: dict[int, dict[str, Any]]) -> dict[str, Any]:
    """The every-seed-pair rule and the seed-pooled bootstrap, from the runs' hypotheses; where
    they cannot be tested here, why."""
    from structnmt.evaluation.significance import compare_seeds, pooled_bootstrap

    study = runs.study
    why = not_fixed or (None if split else runs.untestable([(recipe, s) for s in seeds] +
                                                           [(study.baseline, s) for s in base_seeds], test))
    if why is not None:  # records travel, references stay with the data (the project ships no corpus text)
        return {"verdict": f"{NOT_TESTED}: {why}", "p": {}}
    refs = runs.references(recipe, seeds[0], test, by_seed[seeds[0]])
    ours = [runs.hypotheses(recipe, s, test, split) for s in seeds]
    theirs = [runs.hypotheses(study.baseline, s, test, split) for s in base_seeds]
    result = compare_seeds(ours, theirs, [refs])
    verdict = result.verdict
    have, want = (len(seeds), len(base_seeds)), (len(study.seeds_of(recipe)), len(study.seeds_of(study.baseline)))
    if have != want:  # the rule wants every seed of both
        verdict += f" so far ({_seeds_so_far(have, want)})"
    pooled = pooled_bootstrap(ours, theirs, [refs])
    return {"verdict": verdict, "rule": result.rule, "pooled_p": pooled.p_value, "pooled_n": pooled.n_samples,
            "p": {f"{seeds[s]}/{base_seeds[b]}": r.p_value for s, b, r in result.pairs}}


def _picture(study: Study, table: dict[str, dict[str, dict[str, Any]]], path: Path) -> Path | None:
    """Each recipe's BLEU per seed (dots) against the baseline's seeds (band), per test set."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tests = [t for t in table if not t.endswith("_longdep")][:4] or list(table)[:4]
    if not tests:
        return None
    fig, axes = plt.subplots(1, len(tests), figsize=(4.2 * len(tests), 4.2), squeeze=False)
    for ax, test in zip(axes[0], tests):
        rows = table[test]
        names = list(rows)
        base = list(rows.get(study.baseline, {}).get("bleu", {}).values())
        if base:
            ax.axhspan(min(base), max(base), color="0.85", zorder=0, label=f"{study.baseline} (seed range)")
            ax.axhline(statistics.mean(base), color="0.4", lw=1, zorder=1)
        for x, name in enumerate(names):
            values = list(rows[name]["bleu"].values())
            ax.scatter([x] * len(values), values, s=28, zorder=2,
                       color="0.3" if name == study.baseline else f"C{x % 10}")
        ax.set_xticks(range(len(names)))
        ax.set_xticklabels(names, rotation=60, ha="right", fontsize=8)
        ax.set_title(test, fontsize=10)
        ax.set_ylabel("BLEU")
        ax.grid(axis="y", alpha=0.3)
    fig.suptitle(f"{study.name}: BLEU per seed against {study.baseline}", fontsize=11)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp.png")
    fig.savefig(tmp, dpi=110)
    plt.close(fig)
    tmp.replace(path)
    return path


def pooled_holm(table: dict[str, dict[str, dict[str, Any]]]) -> dict[tuple[str, str], float]:
    """Holm-adjusted seed-pooled p by (test set, recipe), the family being every comparison of the
    table against its baseline that has a pooled p (every recipe on every test set it was tested
    on, long-dependency subsets included)."""
    keys = [(test, recipe) for test, rows in table.items() for recipe, row in rows.items()
            if (row.get("verdict") or {}).get("pooled_p") is not None]
    return dict(zip(keys, holm([table[test][recipe]["verdict"]["pooled_p"] for test, recipe in keys])))


def _compared(baseline: str, table: dict[str, dict[str, dict[str, Any]]]) -> list[tuple[str, str, str]]:
    """(test set, recipe, verdict) of every recipe with a verdict against the baseline."""
    return [(test, recipe, verdict) for test, rows in table.items() for recipe, row in rows.items()
            if recipe != baseline and (verdict := (row.get("verdict") or {}).get("verdict"))]


def headline(baseline: str, table: dict[str, dict[str, dict[str, Any]]]) -> list[str]:
    """The findings, the primary rule's first: how many comparisons it calls better, worse or
    neither; then, as suggestive only, where the seed-pooled bootstrap is below 0.05 before and
    after Holm's correction."""
    compared = _compared(baseline, table)
    if not compared:
        return []
    tested = [(t, r, v) for t, r, v in compared if v.startswith(("better", "worse", "no significant"))]
    better = [f"{r} on {t}" for t, r, v in tested if v.startswith("better")]
    worse = [f"{r} on {t}" for t, r, v in tested if v.startswith("worse")]
    so_far = " (some so far, with fewer seeds than the study has)" if any("so far" in v for _, _, v in tested) else ""
    named = {kind: f" ({', '.join(which)})" if which else "" for kind, which in (("better", better), ("worse", worse))}
    text = (f"**Primary verdict** (the rule declared before the runs, below): of the {len(tested)} recipe × "
            f"test-set comparisons against `{baseline}` tested here{so_far}, {len(better)} better{named['better']}, "
            f"{len(worse)} worse{named['worse']}, {len(tested) - len(better) - len(worse)} no significant difference.")
    if len(compared) > len(tested):
        text += f" {len(compared) - len(tested)} more not tested or not compared (their rows say why)."
    lines = [text, ""]
    adjusted = pooled_holm(table)
    if adjusted:
        raw = [(t, r) for (t, r) in adjusted if table[t][r]["verdict"]["pooled_p"] < ALPHA]
        kept = [f"{r} on {t} ({format_p(table[t][r]['verdict']['pooled_p'])}, Holm {format_p(p)})"
                for (t, r), p in adjusted.items() if p < ALPHA]
        resamples = min(table[t][r]["verdict"].get("pooled_n") or 1000 for t, r in adjusted)
        floor = "" if len(adjusted) / (resamples + 1) < ALPHA else (
            f" (with {resamples:,} resamples no pooled p is below 1/{resamples + 1:,}, so over {len(adjusted)} "
            f"comparisons none can stay below {ALPHA}: a family this large needs more resamples)")
        lines += [f"**Secondary, suggestive only**: the seed-pooled bootstrap (which resamples sentences of these "
                  f"trainings, not trainings) has p < {ALPHA} in {len(raw)} of the {len(adjusted)} comparisons, "
                  f"{len(kept)} after Holm's correction over all {len(adjusted)}{floor}"
                  f"{': ' + '; '.join(kept) if kept else ''}. It does not change the verdict.", ""]
    return lines


def summary_lines(baseline: str, table: dict[str, dict[str, dict[str, Any]]]) -> list[str]:
    """The table a paper prints: recipes by test sets, mean BLEU with its gap to the baseline and
    a mark where the verdict is better or worse, so the whole comparison reads at a glance."""
    adjusted = pooled_holm(table)
    tests = list(table)
    recipes: list[str] = []
    for rows in table.values():
        recipes += [r for r in rows if r not in recipes]
    if not tests or not recipes:
        return []
    lines = ["| recipe | seeds | " + " | ".join(tests) + " |", "|---|---:|" + "---:|" * len(tests)]
    for recipe in recipes:
        cells, seeds = [], set()
        for test in tests:
            row = table[test].get(recipe)
            if row is None:
                cells.append("")
                continue
            bleu = list(row["bleu"].values())
            seeds |= set(row["bleu"])
            base = list(table[test].get(baseline, {}).get("bleu", {}).values())
            if recipe == baseline or not base:
                cells.append(f"{statistics.mean(bleu):.2f}")
                continue
            verdict = (row.get("verdict") or {}).get("verdict", "")
            mark = " ▲" if verdict.startswith("better") else " ▼" if verdict.startswith("worse") else ""
            mark += "*" if mark and "so far" in verdict else ""
            pooled = (row.get("verdict") or {}).get("pooled_p")
            if adjusted.get((test, recipe), 1.0) < ALPHA:  # secondary: below alpha after Holm's correction
                mark += " †"
            elif pooled is not None and pooled < ALPHA:  # below alpha before the correction only
                mark += " (†)"
            cells.append(f"{statistics.mean(bleu):.2f} ({statistics.mean(bleu) - statistics.mean(base):+.2f}){mark}")
        lines.append(f"| {recipe} | {len(seeds)} | " + " | ".join(cells) + " |")
    return lines


def summary_legend(baseline: str, table: dict[str, dict[str, dict[str, Any]]]) -> str:
    """The summary table's key; the provisional mark is explained only where one is shown."""
    verdicts = [(row.get("verdict") or {}).get("verdict", "") for rows in table.values() for row in rows.values()]
    marked = any(v.startswith(("better", "worse")) and "so far" in v for v in verdicts)
    provisional = "; *: so far, with fewer seeds than the study has" if marked else ""
    family = len(pooled_holm(table))
    pooled = "" if not family else (
        f"; secondary, suggestive only (neither changes the verdict): †: the mean over seeds differs from the "
        f"baseline's with p < {ALPHA} by the seed-pooled bootstrap after Holm's correction over the {family} "
        f"comparisons of this report, (†): with p < {ALPHA} before the correction only")
    return (f"BLEU, mean over the recorded seeds (in brackets: minus `{baseline}`'s mean); ▲ better, ▼ worse "
            f"by the primary rule, no mark: no significant difference{provisional}{pooled}.")


def _tested_on(study: Study) -> str:
    if study.test_checkpoint == "best":
        return "the checkpoint with its best validation score (`best.pt`)"
    return "its last checkpoint"


def render(study: Study, data: dict[str, Any], table: dict[str, dict[str, dict[str, Any]]],
           picture: Path | None, out: Path, report_flags: str = "--report") -> str:
    """The report in its order: what ran and where, how to read the tests, the scores, the runs."""
    records = data["records"]
    trees = trees_read(study, records, (data.get("subsets") or {}).get("lines") or {})
    lines = [*_header_lines(study, data, trees, report_flags), *_reading_lines(study, data, table),
             *_score_tables(study, table)]
    if picture is not None:
        rel = Path(picture).resolve().relative_to(out.parent.resolve()) if out.parent.resolve() in \
            Path(picture).resolve().parents else picture
        lines += [f"![BLEU per seed]({rel})", ""]
    lines += [*_runs_table(study, records), *provenance_lines(study, records, trees), *_trouble_lines(data),
              "## The study file", "", "```yaml", study.path.read_text(encoding="utf-8").rstrip(), "```", ""]
    return "\n".join(lines)


def _header_lines(study: Study, data: dict[str, Any], trees: dict[tuple[str, int], dict[str, Any]],
                  report_flags: str) -> list[str]:
    """Title, how many runs are in, provenance warnings, the commands, the machines, sacreBLEU's signatures."""
    records = data["records"]
    all_records = [r for by_seed in records.values() for r in by_seed.values()]
    lines = [f"# Study `{study.name}`", ""]
    n_runs = len(study.runs())
    damaged = f", {len(data['damaged'])} damaged" if data.get("damaged") else ""
    lines += [f"{len(all_records)} of {n_runs} runs recorded ({len(data['failed'])} failed, "
              f"{len(data['missing'])} pending, {len(data['stale'])} stale{damaged}). Every run trains exactly "
              f"{study.max_steps} updates and is tested on {_tested_on(study)} with beam search.", ""]
    lines += [*warnings, ""] if (warnings := provenance_warnings(study, records, trees)) else []
    lines += ["## Commands", "", "```sh",
              f"structnmt study {study.path}            # runs what is missing, then writes this report",
              f"structnmt study {study.path} --status   # where every run stands",
              f"structnmt study {study.path} {report_flags}   # this report from the records", "```", ""]
    machines = sorted({f"{cpu_kind(r)}, {r.get('device')}, {r.get('precision')}, {_threads(r)} "
                       f"thread{'' if _threads(r) == '1' else 's'}" for r in all_records})
    if machines:
        lines += ["Where the runs trained: " + "; ".join(machines) + ".", ""]
    return lines


def _reading_lines(study: Study, data: dict[str, Any], table: dict[str, dict[str, dict[str, Any]]]) -> list[str]:
    """The headline, the primary rule and the secondary tests in words, then the summary table."""
    lines = []
    sigs = sorted({s for rows in table.values() for row in rows.values() for s in row["signature"].values()})
    if sigs:
        lines += ["sacreBLEU signatures: " + "; ".join(f"`{s}`" for s in sigs), ""]
    from structnmt.evaluation.significance import ASO_RULE, SEED_RULE

    rule = next((row["verdict"]["rule"] for rows in table.values() for row in rows.values()
                 if "rule" in row.get("verdict", {})), SEED_RULE.format(alpha=0.05, n=1000, seed=12345))
    family = len(pooled_holm(table))
    lines += ["## Scores", "", *headline(study.baseline, table),
              f"**Verdicts against `{study.baseline}`**, by the primary rule, declared before the runs: {rule} "
              "p per seed pair is given as system seed/baseline seed: p. It asks whether every training of the "
              "recipe translates this test set better than every training of the baseline, sentences being the "
              "sample.", "",
              "**Secondary tests, suggestive only** (they never change the verdict): \"p pooled\": one paired "
              "bootstrap of the mean over seeds (Clark et al. 2011, as MultEval; the same 1,000 resamples of the "
              "sentences score every seed of both recipes; two-sided). It asks whether the recipes differ on "
              "average, with more power than asking every seed pair to agree. \"Holm\": that p adjusted by "
              f"Holm's step-down correction (Holm 1979) over the family of all {family} recipe × test-set "
              f"comparisons against `{study.baseline}` in this report that have a pooled p (every recipe on every "
              "test set, long-dependency subsets included), so that the chance of any false finding among them "
              f"stays below {ALPHA}: read it, not the raw p, against {ALPHA}. Both bootstraps resample sentences "
              "of the trainings there are, not trainings; neither asks how another training would do.", ""]
    aso_rows = [(len(row["bleu"]), len(rows[study.baseline]["bleu"])) for rows in table.values()
                for recipe, row in rows.items() if row.get("verdict", {}).get("aso") and study.baseline in rows]
    if aso_rows:
        chances = "; ".join(f"once in {round(1 / order_by_chance(k, n))} with {k} seeds against {n}"
                            for k, n in sorted(set(aso_rows), reverse=True))
        lines += [ASO_RULE.format(n=1000, seed=12345, confidence=0.95) + " It needs no references. With so few "
                  "seeds, ε = 0.00 one way says no more than that every seed of one recipe scored above every seed "
                  f"of the other, which chance alone gives when the recipes do not differ ({chances}): suggestive, "
                  "not a finding.", ""]
    if (data.get("subsets") or {}).get("note"):
        lines += [data["subsets"]["note"], ""]
    summary = summary_lines(study.baseline, table)
    if summary:
        lines += [summary_legend(study.baseline, table), "", *summary, "",
                  "Length ratio (below): the hypotheses' length over the references' as BLEU counts them; "
                  "below 1 BLEU's brevity penalty applies (BP = exp(1 − 1/ratio)), so a gap in BLEU between "
                  "recipes whose ratios differ is partly a gap in output length.", ""]
    return lines


def _score_tables(study: Study, table: dict[str, dict[str, dict[str, Any]]]) -> list[str]:
    """One table a test set: each recipe's scores, its verdict, and the p-values behind it."""
    lines = []
    holm_p = pooled_holm(table)
    for test, rows in table.items():
        lines += [f"### {test}", "", *_subset_lines(rows),
                  "| recipe | BLEU (mean ± sd) | chrF (mean ± sd) | length ratio | BLEU per seed | "
                  "Δ BLEU | verdict (primary) | p per seed pair | p pooled | p pooled, Holm | ASO ε |",
                  "|---|---:|---:|---:|---|---:|---|---|---:|---:|---|"]
        base_bleu = list(rows.get(study.baseline, {}).get("bleu", {}).values())
        for recipe, row in rows.items():
            bleu = list(row["bleu"].values())
            delta = f"{statistics.mean(bleu) - statistics.mean(base_bleu):+.2f}" if base_bleu and \
                recipe != study.baseline else ""
            verdict = row.get("verdict") or {}
            pvals = ", ".join(f"{pair}: {format_p(p)}" for pair, p in (verdict.get("p") or {}).items())
            label = verdict.get("verdict", "baseline" if recipe == study.baseline else "no baseline runs")
            per_seed = ", ".join(f"s{s}: {v:.2f}" for s, v in row["bleu"].items())
            pooled = format_p(verdict["pooled_p"]) if verdict.get("pooled_p") is not None else ""
            adjusted = format_p(holm_p[(test, recipe)]) if (test, recipe) in holm_p else ""
            aso = " / ".join(f"{e:.2f}" for e in verdict["aso"]) if verdict.get("aso") else ""
            ratios = [r for r in row.get("ratio", {}).values() if r is not None]
            lines.append(f"| {recipe} | {_mean_sd(bleu)} | {_mean_sd(list(row['chrf'].values()))} | "
                         f"{_mean_sd(ratios, 3)} | {per_seed} | {delta} | {label} | {pvals} | {pooled} | {adjusted} | "
                         f"{aso} |")
        lines.append("")
    return lines


def _runs_table(study: Study, records: dict[str, dict[int, dict]]) -> list[str]:
    """Each run's updates, minutes, device, precision, threads and resumes."""
    lines = ["## Runs", "", "Threads: each call's that trained the run; resumed from: the step each later call "
             "started from (records made before calls were kept: the steps from the training log, and the "
             "last call's threads only, marked *).", "",
             "| recipe | seed | updates | train min | test min | device | precision | threads | resumed from | "
             "finished |", "|---|---:|---:|---:|---:|---|---|---|---|---|"]
    for recipe, by_seed in records.items():
        for seed, r in sorted(by_seed.items()):
            threads, resumed = _calls_cells(r, study.record_dir(recipe, seed) / "log.jsonl")
            lines.append(f"| {recipe} | {seed} | {r['updates']} | {r['train_seconds'] / 60:.1f} | "
                         f"{r['test_seconds'] / 60:.1f} | {r.get('device')} | {r.get('precision')} | {threads} | "
                         f"{resumed} | {r.get('finished', '')[:16]} |")
    lines.append("")
    return lines


def _trouble_lines(data: dict[str, Any]) -> list[str]:
    """Damaged records, failed runs (with their log's last lines) and runs not yet done."""
    lines = []
    if data.get("damaged"):
        lines += ["## Damaged records", ""]
        lines += [f"- **{recipe} seed {seed}**: {why}" for recipe, seed, why in data["damaged"]]
        lines.append("")
    if data["failed"]:
        lines += ["## Failed runs", ""]
        for recipe, seed, failure in data["failed"]:
            lines.append(f"- **{recipe} seed {seed}**: {failure.get('error', '')}")
            tail = failure.get("log_tail") or []
            if tail:
                lines += ["  ```", *[f"  {t}" for t in tail[-5:]], "  ```"]
        lines.append("")
    if data["missing"] or data["stale"]:
        lines += ["## Not yet run", ""]
        lines += [f"- {recipe} seed {seed}" for recipe, seed in data["missing"]]
        lines += [f"- {recipe} seed {seed} ({reason})" for recipe, seed, reason in data["stale"]]
        lines.append("")
    return lines


def cpu_kind(record: dict) -> str:
    """The CPU with its instruction set where the record keeps it: machines of one model name
    differ in it (AVX-512 with bf16 or AVX2 alone), and with it in speed and precision."""
    isa = (record.get("cpu_info") or {}).get("isa")
    return f"{record.get('cpu')} ({isa})" if isa else str(record.get("cpu"))


def _subset_lines(rows: dict[str, dict[str, Any]]) -> list[str]:
    """Under a long-dependency test set's heading: which sentences its rows were scored on."""
    subsets = [row["subset"] for row in rows.values() if "subset" in row]
    if not subsets:
        return []
    sizes = sorted({n for subset in subsets for n in subset["sentences"]})
    if all(subset["fixed"] for subset in subsets):
        return [f"Scored on {' or '.join(map(str, sizes))} sentences, the same for every run: the fixed subset "
                "(see above).", ""]
    why = next((subset["why"] for subset in subsets if subset.get("why")), None)
    return [f"Each run's own subset, as its record keeps it ({' or '.join(map(str, sizes))} sentences)"
            + (f"; not the study's fixed one, which needs the references: {why}" if why else "") + ".", ""]


def _threads(record: dict[str, Any]) -> str:
    """The threads a run trained with: its calls' (a record made with ``threads: 0``, "the
    executor's share", keeps the share each call got there), else the record's; ? when unknown."""
    calls = [c.get("threads") for c in record.get("calls") or [] if isinstance(c, dict)]
    known = [t for t in calls if isinstance(t, int) and t > 0]
    if known:
        return ", ".join(str(t) for t in dict.fromkeys(known))
    threads = record.get("threads")
    return str(threads) if isinstance(threads, int) and threads > 0 else "?"


def machine_kinds(record: dict[str, Any]) -> list[str]:
    """The kinds of machine a run trained on: the record's CPU (with its instruction set) and GPU,
    and any other a call of a resumed run names."""
    def kind(cpu: str, gpu: Any) -> str:
        return f"{cpu} + {gpu}" if gpu else cpu

    kinds = [kind(cpu_kind(record), record.get("gpu"))]
    for call in record.get("calls") or []:
        if not isinstance(call, dict):
            continue
        other_cpu = call.get("cpu") and call["cpu"] != record.get("cpu")
        if other_cpu or (call.get("gpu") and call.get("gpu") != record.get("gpu")):
            kinds.append(kind(call.get("cpu") if other_cpu else cpu_kind(record), call.get("gpu")))
    return list(dict.fromkeys(kinds))


def _commits(record: dict[str, Any]) -> list[str]:
    """structnmt's commits a run was trained (each call's) and tested (the record's) at, short; or
    ["not recorded"]; then each module of methods kept outside the package with its file's digest
    (``mymethods@1a2b3c4d``), since no commit of structnmt pins that code."""
    found = [c.get("git_commit") for c in record.get("calls") or [] if isinstance(c, dict)]
    found.append(record.get("git_commit"))
    short = [f"{c[:7]}{'+dirty' if c.endswith('+dirty') else ''}" for c in found if isinstance(c, str) and c]
    outside = record.get("methods_outside")
    modules = [f"{name}@{str(digest)[:8]}" for name, digest in sorted(outside.items())] \
        if isinstance(outside, dict) else []
    return (list(dict.fromkeys(short)) or ["not recorded"]) + modules


def _own_subsets_match(record: dict[str, Any], lines: dict[str, list[int]]) -> bool | None:
    """Whether the long-dependency subsets a record chose (from the trees its dataset held) are the
    fixed ones (chosen from the study's trees file); None when there is nothing to compare."""
    mine = [(split, (record["scores"].get(split + LONGDEP) or {}).get("lines")) for split in lines]
    mine = [(split, chosen) for split, chosen in mine if chosen is not None]
    return all(chosen == lines[split] for split, chosen in mine) if mine else None


def _trees_digest(record: dict[str, Any]) -> str | None:
    """The record's trees digest as one comparable string; None where it keeps none."""
    trees = record.get("trees")
    return json.dumps(trees, sort_keys=True) if isinstance(trees, dict) and trees else None


def _trees_short(record: dict[str, Any]) -> str:
    """The digest as the report prints it: each part's first eight characters."""
    return "+".join(str(v)[:8] for _, v in sorted(record["trees"].items()))


def _study_digests(study: Study, records: dict[str, dict[int, dict]], lines: dict[str, list[int]]
                   ) -> dict[str, tuple[str | None, bool]]:
    """Each dataset's study digest, and whether the trees file vouches for it: the most common
    digest of the runs whose own subsets are the file's or, where no such run has a digest, of all
    its runs that read trees; None where the two most common tie."""
    pinned: dict[str, Counter] = {}
    every: dict[str, Counter] = {}
    for recipe, by_seed in records.items():
        for seed, record in by_seed.items():
            if record.get("reads_trees") and (d := _trees_digest(record)) is not None:
                where = str(study.run_config(recipe, seed).data.dir)
                every.setdefault(where, Counter())[d] += 1
                if _own_subsets_match(record, lines):
                    pinned.setdefault(where, Counter())[d] += 1
    out: dict[str, tuple[str | None, bool]] = {}
    for where in every:
        for counts, vouched in ((pinned.get(where), True), (every[where], False)):
            top = (counts or Counter()).most_common(2)
            if top:
                out[where] = (top[0][0], vouched) if len(top) == 1 or top[0][1] > top[1][1] else (None, vouched)
                break
    return out


def trees_read(study: Study, records: dict[str, dict[int, dict]], lines: dict[str, list[int]]
               ) -> dict[tuple[str, int], dict[str, Any]]:
    """Which trees each run read, without the dataset (a fresh clone has the records only).

    A run that reads trees keeps their digest (``record["trees"]``, over its dataset's arrays); the
    study's are the digest of the runs of that dataset whose long-dependency subsets are the ones
    the study's trees file gives (else the one most runs have). A run with another digest, or whose
    own subsets are other sentences (records made before digests were kept), read other trees.
    Returns ``{(recipe, seed): {"cell": for the table, "other": why, when other trees}}``."""
    references = _study_digests(study, records, lines)
    out: dict[tuple[str, int], dict[str, Any]] = {}
    for recipe, by_seed in records.items():
        for seed, record in sorted(by_seed.items()):
            ref, vouched = None, False
            if record.get("reads_trees"):
                ref, vouched = references.get(str(study.run_config(recipe, seed).data.dir), (None, False))
            out[(recipe, seed)] = _trees_cell(study, record, lines, ref, vouched)
    return out


def _trees_cell(study: Study, record: dict[str, Any], lines: dict[str, list[int]], ref: str | None,
                vouched: bool) -> dict[str, Any]:
    """One run's cell of the trees column, and why its trees are other ones where they are."""
    if not record.get("reads_trees"):
        return {"cell": "reads none", "other": None}
    d, match = _trees_digest(record), _own_subsets_match(record, lines)
    if match is False:
        sizes = " / ".join(str(len((record["scores"].get(s + LONGDEP) or {}).get("lines") or ())) for s in lines)
        fixed = " / ".join(str(len(chosen)) for chosen in lines.values())
        mine = f"digest {_trees_short(record)}, and " if d else ""
        return {"cell": f"**other** ({_trees_short(record) if d else 'by its subsets'})",
                "other": f"{mine}long-dependency subsets of other sentences ({sizes} against the trees file's {fixed})"}
    if d is not None and ref is not None and d != ref:
        theirs = "the runs that read the study's trees" if vouched else "most runs of the dataset"
        return {"cell": f"**other** ({_trees_short(record)})",
                "other": f"digest {_trees_short(record)}, where {theirs} have "
                         f"{'+'.join(v[:8] for _, v in sorted(json.loads(ref).items()))}"}
    if d is not None:
        pinned_here = study.trees is not None and (match or (d == ref and vouched))
        return {"cell": f"pinned ({_trees_short(record)})" if pinned_here else _trees_short(record), "other": None}
    if match:
        return {"cell": "pinned (by its subsets)", "other": None}
    return {"cell": "not recorded", "other": None}


def _runs_by(values: dict[str, list[str]]) -> str:
    return "; ".join(f"{value}: {', '.join(runs)}" for value, runs in values.items())


def provenance_warnings(study: Study, records: dict[str, dict[int, dict]],
                        trees: dict[tuple[str, int], dict[str, Any]]) -> list[str]:
    """A line for each seed whose runs trained on different kinds of machine or at different
    commits (their scores are pooled all the same: a seed is a training's draw, not a machine),
    and one naming the runs that read other trees than the study's."""
    out = []
    for seed in sorted({s for by_seed in records.values() for s in by_seed}):
        kinds: dict[str, list[str]] = {}
        commits: dict[str, list[str]] = {}
        for recipe, by_seed in records.items():
            if seed in by_seed:
                for kind in machine_kinds(by_seed[seed]):
                    kinds.setdefault(kind, []).append(recipe)
                for commit in _commits(by_seed[seed]):
                    commits.setdefault(commit, []).append(recipe)
        if len(kinds) > 1:
            out.append(f"- **Warning: seed {seed} pools runs on {len(kinds)} kinds of machine**, {_runs_by(kinds)}. "
                       "They are pooled all the same: a gap between recipes may partly be a gap between machines.")
        if len(commits) > 1:
            out.append(f"- **Warning: seed {seed} pools runs of {len(commits)} commits**, {_runs_by(commits)}. "
                       "They are pooled all the same: a gap between recipes may partly be a change of code.")
    other: dict[str, list[str]] = {}  # why -> runs
    for (recipe, seed), t in trees.items():
        if t["other"]:
            other.setdefault(t["other"], []).append(f"{recipe} seed {seed}")
    if other:
        whose = (f"the study's pinned trees (`{study.trees.file}`)" if study.trees is not None else
                 "the trees most runs of their dataset read")
        count = sum(len(runs) for runs in other.values())
        named = "; ".join(", ".join(runs) + f": {why}" for why, runs in other.items())
        out.append(f"- **Warning: {counted(count, 'run')} read other trees than {whose}**, {named}. "
                   "Their scores are pooled with the others' all the same.")
    return out


def provenance_lines(study: Study, records: dict[str, dict[int, dict]],
                     trees: dict[tuple[str, int], dict[str, Any]]) -> list[str]:
    """The section listing, seed by seed, where and with what each run trained."""
    if not records:
        return []

    def cell(value: Any, absent: str = "-") -> str:
        return absent if value is None else f"{value:g}" if isinstance(value, float) else str(value)

    outside = ", and each module of methods kept outside the package, with its file's digest" if any(
        "methods_outside" in r for by_seed in records.values() for r in by_seed.values()) else ""
    lines = ["## Provenance by seed", "",
             "Machine: the CPU (with the instruction set torch used) and GPU the run trained on (a resumed run: "
             "every one its calls name); commit: structnmt's commit at each call and at testing (+dirty: with "
             f"changes not committed){outside}; threads: each call's; trees: the digest of the trees its model read "
             "(pinned: the study's; **other**: not the study's); -: not recorded (records made before it was "
             "kept).", "",
             "| seed | recipe | machine | cores | memory (GiB) | GPU | precision | threads | commit | trees |",
             "|---:|---|---|---:|---:|---|---|---|---|---|"]
    for seed in sorted({s for by_seed in records.values() for s in by_seed}):
        for recipe, by_seed in records.items():
            if seed not in by_seed:
                continue
            r = by_seed[seed]
            gpu = cell(r.get("gpu"), "none") if "gpu" in r else "-"
            lines.append(f"| {seed} | {recipe} | {'; '.join(machine_kinds(r))} | {cell(r.get('cores'))} | "
                         f"{cell(r.get('memory_gib'))} | {gpu} | {r.get('precision')} | {_threads(r)} | "
                         f"{', '.join(_commits(r))} | {trees.get((recipe, seed), {}).get('cell', '-')} |")
    return [*lines, ""]


def _calls_cells(record: dict[str, Any], log: Path) -> tuple[str, str]:
    """The Runs table's threads and resumed-from cells: every call where the record keeps them,
    else what is known (the log's resumes; the last call's threads, marked * when it resumed)."""
    calls, complete = known_calls(record, log)
    resumed = ", ".join(c.split("→")[0] for c in calls[1:]) or "-"
    if complete:
        return ", ".join(str(c.get("threads", "?")) for c in record["calls"]), resumed
    return f"{record.get('threads')}{'*' if len(calls) > 1 else ''}", resumed


def _verdict(table: dict[str, dict[str, dict[str, Any]]], test: str, recipe: str) -> str:
    return (table.get(test, {}).get(recipe, {}).get("verdict") or {}).get("verdict") or ""


def _tested(summary_file: Path) -> set[tuple[str, str]]:
    """(test set, recipe) pairs whose verdict a written report's JSON has from a significance test."""
    try:
        summary = json.loads(summary_file.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return set()
    if not isinstance(summary, dict):
        return set()
    return {(test, recipe) for test, rows in summary.items() if isinstance(rows, dict)
            for recipe, row in rows.items() if isinstance(row, dict) and row.get("pooled_p") is not None}


def write_report(study: Study, out: str | Path | None = None, baseline: str | None = None) -> Path:
    """Write ``<records>/report.md`` (and ``report.png``); returns the Markdown's path.

    ``baseline`` compares against another recipe of the study (a control against the method it
    controls, say) in ``<records>/report_vs_<baseline>.md``, leaving the study's report alone.
    """
    from structnmt.study.runs import check_own_records

    check_own_records(study)  # another study's records and report are not this one's to report or replace
    name, flags = "report.md", "--report"
    if baseline and baseline != study.baseline:
        study = study.with_baseline(baseline)
        name, flags = f"report_vs_{baseline}.md", f"--report --baseline {baseline}"
    out = Path(out) if out else study.records / name
    data = collect(study)
    table = compare(study, data)
    lost = sorted((test, recipe) for test, recipe in _tested(out.with_suffix(".json"))
                  if _verdict(table, test, recipe).startswith(NOT_TESTED))
    if lost:
        test, recipe = lost[0]
        why = table[test][recipe]["verdict"]["verdict"].removeprefix(f"{NOT_TESTED}: ")
        raise ReportError(f"{out} keeps significance tests this machine cannot redo ({len(lost)} verdicts, "
                          f"{recipe} on {test} first: {why}); it is left as it is (give --out to write "
                          "this one elsewhere)")
    picture = _picture(study, table, out.with_suffix(".png"))
    text = render(study, data, table, picture, out, flags)
    atomic_write_text(out, text)
    holm_p = pooled_holm(table)

    def summary_row(test: str, recipe: str, row: dict[str, Any]) -> dict[str, Any]:
        verdict = row.get("verdict") or {}
        out = {"bleu": row["bleu"], "verdict": verdict.get("verdict"), "pooled_p": verdict.get("pooled_p"),
               "pooled_p_holm": holm_p.get((test, recipe)), "holm_family": len(holm_p), "aso": verdict.get("aso")}
        return {**out, "subset": row["subset"]} if "subset" in row else out

    summary = {test: {recipe: summary_row(test, recipe, row) for recipe, row in rows.items()}
               for test, rows in table.items()}
    atomic_write_text(out.with_suffix(".json"), json.dumps(summary, indent=2) + "\n")
    return out

