"""``structnmt demo``: the whole pipeline on the built-in synthetic task, in minutes on a CPU.

Writes the synthetic translation task (:mod:`structnmt.data.synthetic`), prepares it with
its gold trees, trains a small Transformer for a few minutes, translates the test set with
beam search and scores it: a check that an installation works end to end, with no data
file, parser or network needed.
"""

from __future__ import annotations

import logging
import shutil
import sys
import time
from pathlib import Path
from typing import Any


def run_demo(work: str | Path = "demo", minutes: float = 3.0, train_size: int = 20000, seed: int = 1,
             overrides: dict[str, Any] | None = None, verbose: bool = True, valid_size: int = 300,
             test_size: int = 500) -> dict[str, Any]:
    """Synthetic data -> prepare -> train -> beam search -> BLEU; returns the test scores
    (``bleu``, ``chrf``, ...) with the ``run`` directory and the training ``summary``.

    ``overrides`` are dotted config keys (``model.d_model``) set on the demo's config;
    ``minutes = 0`` trains without a time limit (set ``training.max_steps`` then).
    """
    from structnmt.config import config_from_dict, set_dotted
    from structnmt.data.prepare import prepare
    from structnmt.data.synthetic import demo_config, write_task
    from structnmt.evaluation.run_eval import evaluate_run
    from structnmt.model.methods import validate_method_configs
    from structnmt.training.trainer import train

    def say(text: str) -> None:
        if verbose:
            print(f"[demo] {text}", flush=True)

    # the synthetic text is tokenised by design ("... the clock ."): sacreBLEU's warning about
    # undetokenised output would only confuse here
    logging.getLogger("sacrebleu").setLevel(logging.ERROR)
    work = Path(work)
    started = time.perf_counter()
    raw = demo_config(work, minutes)
    raw["training"]["seed"] = seed
    raw["training"]["progress"] = verbose and sys.stderr.isatty()
    for key, value in (overrides or {}).items():
        set_dotted(raw, key, value)
    cfg = config_from_dict(raw)
    validate_method_configs(cfg.model)
    say(f"writing the synthetic task to {work / 'data'}")
    write_task(work / "data", sizes={"train": train_size, "val": valid_size, "test": test_size}, seed=seed)
    say("preparing the dataset (gold trees from CoNLL-U, SentencePiece)")
    prepare(cfg, force=True, verbose=verbose)
    run_dir = Path(cfg.training.out_dir)
    if run_dir.exists():
        shutil.rmtree(run_dir)
    say(f"training for up to {minutes:g} minutes")
    summary = train(cfg)
    say("translating the test set with beam search")
    results = evaluate_run(run_dir, splits=["test"], device=cfg.training.device, quiet=not verbose)
    scores = dict(results["test"], run=str(run_dir), summary=summary)
    say(f"done in {(time.perf_counter() - started) / 60:.1f} min: test BLEU {scores['bleu']:.2f} "
        f"(hypotheses in {run_dir / 'eval' / 'test.hyp'})")
    return scores
