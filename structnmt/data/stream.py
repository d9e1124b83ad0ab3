"""The three streaming stages of ``prepare``; memory stays flat however large the corpus.

1. :func:`make_plan` reads and cleans every split once (counts, warnings), draws a random
   sample of at most ``data.subwords.sample_pairs`` training pairs, tokenises it into text
   files and trains the SentencePiece model(s) on them. The plan (``plan.json`` beside the
   models) fixes everything the later stages share: line counts, cleaning counts, sub-word
   digests, parser identities, config and input fingerprints.
2. :func:`encode_shard` takes one contiguous slice of the lines of every split (all of them
   for a one-shot prepare), and streams it through cleaning, (Moses), parsing, SentencePiece
   and structure projection in chunks of :data:`CHUNK` pairs into a dataset directory of its
   own (``shard.json`` says what it holds).
3. :func:`assemble` joins the shards' splits, in order, into the final dataset: arrays are
   copied in blocks (labels renumbered into one list), never loaded whole. A one-shot
   prepare has one shard, whose splits are simply moved into place.

A one-shot prepare and a sharded one run the same code on the same plan, so they give the
same dataset record for record (``tests/test_prepare_stream.py``).
"""

from __future__ import annotations

import bisect
import json
import random
import shutil
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict
from itertools import islice
from pathlib import Path

import numpy as np
import sentencepiece as spm

from structnmt.config import CleanConfig, DataConfig, SplitFiles
from structnmt.data.corpus import DROP_REASONS, AlignmentWatch, Pair, RatioWatch, iter_clean, iter_pairs
from structnmt.data.dataset import NO_LABEL, DatasetWriter, NpyStream, read_npy_chunks
from structnmt.data.example import Example, Side
from structnmt.data.identity import config_digest, file_digest, fingerprint_inputs, input_files
from structnmt.data.parsing.cache import pinned_to
from structnmt.data.pipeline import PARSE_TAG, SIDES, TRANSLATE_TAG, Preprocessor, linearise, tag
from structnmt.data.progress import Progress
from structnmt.data.tokenisation import SubwordModel, train_sentencepiece
from structnmt.errors import DataError
from structnmt.io import atomic_write_text, same_file
from structnmt.wording import counted

#: cleaned pairs tokenised, parsed and encoded at a time (bounds the memory of a shard)
CHUNK = 4000
#: seed of the sub-word training sample, so that every run of a config draws the same one
SAMPLE_SEED = 12345
#: a split's C&H parse twins are stored after its translation pairs, as this part
TWINS = ".parse_twins"
#: how many dropped sentences a shard names one by one before it only counts
SHOW_DROPPED = 5
#: progress is counted in blocks of lines (a tqdm update per line would cost more than the line)
TICK = 1000


def split_path(files: SplitFiles) -> str:
    return files.tsv or files.src or ""


def split_paths(files: SplitFiles) -> dict[str, str]:
    if files.tsv is not None:
        return {"src": files.tsv, "tgt": files.tsv}
    return {"src": files.src or "", "tgt": files.tgt or ""}


def clean_config(data: DataConfig, split: str) -> CleanConfig:
    """Only the training split is filtered by length: evaluation sets stay whole, so that their
    scores are comparable with published ones."""
    if split == data.train_split:
        return data.clean
    return CleanConfig(max_len=10**9, max_ratio=float("inf"), drop_bad_lines=data.clean.drop_bad_lines)


def _chunks(items: Iterable, size: int) -> Iterator[list]:
    iterator = iter(items)
    while chunk := list(islice(iterator, size)):
        yield chunk


def _ticking(pairs: Iterable, bar: Progress) -> Iterator:
    """Pass items through, advancing ``bar`` every :data:`TICK` of them."""
    count = 0
    for item in pairs:
        count += 1
        if count == TICK:
            bar.update(count)
            count = 0
        yield item
    bar.update(count)


def _words(text: str) -> int:
    return len(text.split())


def task_tag(data: DataConfig) -> str | None:
    return TRANSLATE_TAG if data.multitask_parse else None


# ---------------------------------------------------------------------------
# 1. the plan: counts, warnings, sub-word sample and models


def _read_split(data: DataConfig, split: str, files: SplitFiles, verbose: bool, say: Callable[[str], None]) -> dict:
    """One pass over a split: read and clean its pairs, say what was dropped or looks wrong, count them."""
    if files.src is not None and files.tgt is not None and same_file(files.src, files.tgt):
        say(f"{split}: warning: data.splits.{split}: src and tgt are the same file ({files.src}): the model "
            "will learn to copy")
    report: Counter[str] = Counter()
    watch = RatioWatch() if split == data.train_split else None
    clean = clean_config(data, split)
    long: list[int] = []
    bad_lines: list[DataError] = []  # the first few, to say which lines drop_bad_lines dropped
    empty: list[tuple[int, str]] = []  # an evaluation split's pairs with an empty side: (line, "src"/"tgt")

    def note_bad(err: DataError) -> None:
        # one per pair: a line bad on both sides is one dropped pair
        if len(bad_lines) < SHOW_DROPPED and all(seen.line != err.line for seen in bad_lines):
            bad_lines.append(err)

    with Progress(f"{split}: read and clean", unit="lines", enabled=verbose) as bar:
        pairs = _aligned(iter_pairs(files, clean.drop_bad_lines, note_bad), files, split,
                         data.clean.allow_misaligned, say)
        on_empty = (lambda n, src, _tgt: empty.append((n, "tgt" if src.split() else "src"))) \
            if split != data.train_split else None
        for number, src, tgt in iter_clean(_ticking(pairs, bar), clean, report, watch, on_empty):
            if watch is None and (_words(src) > data.clean.max_len or _words(tgt) > data.clean.max_len):
                long.append(number)
    warning = watch.warning(split_path(files), data.clean.max_ratio) if watch is not None else \
        _long_line_warning(long, data.clean.max_len, split_path(files))
    if warning:
        say(f"{split}: warning: {warning}")
    for err in bad_lines:
        say(f"{split}: dropped (bad_line) {err}")
    if report["bad_line"] > len(bad_lines):
        say(f"{split}: ... and {counted(report['bad_line'] - len(bad_lines), 'more bad line')} dropped")
    if blank := [n for n, side in empty if side == "src"]:
        which = "validation leaves it out, " if split == data.valid_split else ""
        say(f"{split}: {_lines(blank, split_paths(files)['src'])} an empty source: {which}`structnmt test` "
            f"scores {'it' if len(blank) == 1 else 'each'} in its place as an empty translation")
    if unreferenced := [n for n, side in empty if side == "tgt"]:
        say(f"{split}: warning: {_lines(unreferenced, split_paths(files)['tgt'])} an empty reference: "
            "dropped, and not scored by `structnmt test` (give it a reference, or remove it from both files)")
    return {"lines": report["read"], "clean": {k: report[k] for k in (*DROP_REASONS, "read", "kept")}}


def make_plan(data: DataConfig, work: Path, cache_dir: Path | None, verbose: bool = True,
              messages=print, parsers: dict | None = None) -> dict:
    """Pass over every split, sample the training pairs, train the sub-word model(s) into ``work``.

    Writes ``work/plan.json`` (last, atomically) and returns it. ``parsers`` keeps the loaded
    parsers for a later stage (see :class:`~structnmt.data.pipeline.Preprocessor`).
    """
    say = messages if verbose else (lambda _m: None)
    work.mkdir(parents=True, exist_ok=True)
    seconds: dict[str, float] = {}
    clock = time.perf_counter()
    for path in input_files(data).values():
        if Path(path).exists() and not (Path(path).is_file() or Path(path).is_dir()):
            raise DataError("not a regular file: prepare reads its inputs more than once (and fingerprints "
                            "them); save it to a file first", path)
    pre = Preprocessor(data, {}, cache_dir=cache_dir, task_tag=task_tag(data), parsers=parsers)
    for side in SIDES:  # a parser that is not installed is found now, not after the sub-word model
        if pre.side_cfg(side).parser.backend in ("spacy", "stanza", "udpipe"):
            pre.parser(side, data.train_split)
    inputs = fingerprint_inputs(data)  # before reading: what we read is what we record
    splits = {split: _read_split(data, split, files, verbose, say) for split, files in data.splits.items()}
    train = splits[data.train_split]["clean"]
    if not train["kept"]:
        raise DataError(f"no sentence pair of the training split is left after cleaning (dropped: {_dropped(train)})",
                        split_path(data.splits[data.train_split]))
    for split, info in splits.items():  # an empty evaluation split would only fail later, in `train`
        if not info["clean"]["kept"]:
            raise DataError(f"no sentence pair of the {split} split is left after cleaning (dropped: "
                            f"{_dropped(info['clean'])}); "
                            "every split needs at least one", split_path(data.splits[split]))
    seconds["read_clean"] = time.perf_counter() - clock

    clock = time.perf_counter()
    _check_parse_counts(data, pre, splits, say)
    sample_dir = work / "sample"
    files, sampled = _write_sample(data, pre, train["kept"], sample_dir, verbose)
    seconds["sample"] = time.perf_counter() - clock
    clock = time.perf_counter()
    symbols = [TRANSLATE_TAG, PARSE_TAG] if data.multitask_parse else []
    if verbose:
        say(f"training the sub-word model{'s' if not data.subwords.joint else ''} on {sampled:,} of "
            f"{train['kept']:,} training pairs")
    sub_info = _train_subwords(data, work, files, symbols)
    shutil.rmtree(sample_dir, ignore_errors=True)
    seconds["subwords_train"] = time.perf_counter() - clock
    models = sorted({info["file"] for info in sub_info.values()})
    plan = {
        "config": asdict(data),
        "config_digest": config_digest(asdict(data)),
        "inputs": {"files": inputs, "parsers": {side: pre.identity(side) for side in SIDES},
                   "subwords": {name: file_digest(work / name) for name in models},
                   # the imported trees file the parse cache is pinned to (absent when none is)
                   **({"trees": pin} if cache_dir is not None and (pin := pinned_to(cache_dir)) else {})},
        "subwords": sub_info,
        "sample": {"pairs": sampled, "of": train["kept"], "seed": SAMPLE_SEED},
        "splits": splits,
        "seconds": seconds,
    }
    atomic_write_text(work / "plan.json", json.dumps(plan, indent=2, ensure_ascii=False) + "\n")
    return plan


def _dropped(clean: dict[str, int]) -> str:
    """A split's drops by reason, for a message: "empty 2, bad_line 1" ("" when none)."""
    return ", ".join(f"{reason} {count}" for reason, count in clean.items() if reason not in ("read", "kept") and count)


def _lines(numbers: list[int], path: str) -> str:
    """"{path} line 5 has" / "{path} lines 5, 9, ... (12 lines) have", for a message."""
    if len(numbers) == 1:
        return f"{path} line {numbers[0]} has"
    shown = ", ".join(map(str, numbers[:SHOW_DROPPED])) + (", ..." if len(numbers) > SHOW_DROPPED else "")
    return f"{path} lines {shown} ({len(numbers)} lines) have"


def _aligned(pairs: Iterable[Pair], files: SplitFiles, split: str, allow: bool, say) -> Iterator[Pair]:
    """Pass the pairs through an :class:`AlignmentWatch`: where source and target slip against each
    other, stop naming the line (or, with ``data.clean.allow_misaligned``, say it once and go on)."""
    watch = AlignmentWatch()
    for pair in pairs:
        yield pair
        if watch.add(*pair) is not None:
            break
    else:
        watch.finish()
        pairs = iter(())
        if watch.unchecked is not None:  # too short, or lengths that say nothing: the user should know
            say(f"{split}: note: {split_path(files)}: {watch.unchecked}")
    if watch.broken is not None:
        line, _ = watch.broken
        path = split_path(files)
        if not allow:
            raise DataError(watch.message(files), path, line)
        say(f"{split}: warning: {path}:{line}: {watch.message(files).split('. Fix the files')[0]} "
            "(data.clean.allow_misaligned: going on)")
    yield from pairs


def _long_line_warning(lines: list[int], max_len: int, path: str) -> str | None:
    """Evaluation splits keep every line; say which are longer than training allowed."""
    if not lines:
        return None
    shown = ", ".join(map(str, lines[:10])) + (f" and {len(lines) - 10} more" if len(lines) > 10 else "")
    where = f"line {shown}" if len(lines) == 1 else f"lines {shown}"
    return (f"{counted(len(lines), 'pair')} longer than data.clean.max_len ({max_len} words) "
            f"{'is' if len(lines) == 1 else 'are'} kept (evaluation splits are never filtered): {where} of {path}; "
            "the model's own limit (model.max_positions sub-words) "
            "is not known here and is checked when translating")


def _check_parse_counts(data: DataConfig, pre: Preprocessor, splits: dict[str, dict], say) -> None:
    """Refuse a CoNLL-U file with more sentences than its split has lines, as one with fewer is
    refused (or, with ``data.clean.drop_bad_lines``, say so and ignore the extra ones, as lines
    without a parse are dropped): encoding only looks sentences up by line, so it never sees them."""
    from structnmt.data.parsing.conllu_backend import ConlluParser

    for split, files in data.splits.items():
        for side in SIDES:
            cfg = getattr(data, side).parser
            if cfg.backend != "conllu" or split not in cfg.conllu:
                continue
            parser = pre.parser(side, split)
            assert isinstance(parser, ConlluParser)
            error = parser.extra_sentences(splits[split]["lines"], split_paths(files)[side])
            if error is not None and not data.clean.drop_bad_lines:
                raise error
            if error is not None:
                say(f"{split}: warning: {error}; the extra sentences are ignored (data.clean.drop_bad_lines)")


def _write_sample(data: DataConfig, pre: Preprocessor, kept: int, directory: Path,
                  verbose: bool) -> tuple[dict[str, list[Path]], int]:
    """The sub-word training text: a random sample of the cleaned training pairs, tokenised.

    Selection sampling (Knuth's algorithm S) over the kept pairs in file order: every subset
    of the wanted size is equally likely, with one random draw per pair and no memory of the
    corpus. With C&H multi-task data the sample's parse twins are added (tagged sources,
    linearised trees), parsed through the cache the encoding stage will read.
    """
    files = data.splits[data.train_split]
    clean = clean_config(data, data.train_split)
    wanted = min(kept, data.subwords.sample_pairs or kept)
    rng = random.Random(SAMPLE_SEED)
    directory.mkdir(parents=True, exist_ok=True)
    paths = {side: directory / f"{side}.txt" for side in SIDES}
    twins = {side: directory / f"{side}.twins.txt" for side in SIDES}
    handles = {side: open(paths[side], "w", encoding="utf-8") for side in SIDES}  # noqa: SIM115
    twin_handles = {side: open(twins[side], "w", encoding="utf-8") for side in SIDES} \
        if data.multitask_parse else {}  # noqa: SIM115
    try:
        def chosen() -> Iterator[tuple[int, str, str]]:
            need, left = wanted, kept
            for pair in iter_clean(iter_pairs(files, clean.drop_bad_lines), clean, Counter()):
                if need and rng.random() * left < need:
                    need -= 1
                    yield pair
                left -= 1

        with Progress("sub-word sample", total=wanted, unit="pairs", enabled=verbose) as bar:
            for chunk in _chunks(chosen(), CHUNK):
                texts = {"src": [pre.tokenise("src", s) for _, s, _ in chunk],
                         "tgt": [pre.tokenise("tgt", t) for _, _, t in chunk]}
                for side in SIDES:
                    handles[side].writelines(t + "\n" for t in texts[side])
                if twin_handles:
                    bad: dict[int, tuple[str, DataError]] = {}
                    lines = [n for n, _, _ in chunk]
                    if data.clean.drop_bad_lines:
                        trees = pre._parse_dropping("src", data.train_split, texts["src"], lines, bad) or []
                    else:
                        trees = pre.parse("src", data.train_split, texts["src"], lines) or []
                    for text, tree in zip(texts["src"], trees):
                        if tree is not None:
                            twin_handles["src"].write(tag(text, PARSE_TAG) + "\n")
                            twin_handles["tgt"].write(linearise(tree) + "\n")
                bar.update(len(chunk))
    finally:
        for handle in [*handles.values(), *twin_handles.values()]:
            handle.close()
    order = {side: [paths[side]] + ([twins[side]] if data.multitask_parse else []) for side in SIDES}
    return order, wanted


def _train_subwords(data: DataConfig, work: Path, files: dict[str, list[Path]], symbols: list[str]) -> dict:
    """Train the joint (or one per side) SentencePiece model on the sample; returns meta's ``subwords``."""
    sub = data.subwords
    model_type = "word" if sub.kind == "none" else sub.model_type
    spm.set_random_generator_seed(SAMPLE_SEED)
    if sub.joint:
        path, _ = train_sentencepiece([], work / "spm", sub.vocab_size, model_type, sub.character_coverage, symbols,
                                      files=files["src"] + files["tgt"])
        info = {"file": path.name, "vocab_size": SubwordModel(path).vocab_size, "requested": sub.vocab_size,
                "model_type": model_type}
        return {"src": info, "tgt": info}
    infos = {}
    for side in SIDES:
        path, _ = train_sentencepiece([], work / f"spm.{side}", sub.vocab_size, model_type, sub.character_coverage,
                                      symbols if side == "src" else [], files=files[side])
        infos[side] = {"file": path.name, "vocab_size": SubwordModel(path).vocab_size, "requested": sub.vocab_size,
                       "model_type": model_type}
    return infos


def load_models(plan: dict, directory: Path) -> dict[str, SubwordModel]:
    models: dict[str, SubwordModel] = {}
    for side in SIDES:
        file = directory / plan["subwords"][side]["file"]
        models[side] = next((m for m in models.values() if m.path == file), None) or SubwordModel(file)
    return models


# ---------------------------------------------------------------------------
# 2. one shard: a slice of every split, encoded


def line_range(lines: int, index: int, count: int) -> tuple[int, int]:
    """1-based lines ``[first, stop)`` of shard ``index`` (0-based) of ``count``: contiguous, as even as can be."""
    return 1 + index * lines // count, 1 + (index + 1) * lines // count


def encode_shard(data: DataConfig, plan: dict, models_dir: Path, out: Path, index: int, count: int,
                 cache_dir: Path | None, verbose: bool = True, messages=print, parsers: dict | None = None) -> dict:
    """Encode shard ``index`` of ``count`` of every split into ``out``; writes and returns ``out/shard.json``
    (``parsers``: those :func:`make_plan` loaded, when it ran in this process)."""
    say = messages if verbose else (lambda _m: None)
    out.mkdir(parents=True, exist_ok=True)
    pre = Preprocessor(data, load_models(plan, models_dir), cache_dir=cache_dir, task_tag=task_tag(data),
                       parsers=parsers)
    store = {side: pre.keeps_structure and getattr(data, side).parser.backend != "none" for side in SIDES}
    labels: list[str] = [NO_LABEL]
    seconds = {"tokenise_parse_encode": 0.0, "store": 0.0}
    record: dict = {"index": index, "count": count, "config_digest": plan["config_digest"],
                    "subwords": plan["inputs"]["subwords"], "parsers": plan["inputs"]["parsers"], "splits": {}}
    name = f"shard {index + 1}/{count}: " if count > 1 else ""
    for split, files in data.splits.items():
        first, stop = line_range(plan["splits"][split]["lines"], index, count)
        clean = clean_config(data, split)
        report: Counter[str] = Counter()
        shown = 0
        # an evaluation split's pairs with an empty source are set aside, not lost: `test` scores them
        # in their place, so that a test set is scored whole (see set_aside_entries)
        empty: list[tuple[int, str, str]] = []
        written: list[int] = []  # the lines of the evaluation split's stored pairs, in order
        evaluated = split != data.train_split
        twins_writer = DatasetWriter(out, split + TWINS, store, label_vocab=labels) \
            if data.multitask_parse and split == data.train_split else None
        with DatasetWriter(out, split, store, label_vocab=labels) as writer, \
                Progress(f"{name}{split}: encode", total=stop - first, unit="lines", enabled=verbose) as bar:
            numbered = (p for p in iter_pairs(files, clean.drop_bad_lines) if p[0] >= first)
            in_range = _ticking(islice(numbered, stop - first), bar)
            on_empty = (lambda n, src, tgt, empty=empty: empty.append((n, src, tgt)) if not src.split() else None) \
                if evaluated else None
            for chunk in _chunks(iter_clean(in_range, clean, report, on_empty=on_empty), CHUNK):
                clock = time.perf_counter()
                dropped: list[tuple[str, DataError]] | None = [] if clean.drop_bad_lines else None
                examples = pre.encode_pairs(chunk, split, split_paths(files), dropped)
                twins = []
                if twins_writer is not None:
                    kept = {ex.meta["line"] for ex in examples}
                    twins = _parse_examples(pre, [p for p in chunk if p[0] in kept], split)
                seconds["tokenise_parse_encode"] += time.perf_counter() - clock
                clock = time.perf_counter()
                for example in examples:
                    writer.add(example)
                if evaluated:
                    written.extend(ex.meta["line"] for ex in examples)
                for example in twins:
                    twins_writer.add(example)  # type: ignore[union-attr]
                seconds["store"] += time.perf_counter() - clock
                for reason, err in dropped or []:
                    report[reason] += 1
                    report["kept"] -= 1
                    if shown < SHOW_DROPPED:
                        say(f"{split}: dropped ({reason}) {err}")
                    shown += 1
            stats = writer.close()
        if shown > SHOW_DROPPED:
            say(f"{split}: ... and {counted(shown - SHOW_DROPPED, 'more dropped sentence')}")
        labels = stats["labels"]
        parts = [{"dir": split, "n": stats["n"], "tokens": stats["tokens"], "fields": stats["fields"]}]
        if twins_writer is not None:
            twin_stats = twins_writer.close()
            parts.append({"dir": split + TWINS, "n": twin_stats["n"], "tokens": twin_stats["tokens"],
                          "fields": twin_stats["fields"]})
        record["splits"][split] = {"lines": [first, stop], "read": report["read"],
                                   "clean": {k: report[k] for k in (*DROP_REASONS, "read", "kept")}
                                   | {k: v for k, v in report.items() if k not in (*DROP_REASONS, "read", "kept")},
                                   "parts": parts, "labels_after": len(labels)}
        if evaluated and report["empty"]:  # the key says the empty sources were looked for, even if none
            record["splits"][split]["set_aside"] = set_aside_entries(empty, written)
    record["labels"] = labels
    record["parser_info"] = {side: pre.parser_info(side) for side in SIDES}
    record["seconds"] = seconds
    atomic_write_text(out / "shard.json", json.dumps(record, indent=2, ensure_ascii=False) + "\n")
    return record


def set_aside_entries(empty: list[tuple[int, str, str]], written: list[int]) -> list[dict]:
    """The pairs of an evaluation split dropped for an empty source, each with ``at``: how many stored
    pairs come before it (exact even where pairs between were dropped for other reasons), so that
    ``structnmt test`` puts its translation and reference back in its place."""
    return [{"line": n, "at": bisect.bisect_left(written, n), "src": src, "tgt": tgt} for n, src, tgt in empty]


def _parse_examples(pre: Preprocessor, pairs: list[tuple[int, str, str]], split: str) -> list[Example]:
    """The C&H parse twins of training pairs (tagged source -> linearised parse)."""
    src_texts = [pre.tokenise("src", s) for _, s, _ in pairs]
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


# ---------------------------------------------------------------------------
# 3. assembly: the shards' parts, in order, into one dataset


def label_list(data: DataConfig, records: list[dict]) -> list[str]:
    """The label list a one-shot prepare would build: first appearance, split by split, shard by shard."""
    labels = [NO_LABEL]
    seen = {NO_LABEL}
    for split in data.splits:
        for record in records:
            before = _labels_before(data, record, split)
            for label in record["labels"][before:record["splits"][split]["labels_after"]]:
                if label not in seen:
                    seen.add(label)
                    labels.append(label)
    return labels


def _labels_before(data: DataConfig, record: dict, split: str) -> int:
    names = list(data.splits)
    k = names.index(split)
    return record["splits"][names[k - 1]]["labels_after"] if k else 1


def assemble(data: DataConfig, plan: dict, shards: list[tuple[Path, dict]], out: Path,
             verbose: bool = True, messages=print, move: bool = False) -> dict:
    """Join the shards' splits into ``out`` (one split directory each); returns the meta's split entries
    and label list. With ``move`` (a one-shot prepare's private work folder), a part on its own whose
    labels need no renumbering is moved, not copied; a merge never moves, since a merge killed
    half-way must leave every finished shard whole for the next one."""
    say = messages if verbose else (lambda _m: None)
    records = [record for _, record in shards]
    labels = label_list(data, records)
    index = {label: i for i, label in enumerate(labels)}
    luts = [np.asarray([index[label] for label in record["labels"]], dtype=np.int16) for record in records]
    splits: dict[str, dict] = {}
    for split in data.splits:
        parts = []  # (directory, lut) in dataset order: every shard's pairs, then every shard's twins
        for kind in (0, 1):
            for (directory, record), lut in zip(shards, luts):
                entries = record["splits"][split]["parts"]
                if kind < len(entries) and entries[kind]["n"]:
                    parts.append((directory / entries[kind]["dir"], lut, entries[kind]))
        target = out / split
        with Progress(f"{split}: merge", total=sum(p[2]["n"] for p in parts), unit="pairs",
                      enabled=verbose and len(parts) > 1) as bar:
            if move and len(parts) == 1 and np.array_equal(parts[0][1], np.arange(len(parts[0][1]))):
                shutil.move(str(parts[0][0]), str(target))
            else:
                _concatenate(parts, target, bar)
        clean: Counter[str] = Counter()
        for record in records:
            clean.update(record["splits"][split]["clean"])
        first = parts[0][2] if parts else {"fields": {}}
        tokens: Counter[str] = Counter()
        for part in parts:
            tokens.update(part[2]["tokens"])
        n = sum(p[2]["n"] for p in parts)
        splits[split] = {"n": n, "tokens": dict(tokens), "fields": first["fields"],
                         "clean": {k: clean[k] for k in (*DROP_REASONS, "read", "kept")}
                         | {k: v for k, v in clean.items() if k not in (*DROP_REASONS, "read", "kept")}}
        set_aside, stored = [], 0  # each shard's set-aside pairs, placed after the shards before it
        for record in records:
            entry = record["splits"][split]
            set_aside += [{**pair, "at": pair["at"] + stored} for pair in entry.get("set_aside", [])]
            stored += entry["parts"][0]["n"]
        if any("set_aside" in record["splits"][split] for record in records) and \
                all("set_aside" in r["splits"][split] for r in records if r["splits"][split]["clean"]["empty"]):
            splits[split]["set_aside"] = set_aside  # (a shard of an older structnmt recorded none: `test` warns)
        if verbose:
            kept = splits[split]["clean"]["kept"]
            extra = f" (+{n - kept} parse examples)" if n - kept else ""
            listed = _dropped(splits[split]["clean"])
            aside = f"; the {len(set_aside)} with an empty source kept aside for `test`" if set_aside else ""
            say(f"{split}: kept {kept} of {splits[split]['clean']['read']} pairs{extra}; "
                f"dropped {listed or 'none'}{aside}")
    return {"splits": splits, "labels": labels}


def _concatenate(parts: list[tuple[Path, np.ndarray, dict]], target: Path, bar: Progress) -> None:
    """Concatenate split directories (ragged .npy fields and raw text files) block by block."""
    target.mkdir(parents=True)
    if not parts:
        return
    names = sorted(p.name[: -len(".data.npy")] for p in parts[0][0].glob("*.data.npy"))
    for name in names:
        dtype, shape, _ = read_npy_chunks(parts[0][0] / f"{name}.data.npy", rows=1)
        data = NpyStream(target / f"{name}.data.npy", dtype, shape[1:])
        offsets = NpyStream(target / f"{name}.offsets.npy", np.dtype(np.int64))
        offsets.write(np.zeros(1, dtype=np.int64))
        relabel = name.endswith(".labels")
        for directory, lut, _ in parts:
            base = data.rows
            _, _, chunks = read_npy_chunks(directory / f"{name}.data.npy")
            for chunk in chunks:
                data.write(lut[chunk] if relabel else chunk)
            _, _, chunks = read_npy_chunks(directory / f"{name}.offsets.npy")
            for k, chunk in enumerate(chunks):
                offsets.write((chunk[1:] if k == 0 else chunk) + base)
        data.close()
        offsets.close()
    for raw in sorted(p.name for p in parts[0][0].glob("raw.*.txt")):
        with open(target / raw, "wb") as sink:
            for directory, _, _ in parts:
                with open(directory / raw, "rb") as source:
                    shutil.copyfileobj(source, sink, 1 << 20)
    for _, _, entry in parts:
        bar.update(entry["n"])
