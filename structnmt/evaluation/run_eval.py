"""``structnmt test``: translate a run's test splits with beam search and score them.

For every test split of the run's dataset (every split but the training and validation
ones, unless named) the chosen checkpoint translates the stored source ids, and the
detokenised output is scored with sacreBLEU against the raw references. Hypotheses,
references, sources and scores land in ``RUN/eval/<split>.{hyp,ref,src,json}``, which
``structnmt report`` reads. When the split carries source parses, the sentences with a long
dependency arc are scored again as a test set of their own (``<split>_longdep``). Every line
is scored: one longer than the model reads is translated from a prefix (``truncated_lines``), and
one with an empty source, which prepare keeps out of the arrays, as an empty translation in its
place (``empty_source_lines``), so that the scores are sacreBLEU's on the user's own files.
"""

from __future__ import annotations

import dataclasses
import json
import sys
import time
from pathlib import Path
from typing import Any

from structnmt.errors import CheckpointError, DataError
from structnmt.io import atomic_write_text
from structnmt.wording import counted


def run_checkpoint(run_dir: Path, checkpoint: str | Path | None = None) -> Path:
    """The checkpoint to evaluate: the one named, else the run's ``best.pt``, else its ``last.pt``."""
    if checkpoint:
        path = Path(checkpoint)
        if not path.exists():
            raise CheckpointError(f"{path}: no such checkpoint")
        return path
    _check_run_dir(run_dir)
    return run_dir / "best.pt" if (run_dir / "best.pt").exists() else run_dir / "last.pt"


def _check_run_dir(run_dir: Path) -> None:
    if run_dir.is_file():  # `test runs/x/best.pt`: the run is the folder, the checkpoint an option
        raise DataError(f"is a file, not a run folder: give the run's folder ({run_dir.parent}), and this file as "
                        "its checkpoint (--checkpoint; checkpoint= in Python)", run_dir)
    if not run_dir.is_dir():
        raise DataError("no such run directory", run_dir)


def _write_set(out: Path, name: str, hyps: list[str], refs: list[str], sources: list[str],
               scores: dict[str, Any]) -> None:
    atomic_write_text(out / f"{name}.hyp", "".join(h + "\n" for h in hyps))
    atomic_write_text(out / f"{name}.ref", "".join(r + "\n" for r in refs))
    atomic_write_text(out / f"{name}.src", "".join(s + "\n" for s in sources))
    atomic_write_text(out / f"{name}.json", json.dumps(scores, indent=2) + "\n")


def evaluate_run(run_dir: str | Path, checkpoint: str | Path | None = None, splits: list[str] | None = None,
                 device: str | None = "auto", beam: int | None = None, quiet: bool = False,
                 long_dependency: int = 7, decoding: Any = None) -> dict[str, dict]:
    """Translate a run's test splits; write ``eval/<split>.{hyp,ref,src,json}``; return the scores by set.

    ``long_dependency``: also score the sentences whose source parse has an arc of that many
    words or more (0: off). With ``quiet=False`` one line per set is printed as it is done.
    ``decoding`` (a ``DecodingConfig``) replaces the checkpoint's own decoding section: a study
    whose decoding changed after training re-tests with today's settings, not the old ones.
    """
    from structnmt.decoding.translator import load_translator

    run_dir = Path(run_dir)
    _check_run_dir(run_dir)
    ckpt = run_checkpoint(run_dir, checkpoint)
    translator = load_translator(ckpt, device)
    cfg = translator.config
    changes = dataclasses.asdict(decoding) if decoding is not None else {}
    if beam is not None:
        changes["beam"] = beam
    settings = translator.decoding(**changes)
    meta = json.loads((translator.dataset_dir / "meta.json").read_text(encoding="utf-8"))
    names = splits or [s for s in meta["splits"] if s not in (cfg.data.train_split, cfg.data.valid_split)]
    if not names:  # scoring nothing and exiting 0 would pass for a tested run
        raise DataError(f"no test split to translate: the dataset has only {', '.join(map(repr, meta['splits']))} "
                        "(the training and validation splits are not tested); add a test split to data.splits "
                        "and prepare again, or name the splits to score (--splits)", translator.dataset_dir)
    results = {}
    for split in names:
        results.update(_evaluate_split(translator, settings, ckpt, run_dir, split, long_dependency, quiet))
    return results


def _evaluate_split(translator: Any, settings: Any, ckpt: Path, run_dir: Path, split: str,
                    long_dependency: int, quiet: bool) -> dict[str, dict]:
    """Translate and score one split (and its long-dependency subset); write its ``eval/`` files."""
    from structnmt.data.dataset import ParallelDataset, with_set_aside
    from structnmt.decoding.translate import translate_split
    from structnmt.evaluation.scores import corpus_scores

    data = ParallelDataset(translator.dataset_dir, split)
    started = time.perf_counter()
    truncated: list[int] = []
    stored = translate_split(translator.model, data, translator.preprocessor, settings, translator.device,
                             labels=translator.labels, truncated=truncated)
    seconds = time.perf_counter() - started
    set_aside = data.set_aside()  # empty sources prepare kept out of the arrays: empty translations
    sources, targets = data.raw("src"), data.raw("tgt")  # the stored pairs' texts, read once
    hyps = with_set_aside(stored, set_aside, lambda _pair: "")
    refs = with_set_aside(targets, set_aside, lambda pair: pair["tgt"])
    places = data.scored_positions()  # stored rows -> lines of the scored set, as eval/ numbers them
    truncated = [places[n - 1] + 1 for n in truncated]
    _warn_unscored(split, data.meta.get("splits", {}).get(split) or {})
    scores = corpus_scores(hyps, [refs], metrics=("bleu", "chrf"))
    scores.update({"checkpoint": str(ckpt), "beam": settings.beam, "sentences": len(hyps), "seconds": seconds,
                   "truncated_lines": truncated})
    if set_aside:
        scores["empty_source_lines"] = [pair["line"] for pair in set_aside]
    _write_set(run_dir / "eval", split, hyps, refs, with_set_aside(sources, set_aside, lambda pair: pair["src"]),
               scores)
    results = {split: scores}
    if not quiet:
        parts = scores["bleu_parts"]
        ratio = f"{parts['ratio']:.3f}" if parts["ratio"] is not None else "-"
        print(f"{split}: BLEU {scores['bleu']:.2f} (BP {parts['bp']:.3f}, length ratio {ratio})  "
              f"chrF {scores['chrf']:.2f}  ({counted(len(hyps), 'sentence')}, {seconds:.1f}s)  "
              f"{scores['signature']['bleu']}")
    if long_dependency and data.has("src", "heads"):
        results.update(_long_dependency(run_dir, split, data, (stored, targets, sources), places,
                                        long_dependency, quiet))
    return results


def _warn_unscored(split: str, info: dict[str, Any]) -> None:
    """A dataset prepared before empty sources were kept aside dropped them unrecorded: say so."""
    empty = (info.get("clean") or {}).get("empty", 0)
    if empty and "set_aside" not in info:
        was, are = ("was", "is") if empty == 1 else ("were", "are")
        print(f"warning: {split}: {counted(empty, 'pair')} with an empty side {was} dropped when this dataset was "
              f"prepared and {are} not scored; `structnmt prepare --force` keeps lines with an empty source, which "
              "`test` then scores as empty translations", file=sys.stderr)


def _long_dependency(run_dir: Path, split: str, data, texts: tuple[list[str], list[str], list[str]],
                     places: list[int], threshold: int, quiet: bool) -> dict[str, dict]:
    """Score the sentences whose source parse has an arc of ``threshold`` words or more as a
    test set of its own (``<split>_longdep``), chosen from the stored parse, so reproducibly.
    ``texts``: the stored pairs' (hypotheses, references, sources); ``places``: each one's line
    in the whole scored set, as ``lines`` counts."""
    from structnmt.evaluation.challenge import long_dependency_subset
    from structnmt.evaluation.scores import corpus_scores

    heads = [data.side_arrays(i, "src")["heads"].tolist() for i in range(len(data))]
    chosen = long_dependency_subset(heads, threshold)
    if not chosen:
        return {}
    name = f"{split}_longdep"
    hyps, refs, sources = texts
    sub_hyps, sub_refs = [hyps[i] for i in chosen], [refs[i] for i in chosen]
    scores = corpus_scores(sub_hyps, [sub_refs], metrics=("bleu", "chrf"))
    scores.update({"subset_of": split, "threshold": threshold, "sentences": len(chosen),
                   "lines": [places[i] + 1 for i in chosen]})
    _write_set(run_dir / "eval", name, sub_hyps, sub_refs, [sources[i] for i in chosen], scores)
    if not quiet:
        print(f"{name}: BLEU {scores['bleu']:.2f}  chrF {scores['chrf']:.2f}  ({counted(len(chosen), 'sentence')} "
              f"with an arc of {threshold}+ words)")
    return {name: scores}
