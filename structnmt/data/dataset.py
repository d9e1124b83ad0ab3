"""The prepared dataset on disk: ragged numpy arrays, memory-mapped when read.

Layout (docs/ARCHITECTURE.md, "Stored dataset"): every field of every side is one
``<side>.<field>.data.npy`` holding all sentences' values concatenated, plus
``<side>.<field>.offsets.npy`` (int64, n + 1) saying where sentence i starts and ends.
The writer streams values and offsets straight into their ``.npy`` files (memory stays flat
however large the corpus) and builds the split in a temporary directory that is renamed into place only by
``close()``: an interrupted ``prepare`` leaves the old split or none, never half of one.
"""

from __future__ import annotations

import bisect
import contextlib
import json
import os
import shutil
from collections.abc import Callable, Collection, Iterator, Sequence
from pathlib import Path
from typing import BinaryIO, TypeVar

import numpy as np

from structnmt.data.example import Example, Side
from structnmt.data.structures import project
from structnmt.errors import DataError
from structnmt.io import make_temp_dir

T = TypeVar("T")

SIDES = ("src", "tgt")
#: dtype and per-item shape of every stored field
FIELDS: dict[str, tuple[np.dtype, tuple[int, ...]]] = {
    "ids": (np.dtype(np.int32), ()),
    "word_index": (np.dtype(np.int32), ()),
    "parent_first": (np.dtype(np.int32), ()),
    "parent_mid": (np.dtype(np.float32), ()),
    "heads": (np.dtype(np.int32), ()),
    "labels": (np.dtype(np.int16), ()),
    "word_spans": (np.dtype(np.int32), (2,)),
    "scene_members": (np.dtype(np.int32), (2,)),
    "scene_parent": (np.dtype(np.int32), ()),
}
NO_LABEL = "<none>"


def side_arrays_of(side: Side, label_id: Callable[[str], int], path: str | Path | None = None,
                   line: int | None = None) -> dict[str, np.ndarray]:
    """The stored per-sentence arrays of an in-memory ``Side``.

    The one conversion from ``Example`` to arrays, used by the dataset writer and by
    ``collate_examples`` (translation of raw input), so both build identical batches.
    Structure fields appear only when the side has a tree (and scenes, for the scene fields).
    """
    out = {"ids": np.asarray(side.ids, dtype=np.int32)}
    tree = side.tree
    if tree is not None:
        if side.word_index is None:
            raise DataError("a parsed sentence has no sub-word to word alignment", path, line)
        word_index = np.asarray(side.word_index, dtype=np.int32)
        if word_index.size != out["ids"].size:
            raise DataError(f"{word_index.size} word indices for {out['ids'].size} sub-words", path, line)
        parent_first, parent_mid = project(tree, word_index)
        out.update(
            word_index=word_index,
            parent_first=parent_first,
            parent_mid=parent_mid,
            heads=np.asarray(tree.heads, dtype=np.int32),
            labels=np.asarray([label_id(lab) for lab in tree.labels], dtype=np.int16),
            word_spans=np.asarray(tree.spans, dtype=np.int32).reshape(-1, 2),
        )
    if side.scenes is not None:
        out["scene_members"] = np.asarray(side.scenes.members, dtype=np.int32).reshape(-1, 2)
        out["scene_parent"] = np.asarray(side.scenes.parent, dtype=np.int32)
    return out


#: bytes of the header of every .npy file we write: room for any shape, a multiple of 64
NPY_HEADER = 128


def npy_header(dtype: np.dtype, shape: tuple[int, ...]) -> bytes:
    """A version 1.0 ``.npy`` header of exactly :data:`NPY_HEADER` bytes (padded with spaces)."""
    text = f"{{'descr': {np.lib.format.dtype_to_descr(dtype)!r}, 'fortran_order': False, 'shape': {shape!r}, }}"
    body = NPY_HEADER - 10
    return b"\x93NUMPY\x01\x00" + body.to_bytes(2, "little") + (text.ljust(body - 1) + "\n").encode("latin1")


class NpyStream:
    """A ``.npy`` file written rows at a time, so memory stays flat however large it grows.

    The header has a fixed size; it is written as a placeholder first and rewritten with the
    final row count by :meth:`close`. The result is an ordinary ``.npy`` file (``np.load``).
    """

    def __init__(self, path: Path, dtype: np.dtype, item: tuple[int, ...] = ()) -> None:
        self.path, self.dtype, self.item = path, np.dtype(dtype), item
        self.handle: BinaryIO = open(path, "wb")  # noqa: SIM115 (closed in close)
        self.handle.write(b"\0" * NPY_HEADER)
        self.rows = 0

    def write(self, values: np.ndarray) -> None:
        values = np.ascontiguousarray(values, dtype=self.dtype).reshape((-1, *self.item))
        self.handle.write(values.tobytes())
        self.rows += len(values)

    def write_bytes(self, raw: bytes) -> None:
        """Rows given as raw bytes of this dtype (copying between files without decoding)."""
        row = self.dtype.itemsize * int(np.prod(self.item, dtype=np.int64))
        if len(raw) % row:
            raise ValueError("partial row")
        self.handle.write(raw)
        self.rows += len(raw) // row

    def close(self) -> None:
        self.handle.seek(0)
        self.handle.write(npy_header(self.dtype, (self.rows, *self.item)))
        self.handle.close()


def read_npy_chunks(path: Path, rows: int = 1 << 20) -> tuple[np.dtype, tuple[int, ...], Iterator[np.ndarray]]:
    """The dtype and shape of a ``.npy`` file and an iterator over its rows, ``rows`` at a time.

    Plain reads, not a memory map: a map's pages count as the reader's resident memory for as
    long as it lives, so copying a large file through one would grow with the file.
    """
    handle = open(path, "rb")  # noqa: SIM115 (closed by the iterator)
    version = np.lib.format.read_magic(handle)
    read_header = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
    shape, fortran, dtype = read_header(handle)
    if fortran:
        handle.close()
        raise DataError("stored array is in Fortran order", path)
    row = dtype.itemsize * int(np.prod(shape[1:], dtype=np.int64))

    def chunks() -> Iterator[np.ndarray]:
        with handle:
            left = shape[0]
            while left:
                take = min(rows, left)
                raw = handle.read(take * row)
                if len(raw) != take * row:
                    raise DataError("stored array is shorter than its header says", path)
                yield np.frombuffer(raw, dtype=dtype).reshape((take, *shape[1:]))
                left -= take

    return dtype, tuple(shape), chunks()


class _RaggedSink:
    """One ragged field being written: values and offsets both streamed to their .npy files."""

    def __init__(self, directory: Path, name: str, dtype: np.dtype, item: tuple[int, ...]) -> None:
        self.name = name
        self.data = NpyStream(directory / f"{name}.data.npy", dtype, item)
        self.offsets = NpyStream(directory / f"{name}.offsets.npy", np.dtype(np.int64))
        self.offsets.write(np.zeros(1, dtype=np.int64))

    def add(self, values: np.ndarray) -> None:
        self.data.write(values)
        self.offsets.write(np.asarray([self.data.rows], dtype=np.int64))

    def finish(self, directory: Path) -> None:
        self.data.close()
        self.offsets.close()


class DatasetWriter:
    """Writes one split of a prepared dataset, example by example.

    ``store_structures[side]`` says whether that side's trees (and scenes) are stored; a
    side with it set must give every example a tree. ``label_vocab`` continues the label
    list of splits already written (ids must agree across splits); index 0 is ``<none>``.
    The raw sentence of each side is taken from ``example.meta["src_text"]`` /
    ``["tgt_text"]``, else from the tree's text, and written to ``raw.<side>.txt``.
    Usable as a context manager: an exception aborts and removes the partial split.
    """

    def __init__(self, dir: Path, split: str, store_structures: dict[str, bool],
                 label_vocab: list[str] | None = None) -> None:
        self.dir = Path(dir)
        self.split = split
        self.store = {side: bool(store_structures.get(side, False)) for side in SIDES}
        self.labels = list(label_vocab) if label_vocab else [NO_LABEL]
        if self.labels[0] != NO_LABEL:
            raise ValueError(f"label vocabulary must start with {NO_LABEL!r}")
        self._label_ids = {lab: i for i, lab in enumerate(self.labels)}
        self.dir.mkdir(parents=True, exist_ok=True)
        self.tmp = make_temp_dir(prefix=f".{split}.", suffix=".tmp", dir=self.dir)
        self.sinks: dict[str, _RaggedSink] = {}
        self.raw_files: dict[str, object] = {}
        self.sides: tuple[str, ...] | None = None
        self.fields: dict[str, tuple[str, ...]] = {}
        self.n = 0
        self.tokens = {side: 0 for side in SIDES}
        self.closed = False

    def label_id(self, label: str) -> int:
        if label not in self._label_ids:
            if len(self.labels) >= np.iinfo(np.int16).max:
                raise DataError(f"more than {np.iinfo(np.int16).max} dependency labels")
            self._label_ids[label] = len(self.labels)
            self.labels.append(label)
        return self._label_ids[label]

    def _text(self, example: Example, side: str) -> str | None:
        text = example.meta.get(f"{side}_text")
        part = getattr(example, side)
        if text is None and part is not None and part.tree is not None:
            text = part.tree.text
        return text

    def add(self, example: Example) -> None:
        """Store one pair; the first example fixes which sides and fields the split has."""
        if self.closed:
            raise RuntimeError("writer is closed")
        # where the pair came from, for messages: the corpus file and line if the pipeline says
        path, line = example.meta.get("path", self.split), example.meta.get("line")
        sides = ("src", "tgt") if example.tgt is not None else ("src",)
        arrays = {}
        for side in sides:
            part: Side = getattr(example, side)
            if self.store[side] and part.tree is None:
                raise DataError(f"{side} sentence has no tree, but this dataset stores {side} structures",
                                path, line)
            got = side_arrays_of(part, self.label_id, path, line)
            arrays[side] = got if self.store[side] else {"ids": got["ids"]}
        if self.sides is None:
            self.sides = sides
            for side in sides:
                self.fields[side] = tuple(arrays[side])
                for name in arrays[side]:
                    dtype, item = FIELDS[name]
                    self.sinks[f"{side}.{name}"] = _RaggedSink(self.tmp, f"{side}.{name}", dtype, item)
                if self._text(example, side) is not None:
                    self.raw_files[side] = open(self.tmp / f"raw.{side}.txt", "w", encoding="utf-8")  # noqa: SIM115
        if sides != self.sides:
            raise DataError(f"example has sides {sides}, the split has {self.sides}", path, line)
        for side in sides:
            if tuple(arrays[side]) != self.fields[side]:
                raise DataError(f"{side} has fields {sorted(arrays[side])}, "
                                f"earlier examples {sorted(self.fields[side])}", path, line)
            for name, values in arrays[side].items():
                self.sinks[f"{side}.{name}"].add(values)
            self.tokens[side] += len(arrays[side]["ids"])
            if side in self.raw_files:
                text = self._text(example, side)
                if text is None or "\n" in text:
                    raise DataError(f"{side} raw text missing or spans several lines", path, line)
                self.raw_files[side].write(text + "\n")  # type: ignore[attr-defined]
        self.n += 1

    def close(self) -> dict:
        """Finish the arrays, move the split into place and return its statistics
        (``n``, tokens per side, fields per side, and the full ``labels`` list for meta.json)."""
        if self.closed:
            raise RuntimeError("writer is closed")
        try:
            for sink in self.sinks.values():
                sink.finish(self.tmp)
            for handle in self.raw_files.values():
                handle.flush()  # type: ignore[attr-defined]
                os.fsync(handle.fileno())  # type: ignore[attr-defined]
                handle.close()  # type: ignore[attr-defined]
            final = self.dir / self.split
            old = None
            if final.exists():
                old = self.dir / f".{self.split}.old.{os.getpid()}"
                os.replace(final, old)
            os.replace(self.tmp, final)
            if old is not None:
                shutil.rmtree(old, ignore_errors=True)
        except BaseException:
            self.abort()
            raise
        self.closed = True
        return {
            "n": self.n,
            "tokens": {side: self.tokens[side] for side in (self.sides or ())},
            "fields": {side: list(names) for side, names in self.fields.items()},
            "labels": list(self.labels),
        }

    def abort(self) -> None:
        """Drop everything written so far; the previous split (if any) stays."""
        for sink in self.sinks.values():
            for stream in (sink.data, sink.offsets):
                with contextlib.suppress(Exception):
                    stream.handle.close()
        for handle in self.raw_files.values():
            with contextlib.suppress(Exception):
                handle.close()  # type: ignore[attr-defined]
        shutil.rmtree(self.tmp, ignore_errors=True)
        self.closed = True

    def __enter__(self) -> DatasetWriter:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is not None:
            self.abort()
        elif not self.closed:
            self.close()


def read_meta(directory: str | Path) -> dict:
    """A dataset's ``meta.json``, or a :class:`DataError` naming it when it is damaged."""
    meta_file = Path(directory) / "meta.json"
    try:
        meta = json.loads(meta_file.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise DataError("no meta.json: not a prepared dataset (run `structnmt prepare`)", directory) from None
    except (OSError, ValueError) as err:
        raise DataError(f"cannot read the dataset description ({err}); the dataset is damaged: "
                        "rebuild it with `structnmt prepare CONFIG --force`", meta_file) from None
    if not isinstance(meta, dict):
        raise DataError("not a dataset description (not a JSON object); the dataset is damaged: "
                        "rebuild it with `structnmt prepare CONFIG --force`", meta_file)
    return meta


def check_meta(meta: dict, directory: str | Path) -> dict:
    """``meta`` when it has what training and translating read from it: the data config (``data``)
    and each side's sub-word model (``subwords.<side>.file``); else one error naming meta.json and
    the entry, not a KeyError or TypeError from deep inside."""
    def refuse(entry: str, holder: dict, key: str, wanted: str) -> DataError:
        value = holder.get(key)
        found = "missing" if key not in holder else "null" if value is None else \
            f"{json.dumps(value, ensure_ascii=False)[:40]}, not {wanted}"
        return DataError(f"{entry} is {found}: the dataset description is incomplete; the dataset is damaged: "
                         "rebuild it with `structnmt prepare CONFIG --force`", Path(directory) / "meta.json")

    if not isinstance(meta.get("data"), dict):
        raise refuse("'data' (the data config it was prepared from)", meta, "data", "an object")
    subwords = meta.get("subwords")
    if not isinstance(subwords, dict):
        raise refuse("'subwords' (the sub-word model of each side)", meta, "subwords", "an object")
    for side in SIDES:
        info = subwords.get(side)
        if not isinstance(info, dict):
            raise refuse(f"'subwords.{side}' (the {side} side's sub-word model)", subwords, side, "an object")
        if not isinstance(info.get("file"), str) or not info["file"]:
            raise refuse(f"'subwords.{side}.file' (the {side} side's sub-word model)", info, "file", "a file name")
    return meta


def check_offsets(offsets: np.ndarray, values: int, path: Path) -> None:
    """Offsets that start at 0, never go down and stay within the ``values`` of their data file.

    Damaged ones would slice garbage (or another sentence) silently, or be met much later as a
    sentence of absurd length; they are named when the dataset opens. One pass over the file.
    """
    damaged = "the file is damaged; rebuild the dataset with `structnmt prepare CONFIG --force`"
    if offsets.ndim != 1 or not np.issubdtype(offsets.dtype, np.integer) or len(offsets) == 0:
        raise DataError(f"not an offsets array (shape {offsets.shape}, dtype {offsets.dtype}); {damaged}", path)
    offsets = np.asarray(offsets)  # a view of the map, not a copy
    outside = np.flatnonzero((offsets < 0) | (offsets > values))
    if len(outside):
        at = int(outside[0])
        raise DataError(f"offsets[{at}] = {int(offsets[at])} (where sentence {at + 1} starts) is outside the "
                        f"{values} values of {path.name.replace('.offsets.npy', '.data.npy')}; {damaged}", path)
    if int(offsets[0]) != 0:
        raise DataError(f"offsets[0] = {int(offsets[0])}, not 0: the first sentence must start at the start of the "
                        f"data; {damaged}", path)
    down = np.flatnonzero(np.diff(offsets) < 0)
    if len(down):
        at = int(down[0]) + 1
        raise DataError(f"offsets are out of order: offsets[{at}] = {int(offsets[at])} (where sentence {at + 1} "
                        f"starts) is below offsets[{at - 1}] = {int(offsets[at - 1])}; {damaged}", path)


def splits_here(dataset_dir: Path) -> str:
    """The splits a prepared dataset holds, in words, for the error of a split it lacks."""
    splits = sorted(p.name for p in dataset_dir.iterdir() if (p / "src.ids.data.npy").is_file()) \
        if dataset_dir.is_dir() else []
    return f"splits: {', '.join(splits)}" if splits else "none prepared: run `structnmt prepare`"


def with_set_aside(stored: Sequence[T], set_aside: Sequence[dict], value: Callable[[dict], T]) -> list[T]:
    """``stored`` (one item per stored pair of a split) with ``value(pair)`` put back at each
    set-aside pair's place (its ``at``: how many stored pairs come before it)."""
    out: list[T] = []
    done = 0
    for pair in set_aside:
        out.extend(stored[done:pair["at"]])
        out.append(value(pair))
        done = pair["at"]
    out.extend(stored[done:])
    return out


class ParallelDataset:
    """One split of a prepared dataset; every array is memory-mapped unless ``mmap=False``."""

    def __init__(self, dir: Path, split: str, mmap: bool = True) -> None:
        self.dir = Path(dir)
        self.split = split
        self.path = self.dir / split
        if not self.path.is_dir():
            raise DataError(f"no split {split!r} in the dataset ({splits_here(self.dir)})", self.path)
        self.arrays: dict[str, dict[str, tuple[np.ndarray, np.ndarray]]] = {}
        for data_file in sorted(self.path.glob("*.data.npy")):
            side, name = data_file.name[: -len(".data.npy")].split(".", 1)
            offsets_file = self.path / f"{side}.{name}.offsets.npy"
            try:
                data = np.load(data_file, mmap_mode="r" if mmap else None)
                offsets = np.load(offsets_file, mmap_mode="r" if mmap else None)
            except (OSError, ValueError) as err:
                raise DataError(f"cannot read stored array: {err}", data_file) from err
            check_offsets(offsets, len(data), offsets_file)
            # plain ndarray views of the mapped files: np.memmap's own __getitem__ costs ~10x a
            # slice, and collation slices every array of every sentence of every batch
            self.arrays.setdefault(side, {})[name] = (data.view(np.ndarray), offsets.view(np.ndarray))
        if "src" not in self.arrays or "ids" not in self.arrays["src"]:
            raise DataError("split has no source ids (src.ids.data.npy)", self.path)
        self.src_lengths = np.diff(np.asarray(self.arrays["src"]["ids"][1])).astype(np.int64)
        self.tgt_lengths: np.ndarray | None = None
        if "tgt" in self.arrays:
            self.tgt_lengths = np.diff(np.asarray(self.arrays["tgt"]["ids"][1])).astype(np.int64)
        for side, fields in self.arrays.items():
            for name, (_data, offsets) in fields.items():
                if len(offsets) != len(self.src_lengths) + 1:
                    raise DataError(f"{side}.{name} has {len(offsets) - 1} sentences, src.ids "
                                    f"{len(self.src_lengths)}", self.path)
        self.meta: dict = read_meta(self.dir) if (self.dir / "meta.json").exists() else {}
        self._check_ids()

    def _check_ids(self) -> None:
        """Every token id inside its side's vocabulary: a damaged file is named when the dataset
        opens, not met as an ``IndexError`` in the middle of training. One pass of max and min
        over each mapped array."""
        for side in SIDES:
            size = ((self.meta.get("subwords") or {}).get(side) or {}).get("vocab_size")
            if not isinstance(size, int) or "ids" not in self.arrays.get(side, {}):
                continue
            data, offsets = self.arrays[side]["ids"]
            if not len(data):
                continue
            low, high = int(data.min()), int(data.max())
            if low >= 0 and high < size:
                continue
            bad = low if low < 0 else high
            position = int(np.flatnonzero(np.asarray(data) == bad)[0])
            sentence = int(np.searchsorted(np.asarray(offsets), position, side="right"))
            raise DataError(f"token id {bad} (sentence {sentence}) is outside the vocabulary of {size} pieces: "
                            "the file is damaged; rebuild the dataset with `structnmt prepare CONFIG --force`",
                            self.path / f"{side}.ids.data.npy")

    def __len__(self) -> int:
        return len(self.src_lengths)

    @property
    def has_target(self) -> bool:
        return self.tgt_lengths is not None

    def has(self, side: str, field: str) -> bool:
        return field in self.arrays.get(side, {})

    def fields(self, side: str) -> list[str]:
        return sorted(self.arrays.get(side, {}))

    def side_arrays(self, i: int, side: str, names: Collection[str] | None = None) -> dict[str, np.ndarray]:
        """Sentence ``i``'s stored arrays of ``side`` (views into the mapped files): all of them, or
        those of ``names``."""
        stored = self.arrays[side]
        out = {}
        for name in stored if names is None else names:
            data, offsets = stored[name]
            out[name] = data[offsets[i]:offsets[i + 1]]
        return out

    def raw(self, side: str) -> list[str]:
        file = self.path / f"raw.{side}.txt"
        if not file.exists():
            raise DataError("no raw sentences stored for this side", file)
        with open(file, encoding="utf-8") as handle:
            return [line.rstrip("\n") for line in handle]

    def set_aside(self) -> list[dict]:
        """The pairs of this evaluation split that prepare kept out of the arrays for an empty
        source, each with its file ``line``, its place among the stored pairs (``at``) and its texts."""
        pairs = list((self.meta.get("splits", {}).get(self.split) or {}).get("set_aside", []))
        places = [pair.get("at") if isinstance(pair, dict) else None for pair in pairs]
        if not all(isinstance(at, int) and 0 <= at <= len(self) for at in places) or places != sorted(places) \
                or not all(isinstance(pair.get(side), str) for pair in pairs for side in SIDES):
            raise DataError(f"splits.{self.split}.set_aside is damaged (each needs its place 'at', in order, "
                            f"between 0 and {len(self)}, and its texts); prepare the dataset again with --force",
                            self.dir / "meta.json")
        return pairs

    def scored_raw(self, side: str) -> list[str]:
        """One side of every line a test scores: the stored pairs' raw text with the set-aside pairs
        back in their places, line for line the user's file (less any pair dropped for a bad line
        or an empty reference)."""
        return with_set_aside(self.raw(side), self.set_aside(), lambda pair: pair[side])

    def scored_positions(self) -> list[int]:
        """Where each stored pair stands among the lines :meth:`scored_raw` gives (0-based)."""
        places = [pair["at"] for pair in self.set_aside()]
        return [i + bisect.bisect_right(places, i) for i in range(len(self))]
