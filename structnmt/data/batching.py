"""Token-count batches, sharding across processes, and collation into ``Batch``.

Batches are planned from sentence lengths alone (cheap, before any array is read) and
collated lazily, so an epoch can start from any batch number: a resumed run replays
exactly the batches it would have seen.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence

import numpy as np
import torch

from structnmt.data.batch import BOS_ID, EOS_ID, PAD_ID, Batch
from structnmt.data.dataset import NO_LABEL, ParallelDataset, side_arrays_of
from structnmt.data.example import Example
from structnmt.data.structures import build_struct, ragged_cells, stored_arrays_for

#: examples sorted together when shuffling: large enough for tight length buckets, small
#: enough that every epoch still mixes sentences of all lengths
SORT_WINDOW = 8192


def _plan(order: np.ndarray, sizes: np.ndarray, budget: int, min_count: int) -> list[np.ndarray]:
    """Cut ``order`` greedily into batches with (longest size) * (count) <= ``budget``.

    A batch closes early only once it has ``min_count`` examples (so every shard gets one);
    a single example longer than the budget gets a batch of its own rather than being lost.
    The loop runs over plain Python ints and only records where batches start (a WMT-size
    epoch of millions of sentences is planned in a fraction of a second, not seconds).
    """
    cuts: list[int] = []
    start, longest = 0, 0
    for k, size in enumerate(sizes[order].tolist()):
        top = size if size > longest else longest
        if k - start >= min_count and top * (k - start + 1) > budget:
            cuts.append(k)
            start, longest = k, size
        else:
            longest = top
    batches = np.split(order, cuts)
    if len(batches) > 1 and len(batches[-1]) < min_count:  # too few for every shard: join the previous batch
        tail = batches.pop()
        batches[-1] = np.concatenate([batches[-1], tail])
    return batches


def token_batches(
    src_lengths: np.ndarray,
    tgt_lengths: np.ndarray | None,
    max_tokens: int,
    shuffle: bool,
    seed: int,
    epoch: int,
    num_shards: int = 1,
    shard: int = 0,
    window: int = SORT_WINDOW,
    bucket_width: int = 0,
) -> list[np.ndarray]:
    """Example indices of each batch of one epoch, for process ``shard`` of ``num_shards``.

    An example costs ``max(src + 1, tgt + 1)`` positions (EOS / BOS); a batch's padded size
    (longest example times count) stays within ``max_tokens`` per process. Shuffling
    permutes the data with a generator seeded by (seed, epoch), sorts each window of
    ``window`` examples by length (similar lengths share a batch, little padding) and
    shuffles the batch order; without shuffling the whole set is sorted by length.
    ``bucket_width`` (``training.bucket_width``) > 0 sorts each window by length rounded down to
    a multiple of it instead, keeping the random order among examples of one bucket: batches
    mix lengths within the width (more varied batches, a little more padding).

    Sharding (DDP): all processes plan the same global batches with a budget of
    ``max_tokens * num_shards`` and process r takes the r-th contiguous slice of each
    (``np.array_split``). So every process has the same number of batches, and N processes
    each with a slice compute exactly the batch one process with ``N * max_tokens`` would:
    ``concat(token_batches(..., M, N, r) for r) == token_batches(..., N * M, 1, 0)``
    whenever every global batch has at least N examples (a batch never closes before that).
    """
    if max_tokens <= 0:
        raise ValueError("max_tokens must be positive")
    if not 0 <= shard < num_shards:
        raise ValueError(f"shard {shard} outside 0..{num_shards - 1}")
    src_lengths = np.asarray(src_lengths, dtype=np.int64)
    sizes = src_lengths + 1
    if tgt_lengths is not None:
        sizes = np.maximum(sizes, np.asarray(tgt_lengths, dtype=np.int64) + 1)
    n = len(sizes)
    if n == 0:
        return []
    budget = max_tokens * num_shards
    if shuffle:
        rng = np.random.default_rng([seed, epoch])
        perm = rng.permutation(n)
        pieces = [perm[s:s + window] for s in range(0, n, window)]
        keys = sizes // bucket_width if bucket_width > 0 else sizes
        order = np.concatenate([p[np.argsort(keys[p], kind="stable")] for p in pieces])
        batches = _plan(order, sizes, budget, num_shards)
        batches = [batches[k] for k in rng.permutation(len(batches))]
    else:
        order = np.argsort(sizes, kind="stable")
        batches = _plan(order, sizes, budget, num_shards)
    if num_shards == 1:
        return batches
    return [np.array_split(b, num_shards)[shard] for b in batches]


# ---------------------------------------------------------------------------
# collation


def _collate_arrays(
    src: Sequence[Mapping[str, np.ndarray]],
    tgt: Sequence[Mapping[str, np.ndarray]] | None,
    indices: Sequence[int],
    fields: Mapping[str, set[str]],
    multiple: int = 1,
    limit: int = 0,
    bucketed: bool = False,
    fill_rows: bool = False,
) -> Batch:
    """The one collation: per-example stored arrays -> padded ``Batch``, each side's length (with
    its EOS) rounded up to ``multiple`` but not past ``limit`` (the model's positions; 0: none).
    ``bucketed``: both sides padded to the :func:`bucket` of the longer one; ``fill_rows``: the
    batch padded to the :func:`bucket` of its size with empty sentences (EOS alone, BOS alone, no
    target token). All-padding rows would not do: attention over no key at all gives NaN."""
    src_len = [len(a["ids"]) for a in src]
    tgt_len = [len(a["ids"]) for a in tgt] if tgt is not None else []
    rows = len(src)
    Ls = _padded_length(max(src_len + tgt_len if bucketed else src_len) + 1, multiple, limit, bucketed)
    if fill_rows:
        filler = bucket(rows, 1) - rows
        src = [*src, *[_empty(src[0])] * filler]
        tgt = [*tgt, *[_empty(tgt[0])] * filler] if tgt is not None else None
        src_len, tgt_len = src_len + [0] * filler, tgt_len + [0] * filler
    src_ids = _padded(src, src_len, len(src), Ls, first=0)
    src_ids[np.arange(len(src)), src_len] = EOS_ID
    struct = {"src": build_struct(src, set(fields.get("src", ())), src_len, 0, Ls), "tgt": {}}
    tgt_in = tgt_out = None
    if tgt is not None:
        Lt = Ls if bucketed else _padded_length(max(tgt_len) + 1, multiple, limit)
        tgt_in = _padded(tgt, tgt_len, len(tgt), Lt, first=1)
        tgt_in[:, 0] = BOS_ID
        tgt_out = _padded(tgt, tgt_len, len(tgt), Lt, first=0)
        tgt_out[np.arange(len(tgt)), tgt_len] = EOS_ID
        tgt_out[rows:] = PAD_ID  # the filler sentences: nothing to predict, no loss, no token counted
        struct["tgt"] = build_struct(tgt, set(fields.get("tgt", ())), tgt_len, 1, Lt)
        tgt_in, tgt_out = torch.from_numpy(tgt_in), torch.from_numpy(tgt_out)
    src_ids = torch.from_numpy(src_ids)
    index = torch.as_tensor(np.asarray([*indices, *[-1] * (len(src) - rows)], dtype=np.int64))
    return Batch(src=src_ids, tgt_in=tgt_in, tgt_out=tgt_out, struct=struct, index=index)


def _padded(side: Sequence[Mapping[str, np.ndarray]], lengths: Sequence[int], rows: int, length: int,
            first: int) -> np.ndarray:
    """(rows, length) int64 of PAD with each sentence's ids from column ``first`` on, in one
    scatter (a Python loop of row copies cost as much as a small model's update on a GPU)."""
    out = np.full((rows, length), PAD_ID, dtype=np.int64)
    row, col = ragged_cells(np.asarray(lengths, dtype=np.int64))
    if row.size:
        out[row, col + first] = np.concatenate([a["ids"] for a in side])
    return out


def bucket(n: int, multiple: int = 8) -> int:
    """The smallest bucket that holds ``n``: multiples of ``multiple`` up to 8 of them, then four
    buckets a doubling (with 8: 8, 16, ..., 64, 80, 96, 112, 128, 160, ...). Padding to it adds
    less than ``multiple`` or a quarter, and lengths up to 1,024 fall in 24 buckets: few shapes for
    CUDA graphs to record."""
    step = multiple << max(((n - 1) // multiple).bit_length() - 3, 0)
    return -(-n // step) * step


def _empty(arrays: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """A sentence of no sub-word with the stored fields of ``arrays`` (a filler row)."""
    return {name: value[:0] for name, value in arrays.items()}


def _padded_length(length: int, multiple: int, limit: int, bucketed: bool = False) -> int:
    padded = bucket(length, multiple) if bucketed else -(-length // multiple) * multiple
    return max(length, min(padded, limit)) if limit else padded


def collate(dataset: ParallelDataset, indices: Sequence[int] | np.ndarray, fields: Mapping[str, set[str]],
            multiple: int = 1, limit: int = 0, bucketed: bool = False, fill_rows: bool = False) -> Batch:
    """A ``Batch`` of the stored examples ``indices``; ``fields[side]`` are the structure
    fields methods asked for (``valid`` is always there). No target stored: no tgt tensors.
    ``multiple``: lengths padded up to a multiple of it (``training.pad_to_multiple``), never
    past ``limit`` (``model.max_positions``); ``bucketed`` and ``fill_rows``: lengths and batch
    size padded to buckets (:func:`bucket`, for ``training.cuda_graphs``), so that an epoch has
    few shapes; the translation loss and the token count stay those of the unpadded batch."""
    indices = [int(i) for i in indices]
    # the ids and the stored arrays the side's structure fields are built from, no others
    names = {side: ["ids", *sorted(stored_arrays_for(fields.get(side, ())) & set(dataset.fields(side)))]
             for side in ("src", "tgt")}
    src = [dataset.side_arrays(i, "src", names["src"]) for i in indices]
    tgt = [dataset.side_arrays(i, "tgt", names["tgt"]) for i in indices] if dataset.has_target else None
    return _collate_arrays(src, tgt, indices, fields, multiple, limit, bucketed, fill_rows)


def collate_examples(examples: Sequence[Example], fields: Mapping[str, set[str]],
                     labels: Sequence[str] | None = None) -> Batch:
    """A ``Batch`` of in-memory examples (raw input at translation time), built exactly as
    ``collate`` builds stored ones. ``labels`` is the dataset's label list (meta.json); a
    label it lacks maps to ``<none>`` (0). Targets are used only if every example has one."""
    label_ids = {lab: i for i, lab in enumerate(labels or [NO_LABEL])}

    def label_id(label: str) -> int:
        return label_ids.get(label, 0)

    src = [side_arrays_of(ex.src, label_id) for ex in examples]
    with_tgt = bool(examples) and all(ex.tgt is not None for ex in examples)
    tgt = [side_arrays_of(ex.tgt, label_id) for ex in examples] if with_tgt else None  # type: ignore[arg-type]
    return _collate_arrays(src, tgt, list(range(len(examples))), fields)


def iterate_batches(dataset: ParallelDataset, batches: Sequence[np.ndarray],
                    fields: Mapping[str, set[str]], start: int = 0) -> Iterator[Batch]:
    """Collate the planned ``batches`` in order from batch number ``start`` (exact resume)."""
    for k in range(start, len(batches)):
        yield collate(dataset, batches[k], fields)
