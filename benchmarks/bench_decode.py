"""Beam-5 decoding: structnmt's beam search against CTranslate2 on the same exported model.

    python benchmarks/bench_decode.py --checkpoint runs/multi30k_en_de_transformer/best.pt --threads 1
    python benchmarks/bench_decode.py --smoke /tmp/bench-smoke        # a tiny model, a few sentences

The checkpoint is exported once (``structnmt export ctranslate2``) and CTranslate2 decodes it
in float32 and with int8 weights; structnmt decodes the checkpoint itself. All three get the
same raw source lines of ``--split``, tokenised by structnmt's preprocessing, the same thread
count, beam 5, batches of at most ``--decode-tokens`` source tokens, and no length
normalisation (the two engines' length penalties are different formulas; at alpha 0 both rank
hypotheses by their summed log-probability, so the searches are the same search). Reported:
sentences/s and output sub-words/s of each engine, the ratio against CTranslate2 float32, and
the share of lines where each CTranslate2 run gives structnmt's output. Model loading is not
timed; each engine decodes the split ``--rounds`` times and the fastest round counts (other
processes only ever slow a round down).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import common  # noqa: E402


def smoke_checkpoint(work: Path) -> Path:
    """A vanilla model trained for 40 updates on the smoke task."""
    import yaml

    from structnmt import api

    config, _ = common.smoke_task(work)
    raw = yaml.safe_load(config.read_text(encoding="utf-8"))
    checkpoint = Path(raw["training"]["out_dir"]) / "last.pt"
    if not checkpoint.is_file():
        api.train(config, {"training.max_steps": 40, "training.max_minutes": 0, "training.valid_every": 40,
                           "training.valid_bleu": False, "training.progress": False, "training.tensorboard": False})
    return checkpoint


def fastest(fn, rounds: int) -> tuple[float, list[str]]:
    best, out = float("inf"), []
    for _ in range(rounds):
        started = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - started)
    return best, out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--checkpoint", help="a vanilla (or otherwise exportable) structnmt checkpoint")
    parser.add_argument("--dataset", help="its dataset (default: as its config names it)")
    parser.add_argument("--split", default="test_2016_flickr", help="prepared split whose sources are decoded")
    parser.add_argument("--threads", type=int, default=1, help="threads of both engines (default %(default)s)")
    parser.add_argument("--beam", type=int, default=5)
    parser.add_argument("--decode-tokens", type=int, default=8000, help="source tokens per batch (both engines)")
    parser.add_argument("--limit", type=int, default=0, help="decode only the first N sentences")
    parser.add_argument("--rounds", type=int, default=2, help="decodings of the split per engine; the fastest counts")
    parser.add_argument("--name", default="decode", help="report: benchmarks/results/NAME.md")
    parser.add_argument("--smoke", metavar="DIR", help=common.SMOKE_HELP + " (work files in DIR)")
    args = parser.parse_args(argv)
    if args.smoke:
        args.checkpoint = str(smoke_checkpoint(Path(args.smoke)))
        args.split, args.limit, args.rounds = "test", 10, 1
    if not args.checkpoint:
        parser.error("--checkpoint is required (or --smoke DIR)")

    import torch

    from structnmt import api
    from structnmt.data.dataset import ParallelDataset
    from structnmt.decoding.ctranslate2_export import CTranslate2Translator
    from structnmt.errors import StructNMTError

    common.set_threads(args.threads)
    info = common.machine()
    try:
        translator = api.load(args.checkpoint, device="cpu", dataset=args.dataset)
        sources = ParallelDataset(translator.dataset_dir, args.split).raw("src")
        exported = Path(args.smoke) / "ct2" if args.smoke else common.ENVS / "ct2" / Path(args.checkpoint).parent.name
        api.export_ctranslate2(args.checkpoint, exported, dataset=args.dataset, force=True)
    except StructNMTError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    sources = sources[: args.limit] if args.limit else sources
    spm = translator.preprocessor.subwords["tgt"]

    def pieces(lines: list[str]) -> float:
        return statistics.mean(len(spm.encode(line)[0]) for line in lines) if lines else 0.0

    ours_s, ours = fastest(lambda: translator.translate(sources, beam=args.beam, length_penalty=0.0,
                                                        max_tokens=args.decode_tokens), args.rounds)
    rows = [["structnmt (float32)", len(sources), round(ours_s, 2),
             round(len(sources) / ours_s, 1), round(pieces(ours), 1), "-", ""]]
    print(f"structnmt: {len(sources)} sentences in {ours_s:.2f} s ({len(sources) / ours_s:.1f} sent/s)")
    ratios = {}
    for compute_type in ("float32", "int8"):
        engine = CTranslate2Translator(exported, translator.preprocessor, threads=args.threads,
                                       compute_type=compute_type)
        seconds, theirs = fastest(lambda e=engine: e.translate(sources, beam=args.beam), args.rounds)
        agree = sum(a == b for a, b in zip(ours, theirs)) / max(len(sources), 1)
        ratios[compute_type] = seconds / ours_s
        print(f"CTranslate2 {compute_type}: {seconds:.2f} s ({len(sources) / seconds:.1f} sent/s); structnmt takes "
              f"{ours_s / seconds:.2f}x its time; same output on {agree:.1%} of lines")
        rows.append([f"CTranslate2 {compute_type}", len(sources), round(seconds, 2), round(len(sources) / seconds, 1),
                     round(pieces(theirs), 1), f"{agree:.1%}", f"{ours_s / seconds:.2f}x"])
    rows[0][-1] = "1.00x"
    torch_threads = torch.get_num_threads()
    sections = [
        ("Setup", f"Checkpoint `{args.checkpoint}` (exported to `{exported}`); split `{args.split}`, "
                  f"{len(sources)} sentences; beam {args.beam}, no length normalisation, batches of at most "
                  f"{args.decode_tokens} source tokens; {args.threads} thread(s) each (torch: {torch_threads}); "
                  f"fastest of {args.rounds} round(s). Goal: structnmt within 2x of CTranslate2 float32."),
        ("Decoding", common.markdown_table(
            ["engine", "sentences", "seconds", "sentences/s", "sub-words per output", "same output as structnmt",
             "structnmt's time over this engine's"], rows)),
    ]
    path = common.write_report(args.name, "Beam search: structnmt against CTranslate2", sections, info)
    print(f"report: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
