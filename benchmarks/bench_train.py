"""Training throughput of vanilla structnmt and of every structure-aware recipe, with the
hardware efficiency and peak memory of training.

    python benchmarks/bench_train.py                       # vanilla + every Multi30k En->De recipe
    python benchmarks/bench_train.py --methods dbsa_src pascal --steps 10 --rounds 2

What is timed is the real training path: ``token_batches`` -> ``collate`` (structure
tensors included) -> ``Updater.update`` (forward, label-smoothed loss, the methods'
losses, backward, clipping, Adam, schedule), on the prepared Multi30k En->De dataset.

* Every model trains on the *same* batches: the first ``--steps`` batches of epoch 1. After
  ``--warmup`` untimed updates, a block is one pass over those batches.
* Overhead of a method = 1 - (its target tokens/s) / (vanilla's), from blocks interleaved
  vanilla, method, vanilla, method, ... (``--rounds`` pairs), so that drift of the machine
  (other processes, thermal limits) falls on both sides alike.
* FLOP/s: matrix-multiply FLOPs of the padded batches counted analytically (the usual
  "model FLOPs" convention: projections, attention products, feed-forward and output layer,
  x3 for forward + backward; elementwise work not counted) / the time, against the peak of
  large matrix multiplies measured at the start of the run (8,192³ on a GPU, where smaller
  products fall far short of it; 1,024³ and 2,048³ on a CPU).
* Peak memory: a fresh process trains vanilla for ``--warmup + --steps`` updates; its peak RSS.

The recipes need source parses: by default the dataset is ``data/multi30k_en_de`` (from
``structnmt prepare configs/multi30k_en_de_transformer.yaml``); if that is missing, a
parse-free copy is prepared (``data/multi30k_en_de_plain``) and the methods whose structure
fields it lacks are skipped, each with the reason.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import common  # noqa: E402  (a script beside this one, not a package)

BASE_CONFIG = "configs/multi30k_en_de_transformer.yaml"
PARSED_DIR = "data/multi30k_en_de"
PLAIN_DIR = "data/multi30k_en_de_plain"
#: overrides that make the base recipe's dataset parse-free (sub-words only)
PLAIN_OVERRIDES = {"data.src.parser.backend": "none", "data.src.scenes": "none", "data.dir": PLAIN_DIR}


# ---------------------------------------------------------------------------
# dataset


def plain_dataset(config: str = BASE_CONFIG) -> Path:
    """The base recipe's data without parses: what vanilla and Joey NMT train on."""
    from structnmt import load_config
    from structnmt.data.prepare import prepare

    cfg = load_config(config, PLAIN_OVERRIDES)
    return prepare(cfg, verbose=False)


def pick_dataset(given: str | None, config: str = BASE_CONFIG) -> Path:
    if given:
        if not (Path(given) / "meta.json").is_file():
            from structnmt.errors import DataError

            raise DataError("not a prepared dataset (no meta.json): run `structnmt prepare` first", given)
        return Path(given)
    if (Path(PARSED_DIR) / "meta.json").is_file():
        return Path(PARSED_DIR)
    print(f"{PARSED_DIR} is not prepared: using a parse-free copy ({PLAIN_DIR}); methods that need "
          "parses will be skipped", file=sys.stderr)
    return plain_dataset(config)


# ---------------------------------------------------------------------------
# FLOPs


def batch_matmul_flops(model_cfg: Any, vocab: int, batch_size: int, src_len: int, tgt_len: int) -> float:
    """Forward + backward matmul FLOPs of one padded batch (backward = 2x forward).

    Attention products are counted over the full padded square (causal ones too): that is
    the work the kernels are given, and the convention published FLOP counts use.
    """
    d, ff, B, S, T = model_cfg.d_model, model_cfg.d_ff, batch_size, src_len, tgt_len
    enc = model_cfg.enc_layers * (2 * B * S * (4 * d * d + 2 * d * ff) + 2 * 2 * B * S * S * d)
    dec_self = 2 * B * T * 4 * d * d + 2 * 2 * B * T * T * d
    dec_cross = 2 * B * T * 2 * d * d + 2 * B * S * 2 * d * d + 2 * 2 * B * T * S * d
    dec = model_cfg.dec_layers * (dec_self + dec_cross + 2 * B * T * 2 * d * ff)
    output = 2 * B * T * d * vocab
    return 3.0 * (enc + dec + output)


def achieved_flops(model_cfg: Any, vocab: int, ds: Any, batches: list, tokens_per_s: float) -> float:
    """Matmul FLOP/s of training at ``tokens_per_s`` on exactly ``batches`` (one pass's FLOPs
    over one pass's time)."""
    flops = 0.0
    for indices in batches:
        src_len = int(ds.src_lengths[indices].max()) + 1
        tgt_len = int(ds.tgt_lengths[indices].max()) + 1
        flops += batch_matmul_flops(model_cfg, vocab, len(indices), src_len, tgt_len)
    tokens_per_pass = sum(int(ds.tgt_lengths[i].sum()) + len(i) for i in batches)
    return flops / (tokens_per_pass / tokens_per_s)


# ---------------------------------------------------------------------------
# one trainable variant


@dataclasses.dataclass
class Variant:
    name: str
    config: Any
    updater: Any
    fields: dict[str, set[str]]
    tokens: int = 0
    seconds: float = 0.0


def build_variant(name: str, recipe: str, dataset: Path, training: Any, device: Any,
                  compile: str = "off") -> Variant:
    """Model and optimiser of one recipe; training hyper-parameters are vanilla's for all."""
    import torch

    from structnmt import load_config
    from structnmt.data.pipeline import Preprocessor
    from structnmt.model.transformer import Transformer
    from structnmt.training.checks import check_methods_against_dataset
    from structnmt.training.trainer import Updater, vocab_sizes

    cfg = load_config(recipe, {"data.dir": str(dataset)})
    src_vocab, tgt_vocab = vocab_sizes(Preprocessor.from_dataset(dataset))
    torch.manual_seed(training.seed)
    model = Transformer(cfg.model, src_vocab, tgt_vocab)
    check_methods_against_dataset(model, dataset)  # what the trainer refuses before a run
    updater = Updater(model, training, device, compile=compile)
    return Variant(name, cfg, updater, model.structure_needs())


def run_block(variant: Variant, dataset: Any, batches: list, sync: bool = False) -> tuple[int, float]:
    """One timed pass over ``batches``: collation included, as in the trainer's loop."""
    import torch

    from structnmt.data.batching import collate
    from structnmt.training.compiled import length_multiple

    # lengths padded as the trainer pads them (training.pad_to_multiple: 8 when compiled on CUDA)
    multiple = length_multiple(0, variant.updater.compiled, variant.updater.device)
    started = time.perf_counter()
    tokens = 0
    for indices in batches:
        stats = variant.updater.update([collate(dataset, indices, variant.fields, multiple)])
        tokens += stats.tokens
    if sync and torch.cuda.is_available():
        torch.cuda.synchronize()
    return tokens, time.perf_counter() - started


def warm_up(variant: Variant, dataset: Any, batches: list) -> float:
    """The untimed first updates (with compile: the compilations, reported apart); seconds."""
    from structnmt.training.compiled import graphs_compiled

    before = graphs_compiled()
    _, seconds = run_block(variant, dataset, batches)
    if variant.updater.compiled:
        print(f"{variant.name}: warm-up with torch.compile {seconds:.1f} s, "
              f"{graphs_compiled() - before} graph(s)")
    return seconds


def compare_compiled(args: Any, base: Any, dataset: Path, ds: Any, batches: list, training: Any, device: Any,
                     peak: float, precision: str) -> list[list[Any]]:
    """Vanilla compiled against vanilla eager in interleaved blocks on the same batches: the
    speed-up, the share of the matmul peak of each, and the compile warm-up apart."""
    from structnmt.training.compiled import graphs_compiled

    eager = build_variant("vanilla eager", args.config, dataset, training, device, "off")
    compiled = build_variant("vanilla compiled", args.config, dataset, training, device, "on")
    if not compiled.updater.compiled:
        print(f"compile unavailable: {compiled.updater.compile_reason}")
        return []
    warm_up(eager, ds, batches[: args.warmup])
    warm = warm_up(compiled, ds, batches[: args.warmup])
    before = graphs_compiled()
    speeds: dict[str, list[float]] = {"eager": [], "compiled": []}
    for _ in range(args.rounds):
        for key, variant in (("eager", eager), ("compiled", compiled)):
            tokens, seconds = run_block(variant, ds, batches[: args.steps], sync=True)
            speeds[key].append(tokens / seconds)
    recompiles = graphs_compiled() - before
    vocab = eager.updater.model.src_embed.num_embeddings
    rows = []
    for key in ("eager", "compiled"):
        tps = sum(speeds[key]) / len(speeds[key])
        share = achieved_flops(base.model, vocab, ds, batches[: args.steps], tps) / peak
        rows.append([key, round(tps), f"{share:.1%}"])
    ratio = sum(speeds["compiled"]) / sum(speeds["eager"])
    print(f"vanilla compiled / eager: {ratio:.2f}x target tokens/s ({rows[1][1]} vs {rows[0][1]}); share of the "
          f"{precision} matmul peak {rows[1][2]} vs {rows[0][2]}; compile warm-up {warm:.0f} s; "
          f"{recompiles} recompilation(s) in the timed blocks")
    rows[1].append(f"{ratio:.2f}x")
    rows[0].append("1.00x")
    for row in rows:
        row.append(f"{warm:.0f} s" if row[0] == "compiled" else "-")
    return rows


def train_batches(dataset: Any, training: Any, n: int) -> list:
    from structnmt.data.batching import token_batches

    batches = token_batches(dataset.src_lengths, dataset.tgt_lengths, training.max_tokens, shuffle=True,
                            seed=training.seed, epoch=1)
    return list(batches[:n])


def vanilla_training(config: str, dataset: str, steps: int, warmup: int, threads: int, device: str) -> float:
    """Vanilla training in this process (the memory probe): target tokens/s of the timed part."""
    import torch

    from structnmt import load_config
    from structnmt.data.dataset import ParallelDataset

    common.set_threads(threads)
    training = load_config(config, {"data.dir": dataset}).training
    ds = ParallelDataset(Path(dataset), "train")
    variant = build_variant("vanilla", config, Path(dataset), training, torch.device(device))
    batches = train_batches(ds, training, max(steps, warmup))
    run_block(variant, ds, batches[:warmup])
    tokens, seconds = run_block(variant, ds, batches[:steps], sync=True)
    return tokens / seconds


# ---------------------------------------------------------------------------
# the benchmark


def recipes(pattern: str, selected: list[str] | None, base: str = BASE_CONFIG) -> dict[str, str]:
    """Method recipes by short name (``configs/multi30k_en_de_dbsa_src.yaml`` -> ``dbsa_src``)."""
    prefix = pattern.split("*")[0]
    found = {}
    for path in sorted(Path(".").glob(pattern)):
        name = path.stem[len(Path(prefix).name):]
        if path.as_posix() != Path(base).as_posix():
            found[name] = path.as_posix()
    if selected is None:
        return found
    unknown = [m for m in selected if m not in found]
    if unknown:
        sys.exit(f"error: no recipe for {unknown} (known: {', '.join(found)})")
    return {m: found[m] for m in selected}


def skip_reason(cfg: Any, base: Any, ds: Any, fields: dict[str, set[str]], first: Any) -> str | None:
    """Why a recipe cannot train on this dataset, or None."""
    from structnmt.data.batching import collate
    from structnmt.errors import StructNMTError

    mine, theirs = dataclasses.asdict(cfg.data), dataclasses.asdict(base.data)
    if mine != theirs:
        changed = sorted(k for k in mine if mine[k] != theirs[k])
        return f"needs its own prepared dataset (data.{', data.'.join(changed)} differ from the base recipe)"
    try:
        collate(ds, first, fields)
    except StructNMTError as err:
        return f"dataset lacks its structure fields: {err}"
    return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default=BASE_CONFIG, help="the vanilla recipe (default: %(default)s)")
    parser.add_argument("--dataset", help=f"prepared dataset (default: {PARSED_DIR}, else a parse-free copy)")
    parser.add_argument("--recipes", default="configs/multi30k_en_de_*.yaml", help="method recipes (glob)")
    parser.add_argument("--methods", nargs="*", help="short recipe names (default: all; none: vanilla only)")
    parser.add_argument("--steps", type=int, default=20, help="timed updates per block (default %(default)s)")
    parser.add_argument("--warmup", type=int, default=3, help="untimed updates per model first")
    parser.add_argument("--rounds", type=int, default=2, help="vanilla/method block pairs per method")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    parser.add_argument("--device", default="cpu", help="cpu or cuda (default %(default)s)")
    parser.add_argument("--no-memory", action="store_true", help="skip the peak-memory probe")
    parser.add_argument("--compile", choices=["off", "on", "compare"], default="off",
                        help="training.compile for every model; compare: vanilla compiled against eager "
                             "(interleaved), then the methods compiled against compiled vanilla")
    parser.add_argument("--name", default="train", help="report: benchmarks/results/NAME.md")
    parser.add_argument("--smoke", metavar="DIR", help=common.SMOKE_HELP + " (work files in DIR)")
    args = parser.parse_args(argv)
    if args.smoke:
        _, smoke_dataset = common.smoke_task(Path(args.smoke))
        args.dataset, args.steps, args.warmup, args.rounds, args.no_memory = str(smoke_dataset), 2, 2, 1, True
        args.methods = args.methods if args.methods is not None else ["dbsa_src", "lpsi_synchmse", "pascal"]

    import torch

    from structnmt import load_config
    from structnmt.data.dataset import ParallelDataset
    from structnmt.errors import StructNMTError

    common.set_threads(args.threads)
    if args.compile != "off":
        # one process builds many models here: without a higher limit dynamo stops compiling the
        # shared forward-and-loss function after 8 graphs and runs the later models eagerly
        common.raise_recompile_limits()
    device = torch.device(args.device)
    try:
        dataset = pick_dataset(args.dataset, args.config)
    except StructNMTError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    info = common.machine()
    print(json.dumps(info, indent=1))
    from structnmt.training.environment import pick_precision

    base = load_config(args.config, {"data.dir": str(dataset)})
    # the ceiling is the matmul peak of the precision training runs in (bf16 autocast on this
    # kind of CPU); the fp32 peak is reported beside it
    amp, _ = pick_precision(base.training.precision, device)
    precision = {None: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16"}[amp]
    # on a GPU at 8,192: the 1,024/2,048 of a CPU reach half of an H200's peak (common.GPU_PEAK_SIZES)
    quick = {"sizes": (256,), "repeats": 1} if args.smoke else {"sizes": common.peak_sizes(args.device)}
    peak = common.measure_matmul_peak(args.device, precision, **quick)
    peak32 = peak if precision == "float32" else common.measure_matmul_peak(args.device, "float32", **quick)
    print(f"matmul peak ({precision}): {peak / 1e9:.1f} GFLOP/s; float32: {peak32 / 1e9:.1f} GFLOP/s")

    training = base.training
    if args.smoke:
        training.max_tokens = 512  # the synthetic task's sentences are short
    ds = ParallelDataset(dataset, base.data.train_split)
    batches = train_batches(ds, training, max(args.steps, args.warmup))
    print(f"dataset {dataset}: {len(ds)} training pairs; {len(batches)} batches of <= {training.max_tokens} tokens")

    mode = "on" if args.compile in ("on", "compare") else "off"
    compiled_rows = compare_compiled(args, base, dataset, ds, batches, training, device, peak, precision) \
        if args.compile == "compare" else []
    vanilla = build_variant("vanilla", args.config, dataset, training, device, mode)
    warm_up(vanilla, ds, batches[: args.warmup])
    selected = None if args.methods is None else [m for m in args.methods if m != "none"]
    rows, skipped = [], []
    pairs: list[tuple[Variant, list[float], list[float]]] = []
    for name, recipe in recipes(args.recipes, selected, args.config).items():
        cfg = load_config(recipe, {"data.dir": str(dataset)})
        from structnmt.model.transformer import Transformer

        needs = Transformer(cfg.model, 16, 16).structure_needs()
        reason = skip_reason(cfg, base, ds, needs, batches[0])
        if reason:
            skipped.append((name, reason))
            print(f"skip {name}: {reason}")
            continue
        variant = build_variant(name, recipe, dataset, training, device, mode)
        warm_up(variant, ds, batches[: args.warmup])
        van, met = [], []
        for _ in range(args.rounds):
            for who, out in ((vanilla, van), (variant, met)):
                tokens, seconds = run_block(who, ds, batches[: args.steps], sync=True)
                who.tokens += tokens
                who.seconds += seconds
                out.append(tokens / seconds)
        ratio = sum(met) / sum(van)
        print(f"{name:24s} {sum(met) / len(met):8.0f} tok/s  vanilla {sum(van) / len(van):8.0f} tok/s  "
              f"overhead {100 * (1 - ratio):+.1f}%")
        pairs.append((variant, van, met))
        rows.append([name, round(sum(met) / len(met)), round(sum(van) / len(van)), f"{100 * (1 - ratio):+.1f}%",
                     "yes" if 1 - ratio <= 0.10 else "**no**"])
        del variant  # free the model before the next one

    if not pairs:  # vanilla alone
        for _ in range(args.rounds):
            tokens, seconds = run_block(vanilla, ds, batches[: args.steps], sync=True)
            vanilla.tokens += tokens
            vanilla.seconds += seconds
    vanilla_tps = vanilla.tokens / vanilla.seconds

    src_vocab = vanilla.updater.model.src_embed.num_embeddings
    achieved = achieved_flops(base.model, src_vocab, ds, batches[: args.steps], vanilla_tps)
    print(f"vanilla: {vanilla_tps:.0f} target tokens/s; {achieved / 1e9:.1f} GFLOP/s = "
          f"{100 * achieved / peak:.1f}% of the {precision} matmul peak ({100 * achieved / peak32:.1f}% of fp32's)")

    memory = None
    if not args.no_memory:
        tps, memory = common.run_with_peak_rss(vanilla_training, args.config, str(dataset), args.steps,
                                               args.warmup, args.threads, args.device)
        print(f"peak RSS of training (fresh process, {args.warmup}+{args.steps} updates): {common.mib(memory)} "
              f"({tps:.0f} tok/s there)")

    params = vanilla.updater.model.num_parameters()
    sections = [
        ("Setup", f"Dataset `{dataset}`; recipe `{args.config}` ({base.model.enc_layers}+{base.model.dec_layers} "
                  f"layers, d_model {base.model.d_model}, {base.model.n_heads} heads, ff {base.model.d_ff}, "
                  f"{src_vocab} joint sub-words, {params:,} parameters); batches of at most "
                  f"{training.max_tokens} tokens; device {args.device} (matmul peak at "
                  f"{' and '.join(f'{n:,}³' for n in quick['sizes'])}); {args.warmup} warm-up updates, "
                  f"{args.steps} timed updates per block, {args.rounds} vanilla/method block pairs."),
        ("Vanilla training", common.markdown_table(
            ["training precision", "target tokens/s", "GFLOP/s (matmul, analytic)", "matmul peak GFLOP/s",
             "fraction of peak", "fp32 matmul peak GFLOP/s", "peak RSS"],
            [[precision, round(vanilla_tps), round(achieved / 1e9, 1), round(peak / 1e9, 1), f"{achieved / peak:.1%}",
              round(peak32 / 1e9, 1), common.mib(memory) if memory else "not measured"]])),
    ]
    if compiled_rows:
        sections.append(("Vanilla, compiled against eager (interleaved blocks)", common.markdown_table(
            ["mode", "target tokens/s", f"share of the {precision} matmul peak", "speed-up", "compile warm-up"],
            compiled_rows)))
    if rows:
        sections.append((f"Structure-aware overhead, training.compile {mode} (target: at most 10%)",
                         common.markdown_table(["recipe", "tokens/s", "vanilla tokens/s (interleaved)", "overhead",
                                                "within 10%"], rows)))
    if skipped:
        sections.append(("Skipped recipes", "\n".join(f"- `{n}`: {r}" for n, r in skipped)))
    path = common.write_report(args.name, "Training throughput", sections, info)
    print(f"report: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
