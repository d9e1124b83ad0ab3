"""Checks before a run starts: what would otherwise fail, or mislead, hours into training.

Each refuses in one line naming the field: a dataset prepared from another data section,
shared embeddings over separate vocabularies, a sentence longer than the model's positions,
trees of two annotation conventions compared by one loss; and a warning where the only trees
available are known to be weak.
"""

from __future__ import annotations

import json
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np

from structnmt.config import DATA_FIELDS_WITHOUT_EFFECT, ExperimentConfig, config_differences, dataset_differences
from structnmt.errors import ConfigError, DataError


def check_dataset_matches_config(cfg: ExperimentConfig, dataset_dir: Path) -> None:
    """Refuse a dataset prepared from another ``data`` section than the config asks for.

    A config asking for an 8k vocabulary must not train on a 6k dataset without a word: the
    dataset's ``meta.json`` keeps the data section it was built from, field by field.
    """
    meta_file = dataset_dir / "meta.json"
    if cfg.data is None or not meta_file.is_file():
        return
    meta = json.loads(meta_file.read_text(encoding="utf-8"))
    built = meta.get("data")
    if not isinstance(built, dict):
        return
    differ = config_differences(built, asdict(cfg.data), "data", DATA_FIELDS_WITHOUT_EFFECT)
    if differ:
        raise ConfigError(f"{dataset_dir} was prepared from another data section ({dataset_differences(differ)}); "
                          f"run `structnmt prepare {cfg.path or 'CONFIG'} --force` or point data.dir elsewhere",
                          "data", cfg.path)


def check_inputs_unchanged(cfg: ExperimentConfig, dataset_dir: Path) -> None:
    """Refuse a dataset whose text or parse files changed since ``prepare`` read them: training
    would learn from the old corpus while the config names the new one. Inputs not on this
    machine (a dataset carried without its raw text) cannot be checked and pass."""
    from structnmt.data.identity import check_files_unchanged

    meta_file = dataset_dir / "meta.json"
    if cfg.data is None or not meta_file.is_file():
        return
    recorded = json.loads(meta_file.read_text(encoding="utf-8")).get("inputs") or {}
    where = f" {cfg.path}" if cfg.path else ""
    check_files_unchanged(recorded.get("files") or {}, cfg.data,
                          f"run `structnmt prepare{where or ' CONFIG'} --force` to rebuild {dataset_dir}")


def check_shared_embeddings(cfg: ExperimentConfig, dataset_dir: Path) -> None:
    """Sharing source and target embeddings is only meaningful over one joint vocabulary."""
    meta_file = dataset_dir / "meta.json"
    meta = json.loads(meta_file.read_text(encoding="utf-8")) if meta_file.is_file() else {}
    if cfg.model.share_embeddings and meta.get("joint_vocab") is False:
        raise ConfigError("the dataset has separate source and target vocabularies; set share_embeddings: false "
                          "(or prepare with data.subwords.joint: true)", "model.share_embeddings", cfg.path)


def check_lengths(data: Any, max_positions: int) -> None:
    """Refuse, before training, a sentence longer than the model's positions (it would fail mid-run)."""
    for side, lengths in (("src", data.src_lengths), ("tgt", data.tgt_lengths)):
        if lengths is None or len(lengths) == 0:
            continue
        longest = int(np.argmax(lengths))
        if int(lengths[longest]) + 1 > max_positions:
            raise DataError(f"sentence {longest + 1} of split {data.split!r} has {int(lengths[longest])} {side} "
                            f"sub-words; the model reads at most {max_positions - 1} (model.max_positions; or "
                            "lower data.clean.max_len)", data.path)


def warn_weak_german_trees(model: Any, cfg: ExperimentConfig) -> None:
    """German UD trees come from a parser trained on GSD's 720 dev sentences: say so."""
    needs = model.structure_needs()
    for side in ("src", "tgt"):
        if needs[side] and getattr(cfg.data, side).lang == "de":
            print(f"warning: the {side} side is German: the only German UD training data here is GSD dev "
                    "(720 sentences; its parser reaches 71.7 UAS, docs/parsers.md), so these trees are weak. "
                    "For target-side trees prefer the En->Fr recipes (configs/multi30k_en_fr_*.yaml): spaCy's "
                    "French model is trained on UD.", file=sys.stderr, flush=True)


def check_methods_against_dataset(model: Any, dataset_dir: Path) -> None:
    """Let every method refuse a dataset it cannot read, once, before the first batch."""
    if not model.methods or not (dataset_dir / "meta.json").is_file():
        return
    from structnmt.data.dataset import read_meta

    meta = read_meta(dataset_dir)  # a damaged meta.json is named, not a traceback
    for method in model.methods:
        method.check_dataset(meta)


def check_fields_stored(cfg: ExperimentConfig, model: Any, data: Any) -> None:
    """Refuse, before a run folder is made, a method whose structure (trees, scenes) the dataset
    does not store: otherwise the first batch fails, naming neither the method nor the config."""
    from structnmt.data.structures import stored_arrays_for

    for i, method in enumerate(model.methods):
        for side, fields in method.needs.items():
            missing = sorted(stored_arrays_for(fields) - set(data.fields(side)))
            if missing:
                source = "data.{0}.scenes" if {"scene_mask", "scene_dist"} & set(fields) else "data.{0}.parser"
                raise ConfigError(f"{method.p.name} reads {', '.join(sorted(fields))} on the {side} side, which "
                                  f"{data.path} does not store ({', '.join(missing)} missing): prepare the dataset "
                                  f"with {source.format(side)} set", f"model.methods[{i}]", cfg.path)


def check_conventions(model: Any, dataset_dir: Path, path: str | None = None) -> None:
    """Refuse trees of two annotation conventions to a model that reads trees on both sides
    (SyncAttn, both-side DBSA): its methods take them for one kind of tree, and a ClearNLP-style
    English tree and a UD French tree disagree on what heads what, so the loss would teach noise.
    """
    needs = model.structure_needs()
    tree_fields = {"parent_first", "parent_mid", "dist", "scene_mask", "scene_dist", "labels"}
    if not (needs["src"] & tree_fields and needs["tgt"] & tree_fields):
        return
    meta_file = dataset_dir / "meta.json"
    meta = json.loads(meta_file.read_text(encoding="utf-8")) if meta_file.is_file() else {}
    parsers = meta.get("parsers") or {}
    conventions = {side: (parsers.get(side) or {}).get("convention") for side in ("src", "tgt")}
    if conventions["src"] != conventions["tgt"]:
        raise ConfigError(
            f"the model's methods read trees on both sides as trees of one kind, but {dataset_dir} has "
            f"{conventions['src']} trees on the source side and {conventions['tgt']} trees on the target side; "
            "parse both sides with parsers of one convention (UD: `structnmt parser train`)", "data.src.parser", path)
