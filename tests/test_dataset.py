"""The on-disk dataset, token batching, sharding and collation."""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pytest
import torch

from structnmt.data.batch import BOS_ID, EOS_ID, PAD_ID
from structnmt.data.batching import collate, collate_examples, iterate_batches, token_batches
from structnmt.data.dataset import DatasetWriter, ParallelDataset
from structnmt.data.example import DepTree, Example, Side
from structnmt.data.scenes import derive_scenes
from structnmt.errors import DataError

ALL = {"word_index", "parent_mid", "parent_first", "dist", "scene_mask", "scene_dist", "labels"}


def random_side(rng: random.Random, scenes: bool) -> tuple[Side, str]:
    """A random sentence: a random tree over 1..6 words, each word cut into 1..3 pieces."""
    n = rng.randint(1, 6)
    words = ["w" + str(rng.randint(0, 99)) for _ in range(n)]
    root = rng.randrange(n)
    order = [root] + [i for i in range(n) if i != root]
    heads = [0] * n
    heads[root] = root
    for k, w in enumerate(order[1:], start=1):
        heads[w] = order[rng.randrange(k)]
    labels = ["root" if i == root else rng.choice(["nsubj", "obj", "acl:relcl", "ccomp", "det"])
              for i in range(n)]
    spans, pos = [], 0
    for w in words:
        spans.append((pos, pos + len(w)))
        pos += len(w) + 1
    text = " ".join(words)
    tree = DepTree(text, words, spans, heads, labels)
    pieces = [rng.randint(1, 3) for _ in range(n)]
    word_index = np.repeat(np.arange(n), pieces).astype(np.int32)
    ids = np.array([rng.randint(4, 50) for _ in word_index], dtype=np.int32)
    return Side(ids=ids, word_index=word_index, tree=tree,
                scenes=derive_scenes(tree) if scenes else None), text


def examples(n: int, seed: int = 0) -> list[Example]:
    rng = random.Random(seed)
    out = []
    for line in range(1, n + 1):
        src, src_text = random_side(rng, scenes=True)
        tgt, tgt_text = random_side(rng, scenes=False)
        out.append(Example(src, tgt, meta={"line": line, "src_text": src_text, "tgt_text": tgt_text}))
    return out


@pytest.fixture
def stored(tmp_path: Path) -> tuple[Path, list[Example], dict]:
    exs = examples(40)
    with DatasetWriter(tmp_path, "train", {"src": True, "tgt": True}) as writer:
        for ex in exs:
            writer.add(ex)
        stats = writer.close()
    return tmp_path, exs, stats


def test_writer_layout_and_round_trip(stored) -> None:
    root, exs, stats = stored
    assert stats["n"] == 40 and stats["labels"][0] == "<none>"
    assert stats["tokens"]["src"] == sum(len(ex.src.ids) for ex in exs)
    assert sorted(p.name for p in root.iterdir()) == ["train"]  # no temporary leftovers
    assert (root / "train" / "src.parent_mid.data.npy").exists()
    assert (root / "train" / "tgt.scene_members.offsets.npy").exists() is False  # no tgt scenes
    ds = ParallelDataset(root, "train")
    assert len(ds) == 40 and ds.meta == {}
    assert ds.has("src", "scene_members") and not ds.has("tgt", "scene_members")
    np.testing.assert_array_equal(ds.src_lengths, [len(ex.src.ids) for ex in exs])
    np.testing.assert_array_equal(ds.tgt_lengths, [len(ex.tgt.ids) for ex in exs])
    arrays = ds.side_arrays(7, "src")
    ex = exs[7]
    np.testing.assert_array_equal(arrays["ids"], ex.src.ids)
    np.testing.assert_array_equal(arrays["heads"], ex.src.tree.heads)
    assert [stats["labels"][i] for i in arrays["labels"]] == ex.src.tree.labels
    assert arrays["word_spans"].tolist() == [list(s) for s in ex.src.tree.spans]
    assert arrays["scene_members"].tolist() == [list(m) for m in ex.src.scenes.members]
    assert arrays["labels"].dtype == np.int16 and arrays["parent_mid"].dtype == np.float32
    assert ds.raw("tgt")[7] == ex.meta["tgt_text"]


def test_failed_prepare_leaves_no_split(tmp_path: Path) -> None:
    exs = examples(3)
    exs[2].src.tree = None  # a side that stores structures must have a tree
    with pytest.raises(DataError, match=r"^train:3: src sentence has no tree"):
        with DatasetWriter(tmp_path, "train", {"src": True, "tgt": False}) as writer:
            for ex in exs:
                writer.add(ex)
    assert list(tmp_path.iterdir()) == []


def test_label_vocabulary_continues_across_splits(tmp_path: Path) -> None:
    exs = examples(6)
    with DatasetWriter(tmp_path, "train", {"src": True}) as w:
        for ex in exs[:3]:
            w.add(ex)
        first = w.close()
    with DatasetWriter(tmp_path, "val", {"src": True}, label_vocab=first["labels"]) as w:
        for ex in exs[3:]:
            w.add(ex)
        second = w.close()
    assert second["labels"][: len(first["labels"])] == first["labels"]
    val = ParallelDataset(tmp_path, "val")
    assert [second["labels"][i] for i in val.side_arrays(0, "src")["labels"]] == exs[3].src.tree.labels
    assert not val.has("tgt", "heads") and val.has("tgt", "ids")


def _memory_mapped(array: np.ndarray) -> bool:
    """Whether ``array`` is a mapped file's memory (itself, or a view of, an ``np.memmap``)."""
    while array is not None:
        if isinstance(array, np.memmap):
            return True
        array = getattr(array, "base", None)
    return False


def test_mmap_and_memory_datasets_give_identical_batches(stored) -> None:
    root, _exs, _ = stored
    fields = {"src": set(ALL), "tgt": set(ALL - {"scene_mask", "scene_dist"})}
    mapped, loaded = ParallelDataset(root, "train", mmap=True), ParallelDataset(root, "train", mmap=False)
    assert _memory_mapped(mapped.arrays["src"]["ids"][0]) and not _memory_mapped(loaded.arrays["src"]["ids"][0])
    plan = token_batches(mapped.src_lengths, mapped.tgt_lengths, 60, True, seed=3, epoch=0)
    pairs = zip(iterate_batches(mapped, plan, fields), iterate_batches(loaded, plan, fields), strict=True)
    for a, b in pairs:
        assert torch.equal(a.src, b.src) and torch.equal(a.tgt_in, b.tgt_in) and torch.equal(a.index, b.index)
        for side in ("src", "tgt"):
            assert a.struct[side].keys() == b.struct[side].keys()
            for name in a.struct[side]:
                assert torch.equal(a.struct[side][name], b.struct[side][name])


def test_collate_layout_and_target_offset(stored) -> None:
    root, exs, _ = stored
    ds = ParallelDataset(root, "train")
    batch = collate(ds, [4, 9], {"src": {"parent_first"}, "tgt": {"parent_mid", "dist", "word_index"}})
    n_src = [len(exs[i].src.ids) for i in (4, 9)]
    n_tgt = [len(exs[i].tgt.ids) for i in (4, 9)]
    assert batch.src.shape == (2, max(n_src) + 1) and batch.tgt_in.shape == (2, max(n_tgt) + 1)
    assert batch.index.tolist() == [4, 9]
    for b, i in enumerate((4, 9)):
        ex = exs[i]
        assert batch.src[b, : n_src[b]].tolist() == ex.src.ids.tolist()
        assert batch.src[b, n_src[b]] == EOS_ID and (batch.src[b, n_src[b] + 1:] == PAD_ID).all()
        assert batch.tgt_in[b, 0] == BOS_ID
        assert batch.tgt_in[b, 1: n_tgt[b] + 1].tolist() == ex.tgt.ids.tolist()
        assert batch.tgt_out[b, n_tgt[b]] == EOS_ID
        # target structures sit one position to the right (behind BOS)
        tgt = batch.struct["tgt"]
        stored_mid = ds.side_arrays(i, "tgt")["parent_mid"]
        assert tgt["parent_mid"][b, 1: n_tgt[b] + 1].tolist() == (stored_mid + 1).tolist()
        assert tgt["parent_mid"][b, 0] == 0 and not tgt["valid"][b, 0]
        assert tgt["word_index"][b, 1: n_tgt[b] + 1].tolist() == ex.tgt.word_index.tolist()
        assert tgt["dist"].shape == (2, batch.tgt_in.size(1), batch.tgt_in.size(1))
    assert batch.n_tgt_tokens == sum(n_tgt) + 2


def test_collate_reads_only_the_arrays_its_fields_are_built_from(stored, monkeypatch) -> None:
    # a vanilla batch of a parsed dataset reads the ids alone: reading every stored array (trees,
    # scenes) for every sentence cost a small model's GPU step in host time
    root, _exs, _ = stored
    ds = ParallelDataset(root, "train")
    assert ds.has("src", "heads") and ds.has("src", "scene_members")  # there is more to read
    read: list[tuple[str, tuple[str, ...]]] = []
    side_arrays = ds.side_arrays
    monkeypatch.setattr(ds, "side_arrays", lambda i, side, names=None: (
        read.append((side, tuple(names) if names is not None else ("ALL",))), side_arrays(i, side, names))[1])
    collate(ds, [0, 1, 2], {"src": set(), "tgt": set()})
    assert set(read) == {("src", ("ids",)), ("tgt", ("ids",))}
    read.clear()
    collate(ds, [0, 1], {"src": {"parent_mid"}, "tgt": set()})
    assert set(read) == {("src", ("ids", "parent_mid")), ("tgt", ("ids",))}


def test_collate_examples_matches_collate(stored) -> None:
    root, exs, stats = stored
    ds = ParallelDataset(root, "train")
    fields = {"src": set(ALL), "tgt": {"labels", "parent_first"}}
    a = collate(ds, [1, 2, 3], fields)
    b = collate_examples(exs[1:4], fields, labels=stats["labels"])
    assert torch.equal(a.src, b.src) and torch.equal(a.tgt_out, b.tgt_out)
    for side in ("src", "tgt"):
        for name in a.struct[side]:
            assert torch.equal(a.struct[side][name], b.struct[side][name]), (side, name)
    no_tgt = [Example(ex.src) for ex in exs[:2]]
    c = collate_examples(no_tgt, {"src": {"dist"}})
    assert c.tgt_in is None and c.tgt_out is None and c.struct["src"]["dist"].shape[0] == 2


def test_dataset_without_target(tmp_path: Path) -> None:
    with DatasetWriter(tmp_path, "test", {"src": False}) as w:
        for ex in examples(5):
            w.add(Example(ex.src, None, meta={"src_text": ex.meta["src_text"]}))
    ds = ParallelDataset(tmp_path, "test")
    assert ds.tgt_lengths is None and ds.fields("src") == ["ids"]
    batch = collate(ds, [0, 1], {"src": set()})
    assert batch.tgt_in is None and set(batch.struct["src"]) == {"valid"}
    assert len(ds.raw("src")) == 5


def lengths(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return rng.integers(1, 40, n), rng.integers(1, 40, n)


def test_token_batches_respect_budget_and_cover_everything() -> None:
    src, tgt = lengths(500, 0)
    for shuffle in (True, False):
        batches = token_batches(src, tgt, max_tokens=200, shuffle=shuffle, seed=1, epoch=0)
        assert sorted(np.concatenate(batches).tolist()) == list(range(500))
        for b in batches:
            assert len(b) * int(max((src[b] + 1).max(), (tgt[b] + 1).max())) <= 200
        # bucketing: batches are length-homogeneous, so padding stays small
        padded = sum(len(b) * int(np.maximum(src[b], tgt[b]).max() + 1) for b in batches)
        assert padded < 1.25 * int((np.maximum(src, tgt) + 1).sum())


def test_token_batches_are_deterministic_per_seed_and_epoch() -> None:
    src, tgt = lengths(300, 1)

    def plan(seed: int, epoch: int) -> list[list[int]]:
        return [b.tolist() for b in token_batches(src, tgt, 150, True, seed, epoch)]

    assert plan(1, 0) == plan(1, 0)
    assert plan(1, 0) != plan(1, 1) and plan(1, 0) != plan(2, 0)
    ordered = token_batches(src, tgt, 150, False, seed=1, epoch=0)
    assert [b.tolist() for b in ordered] == [b.tolist() for b in token_batches(src, tgt, 150, False, 9, 5)]


def test_bucket_width_batches_lengths_within_the_width_and_keeps_the_budget() -> None:
    src, tgt = lengths(600, 2)
    sizes = np.maximum(src, tgt) + 1
    exact = token_batches(src, tgt, 200, True, seed=4, epoch=1)
    bucketed = token_batches(src, tgt, 200, True, seed=4, epoch=1, bucket_width=8)
    zero = token_batches(src, tgt, 200, True, seed=4, epoch=1, bucket_width=0)  # the default: exact order
    assert len(zero) == len(exact) and all(np.array_equal(a, b) for a, b in zip(exact, zero))
    assert sorted(np.concatenate(bucketed).tolist()) == list(range(600))
    assert all(len(b) * int(sizes[b].max()) <= 200 for b in bucketed)
    # within a batch, lengths fall in at most two neighbouring buckets (a batch may close across
    # a bucket boundary); exactly sorted windows give batches of (nearly) one length
    spread = [int(sizes[b].max() - sizes[b].min()) for b in bucketed]
    assert max(spread) < 2 * 8 and np.mean(spread) > np.mean([int(sizes[b].max() - sizes[b].min()) for b in exact])
    assert [b.tolist() for b in bucketed] != [b.tolist() for b in exact]


def test_an_example_longer_than_the_budget_gets_its_own_batch() -> None:
    batches = token_batches(np.array([3, 100, 4]), np.array([3, 5, 4]), 20, False, 0, 0)
    assert [b.tolist() for b in batches] == [[0, 2], [1]]


def test_sharding_slices_each_global_batch() -> None:
    src, tgt = lengths(301, 2)
    whole = token_batches(src, tgt, 400, True, seed=4, epoch=2)
    halves = [token_batches(src, tgt, 200, True, seed=4, epoch=2, num_shards=2, shard=r) for r in (0, 1)]
    assert len(halves[0]) == len(halves[1]) == len(whole)
    for k, batch in enumerate(whole):
        assert np.concatenate([halves[0][k], halves[1][k]]).tolist() == batch.tolist()
        assert abs(len(halves[0][k]) - len(halves[1][k])) <= 1 and len(halves[1][k]) >= 1


def test_iterate_batches_resumes_at_a_position(stored) -> None:
    root, _, _ = stored
    ds = ParallelDataset(root, "train")
    plan = token_batches(ds.src_lengths, ds.tgt_lengths, 50, True, seed=0, epoch=0)
    full = [b.index.tolist() for b in iterate_batches(ds, plan, {})]
    resumed = [b.index.tolist() for b in iterate_batches(ds, plan, {}, start=3)]
    assert resumed == full[3:] and len(full) == len(plan)


def test_collation_pads_each_side_as_written_out_by_hand() -> None:
    """Two sentences, lengths rounded up to 4: the source ends in EOS, the decoder input starts
    with BOS, the output ends in EOS, padding everywhere else, and ``valid`` marks the sub-words
    (shifted by one on the target, where BOS comes first)."""
    from structnmt.data.batching import _collate_arrays

    B, E, P = BOS_ID, EOS_ID, PAD_ID

    def side(*ids: int) -> dict[str, np.ndarray]:
        return {"ids": np.asarray(ids, dtype=np.int32)}

    batch = _collate_arrays([side(5, 6, 7), side(8)], [side(9, 10, 11), side(12, 13)], [4, 2],
                            {"src": set(), "tgt": set()}, multiple=4)
    assert batch.src.tolist() == [[5, 6, 7, E], [8, E, P, P]]
    assert batch.tgt_in.tolist() == [[B, 9, 10, 11], [B, 12, 13, P]]
    assert batch.tgt_out.tolist() == [[9, 10, 11, E], [12, 13, E, P]]
    assert batch.struct["src"]["valid"].tolist() == [[True, True, True, False], [True, False, False, False]]
    assert batch.struct["tgt"]["valid"].tolist() == [[False, True, True, True], [False, True, True, False]]
    assert batch.index.tolist() == [4, 2] and batch.src.dtype == batch.tgt_out.dtype == torch.long
