"""structnmt against Joey NMT 2.3.0: training target tokens/s and beam-5 decoding sentences/s.

    python benchmarks/bench_joey.py                    # 200 training steps each, then decoding
    python benchmarks/bench_joey.py --steps 20 --log-every 5 --decode-limit 50   # smoke run

Both toolkits get the same task: the cleaned Multi30k En->De training pairs of structnmt's
prepared (parse-free) dataset, the same joint 8k SentencePiece model (Joey's
``sentencepiece`` tokenizer reads structnmt's ``spm.model``; its vocabulary file lists the
same pieces), the same architecture (3+3 pre-norm layers, d_model 256, 4 heads, ff 1024,
tied embeddings and output layer, dropout 0.2), Adam with the same schedule, label
smoothing and clipping, and 4096-token batches. Each toolkit is run as its own command
(Joey NMT from an interpreter that imports it, ``--joey-python`` or this one, else from a
separate virtual environment the script builds) and measured from its own
training log: the windows of ``--log-every`` updates after the first one (warm-up).

Decoding is only fair between models that stop at the same time: an untrained model never
emits EOS and decodes to the length limit. So both models are the ones just trained for the
same number of updates on the same batches, or trained checkpoints given with
``--checkpoint`` / ``--joey-checkpoint``; the mean output length of each is reported beside
the speed so the reader can see the work was comparable. Length limits: Joey NMT's
1.5 x (longest source in the batch); structnmt's recipe 1.5 x source + 10 (per sentence).
Both use beam 5, length penalty alpha 0.6 and batches of ``--decode-tokens`` tokens.
Decoding time is each toolkit's own generation time (Joey: "Generation took"; structnmt:
``translate_split`` on the prepared split), with model loading excluded for both.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import common  # noqa: E402
from bench_train import BASE_CONFIG, PLAIN_OVERRIDES, plain_dataset  # noqa: E402

JOEY_ENV = common.ENVS / "joey"
WORK = common.ENVS / "joey-run"
TORCH_VERSION = "2.13.0"  # the torch of this project: pip finds the local CPU wheel (find-links)
#: Joey 2.3.0 imports importlib_metadata without requiring it; 10.x needs lazy_importer, which
#: nothing installs, so the pin stays below 10
JOEY_PACKAGES = ["joeynmt==2.3.0", "importlib_metadata<10", "sentencepiece==0.2.0"]
#: joeynmt.helpers imports importlib_metadata: a bare `import joeynmt` passes without it
JOEY_CHECK = "import joeynmt, joeynmt.helpers, torch; print(joeynmt.__version__, torch.__version__)"


# ---------------------------------------------------------------------------
# Joey NMT's environment and inputs


def joey_python() -> Path:
    return JOEY_ENV / "bin" / "python"


def joey_version(python: str | Path) -> str | None:
    """"JOEY_VERSION TORCH_VERSION" when ``python`` imports joeynmt (and torch), else None."""
    if not Path(python).exists() and shutil.which(str(python)) is None:
        return None
    result = common.run_command([str(python), "-c", JOEY_CHECK], env=joey_env())
    lines = result.output.strip().splitlines()
    return lines[-1] if result.returncode == 0 and lines else None


def find_joey_python(given: str | Path | None = None) -> Path | None:
    """An interpreter that imports joeynmt, found without installing anything (a machine with
    no network, such as a borrowed GPU): ``given`` alone when set, else this interpreter, else
    the venv built by an earlier run; None when none does."""
    candidates = [Path(given)] if given else [Path(sys.executable), joey_python()]
    for python in candidates:
        if joey_version(python):
            return python
    return None


def ensure_joey_env(given: str | Path | None = None) -> Path:
    """An interpreter with Joey NMT: ``given`` (``--joey-python``), else this interpreter when
    it imports joeynmt, else ``benchmarks/envs/joey``, built on first use: a separate venv with
    Joey NMT 2.3.0 and a CPU torch (installing torch first keeps pip from pulling a CUDA build
    for Joey's ``torch`` requirement)."""
    found = find_joey_python(given)
    if found:
        return found
    if given:
        sys.exit(f"error: {given} cannot import joeynmt (tried: {JOEY_CHECK})")
    python = joey_python()
    print(f"building {JOEY_ENV} (network and disk; a few minutes)", file=sys.stderr)
    steps = [[sys.executable, "-m", "venv", str(JOEY_ENV)],
             [str(python), "-m", "pip", "install", "-q", f"torch=={TORCH_VERSION}"],
             [str(python), "-m", "pip", "install", "-q", *JOEY_PACKAGES]]
    for cmd in steps:
        result = common.run_command(cmd)
        if result.returncode != 0:
            sys.exit(f"error: {' '.join(cmd)} failed:\n{result.output[-3000:]}")
    if not joey_version(python):
        sys.exit(f"error: {python} was built but cannot import joeynmt (tried: {JOEY_CHECK})")
    return python


def write_joey_inputs(dataset: Path, work: Path, steps: int, log_every: int, decode_tokens: int,
                      max_tokens: int, test_limit: int = 0, test_split: str = "test_2016_flickr") -> Path:
    """Joey's data files (the prepared dataset's cleaned raw text), vocabulary and config."""
    import sentencepiece as spm
    import yaml

    from structnmt import load_config

    base = load_config(BASE_CONFIG)
    m, t = base.model, base.training
    data = work / "data"
    data.mkdir(parents=True, exist_ok=True)
    for split, limit in (("train", None), ("val", 20), (test_split, test_limit or None)):
        for side, lang in (("src", "en"), ("tgt", "de")):
            lines = (dataset / split / f"raw.{side}.txt").read_text(encoding="utf-8").splitlines(keepends=True)
            (data / f"{split}.{lang}").write_text("".join(lines[:limit]), encoding="utf-8")
    sp = spm.SentencePieceProcessor(model_file=str(dataset / "spm.model"))
    pieces = [sp.id_to_piece(i) for i in range(4, sp.get_piece_size())]  # Joey adds the four specials
    (work / "vocab.txt").write_text("".join(p + "\n" for p in pieces), encoding="utf-8")
    side = {"level": "bpe", "lowercase": False, "max_length": 10**4, "voc_file": str(work / "vocab.txt"),
            "tokenizer_type": "sentencepiece", "tokenizer_cfg": {"model_file": str(dataset / "spm.model")}}
    stack = {"type": "transformer", "num_layers": m.enc_layers, "num_heads": m.n_heads,
             "embeddings": {"embedding_dim": m.d_model, "scale": True}, "hidden_size": m.d_model,
             "ff_size": m.d_ff, "dropout": m.dropout, "layer_norm": m.norm}
    config = {
        "name": "bench", "joeynmt_version": "2.3.0", "model_dir": str(work / "model"),
        "use_cuda": False, "fp16": False, "random_seed": t.seed,
        "data": {"train": str(data / "train"), "dev": str(data / "val"), "test": str(data / test_split),
                 "dataset_type": "plain", "src": {"lang": "en", **side}, "trg": {"lang": "de", **side},
                 "special_symbols": {"unk_token": "<unk>", "unk_id": 0, "pad_token": "<pad>", "pad_id": 1,
                                     "bos_token": "<s>", "bos_id": 2, "eos_token": "</s>", "eos_id": 3}},
        "testing": {"load_model": str(work / "model" / "latest.ckpt"), "n_best": 1, "beam_size": 5,
                    "beam_alpha": 0.6, "batch_size": decode_tokens, "batch_type": "token",
                    "eval_metrics": ["bleu"], "sacrebleu_cfg": {"tokenize": "13a"}},
        "training": {"optimizer": "adam", "adam_betas": list(t.betas), "learning_rate": t.lr,
                     "scheduling": "warmupinversesquareroot", "learning_rate_warmup": t.warmup,
                     "clip_grad_norm": t.clip_norm, "label_smoothing": t.label_smoothing,
                     "loss": "crossentropy", "normalization": "tokens", "batch_size": max_tokens,
                     "batch_type": "token", "batch_multiplier": 1, "epochs": 1000, "updates": steps,
                     "validation_freq": 10**9, "logging_freq": log_every, "shuffle": True, "overwrite": True,
                     "early_stopping_metric": "bleu", "print_valid_sents": [], "keep_best_ckpts": 1,
                     "num_workers": 0},
        "model": {"initializer": "xavier_uniform", "embed_initializer": "xavier_uniform", "bias_initializer": "zeros",
                  "tied_embeddings": True, "tied_softmax": True, "encoder": stack, "decoder": stack},
    }
    path = work / "joey.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False), encoding="utf-8")
    return path


# ---------------------------------------------------------------------------
# measuring each toolkit


def harmonic_after_first(rates: list[float]) -> float:
    """Throughput over the windows after the first (warm-up); windows of equal step counts and
    near-equal token counts, so the harmonic mean of their rates is tokens / time."""
    if len(rates) < 2:
        raise RuntimeError(f"need at least two logging windows, got {len(rates)} (lower --log-every)")
    return statistics.harmonic_mean(rates[1:])


def mean_pieces(hyps: list[str], spm_model: Path) -> float:
    """Mean output length in the shared sub-words: the decoding work each system did."""
    import sentencepiece as spm

    sp = spm.SentencePieceProcessor(model_file=str(spm_model))
    return statistics.mean(len(sp.encode(h)) for h in hyps) if hyps else 0.0


def thread_env(threads: int) -> dict[str, str]:
    env = dict(os.environ)
    if threads > 0:
        env["OMP_NUM_THREADS"] = str(threads)
    return env


def joey_env(threads: int = 0) -> dict[str, str]:
    """``thread_env`` with ``JOEY_PYTHONPATH`` (set by ``gpu_env.sh``) first on the path: packages
    Joey NMT needs in older versions than structnmt's (sentencepiece 0.2.0, whose
    ``SetVocabulary`` Joey 2.3.0 calls), seen by Joey's commands alone."""
    env = thread_env(threads)
    extra = env.get("JOEY_PYTHONPATH")
    if extra:
        env["PYTHONPATH"] = os.pathsep.join(p for p in (extra, env.get("PYTHONPATH")) if p)
    return env


def joey_train(python: Path, config: Path, threads: int) -> tuple[float, int]:
    result = common.run_command([str(python), "-m", "joeynmt", "train", str(config), "--skip-test"],
                                env=joey_env(threads), log=WORK / "joey_train.out")
    if result.returncode != 0:
        sys.exit(f"error: Joey NMT training failed (see {WORK / 'joey_train.out'}):\n{result.output[-3000:]}")
    rates = [float(x) for x in re.findall(r"Tokens per Sec:\s*([\d.]+)", result.output)]
    return harmonic_after_first(rates), result.peak_rss


def joey_decode(python: Path, config: Path, threads: int, checkpoint: str | None, spm_model: Path) -> dict[str, Any]:
    if checkpoint:
        import yaml

        cfg = yaml.safe_load(config.read_text(encoding="utf-8"))
        cfg["testing"]["load_model"] = checkpoint
        config.write_text(yaml.safe_dump(cfg, sort_keys=False), encoding="utf-8")
    out = WORK / "joey_hyps"
    result = common.run_command([str(python), "-m", "joeynmt", "test", str(config), "-o", str(out)],
                                env=joey_env(threads), log=WORK / "joey_test.out")
    if result.returncode != 0:
        sys.exit(f"error: Joey NMT decoding failed (see {WORK / 'joey_test.out'}):\n{result.output[-3000:]}")
    seconds = float(re.findall(r"Generation took ([\d.]+)\[sec\]", result.output)[-1])  # dev first, then test
    hyps = Path(f"{out}.test").read_text(encoding="utf-8").splitlines()
    return {"seconds": seconds, "sentences": len(hyps), "pieces": mean_pieces(hyps, spm_model),
            "peak_rss": result.peak_rss}


def structnmt_train(dataset: Path, steps: int, log_every: int, threads: int,
                    max_tokens: int, precision: str = "auto", config: str = BASE_CONFIG,
                    work: Path = WORK, device: str = "cpu", sets: dict[str, Any] | None = None,
                    plain: bool | None = None) -> tuple[float, int, Path]:
    """``structnmt train`` as a user runs it, on the parse-free dataset: the recipe's data section
    with the parse-free settings too (``plain``; by default when ``config`` is the base recipe),
    or the dataset's fingerprint check refuses the run. ``sets`` go last (``--set`` overrides)."""
    run = work / ("structnmt" if precision == "auto" else f"structnmt_{precision}")
    plain = PLAIN_OVERRIDES if (config == BASE_CONFIG if plain is None else plain) else {}
    sets = {**plain, "training.precision": precision, "data.dir": dataset, "training.out_dir": run,
            "training.max_steps": steps,
            "training.log_every": log_every, "training.valid_every": 0, "training.valid_bleu": "false",
            "training.tensorboard": "false", "training.progress": "false", "training.threads": threads,
            "training.max_minutes": 0, "training.device": device, "training.max_tokens": max_tokens,
            **(sets or {})}
    cmd = [sys.executable, "-m", "structnmt.cli.main", "train", config]
    for key, value in sets.items():
        cmd += ["--set", f"{key}={value}"]
    shutil.rmtree(run, ignore_errors=True)
    work.mkdir(parents=True, exist_ok=True)
    result = common.run_command(cmd, env=thread_env(threads), log=work / f"{run.name}_train.out")
    if result.returncode != 0:
        sys.exit(f"error: structnmt training failed (see {work / f'{run.name}_train.out'}):\n{result.output[-3000:]}")
    rates = []
    for line in (run / "log.jsonl").read_text(encoding="utf-8").splitlines():
        record = json.loads(line)
        if record.get("kind") == "train":
            rates.append(record["tgt_tokens_per_s"])
    return harmonic_after_first(rates), result.peak_rss, run / "last.pt"


def structnmt_decode(checkpoint: str, dataset: str, split: str, beam: int, decode_tokens: int,
                     threads: int, limit: int, device: str = "cpu") -> dict[str, Any]:
    """Beam search over a prepared split in this process (run by ``run_with_peak_rss``)."""
    import dataclasses

    from structnmt.data.dataset import ParallelDataset
    from structnmt.data.pipeline import Preprocessor
    from structnmt.decoding.translate import translate_split
    from structnmt.training.checkpoint import load_model

    common.set_threads(threads)
    model, cfg, _ = load_model(checkpoint, device, dataset_dir=dataset)
    pre = Preprocessor.from_dataset(dataset)
    data = ParallelDataset(Path(dataset), split)
    if limit:
        data.src_lengths = data.src_lengths[:limit]
    dcfg = dataclasses.replace(cfg.decoding, beam=beam, max_tokens=decode_tokens)
    started = time.perf_counter()
    hyps = translate_split(model, data, pre, dcfg, device)
    if device.startswith("cuda"):
        import torch

        torch.cuda.synchronize()
    seconds = time.perf_counter() - started
    return {"seconds": seconds, "sentences": len(hyps), "pieces": mean_pieces(hyps, Path(dataset) / "spm.model")}


def smoke(work: Path) -> int:
    """structnmt's half of the benchmark on the smoke task: the training command and the decoding
    function the real run uses, a few steps and sentences."""
    config, dataset = common.smoke_task(work)
    tps, rss, last = structnmt_train(dataset, 4, 2, 1, 512, config=str(config), work=work)
    decoded = structnmt_decode(str(last), str(dataset), "test", 5, 2000, 1, 5)
    print(f"smoke: structnmt trained at {tps:.0f} target tokens/s (peak RSS {common.mib(rss)}), decoded "
          f"{decoded['sentences']} sentences in {decoded['seconds']:.2f} s")
    return 0


# ---------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=200, help="training updates of each toolkit")
    parser.add_argument("--log-every", type=int, default=20, help="updates per throughput window")
    parser.add_argument("--max-tokens", type=int, default=4096, help="batch size in tokens (both)")
    parser.add_argument("--threads", type=int, default=0, help="threads of each toolkit (0: their default)")
    parser.add_argument("--decode-tokens", type=int, default=8000, help="tokens per decoding batch (both)")
    parser.add_argument("--decode-limit", type=int, default=0,
                        help="decode only the first N test sentences, both toolkits (smoke runs)")
    parser.add_argument("--checkpoint", help="trained structnmt checkpoint for decoding (on the plain dataset)")
    parser.add_argument("--joey-checkpoint", help="trained Joey NMT checkpoint for decoding")
    parser.add_argument("--skip-train", action="store_true", help="decoding only (needs both checkpoints)")
    parser.add_argument("--fp32-too", action="store_true",
                        help="also train structnmt in fp32 (Joey NMT trains in fp32 on a CPU; structnmt's "
                             "default precision 'auto' is bf16 on CPUs with native bf16)")
    parser.add_argument("--joey-python", metavar="PATH",
                        help="an interpreter that imports joeynmt (default: this one when it does, else "
                             f"{JOEY_ENV}, built with pip on first use)")
    parser.add_argument("--name", default="joey", help="report: benchmarks/results/NAME.md")
    parser.add_argument("--smoke", metavar="DIR",
                        help=common.SMOKE_HELP + ": structnmt's side only (Joey NMT's environment is a 1.6 GB "
                             "install), in DIR")
    args = parser.parse_args(argv)
    if args.smoke:
        return smoke(Path(args.smoke))
    if args.skip_train and not (args.checkpoint and args.joey_checkpoint):
        parser.error("--skip-train needs --checkpoint and --joey-checkpoint")

    from structnmt.errors import StructNMTError

    python = ensure_joey_env(args.joey_python)
    try:
        dataset = plain_dataset()
    except StructNMTError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    WORK.mkdir(parents=True, exist_ok=True)
    config = write_joey_inputs(dataset, WORK, args.steps, args.log_every, args.decode_tokens, args.max_tokens,
                               args.decode_limit)
    info = common.machine()
    sections = [("Setup", f"Dataset `{dataset}` (parse-free copy of `{BASE_CONFIG}`'s data); Joey NMT config "
                          f"`{config}`; {args.steps} updates of at most {args.max_tokens} tokens each; "
                          f"throughput from each toolkit's log, windows of {args.log_every} updates after the "
                          "first; threads: " + (str(args.threads) if args.threads else "library default"))]

    checkpoint = args.checkpoint
    if not args.skip_train:
        joey_tps, joey_rss = joey_train(python, config, args.threads)
        print(f"Joey NMT: {joey_tps:.0f} target tokens/s (peak RSS {common.mib(joey_rss)})")
        ours_tps, ours_rss, last = structnmt_train(dataset, args.steps, args.log_every, args.threads,
                                                   args.max_tokens)
        checkpoint = checkpoint or str(last)
        print(f"structnmt: {ours_tps:.0f} target tokens/s (peak RSS {common.mib(ours_rss)}); "
              f"ratio {ours_tps / joey_tps:.2f}x (target >= 2x)")
        rows = [["Joey NMT 2.3.0 (fp32)", round(joey_tps), "1.00x", common.mib(joey_rss)],
                ["structnmt (precision auto: bf16 autocast here)", round(ours_tps), f"**{ours_tps / joey_tps:.2f}x**",
                 common.mib(ours_rss)]]
        if args.fp32_too:
            fp32_tps, fp32_rss, _ = structnmt_train(dataset, args.steps, args.log_every, args.threads,
                                                    args.max_tokens, precision="fp32")
            print(f"structnmt fp32: {fp32_tps:.0f} target tokens/s; ratio {fp32_tps / joey_tps:.2f}x")
            rows.append(["structnmt (fp32)", round(fp32_tps), f"{fp32_tps / joey_tps:.2f}x", common.mib(fp32_rss)])
        sections.append(("Training (target: structnmt >= 2x Joey NMT)", common.markdown_table(
            ["toolkit", "target tokens/s", "against Joey NMT", "peak RSS (whole command)"], rows)))

    joey = joey_decode(python, config, args.threads, args.joey_checkpoint, dataset / "spm.model")
    print(f"Joey NMT decoding: {joey['sentences']} sentences in {joey['seconds']:.1f}s "
          f"({joey['sentences'] / joey['seconds']:.2f} sent/s, {joey['pieces']:.1f} sub-words/sentence)")
    ours, ours_rss = common.run_with_peak_rss(structnmt_decode, checkpoint, str(dataset), "test_2016_flickr", 5,
                                              args.decode_tokens, args.threads, args.decode_limit)
    joey_sps = joey["sentences"] / joey["seconds"]
    ours_sps = ours["sentences"] / ours["seconds"]
    print(f"structnmt decoding: {ours['sentences']} sentences in {ours['seconds']:.1f}s ({ours_sps:.2f} sent/s, "
          f"{ours['pieces']:.1f} sub-words/sentence); ratio {ours_sps / joey_sps:.2f}x (target >= 3x)")
    sections.append(("Decoding test_2016_flickr, beam 5 (target: structnmt >= 3x Joey NMT)", common.markdown_table(
        ["toolkit", "sentences", "seconds", "sentences/s", "sub-words per output", "peak RSS"],
        [["Joey NMT 2.3.0", joey["sentences"], round(joey["seconds"], 1), round(joey_sps, 2),
          round(joey["pieces"], 1), common.mib(joey["peak_rss"]) + " (whole command)"],
         ["structnmt", ours["sentences"], round(ours["seconds"], 1), round(ours_sps, 2), round(ours["pieces"], 1),
          common.mib(ours_rss) + " (decoding process)"],
         ["ratio", "", "", f"**{ours_sps / joey_sps:.2f}x**", "", ""]])
        + f"\n\nCheckpoints: structnmt `{checkpoint}`, Joey NMT "
          f"`{args.joey_checkpoint or WORK / 'model' / 'latest.ckpt'}`."))
    path = common.write_report(args.name, "structnmt against Joey NMT 2.3.0", sections, info)
    print(f"report: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
