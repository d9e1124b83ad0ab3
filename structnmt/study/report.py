"""The study report: Markdown tables from the records, significance against the baseline, one picture.

Everything is computed from the records (committed text files) and, for significance, the
test sets' references: the prepared dataset's, or where it is absent (a fresh clone) the
corpus file the study's config names (``data.splits.<set>.tgt``), used only once shown to be
the references the run was tested on (the digest its record keeps; for records made before
digests were kept, its recorded BLEU rescored exactly). A report that cannot test
significance still has every score and says why, and never replaces one that could.
"""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path
from typing import Any

from structnmt.errors import StructNMTError
from structnmt.evaluation.significance import format_p, mean_sd
from structnmt.io import atomic_write_text
from structnmt.study.provenance import known_calls, lines_digest
from structnmt.study.runs import read_failure, read_record, record_damage, stale_reason
from structnmt.study.spec import Study

NOT_TESTED = "not tested"


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
    from structnmt.data.corpus import read_lines
    from structnmt.data.dataset import ParallelDataset

    cfg = study.run_config(recipe, seed)
    if (Path(cfg.data.dir) / split / "raw.tgt.txt").is_file():
        return ParallelDataset(cfg.data.dir, split).raw("tgt"), f"{cfg.data.dir}/{split}"
    files = cfg.data.splits.get(split)
    if files is not None and files.tgt and Path(files.tgt).is_file():
        return read_lines(files.tgt), files.tgt
    where = f" or put `{files.tgt}` there" if files is not None and files.tgt else ""
    return None, f"no references on this machine (prepare `{cfg.data.dir}` first{where})"


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
    return {"records": records, "missing": missing, "failed": failed, "stale": stale, "damaged": damaged}


def compare(study: Study, data: dict[str, Any]) -> dict[str, dict[str, dict[str, Any]]]:
    """For each test set and recipe: scores per seed, mean ± sd, and the verdict against the baseline."""
    from structnmt.evaluation.scores import length_ratio
    from structnmt.evaluation.significance import aso_seeds, compare_seeds, pooled_bootstrap

    records = data["records"]
    tests: list[str] = []
    for by_seed in records.values():
        for record in by_seed.values():
            tests += [t for t in record["scores"] if t not in tests]
    base = records.get(study.baseline, {})
    out: dict[str, dict[str, dict[str, Any]]] = {}
    cache: dict[tuple[str, str], tuple[list[str] | None, str]] = {}
    checked: dict[tuple[str, int, str], str | None] = {}

    def whole_split(recipe: str, seed: int, split: str) -> tuple[list[str] | None, str]:
        key = (str(study.run_config(recipe, seed).data.dir), split)
        if key not in cache:
            cache[key] = split_references(study, recipe, seed, split)
        return cache[key]

    def references(recipe: str, seed: int, test: str, scores: dict[str, Any]) -> list[str] | None:
        refs, _ = whole_split(recipe, seed, scores.get("subset_of", test))
        return None if refs is None else _subset(refs, scores)

    def untestable(runs: list[tuple[str, int]], test: str) -> str | None:
        """Why these runs cannot be tested on ``test`` here (no references, or other ones), or None."""
        for recipe, seed in runs:
            if (recipe, seed, test) not in checked:
                checked[(recipe, seed, test)] = check(recipe, seed, test)
            if checked[(recipe, seed, test)]:
                return checked[(recipe, seed, test)]
        return None

    def check(recipe: str, seed: int, test: str) -> str | None:
        record = records[recipe][seed]
        refs, where = whole_split(recipe, seed, record["scores"][test].get("subset_of", test))
        if refs is None:
            return where
        in_dataset = where.startswith(f"{study.run_config(recipe, seed).data.dir}/")
        if in_dataset and "references" not in record:  # the dataset the run read (its identity is checked)
            return None
        why = references_mismatch(record, test, refs, run_hypotheses(study, recipe, seed, test))
        return why and f"the references at `{where}` are not the ones {recipe} seed {seed} was tested on ({why})"

    def ratio(recipe: str, seed: int, test: str, scores: dict[str, Any]) -> float | None:
        """From the record (runs tested since BLEU's parts are kept), else from hypotheses and references."""
        if "bleu_parts" in scores:
            return scores["bleu_parts"]["ratio"]
        refs = references(recipe, seed, test, scores)
        try:
            return None if refs is None else length_ratio(run_hypotheses(study, recipe, seed, test), [refs])
        except (OSError, StructNMTError):  # a missing or misaligned hypothesis file: no ratio, not no report
            return None

    for test in tests:
        rows: dict[str, dict[str, Any]] = {}
        for recipe in [study.baseline] + [r.name for r in study.recipes if r.name != study.baseline]:
            by_seed = {s: r for s, r in records.get(recipe, {}).items() if test in r["scores"]}
            if not by_seed:
                continue
            row: dict[str, Any] = {
                "bleu": {s: r["scores"][test]["bleu"] for s, r in sorted(by_seed.items())},
                "chrf": {s: r["scores"][test]["chrf"] for s, r in sorted(by_seed.items())},
                "signature": next(iter(by_seed.values()))["scores"][test].get("signature", {}),
                "ratio": {s: ratio(recipe, s, test, r["scores"][test]) for s, r in sorted(by_seed.items())},
            }
            base_seeds = sorted(s for s, r in base.items() if test in r["scores"])
            subsets = {json.dumps(r["scores"][test].get("lines")) for r in list(by_seed.values()) +
                       [base[s] for s in base_seeds]}
            if recipe != study.baseline and base_seeds and len(subsets) > 1:
                # a long-dependency subset chosen from other trees: not the same sentences
                row["verdict"] = {"verdict": "not compared (the subset's sentences differ between runs)", "p": {}}
            elif recipe != study.baseline and base_seeds:
                seeds = sorted(by_seed)
                why = untestable([(recipe, s) for s in seeds] + [(study.baseline, s) for s in base_seeds], test)
                if why is None:
                    refs = references(recipe, seeds[0], test, by_seed[seeds[0]]["scores"][test])
                    ours = [run_hypotheses(study, recipe, s, test) for s in seeds]
                    theirs = [run_hypotheses(study, study.baseline, s, test) for s in base_seeds]
                    result = compare_seeds(ours, theirs, [refs])
                    verdict = result.verdict
                    have, want = (len(seeds), len(base_seeds)), (len(study.seeds_of(recipe)),
                                                                   len(study.seeds_of(study.baseline)))
                    if have != want:  # the rule wants every seed of both
                        verdict += f" so far ({_seeds_so_far(have, want)})"
                    pooled = pooled_bootstrap(ours, theirs, [refs])
                    row["verdict"] = {"verdict": verdict, "rule": result.rule, "pooled_p": pooled.p_value,
                                      "p": {f"{seeds[s]}/{base_seeds[b]}": r.p_value for s, b, r in result.pairs}}
                else:  # records travel, references stay with the data (the project ships no corpus text)
                    row["verdict"] = {"verdict": f"{NOT_TESTED}: {why}", "p": {}}
                # across trainings, from the scores alone: needs no references
                row.setdefault("verdict", {})["aso"] = aso_seeds(list(row["bleu"].values()),
                                                                 [base[s]["scores"][test]["bleu"] for s in base_seeds])
            rows[recipe] = row
        out[test] = rows
    return out


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


def summary_lines(baseline: str, table: dict[str, dict[str, dict[str, Any]]]) -> list[str]:
    """The table a paper prints: recipes by test sets, mean BLEU with its gap to the baseline and
    a mark where the verdict is better or worse, so the whole comparison reads at a glance."""
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
            mark += " †" if pooled is not None and pooled < 0.05 else ""
            cells.append(f"{statistics.mean(bleu):.2f} ({statistics.mean(bleu) - statistics.mean(base):+.2f}){mark}")
        lines.append(f"| {recipe} | {len(seeds)} | " + " | ".join(cells) + " |")
    return lines


def summary_legend(baseline: str, table: dict[str, dict[str, dict[str, Any]]]) -> str:
    """The summary table's key; the provisional mark is explained only where one is shown."""
    verdicts = [(row.get("verdict") or {}).get("verdict", "") for rows in table.values() for row in rows.values()]
    marked = any(v.startswith(("better", "worse")) and "so far" in v for v in verdicts)
    provisional = "; *: so far, with fewer seeds than the study has" if marked else ""
    return (f"BLEU, mean over the recorded seeds (in brackets: minus `{baseline}`'s mean); ▲ better, ▼ worse "
            f"by that rule, no mark: no significant difference{provisional}; †: the mean over seeds differs "
            "from the baseline's with p < 0.05 by the seed-pooled bootstrap (below; it does not change the verdict).")


def _tested_on(study: Study) -> str:
    if study.test_checkpoint == "best":
        return "the checkpoint with its best validation score (`best.pt`)"
    return "its last checkpoint"


def render(study: Study, data: dict[str, Any], table: dict[str, dict[str, dict[str, Any]]],
           picture: Path | None, out: Path, report_flags: str = "--report") -> str:
    records = data["records"]
    all_records = [r for by_seed in records.values() for r in by_seed.values()]
    lines = [f"# Study `{study.name}`", ""]
    n_runs = len(study.runs())
    damaged = f", {len(data['damaged'])} damaged" if data.get("damaged") else ""
    lines += [f"{len(all_records)} of {n_runs} runs recorded ({len(data['failed'])} failed, "
              f"{len(data['missing'])} pending, {len(data['stale'])} stale{damaged}). Every run trains exactly "
              f"{study.max_steps} updates and is tested on {_tested_on(study)} with beam search.", ""]
    lines += ["## Commands", "", "```sh",
              f"structnmt study {study.path}            # runs what is missing, then writes this report",
              f"structnmt study {study.path} --status   # where every run stands",
              f"structnmt study {study.path} {report_flags}   # this report from the records", "```", ""]
    machines = sorted({f"{_cpu(r)}, {r.get('device')}, {r.get('precision')}, {r.get('threads')} thread(s)"
                       for r in all_records})
    if machines:
        lines += ["Where the runs trained: " + "; ".join(machines) + ".", ""]
    sigs = sorted({s for rows in table.values() for row in rows.values() for s in row["signature"].values()})
    if sigs:
        lines += ["sacreBLEU signatures: " + "; ".join(f"`{s}`" for s in sigs), ""]
    from structnmt.evaluation.significance import ASO_RULE, SEED_RULE

    rule = next((row["verdict"]["rule"] for rows in table.values() for row in rows.values()
                 if "rule" in row.get("verdict", {})), SEED_RULE.format(alpha=0.05, n=1000, seed=12345))
    lines += ["## Scores", "", f"Verdicts against `{study.baseline}`: {rule} p per seed pair is given as "
              "system seed/baseline seed: p. It asks whether every training of the recipe translates this "
              "test set better than every training of the baseline, sentences being the sample. Beside it, "
              "\"p pooled\": one paired bootstrap of the mean over "
              "seeds (Clark et al. 2011, as MultEval; the same 1,000 resamples of the sentences score every "
              "seed of both recipes; two-sided). It asks whether the recipes differ on average, with more "
              "power than asking every seed pair to agree; the verdict stays the rule above. Both resample "
              "sentences of the trainings there are; neither asks how another training would do.", ""]
    if any(row.get("verdict", {}).get("aso") for rows in table.values() for row in rows.values()):
        lines += [ASO_RULE.format(n=1000, seed=12345, confidence=0.95) + " It needs no references.", ""]
    summary = summary_lines(study.baseline, table)
    if summary:
        lines += [summary_legend(study.baseline, table), "", *summary, "",
                  "Length ratio (below): the hypotheses' length over the references' as BLEU counts them; "
                  "below 1 BLEU's brevity penalty applies (BP = exp(1 − 1/ratio)), so a gap in BLEU between "
                  "recipes whose ratios differ is partly a gap in output length.", ""]
    for test, rows in table.items():
        lines += [f"### {test}", "", "| recipe | BLEU (mean ± sd) | chrF (mean ± sd) | length ratio | BLEU per seed | "
                  "Δ BLEU | verdict | p per seed pair | p pooled | ASO ε |",
                  "|---|---:|---:|---:|---|---:|---|---|---:|---|"]
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
            aso = " / ".join(f"{e:.2f}" for e in verdict["aso"]) if verdict.get("aso") else ""
            ratios = [r for r in row.get("ratio", {}).values() if r is not None]
            lines.append(f"| {recipe} | {_mean_sd(bleu)} | {_mean_sd(list(row['chrf'].values()))} | "
                         f"{_mean_sd(ratios, 3)} | {per_seed} | {delta} | {label} | {pvals} | {pooled} | {aso} |")
        lines.append("")
    if picture is not None:
        rel = Path(picture).resolve().relative_to(out.parent.resolve()) if out.parent.resolve() in \
            Path(picture).resolve().parents else picture
        lines += [f"![BLEU per seed]({rel})", ""]
    lines += ["## Runs", "", "Threads: each call's that trained the run; resumed from: the step each later call "
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
    lines += ["## The study file", "", "```yaml", study.path.read_text(encoding="utf-8").rstrip(), "```", ""]
    return "\n".join(lines)


def _cpu(record: dict) -> str:
    """The CPU with its instruction set where the record keeps it: machines of one model name
    differ in it (AVX-512 with bf16 or AVX2 alone), and with it in speed and precision."""
    isa = (record.get("cpu_info") or {}).get("isa")
    return f"{record.get('cpu')} ({isa})" if isa else str(record.get("cpu"))


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
    summary = {test: {recipe: {"bleu": row["bleu"], "verdict": (row.get("verdict") or {}).get("verdict"),
                               "pooled_p": (row.get("verdict") or {}).get("pooled_p"),
                               "aso": (row.get("verdict") or {}).get("aso")}
                      for recipe, row in rows.items()} for test, rows in table.items()}
    atomic_write_text(out.with_suffix(".json"), json.dumps(summary, indent=2) + "\n")
    return out

