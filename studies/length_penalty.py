"""Does a study's short output come from the decoding? Re-decode with other length penalties.

    python studies/length_penalty.py studies/multi30k_en_fr.yaml [--split val] [--alphas 0.6 1.0 1.5]

Beam search favours short hypotheses; the GNMT length penalty (α, ``decoding.length_penalty``)
counters that, and a model that stops early under the study's α may not under a larger one.
For every run with a record and a last checkpoint on this machine, this decodes ``--split``
(the validation split by default: choosing α on a test set would be tuning on it) with the
run's own decoding settings, only α changed, and prints BLEU, length ratio and chrF per α.
The recipe's own α gives the record's hypotheses again when the split is one of its test
sets. Each run's figures are kept beside its record (``RECORDS/RECIPE/seedN/length_penalty/
SPLIT.json``, small, committed), so the table survives the checkpoints; it goes to the screen.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from structnmt.io import atomic_write_text  # noqa: E402
from structnmt.study.runs import read_record, stale_reason  # noqa: E402
from structnmt.study.spec import load_study  # noqa: E402


def decode(checkpoint: Path, split: str, alphas: list[float], decoding: object) -> dict[str, dict[str, float]]:
    """BLEU, length ratio and chrF of ``split`` for each α, everything else as the study decodes."""
    import dataclasses

    from structnmt.data.dataset import ParallelDataset
    from structnmt.decoding.translate import translate_split
    from structnmt.decoding.translator import load_translator
    from structnmt.evaluation.scores import corpus_scores

    translator = load_translator(checkpoint, "cpu")
    data = ParallelDataset(translator.dataset_dir, split)
    refs = data.raw("tgt")
    out = {}
    for alpha in alphas:
        settings = translator.decoding(**{**dataclasses.asdict(decoding), "length_penalty": alpha})
        hyps = translate_split(translator.model, data, translator.preprocessor, settings, translator.device,
                               labels=translator.labels)
        scores = corpus_scores(hyps, [refs], metrics=("bleu", "chrf"))
        out[f"{alpha:g}"] = {"bleu": scores["bleu"], "ratio": scores["bleu_parts"]["ratio"], "chrf": scores["chrf"],
                             "beam": settings.beam}
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("study")
    parser.add_argument("--split", default="val")
    parser.add_argument("--alphas", nargs="+", type=float, default=[0.6, 1.0, 1.5])
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default 1: studies may be training)")
    parser.add_argument("--redo", action="store_true", help="decode runs that already have figures again")
    args = parser.parse_args(argv)
    import torch

    torch.set_num_threads(args.threads)
    study = load_study(args.study)
    rows = []
    for recipe, seed in study.runs():
        record = read_record(study, recipe, seed)
        if record is None or stale_reason(study, recipe, seed, record):
            continue
        kept = study.record_dir(recipe, seed) / "length_penalty" / f"{args.split}.json"
        figures = json.loads(kept.read_text(encoding="utf-8")) if kept.is_file() else {}
        missing = [a for a in args.alphas if f"{a:g}" not in figures]
        checkpoint = study.run_dir(recipe, seed) / "last.pt"
        if (missing or args.redo) and checkpoint.is_file():
            figures.update(decode(checkpoint, args.split, args.alphas if args.redo else missing,
                                  study.run_config(recipe, seed).decoding))
            atomic_write_text(kept, json.dumps(figures, indent=1, sort_keys=True) + "\n")
        if figures:
            rows.append((recipe, seed, figures))
    if not rows:
        print("no run has a checkpoint or kept figures here", file=sys.stderr)
        return 1
    alphas = sorted({a for _, _, f in rows for a in f}, key=float)
    print(f"## {study.name}: {args.split}, beam {rows[0][2][alphas[0]]['beam']}, BLEU / length ratio / chrF by α\n")
    print("| run | " + " | ".join(f"α {a}" for a in alphas) + " |\n|---|" + "---|" * len(alphas))
    for recipe, seed, figures in rows:
        cells = [f"{f['bleu']:.2f} / {f['ratio'] or float('nan'):.3f} / {f['chrf']:.2f}"
                 if (f := figures.get(a)) else "" for a in alphas]
        print(f"| {recipe} seed {seed} | " + " | ".join(cells) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
