"""Training throughput of this checkout against an earlier commit, measured in the same run.

A speed claim across commits ("the CPU loses nothing") cannot rest on figures from two days:
the machine, its load and its CPU change between them. This script checks the other commit out
into a scratch git worktree and trains each recipe with both code bases in alternating blocks
(old/new, then new/old, ...), each block its own ``structnmt train`` process on the same
prepared dataset, threads and precision, and prints the ratio of their target tokens/s.

    python benchmarks/bench_commits.py --against 1c433cd --recipes transformer lpsi_synchmse pascal

Each block trains ``--steps`` updates and logs every ``--log-every``; its throughput is the
median of the logged windows after the first (which holds start-up). Validation, checkpoints
beyond the last and TensorBoard are off; the validation every run ends with is the loss alone
(no decoding: an untrained model decodes to the length limit, which would dwarf the block).
Both commits read one dataset, so it must be one both can read (``data/multi30k_en_de`` by
default; ``--smoke DIR`` uses the built-in synthetic task and compares this checkout against its
own HEAD).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import common

ROOT = common.ROOT


def worktree(commit: str, where: Path) -> Path:
    """A detached git worktree of ``commit`` under ``where`` (removed by :func:`drop_worktree`)."""
    path = where / f"wt_{commit[:12]}"
    made = subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", "--force", str(path), commit],
                          capture_output=True, text=True)
    if made.returncode != 0:
        raise SystemExit(f"bench_commits: cannot check out {commit!r}: {made.stderr.strip()}")
    return path


def drop_worktree(path: Path) -> None:
    subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(path)],
                   capture_output=True, text=True)
    shutil.rmtree(path, ignore_errors=True)
    subprocess.run(["git", "-C", str(ROOT), "worktree", "prune"], capture_output=True, text=True)


def train_block(code: Path, config: Path, dataset: Path, out_dir: Path, args: argparse.Namespace) -> float:
    """Target tokens/s of one ``structnmt train`` process run from the code base ``code``."""
    shutil.rmtree(out_dir, ignore_errors=True)
    overrides = {
        "data.dir": str(dataset), "training.out_dir": str(out_dir), "training.max_steps": args.steps,
        "training.log_every": args.log_every, "training.valid_every": 10**9, "training.valid_bleu": "false",
        "training.max_minutes": 0,
        "training.keep_last": 0, "training.tensorboard": "false", "training.progress": "false",
        "training.compile": "off", "training.threads": args.threads, "training.precision": args.precision,
        "training.device": "cpu", "training.seed": 1,
    }
    cmd = [sys.executable, "-m", "structnmt.cli.main", "train", str(config)]
    for key, value in overrides.items():
        cmd += ["--set", f"{key}={value}"]
    # the code base's own package first: cwd is sys.path[0] under -m, so run from inside it
    env = {**os.environ, "PYTHONPATH": str(code), "OMP_NUM_THREADS": str(args.threads or ""),
           "MKL_NUM_THREADS": str(args.threads or "")}
    env = {k: v for k, v in env.items() if v != ""}
    result = common.run_command(cmd, cwd=code, env=env)
    if result.returncode != 0:
        raise SystemExit(f"bench_commits: training from {code} failed ({result.returncode}):\n"
                         f"{result.output[-3000:]}")
    ran = json.loads((out_dir / "run.json").read_text())["command"][0]
    if not Path(ran).resolve().is_relative_to(code.resolve()):  # the other code base's package was imported
        raise SystemExit(f"bench_commits: the block meant to run {code} ran {ran}")
    windows = [json.loads(line) for line in (out_dir / "log.jsonl").read_text().splitlines()
               if line.strip() and json.loads(line).get("kind") == "train"]
    speeds = [w["tgt_tokens_per_s"] for w in windows[1:]] or [w["tgt_tokens_per_s"] for w in windows]
    if not speeds:
        raise SystemExit(f"bench_commits: {out_dir / 'log.jsonl'} logged no training window")
    return statistics.median(speeds)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--against", default="1c433cd", help="the earlier commit (default 1c433cd)")
    parser.add_argument("--recipes", nargs="+", default=["transformer", "lpsi_synchmse", "pascal", "dbsa_src"],
                        help="short names of configs/multi30k_en_de_<name>.yaml")
    parser.add_argument("--dataset", default="data/multi30k_en_de", help="prepared dataset both commits read")
    parser.add_argument("--steps", type=int, default=40, help="updates per block")
    parser.add_argument("--log-every", type=int, default=10, help="updates per logged window")
    parser.add_argument("--rounds", type=int, default=3, help="old/new block pairs per recipe")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (0: torch's default)")
    parser.add_argument("--precision", default="bf16", choices=["fp32", "bf16"],
                        help="training.precision for both (default bf16, the studies' CPU precision)")
    parser.add_argument("--name", default="bench_commits", help="report: benchmarks/results/NAME.md")
    parser.add_argument("--smoke", metavar="DIR", help=common.SMOKE_HELP + " (HEAD against itself)")
    args = parser.parse_args()

    # a stopped run (SIGTERM) still removes its scratch worktree: the finally below runs on SystemExit
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    scratch = Path(tempfile.mkdtemp(prefix="bench_commits_"))
    against = args.against
    if args.smoke:
        smoke_config, smoke_dataset = common.smoke_task(Path(args.smoke))
        against, args.recipes, args.steps, args.log_every, args.rounds = "HEAD", ["smoke"], 4, 2, 1
        args.dataset = str(smoke_dataset)
    head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True,
                          text=True, check=True).stdout.strip()
    if subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain", "--untracked-files=no"],
                      capture_output=True, text=True).stdout.strip():
        head += "+dirty"  # the new side runs the working tree, changes not committed included
    dataset = Path(args.dataset) if Path(args.dataset).is_absolute() else ROOT / args.dataset
    dataset = dataset.resolve()
    rows, report_rows = [], []
    old = scratch / f"wt_{against[:12]}"
    try:
        old = worktree(against, scratch)
        for recipe in args.recipes:
            configs = {}
            for label, code in (("old", old), ("new", ROOT)):
                configs[label] = (Path(smoke_config) if args.smoke
                                  else code / "configs" / f"multi30k_en_de_{recipe}.yaml")
                if not configs[label].is_file():
                    raise SystemExit(f"bench_commits: {configs[label]} does not exist")
            speeds: dict[str, list[float]] = {"old": [], "new": []}
            for r in range(args.rounds):
                order = ("old", "new") if r % 2 == 0 else ("new", "old")
                for label in order:
                    code = old if label == "old" else ROOT
                    speed = train_block(code, configs[label], dataset, scratch / f"run_{label}", args)
                    speeds[label].append(speed)
                    print(f"{recipe:<16} round {r + 1} {label}: {speed:,.0f} tgt tok/s", flush=True)
            ratio = statistics.median(speeds["new"]) / statistics.median(speeds["old"])
            per_round = [n / o for n, o in zip(speeds["new"], speeds["old"])]
            rows.append((recipe, ratio, min(per_round), max(per_round)))
            report_rows.append([recipe, f"{statistics.median(speeds['old']):,.0f}",
                                f"{statistics.median(speeds['new']):,.0f}", f"{ratio:.3f}",
                                f"{min(per_round):.3f}–{max(per_round):.3f}"])
    finally:
        drop_worktree(old)
        shutil.rmtree(scratch, ignore_errors=True)

    print(f"\nthis checkout ({head}) against {against}: median target tokens/s ratio (per-round range)")
    for recipe, ratio, low, high in rows:
        print(f"  {recipe:<16} {ratio:.3f}  ({low:.3f}–{high:.3f})")
    table = common.markdown_table(
        ["recipe", f"{against} tok/s", f"{head} tok/s", "ratio (new / old)", "per-round range"], report_rows)
    settings = (f"{args.rounds} rounds of alternating blocks, {args.steps} updates a block, median of the "
                f"{args.log_every}-update windows after the first; {args.precision}, {args.threads} thread(s), "
                f"eager, dataset {dataset}; each side trains its own commit's recipe file")
    machine = common.machine()
    path = common.write_report(args.name, f"Training speed: {head} against {against}",
                               [("Settings", settings), ("Results", table)], machine)
    print(f"report: {path}")


if __name__ == "__main__":
    main()
