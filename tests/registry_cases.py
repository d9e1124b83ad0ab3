"""Every registered method (and the vanilla model) as a tiny model, and batches of the synthetic task.

Shared by the device-placement and fp16 tests and by ``benchmarks/gpu_smoke.py``: all cover the
whole method registry. ``all_cases()`` is ``CASES`` (each method at least once, with the variants
whose code paths differ) plus, for a registered method ``CASES`` does not name, the method with
its default parameters: a new method is tested without a line here, and needs one only when its
defaults do not fit the tiny model.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch

from structnmt.config import ModelConfig, config_from_dict
from structnmt.data.batch import Batch
from structnmt.data.batching import collate, token_batches
from structnmt.data.dataset import ParallelDataset
from structnmt.data.prepare import prepare
from structnmt.data.synthetic import demo_config, write_task
from structnmt.model.methods import METHODS
from structnmt.model.methods import discover as discover_methods
from structnmt.model.transformer import Transformer

#: each registered method at least once, with the variants whose code paths differ (two layers each side)
CASES: dict[str, list[dict[str, Any]]] = {
    "vanilla": [],
    "pascal": [{"name": "pascal", "parent_ignoring": 0.3}],
    "deps_san_rs": [{"name": "deps_san", "layers": [1, 2], "rs_sparsing": True}],
    "deps_san_wink": [{"name": "deps_san", "layers": [1], "wink_sparsing": True}],
    "udiscal": [{"name": "udiscal"}],
    "sasa": [{"name": "sasa", "layers": [2], "mask": "normal"}],
    "sacra": [{"name": "sacra", "layers": [1, 2]}],
    "localness_query": [{"name": "localness", "variant": "query", "layers": [1, 2]}],
    "context_aware": [{"name": "context_aware", "variant": "deep_global", "layers": [1, 2]}],
    "relative_position": [{"name": "relative_position", "layers": [1, 2]},
                          {"name": "relative_position", "stack": "decoder", "layers": [1, 2]}],
    "sh_labels": [{"name": "sh_labels", "n_labels": 64}],
    "dbsa": [{"name": "dbsa", "sides": ["src", "tgt"]}],
    "sisa": [{"name": "sisa"}],
    "syncattn": [{"name": "syncattn"}],
    "lpsi_mse": [{"name": "lpsi", "synch": "mse"}],
    "local_window": [{"name": "local_window"}],
}


def registered_methods() -> set[str]:
    discover_methods()
    return set(METHODS)


def all_cases() -> dict[str, list[dict[str, Any]]]:
    """``CASES``, and every registered method they do not name with its default parameters."""
    named = {entry["name"] for entries in CASES.values() for entry in entries}
    return {**CASES, **{name: [{"name": name}] for name in sorted(registered_methods() - named)}}


def covered_methods() -> set[str]:
    return {entry["name"] for entries in all_cases().values() for entry in entries}


def model_config(case: str, **kw: Any) -> ModelConfig:
    settings = {"enc_layers": 2, "dec_layers": 2, "d_model": 32, "n_heads": 4, "d_ff": 64, "dropout": 0.1,
                "methods": all_cases()[case], **kw}
    return ModelConfig(**settings)


def make_model(case: str, vocab: int, **kw: Any) -> Transformer:
    return Transformer(model_config(case, **kw), vocab, vocab)


def prepare_synthetic(work: Path, train: int = 96, test: int = 40) -> Path:
    """A prepared synthetic dataset with gold trees on both sides and source scenes; its directory."""
    write_task(work / "data", sizes={"train": train, "val": 8, "test": test}, seed=4)
    data = demo_config(work, 1.0)["data"]
    data["subwords"]["vocab_size"] = 300
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        prepare(config_from_dict({"data": data}), force=True, verbose=False)
    finally:
        torch.set_num_threads(threads)
    return Path(data["dir"])


def vocab_size(dataset_dir: Path) -> int:
    import sentencepiece as spm

    return spm.SentencePieceProcessor(model_file=str(dataset_dir / "spm.model")).get_piece_size()


def batches(dataset_dir: Path, split: str, model: Transformer, max_tokens: int = 300,
            inference: bool = False, multiple: int = 1) -> list[Batch]:
    """The split's batches with the fields ``model``'s methods read (at translation time: source only),
    lengths padded up to ``multiple``."""
    dataset = ParallelDataset(dataset_dir, split)
    needs = model.structure_needs(inference=inference)
    fields = {"src": needs["src"] | {"valid"}, "tgt": set() if inference else needs["tgt"] | {"valid"}}
    src_len = np.asarray([len(dataset.side_arrays(i, "src")["ids"]) for i in range(len(dataset))])
    out = []
    for indices in token_batches(src_len, None, max_tokens, shuffle=False, seed=1, epoch=1):
        batch = collate(dataset, indices, fields, multiple)
        if inference:
            batch = Batch(batch.src, struct={"src": batch.struct["src"], "tgt": {}}, index=batch.index)
        out.append(batch)
    return out
