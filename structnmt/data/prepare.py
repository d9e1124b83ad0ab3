"""``structnmt prepare``: raw parallel text in, a prepared dataset directory out.

Everything is built in a temporary directory beside ``data.dir`` and renamed into place
only at the end, so a failed or interrupted prepare leaves the previous dataset (or
none), never half of one. The parse cache (default ``<dir>/.parse_cache``) lives outside
that swap: it survives a failed run and is carried into the new dataset directory.

``data.multitask_parse`` builds the C&H baseline data (Currey & Heafield 2019, as run in
pascal-bugliarello2020): every training pair gets a twin whose source is the tagged
sentence ``<parse> ... <parse>`` and whose target is its linearised dependency parse
(:func:`structnmt.data.pipeline.linearise`); translation sources carry ``<translate>``.
The tags are user-defined SentencePiece symbols, so they stay one piece each.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from dataclasses import asdict
from pathlib import Path

from structnmt.config import CleanConfig, DataConfig, ExperimentConfig
from structnmt.data.corpus import RatioWatch, long_lines, read_parallel
from structnmt.data.dataset import DatasetWriter
from structnmt.data.example import Example, Side
from structnmt.data.identity import check_unchanged, fingerprint_inputs
from structnmt.data.pipeline import PARSE_TAG, SIDES, TRANSLATE_TAG, Preprocessor, linearise, tag
from structnmt.data.tokenisation import MosesTokeniser, SubwordModel, train_sentencepiece
from structnmt.errors import ConfigError, DataError
from structnmt.io import atomic_write_text, sha256_file
from structnmt.locks import DirectoryLock

FORMAT_VERSION = 1


def _split_paths(data: DataConfig, split: str) -> dict[str, str]:
    files = data.splits[split]
    if files.tsv is not None:
        return {"src": files.tsv, "tgt": files.tsv}
    return {"src": files.src or "", "tgt": files.tgt or ""}


def _check(data: DataConfig) -> None:
    if data.multitask_parse and data.src.parser.backend == "none":
        raise ConfigError("the C&H multi-task data needs a source parser (data.src.parser)",
                          "data.multitask_parse")


def _train_subwords(data: DataConfig, tmp: Path, train: dict[str, list[str]],
                    symbols: list[str]) -> tuple[dict[str, SubwordModel], dict[str, dict]]:
    """Train the joint (or one per side) SentencePiece model on the training split."""
    sub = data.subwords
    model_type = "word" if sub.kind == "none" else sub.model_type
    if sub.joint:
        path, _ = train_sentencepiece(train["src"] + train["tgt"], tmp / "spm", sub.vocab_size, model_type,
                                      sub.character_coverage, symbols)
        model = SubwordModel(path)
        info = {"file": path.name, "vocab_size": model.vocab_size, "requested": sub.vocab_size,
                "model_type": model_type}
        return {"src": model, "tgt": model}, {"src": info, "tgt": info}
    models, infos = {}, {}
    for side in SIDES:
        path, _ = train_sentencepiece(train[side], tmp / f"spm.{side}", sub.vocab_size, model_type,
                                      sub.character_coverage, symbols if side == "src" else [])
        models[side] = SubwordModel(path)
        infos[side] = {"file": path.name, "vocab_size": models[side].vocab_size, "requested": sub.vocab_size,
                       "model_type": model_type}
    return models, infos


def _parse_examples(pre: Preprocessor, pairs: list[tuple[int, str, str]], split: str,
                    src_texts: list[str]) -> list[Example]:
    """The C&H parse twins of the training pairs (tagged source -> linearised parse)."""
    trees = pre.parse("src", split, src_texts, [n for n, _, _ in pairs]) or []
    out = []
    for (line, _src, _tgt), text, tree in zip(pairs, src_texts, trees):
        source = tag(text, PARSE_TAG)
        target = linearise(tree)
        src_ids, _ = pre.subwords["src"].encode(source)
        tgt_ids, _ = pre.subwords["tgt"].encode(target)
        out.append(Example(src=Side(ids=src_ids), tgt=Side(ids=tgt_ids),
                           meta={"line": line, "src_text": source, "tgt_text": target, "task": "parse"}))
    return out


def prepare(cfg: ExperimentConfig, force: bool = False, verbose: bool = True) -> Path:
    """Build the dataset of ``cfg.data``; returns its directory.

    An existing dataset prepared from the same data config and the same inputs (files,
    parser models: :mod:`structnmt.data.identity`) is kept as it is; one from a different
    config, or whose inputs changed since, is replaced only with ``force``.
    """
    if cfg.data is None:
        raise ConfigError("the config has no data section", "data")
    try:
        # one prepare per dataset directory at a time: a second one is refused at once, naming
        # the holder (two would race to rename their results into place)
        with DirectoryLock(cfg.data.dir, "prepare", messages=print if verbose else _quiet):
            return _prepare(cfg, force, verbose)
    except ConfigError as err:
        # errors raised deep inside (the sub-word model, a parser) know the field, not the file
        if cfg.path is None or str(err).startswith(f"{cfg.path}: "):
            raise
        named = ConfigError(str(err), path=cfg.path)
        named.field = err.field
        raise named from None


def _prepare(cfg: ExperimentConfig, force: bool, verbose: bool) -> Path:
    if cfg.data is None:
        raise ConfigError("the config has no data section", "data")
    data = cfg.data
    _check(data)
    out = Path(data.dir)
    config_dict = asdict(data)
    if out.exists() and not (out / "meta.json").is_file() and (not out.is_dir() or any(out.iterdir())):
        # prepare replaces data.dir whole: never a directory it did not make (raw corpora, say)
        raise ConfigError(f"{out} exists and is not a structnmt dataset; choose another directory", "data.dir")
    _remove_stale_temporaries(out, verbose)
    if (out / "meta.json").is_file() and not force:
        old = json.loads((out / "meta.json").read_text(encoding="utf-8"))
        if old.get("data") == json.loads(json.dumps(config_dict)):
            if "inputs" in old:
                check_unchanged(old["inputs"], data)
            elif verbose:
                print(f"{out}: prepared by an older structnmt that recorded no input fingerprints; "
                      "kept as it is (use --force to rebuild and record them)")
            if verbose:
                print(f"{out}: already prepared from this config and these inputs (use --force to rebuild)")
            return out
        raise ConfigError(f"{out} holds a dataset prepared from a different config; "
                          "use --force to replace it", "data.dir")
    cache_dir = Path(data.cache_dir) if data.cache_dir else out / ".parse_cache"
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".tmp", dir=out.parent))
    try:
        meta = _build(data, tmp, cache_dir, config_dict, verbose)
        atomic_write_text(tmp / "meta.json", json.dumps(meta, indent=2, ensure_ascii=False) + "\n")
        _swap(tmp, out, cache_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


def _quiet(_message: str) -> None:
    pass


def _remove_stale_temporaries(out: Path, verbose: bool) -> None:
    """Remove what a prepare that died left beside ``out`` (we hold the lock: nobody else is writing)."""
    if not out.parent.is_dir():
        return
    for path in sorted(out.parent.glob(f".{out.name}.*.tmp")) + sorted(out.parent.glob(f".{out.name}.old.*")):
        if path.is_dir():
            if verbose:
                print(f"{path}: removing what an earlier prepare left behind (it did not finish)")
            shutil.rmtree(path, ignore_errors=True)


def _swap(tmp: Path, out: Path, cache_dir: Path) -> None:
    """Move the finished dataset into place, keeping the parse cache if it lives inside ``out``."""
    inside = out / ".parse_cache"
    if cache_dir.resolve() == inside.resolve() and inside.is_dir():
        os.replace(inside, tmp / ".parse_cache")
    old = None
    if out.exists():
        old = out.parent / f".{out.name}.old.{os.getpid()}"
        os.replace(out, old)
    os.replace(tmp, out)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def _build(data: DataConfig, tmp: Path, cache_dir: Path, config_dict: dict, verbose: bool) -> dict:
    # wall seconds of each stage, kept in meta.json: where a slow prepare spends its time
    seconds: dict[str, float] = {"read_clean": 0.0, "subwords_train": 0.0, "tokenise_parse_encode": 0.0,
                                 "store": 0.0}
    clock = time.perf_counter()
    splits: dict[str, list[tuple[int, str, str]]] = {}
    reports: dict[str, dict[str, int]] = {}
    # only the training split is filtered by length: evaluation sets stay whole, so that their
    # scores are comparable with published ones
    keep_all = CleanConfig(max_len=10**9, max_ratio=float("inf"), drop_bad_lines=data.clean.drop_bad_lines)
    inputs = fingerprint_inputs(data)  # before reading: what we read is what we record
    for split, files in data.splits.items():
        if split == data.train_split:
            watch = RatioWatch()
            splits[split], reports[split] = read_parallel(files, data.clean, watch)
            warning = watch.warning(files.tsv or files.src, data.clean.max_ratio)
        else:
            splits[split], reports[split] = read_parallel(files, keep_all)
            warning = _long_line_warning(splits[split], data.clean.max_len, files.tsv or files.src)
        if warning and verbose:
            print(f"{split}: warning: {warning}")
    if not splits[data.train_split]:
        files = data.splits[data.train_split]
        dropped = {k: v for k, v in reports[data.train_split].items() if k not in ("read", "kept") and v}
        raise DataError(f"no sentence pair of the training split is left after cleaning (dropped: {dropped})",
                        files.tsv or files.src)
    task_tag = TRANSLATE_TAG if data.multitask_parse else None
    seconds["read_clean"] = time.perf_counter() - clock
    clock = time.perf_counter()

    # sub-word training text: the training split as the parser sees it (Moses-tokenised if on)
    moses = {side: MosesTokeniser(getattr(data, side).lang) for side in SIDES} if data.moses else {}
    train_pairs = splits[data.train_split]
    train = {
        "src": [moses["src"].tokenise(s) if moses else s for _, s, _ in train_pairs],
        "tgt": [moses["tgt"].tokenise(t) if moses else t for _, _, t in train_pairs],
    }
    pre = Preprocessor(data, {}, cache_dir=cache_dir, task_tag=task_tag)
    symbols: list[str] = []
    parses: list[str] = []
    if data.multitask_parse:
        symbols = [TRANSLATE_TAG, PARSE_TAG]
        trees = pre.parse("src", data.train_split, train["src"], [n for n, _, _ in train_pairs]) or []
        parses = [linearise(t) for t in trees]
    # with multi-task data the models also learn the parse twins (tagged sources, bracketings)
    train_text = {"src": list(train["src"]), "tgt": train["tgt"] + parses}
    if parses:
        train_text["src"] += [tag(s, PARSE_TAG) for s in train["src"]]
    seconds["tokenise_parse_encode"] = time.perf_counter() - clock  # Moses and the C&H parses, if any
    clock = time.perf_counter()
    pre.subwords, sub_info = _train_subwords(data, tmp, train_text, symbols)
    seconds["subwords_train"] = time.perf_counter() - clock

    store = {side: pre.keeps_structure and getattr(data, side).parser.backend != "none" for side in SIDES}
    labels: list[str] | None = None
    stats: dict[str, dict] = {}
    for split, pairs in splits.items():
        dropped: list[tuple[str, DataError]] | None = [] if data.clean.drop_bad_lines else None
        clock = time.perf_counter()
        examples = pre.encode_pairs(pairs, split, _split_paths(data, split), dropped)
        if dropped:
            pairs = _forget_dropped(pairs, examples, reports[split], dropped, split, verbose)
        if data.multitask_parse and split == data.train_split:
            examples += _parse_examples(pre, pairs, split, [pre.tokenise("src", s) for _, s, _ in pairs])
        seconds["tokenise_parse_encode"] += time.perf_counter() - clock
        clock = time.perf_counter()
        with DatasetWriter(tmp, split, store, label_vocab=labels) as writer:
            for example in examples:
                writer.add(example)
            stats[split] = writer.close()
        seconds["store"] += time.perf_counter() - clock
        labels = stats[split]["labels"]
        if verbose:
            dropped = {k: v for k, v in reports[split].items() if k not in ("read", "kept") and v}
            n_parse = stats[split]["n"] - len(pairs)
            extra = f" (+{n_parse} parse examples)" if n_parse else ""
            print(f"{split}: kept {len(pairs)} of {reports[split]['read']} pairs{extra}; "
                  f"dropped {dropped or 'none'}")
    models = sorted({info["file"] for info in sub_info.values()})
    return {
        "format_version": FORMAT_VERSION,
        "inputs": {"files": inputs, "parsers": {side: pre.identity(side) for side in SIDES},
                   "subwords": {name: sha256_file(tmp / name) for name in models}},
        "langs": {"src": data.src.lang, "tgt": data.tgt.lang},
        "moses": data.moses,
        "subwords": sub_info,
        "joint_vocab": data.subwords.joint,
        "task_tag": task_tag,
        "parsers": {side: pre.parser_info(side) for side in SIDES},
        "structures": store,
        "scenes": {side: pre.scene_source(side) if store[side] else "none" for side in SIDES},
        "labels": labels or [],
        "splits": {split: {"n": stats[split]["n"], "tokens": stats[split]["tokens"],
                           "fields": stats[split]["fields"], "clean": reports[split]}
                   for split in splits},
        "data": config_dict,
        "seconds": {k: round(v, 2) for k, v in seconds.items()},
    }


def _long_line_warning(pairs: list[tuple[int, str, str]], max_len: int, path: str | None) -> str | None:
    """Evaluation splits keep every line; say which are longer than training allowed."""
    lines = long_lines(pairs, max_len)
    if not lines:
        return None
    shown = ", ".join(map(str, lines[:10])) + (f" and {len(lines) - 10} more" if len(lines) > 10 else "")
    return (f"{len(lines)} pairs longer than data.clean.max_len ({max_len} words) are kept (evaluation splits "
            f"are never filtered): lines {shown} of {path}; the model's own limit (model.max_positions sub-words) "
            "is not known here and is checked when translating")


#: how many dropped sentences ``prepare`` names one by one before it only counts
SHOW_DROPPED = 5


def _forget_dropped(pairs: list[tuple[int, str, str]], examples: list[Example], report: dict[str, int],
                    dropped: list[tuple[str, DataError]], split: str, verbose: bool) -> list[tuple[int, str, str]]:
    """Count sentences dropped for their parse or alignment, name the first few, keep the rest."""
    for reason, _ in dropped:
        report[reason] = report.get(reason, 0) + 1
    report["kept"] = len(examples)
    if verbose:
        for reason, err in dropped[:SHOW_DROPPED]:
            print(f"{split}: dropped ({reason}) {err}")
        if len(dropped) > SHOW_DROPPED:
            print(f"{split}: ... and {len(dropped) - SHOW_DROPPED} more dropped sentences")
    kept = {ex.meta["line"] for ex in examples}
    return [pair for pair in pairs if pair[0] in kept]


def summary(meta: dict) -> str:
    """One line per split: kept and dropped counts (what ``prepare`` printed)."""
    lines = []
    for split, info in meta["splits"].items():
        dropped = {k: v for k, v in info["clean"].items() if k not in ("read", "kept") and v}
        lines.append(f"{split}: {info['clean']['kept']} kept, dropped {dropped or 'none'}")
    return "\n".join(lines)

