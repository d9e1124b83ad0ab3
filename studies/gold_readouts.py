"""Supervised heads read out against real gold trees, beside the parser they learned from.

    python studies/gold_readouts.py RUN [RUN ...] [--out FILE.md] [--gold LANG=FILE]
        [--parser LANG=MODEL] [--src LANG=FILE] [--checkpoint best|last]

For every run and every side on which its model has a supervised dependency head (DBSA, SISA,
SyncAttn: what ``structnmt inspect trees`` reads), the head's trees are scored against a UD
treebank of that side's language (default: the test files of ``../shared/data/ud``: English EWT,
French GSD, German GSD), and the parser the run's dataset was prepared with on that side (from
the dataset's ``meta.json``; ``--parser`` names another) parses the gold words of exactly the
same sentences. Both trees are projected onto the run's sub-words the same way, so the two UAS
differ in their heads alone: a head trained on the parser's trees can hardly beat them by much,
and how close it comes is the finding. Right- and left-branching chains are the floor.

Sentences that cannot be projected onto the run's sub-words (or whose parse cannot) are left
out of every figure of their row and counted by reason. A UD test file has no parallel sources,
so a target-side head is read with empty sources unless ``--src LANG=FILE`` gives some; that is
checked on every call (the trees must not change with the source, as for a head in decoder layer
1, whose self-attention comes before any cross-attention), and refused otherwise. A decoder head
is causally masked: it can only attach a word to an earlier word (or make it the root), so its
row also gives the share of gold heads it can reach at all.

Each row is one ``structnmt inspect trees RUN --conllu GOLD --parser-uas ...`` call (printed in
the table's notes); the scores and the trees go to ``RUN/inspect/gold/`` (or ``--inspect-dir``).
The table goes to the screen and to ``--out`` (with the raw scores beside it as JSON). Exit
status 1 when a run could not be scored (its row says why).
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from structnmt.errors import StructNMTError  # noqa: E402
from structnmt.io import atomic_write_text  # noqa: E402

UD = ROOT.parent / "shared" / "data" / "ud"
#: the gold test treebank of each language (../shared/data/ud)
DEFAULT_GOLD = {"en": UD / "en_ewt-ud-test.conllu", "fr": UD / "fr_gsd-ud-test.conllu",
                "de": UD / "de_gsd-ud-test.conllu"}


def _pairs(values: list[str], option: str) -> dict[str, str]:
    out = {}
    for value in values:
        lang, sep, path = value.partition("=")
        if not sep or not lang or not path:
            raise SystemExit(f"{option}: expected LANG=VALUE, got {value!r}")
        out[lang] = path
    return out


def _display(path: str | Path) -> str:
    """A path as it reads from the project root (``../shared/...`` for the shared data)."""
    resolved = Path(path).resolve()
    for base, prefix in ((ROOT.resolve(), ""), (ROOT.parent.resolve(), "../")):
        if resolved.is_relative_to(base):
            return prefix + resolved.relative_to(base).as_posix()
    return str(path)


def read_run(run: Path, side: str, gold: Path, *, checkpoint: str | None, parser: str | None, src: str | None,
             out: Path, translator: Any) -> dict[str, Any]:
    """One row: :func:`~structnmt.evaluation.inspect_gold.inspect_trees_gold` with the parser's UAS."""
    from structnmt.evaluation.inspect_gold import inspect_trees_gold

    scores = inspect_trees_gold(translator, gold, out, side, None, src=src if side == "tgt" else None,
                                parser_uas=True, parser=parser, without_src=side == "tgt" and src is None)
    command = ["structnmt", "inspect", "trees", str(run), "--side", side, "--conllu", _display(gold),
               "--parser-uas", "--out", str(out)]
    if checkpoint:
        command += ["--checkpoint", checkpoint]
    if parser:
        command += ["--parser", parser]
    if side == "tgt":
        command += ["--src", src] if src else ["--without-src"]
    scores["command"] = shlex.join(command)
    return scores


def _methods(translator: Any) -> str:
    return ", ".join(f"{m.name} ({'/'.join(sorted({s.stack for s in m.sites()}))} layer "
                     f"{'/'.join(str(k) for k in sorted({s.layer + 1 for s in m.sites()}))})"
                     for m in translator.model.methods)


def _sides(translator: Any) -> list[str]:
    from structnmt.errors import ConfigError
    from structnmt.evaluation.inspect import _readable

    sides = []
    for side in ("src", "tgt"):
        try:
            _readable(translator.model, "dependency_tree", side, None)
        except ConfigError:
            continue
        sides.append(side)
    return sides


def collect(runs: list[str], gold: dict[str, str], parsers: dict[str, str], sources: dict[str, str],
            checkpoint: str | None, inspect_dir: str | None) -> list[dict[str, Any]]:
    from structnmt.decoding.translator import load_translator
    from structnmt.evaluation.run_eval import run_checkpoint

    rows = []
    for run in runs:
        row: dict[str, Any] = {"run": run}
        try:
            path = run_checkpoint(Path(run), checkpoint)
            translator = load_translator(path, "cpu")
        except StructNMTError as err:
            rows.append({**row, "error": str(err)})
            continue
        row.update({"checkpoint": str(path), "step": translator.info.get("step"), "method": _methods(translator)})
        sides = _sides(translator)
        if not sides:
            rows.append({**row, "error": "the model has no supervised dependency head (DBSA, SISA, SyncAttn)"})
            continue
        for side in sides:
            lang = translator.preprocessor.side_cfg(side).lang
            entry = {**row, "side": side, "lang": lang}
            file = gold.get(lang) or DEFAULT_GOLD.get(lang)
            if file is None or not Path(file).is_file():
                rows.append({**entry, "error": f"no gold treebank for {lang!r} (give --gold {lang}=FILE)"
                             + (f": {file} is absent" if file else "")})
                continue
            out = Path(inspect_dir) / Path(run).name / side if inspect_dir else Path(run) / "inspect" / "gold"
            try:
                scores = read_run(Path(run), side, Path(file), checkpoint=checkpoint, parser=parsers.get(lang),
                                  src=sources.get(lang), out=out, translator=translator)
            except StructNMTError as err:
                rows.append({**entry, "gold": str(file), "error": str(err)})
                continue
            rows.append({**entry, "gold": str(file), **scores})
    return rows


def _pct(value: float | None) -> str:
    return "–" if value is None else f"{100 * value:.2f}"


def format_table(rows: list[dict[str, Any]], command: str) -> str:
    lines = ["# Supervised heads against gold trees, beside their parser", "",
             f"`{command}`", "",
             "UAS in % over the same sentences and words for every figure of a row (gold words; units that share a "
             "sub-word merged, as `prepare` merges them). *parser*: the parser the run's dataset was prepared with "
             "on that side (or `--parser`), parsing the gold words; *match*: how it stands to the recorded one "
             "(exact files, same recipe retrained, other). RB / LB: right- / left-branching chains.", "",
             "| run | step | method | side | gold | sentences (dropped) | head UAS | parser UAS | head − parser "
             "| RB | LB | parser (match) |",
             "|---|---:|---|---|---|---:|---:|---:|---:|---:|---:|---|"]
    notes = []
    for n, row in enumerate(rows, start=1):
        where = f"{row['run']} [{n}]"
        if "error" in row:
            lines.append(f"| {where} | {row.get('step', '–')} | {row.get('method', '–')} | {row.get('side', '–')} | "
                         f"{Path(row['gold']).name if row.get('gold') else '–'} | – | – | – | – | – | – | "
                         f"not scored |")
            notes.append(f"[{n}] not scored: {row['error']}")
            continue
        parser = row.get("parser") or {}
        gap = row["uas"] - row["parser_uas"] if row.get("parser_uas") is not None else None
        lines.append(
            f"| {where} | {row['step']} | {row['method']} | {row['side']} ({row['lang']}) | {Path(row['gold']).name} | "
            f"{row['sentences']:,} of {row['file_sentences']:,} ({row['dropped']['sentences']}) | "
            f"**{_pct(row['uas'])}** | {_pct(row.get('parser_uas'))} | "
            f"{'–' if gap is None else f'{100 * gap:+.2f}'} | {_pct(row['right_branching_uas'])} | "
            f"{_pct(row['left_branching_uas'])} | {parser.get('name') or parser.get('model')} "
            f"{parser.get('version') or ''} ({parser.get('match', '?')}) |")
        dropped = "; ".join(f"{why['sentences']} {reason} (lines {', '.join(map(str, why['lines'][:5]))}"
                            f"{' …' if len(why['lines']) > 5 else ''}: {why['why']}; first: {why['first'][0]})"
                            for reason, why in row["dropped"]["reasons"].items()) or "none"
        extra = f"; a causally masked head can reach {_pct(row['causal_reach'])}% of the gold heads" \
            if "causal_reach" in row else ""
        notes.append(f"[{n}] `{row['command']}` — layer {row['layer']}, {row['words']:,} words "
                     f"({row['merged_words']} merged), read with {row['reads']}{extra}; dropped: {dropped}")
    return "\n".join(lines + [""] + notes) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("runs", nargs="+", metavar="RUN", help="run directories (their best.pt, else last.pt)")
    parser.add_argument("--out", help="write the table here (Markdown) and the scores beside it (.json)")
    parser.add_argument("--gold", action="append", default=[], metavar="LANG=FILE",
                        help="the gold treebank of a language (default: ../shared/data/ud's EWT, GSD test files)")
    parser.add_argument("--parser", action="append", default=[], metavar="LANG=MODEL",
                        help="score this spaCy parser for a language instead of the dataset's (e.g. when the "
                             "dataset's is not on this machine); its match column then says how it stands to it")
    parser.add_argument("--src", action="append", default=[], metavar="LANG=FILE",
                        help="sources for the target-side gold file of LANG, one a line (default: none, checked)")
    parser.add_argument("--checkpoint", help="checkpoint file name or path (default: best.pt, else last.pt)")
    parser.add_argument("--inspect-dir", dest="inspect_dir",
                        help="write each row's trees and scores here (default: RUN/inspect/gold)")
    args = parser.parse_args(argv)
    command = shlex.join(["python", "studies/gold_readouts.py", *(argv if argv is not None else sys.argv[1:])])
    rows = collect(args.runs, _pairs(args.gold, "--gold"), _pairs(args.parser, "--parser"),
                   _pairs(args.src, "--src"), args.checkpoint, args.inspect_dir)
    text = format_table(rows, command)
    if args.out:
        atomic_write_text(Path(args.out), text)
        atomic_write_text(Path(args.out).with_suffix(".json"), json.dumps(rows, indent=1) + "\n")
    print(text)
    return 1 if any("error" in row for row in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
