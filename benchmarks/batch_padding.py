"""How much of a training batch is padding, as the trainer plans and pads batches.

    python benchmarks/batch_padding.py [--dataset data/multi30k_en_de] [--max-tokens 4096] [--epochs 2]

Target tokens/s counts real target tokens; a GPU computes every padded cell. For each epoch's
planned batches (``token_batches``, shuffled as in training) it prints the real target tokens as
a share of the padded target cells: lengths padded to a multiple of 8 (compiled training on
CUDA), to the length buckets CUDA graphs use (both sides to the bucket of the longer), and with
filler rows to the batch-size bucket as well; and the number of batch shapes (one CUDA graph
each). Reads only the dataset's lengths: no model, no device.
"""

from __future__ import annotations

import argparse

import numpy as np

from structnmt.data.batching import _padded_length, bucket, token_batches
from structnmt.data.dataset import ParallelDataset


def padding_shares(src: np.ndarray, tgt: np.ndarray, max_tokens: int, epoch: int, seed: int = 1) -> dict[str, float]:
    """One epoch's real target tokens as a share of the padded target cells, three ways, and its
    batch shapes under CUDA graphs' buckets."""
    batches = token_batches(src, tgt, max_tokens, shuffle=True, seed=seed, epoch=epoch)
    real = by8 = buckets = rows_too = 0
    shapes = set()
    for idx in batches:
        s, t, rows = src[idx], tgt[idx], len(idx)
        real += int((t + 1).sum())  # each target sentence and its EOS
        by8 += rows * _padded_length(int(t.max()) + 1, 8, 0)  # collate's own rounding
        length = _padded_length(int(max(s.max(), t.max())) + 1, 8, 0, bucketed=True)  # both sides, the longer's bucket
        buckets += rows * length
        rows_too += bucket(rows, 1) * length
        shapes.add((bucket(rows, 1), length))
    return {"batches": len(batches), "real": real, "multiple_of_8": real / by8, "length_buckets": real / buckets,
            "length_and_rows": real / rows_too, "shapes": len(shapes)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--dataset", default="data/multi30k_en_de")
    p.add_argument("--split", default="train")
    p.add_argument("--max-tokens", type=int, default=4096)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--seed", type=int, default=1)
    args = p.parse_args(argv)
    ds = ParallelDataset(args.dataset, args.split)
    src, tgt = np.asarray(ds.src_lengths), np.asarray(ds.tgt_lengths)
    for epoch in range(1, args.epochs + 1):
        f = padding_shares(src, tgt, args.max_tokens, epoch, args.seed)
        print(f"epoch {epoch}: {f['batches']} batches, {f['real'] / f['batches']:,.0f} real target tokens a batch; "
              f"real share of the padded target cells: multiple of 8 {f['multiple_of_8']:.3f}, length buckets "
              f"{f['length_buckets']:.3f}, length and batch-size buckets {f['length_and_rows']:.3f}; "
              f"{f['shapes']} shapes")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
