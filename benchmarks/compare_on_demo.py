"""Structure-aware methods against the vanilla Transformer on the synthetic demo task.

Every system trains for the same number of updates on the same batches (seeded), for
several seeds, on the demo task whose source trees, alignments and brackets are gold; the
test set is translated with beam search. Reported: test BLEU mean and spread per system, and
what the model learned where the task has gold answers (UAS of DBSA heads, AER of the
vanilla model's cross-attention, UF of LPSI trees), each beside its trivial baseline.

    python benchmarks/compare_on_demo.py --steps 400 --seeds 1 2 3

Writes ``benchmarks/results/compare_on_demo.md`` (and prints it).
"""

from __future__ import annotations

import argparse
import copy
import json
import shutil
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import RESULTS, command_line, machine, markdown_table, write_report  # noqa: E402

from structnmt.config import config_from_dict  # noqa: E402
from structnmt.data.dataset import ParallelDataset  # noqa: E402
from structnmt.data.prepare import prepare  # noqa: E402
from structnmt.data.synthetic import demo_config, write_task  # noqa: E402
from structnmt.evaluation.inspect_run import inspect_split  # noqa: E402
from structnmt.evaluation.run_eval import evaluate_run  # noqa: E402
from structnmt.training.checkpoint import load_model  # noqa: E402
from structnmt.training.trainer import train  # noqa: E402

#: the demo model has 3+3 layers and 4 heads; each method at its paper's place mapped to that depth
SYSTEMS: dict[str, list[dict]] = {
    "vanilla": [],
    "pascal": [{"name": "pascal", "layers": [1], "heads": 2}],
    "deps_san": [{"name": "deps_san", "layers": [1, 2]}],
    "sasa": [{"name": "sasa", "layers": [3], "heads": [0]}],
    "dbsa": [{"name": "dbsa", "sides": ["src"], "layers": [1], "heads": [0]}],
    "lpsi": [{"name": "lpsi"}],
}
BLEU_SYSTEMS = ("vanilla", "pascal", "deps_san", "sasa")


def run_system(name: str, base: dict, seed: int, steps: int, work: Path) -> dict:
    raw = copy.deepcopy(base)
    raw["model"]["methods"] = SYSTEMS[name]
    out = work / "runs" / f"{name}_seed{seed}"
    shutil.rmtree(out, ignore_errors=True)
    raw["training"].update({"out_dir": str(out), "seed": seed, "max_steps": steps, "max_minutes": 0,
                            "valid_every": steps, "progress": False, "tensorboard": False})
    cfg = config_from_dict(raw)
    started = time.perf_counter()
    train(cfg)
    seconds = time.perf_counter() - started
    scores = evaluate_run(out, checkpoint=str(out / "last.pt"), splits=["test"], device="cpu", quiet=True)["test"]
    return {"system": name, "seed": seed, "bleu": scores["bleu"], "chrf": scores["chrf"], "train_s": seconds,
            "run": str(out)}


def analyse(result: dict, data_dir: Path, task_dir: Path) -> dict:
    """Structure read out of the model where the task has gold answers."""
    run = Path(result["run"])
    model, _, _ = load_model(run / "last.pt", "cpu")
    data = ParallelDataset(data_dir, "test")
    if result["system"] == "dbsa":
        return inspect_split(model, data, "trees", run / "inspect")
    if result["system"] == "lpsi":  # both gated encoder layers (docs/results.md: the second one carries the phrases)
        gold = str(task_dir / "test.src.brackets")
        return {f"layer{k + 1}": inspect_split(model, data, "phrases", run / "inspect", layer=k, gold=gold)
                for k in range(2)}
    if result["system"] == "vanilla":
        return inspect_split(model, data, "align", run / "inspect", gold=str(task_dir / "test.align"))
    return {}


def mean_sd(values: list[float]) -> str:
    if len(values) == 1:
        return f"{values[0]:.2f}"
    return f"{statistics.mean(values):.2f} ± {statistics.stdev(values):.2f}"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=400, help="updates per run (the same budget for every system)")
    p.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    p.add_argument("--systems", nargs="+", default=list(SYSTEMS), choices=list(SYSTEMS))
    p.add_argument("--train-size", type=int, default=20000)
    p.add_argument("--work", default="benchmarks/envs/compare_on_demo")
    p.add_argument("--threads", type=int, default=0)
    p.add_argument("--name", default="compare_on_demo")
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    work = Path(args.work)
    write_task(work / "data", sizes={"train": args.train_size, "val": 300, "test": 500}, seed=1)
    base = demo_config(work, 0)
    prepare(config_from_dict(base), force=True, verbose=False)

    results = []
    for seed in args.seeds:
        for name in args.systems:
            if name not in BLEU_SYSTEMS and seed != args.seeds[0]:
                continue  # the structure read-outs need one run each
            result = run_system(name, base, seed, args.steps, work)
            result["analysis"] = analyse(result, Path(base["data"]["dir"]), work / "data")
            print(json.dumps({k: v for k, v in result.items() if k != "run"}), flush=True)
            results.append(result)

    rows = []
    for name in args.systems:
        mine = [r for r in results if r["system"] == name]
        rows.append([name, str(len(mine)), mean_sd([r["bleu"] for r in mine]), mean_sd([r["chrf"] for r in mine]),
                     f"{statistics.mean(r['train_s'] for r in mine):.0f}"])
    sections = [
        ("Test BLEU at the same budget",
         f"{args.steps} updates of about {base['training']['max_tokens']} target tokens, seeds {args.seeds}; "
         "test set of 500 sentences, beam 5; mean ± sample standard deviation over seeds.\n\n"
         + markdown_table(["system", "runs", "BLEU", "chrF", "train s"], rows)),
    ]
    read_outs = []
    for r in results:
        a = r["analysis"]
        if r["system"] == "dbsa" and a:
            read_outs.append(["DBSA head (encoder layer 1) vs gold source trees", "UAS",
                              f"{100 * a['uas']:.1f}", f"right-branching {100 * a['right_branching_uas']:.1f}, "
                              f"left-branching {100 * a['left_branching_uas']:.1f}"])
        if r["system"] == "lpsi" and a:
            for layer, scores in a.items():
                read_outs.append([f"LPSI distances (encoder {layer.replace('layer', 'layer ')}, boundary "
                                  f"{scores['boundary']}) vs gold source brackets", "UF (sentence)",
                                  f"{100 * scores['uf']['sentence_f1']:.1f}",
                                  f"right-branching {100 * scores['right_branching_uf']['sentence_f1']:.1f}"])
        if r["system"] == "vanilla" and a and r["seed"] == args.seeds[0]:
            read_outs.append(["vanilla cross-attention (penultimate layer), grow-diag-final", "AER",
                              f"{100 * a['grow_diag_final']['aer']:.1f}", f"diagonal {100 * a['diagonal']['aer']:.1f}"])
    if read_outs:
        sections.append(("Structure read out of the trained models (test set)",
                         markdown_table(["what", "metric", "model", "baseline"], read_outs)))
    sections.append(("Raw results", "```\n" + "\n".join(json.dumps({k: v for k, v in r.items() if k != "run"})
                                                         for r in results) + "\n```"))
    path = write_report(args.name, "Methods on the synthetic demo task", sections, machine())
    print(path.read_text())
    print(f"(results in {path}; command: {command_line()}; RESULTS={RESULTS})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
