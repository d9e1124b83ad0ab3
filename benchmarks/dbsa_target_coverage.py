"""Which share of target tokens a decoder-side DBSA head is supervised on.

    python benchmarks/dbsa_target_coverage.py data/multi30k_en_fr [--split train]

A causally masked head cannot attend to a parent that comes later, so the dependency loss
skips those tokens (:func:`structnmt.model.methods.dbsa.dependency_nll`). This counts, over
the stored split, the valid target tokens and the ones the loss keeps, with the very batch
tensors and the very rule the loss uses.
"""

from __future__ import annotations

import argparse
import json

import numpy as np
import torch

from structnmt.data.batching import collate
from structnmt.data.dataset import ParallelDataset


def coverage(dataset: ParallelDataset, batch_size: int = 256) -> dict[str, float]:
    fields = {"src": set(), "tgt": {"parent_first", "valid"}}
    valid_total = kept_total = 0
    for start in range(0, len(dataset), batch_size):
        batch = collate(dataset, np.arange(start, min(start + batch_size, len(dataset))), fields)
        parent, valid = batch.struct["tgt"]["parent_first"], batch.struct["tgt"]["valid"]
        i = parent.shape[1]
        keep = valid & (parent <= torch.arange(i))
        valid_total += int(valid.sum())
        kept_total += int(keep.sum())
    return {"tokens": valid_total, "supervised": kept_total,
            "share_supervised": round(100 * kept_total / max(valid_total, 1), 2)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("dataset")
    ap.add_argument("--split", default="train")
    args = ap.parse_args()
    print(json.dumps(coverage(ParallelDataset(args.dataset, args.split)), indent=2))


if __name__ == "__main__":
    main()
