"""Streaming and sharded ``prepare`` (issue 15).

* a merge of shards equals a one-shot prepare record for record (labels renumbered, C&H twins
  in order), also when the shards run as real processes under ``submitit.LocalExecutor``;
* a merge with a shard missing, repeated, or made with another sub-word model is refused;
* a prepare or a shard killed with SIGKILL leaves the previous dataset in place, and a rerun finishes;
* the sub-word model learns from a capped, fixed random sample; progress lines without a terminal.
"""

from __future__ import annotations

import copy
import json
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from structnmt.config import (
    CleanConfig,
    DataConfig,
    ExperimentConfig,
    ParserConfig,
    SideConfig,
    SplitFiles,
    SubwordConfig,
)
from structnmt.data.prepare import (
    ShardError,
    merge_shards,
    prepare,
    prepare_shard,
    prepare_sharded,
    prepare_subwords,
    shards_dir,
)
from structnmt.data.progress import Progress
from structnmt.data.stream import line_range

ROOT = Path(__file__).resolve().parents[1]
RELATIONS = ["det", "nsubj", "obj", "amod", "advmod", "case", "nmod", "punct", "obl", "mark"]


def labelled_corpus(n: int, seed: int) -> list[tuple[str, str, str]]:
    """(source, target, CoNLL-U) triples of 3 to 7 words; labels drawn at random, so each shard
    meets them in its own order and the merge has to renumber them."""
    rng = random.Random(seed)
    words = ["dog", "cat", "bird", "child", "sees", "likes", "red", "old", "near", "fast", "home"]
    out = []
    for k in range(n):
        forms = [rng.choice(words) for _ in range(rng.randint(3, 7))]
        root = rng.randrange(len(forms))
        rows = []
        for i, form in enumerate(forms, start=1):
            head = 0 if i - 1 == root else root + 1
            rows.append(f"{i}\t{form}\t_\t_\t_\t_\t{head}\t{'root' if head == 0 else rng.choice(RELATIONS)}\t_\t_\n")
        src = " ".join(forms)
        out.append((src, f"{src.upper()} {k}", "".join(rows) + "\n"))
    return out


def write_split(root: Path, name: str, rows: list[tuple[str, str, str]]) -> tuple[SplitFiles, str]:
    (root / f"{name}.en").write_text("".join(r[0] + "\n" for r in rows), encoding="utf-8")
    (root / f"{name}.de").write_text("".join(r[1] + "\n" for r in rows), encoding="utf-8")
    (root / f"{name}.conllu").write_text("".join(r[2] for r in rows), encoding="utf-8")
    return SplitFiles(src=str(root / f"{name}.en"), tgt=str(root / f"{name}.de")), str(root / f"{name}.conllu")


def make_config(root: Path, dir_name: str = "dataset", multitask: bool = False, vocab: int = 80,
                n_train: int = 150) -> ExperimentConfig:
    root.mkdir(parents=True, exist_ok=True)
    train_rows = labelled_corpus(n_train, 1)
    train_rows[7] = (train_rows[7][0], "", train_rows[7][2])  # dropped by cleaning: shards count it too
    train, train_conllu = write_split(root, "train", train_rows)
    val, val_conllu = write_split(root, "val", labelled_corpus(23, 2))
    data = DataConfig(
        src=SideConfig(lang="en", parser=ParserConfig(backend="conllu", conllu={"train": train_conllu,
                                                                                 "val": val_conllu}),
                       scenes="none" if multitask else "dependency"),
        tgt=SideConfig(lang="de"),
        splits={"train": train, "val": val},
        dir=str(root / dir_name),
        subwords=SubwordConfig(vocab_size=vocab),
        clean=CleanConfig(),
        multitask_parse=multitask,
    )
    return ExperimentConfig(data=data)


def elsewhere(cfg: ExperimentConfig, dir_name: str) -> ExperimentConfig:
    other = copy.deepcopy(cfg)
    assert other.data is not None
    other.data.dir = str(Path(cfg.data.dir).parent / dir_name)  # type: ignore[union-attr]
    return other


def assert_same_dataset(a: Path, b: Path) -> None:
    """Record for record: every stored array (dtype and values), every raw text, the meta data."""
    meta_a, meta_b = (json.loads((d / "meta.json").read_text()) for d in (a, b))
    for meta in (meta_a, meta_b):
        for key in ("seconds", "shards"):
            meta.pop(key, None)
        for where in ("dir", "cache_dir"):  # where it lives, not what it holds
            meta["data"].pop(where)
    assert meta_a == meta_b
    assert (a / "spm.model").read_bytes() == (b / "spm.model").read_bytes()
    for split in meta_a["splits"]:
        names = sorted(p.name for p in (a / split).iterdir())
        assert names == sorted(p.name for p in (b / split).iterdir())
        for name in names:
            if name.endswith(".npy"):
                x, y = np.load(a / split / name), np.load(b / split / name)
                assert x.dtype == y.dtype and x.shape == y.shape and np.array_equal(x, y), name
            else:
                assert (a / split / name).read_bytes() == (b / split / name).read_bytes(), name


def test_line_ranges_tile_the_file() -> None:
    for lines in (0, 1, 7, 100):
        for count in (1, 2, 3, 8):
            ranges = [line_range(lines, k, count) for k in range(count)]
            assert ranges[0][0] == 1 and ranges[-1][1] == lines + 1
            assert all(ranges[k][1] == ranges[k + 1][0] for k in range(count - 1))


def test_merge_of_shards_equals_one_shot(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    cfg = make_config(tmp_path)
    one = prepare(cfg, verbose=False)
    sharded = elsewhere(cfg, "sharded")
    prepare_subwords(sharded, verbose=False)
    for index in (2, 0, 1):  # any order
        prepare_shard(sharded, index, 3, verbose=False)
    work = shards_dir(sharded.data)  # type: ignore[arg-type]
    records = [json.loads((work / f"shard-00{k}-of-003" / "shard.json").read_text()) for k in (1, 2, 3)]
    assert [r["splits"]["train"]["lines"] for r in records] == [[1, 51], [51, 101], [101, 151]]
    # each shard met the labels in its own order: the merge had to renumber them
    assert len({tuple(r["labels"]) for r in records}) == 3
    merged = merge_shards(sharded, verbose=True)
    assert "train: kept 149 of 150 pairs; dropped empty 1" in capsys.readouterr().out
    assert_same_dataset(one, merged)
    meta = json.loads((merged / "meta.json").read_text())
    assert meta["shards"] == 3 and meta["splits"]["train"]["n"] == 149
    assert not work.exists()  # the shards are removed once merged
    assert meta["splits"]["train"]["fields"]["src"] == ["ids", "word_index", "parent_first", "parent_mid",
                                                          "heads", "labels", "word_spans", "scene_members",
                                                          "scene_parent"]


def test_empty_sources_of_a_test_split_keep_their_places_across_shards(tmp_path: Path) -> None:
    """Lines 3, 17 and 29 of the test split (one in each of three shards) have an empty source and
    line 8 an empty reference: the merge places each set-aside pair as a one-shot prepare does."""
    from structnmt.data.dataset import ParallelDataset

    cfg = make_config(tmp_path)
    rows = labelled_corpus(30, 3)
    for n in (3, 17, 29):
        rows[n - 1] = ("", f"REF {n}", rows[n - 1][2])
    rows[7] = (rows[7][0], "", rows[7][2])
    test, test_conllu = write_split(tmp_path, "test", rows)
    cfg.data.splits["test"] = test  # type: ignore[union-attr]
    cfg.data.src.parser.conllu["test"] = test_conllu  # type: ignore[union-attr]
    one = prepare(cfg, verbose=False)
    sharded = elsewhere(cfg, "sharded")
    prepare_subwords(sharded, verbose=False)
    for index in range(3):
        prepare_shard(sharded, index, 3, verbose=False)
    merged = merge_shards(sharded, verbose=False)
    assert_same_dataset(one, merged)
    data = ParallelDataset(merged, "test")
    # stored: the 26 lines but 3, 8, 17 and 29; each set-aside pair follows the stored ones before it
    assert [(p["line"], p["at"], p["tgt"]) for p in data.set_aside()] == [(3, 2, "REF 3"), (17, 14, "REF 17"),
                                                                       (29, 25, "REF 29")]
    assert data.scored_raw("tgt") == [tgt for k, (_, tgt, _) in enumerate(rows) if k != 7]
    places = data.scored_positions()
    assert [data.scored_raw("src")[place] for place in places] == data.raw("src")


def test_merge_of_multitask_shards_keeps_the_twins_last(tmp_path: Path) -> None:
    cfg = make_config(tmp_path, multitask=True, vocab=120)
    one = prepare(cfg, verbose=False)
    sharded = elsewhere(cfg, "sharded")
    prepare_subwords(sharded, verbose=False)
    for index in range(2):
        prepare_shard(sharded, index, 2, verbose=False)
    assert_same_dataset(one, merge_shards(sharded, verbose=False))
    raw = (one / "train" / "raw.src.txt").read_text().splitlines()
    assert len(raw) == 2 * 149 and not raw[148].startswith("<parse>") and raw[149].startswith("<parse>")


def test_merge_refuses_missing_repeated_and_foreign_shards(tmp_path: Path) -> None:
    cfg = make_config(tmp_path)
    prepare_subwords(cfg, verbose=False)
    work = shards_dir(cfg.data)  # type: ignore[arg-type]
    for index in (0, 2):
        prepare_shard(cfg, index, 3, verbose=False)
    with pytest.raises(ShardError, match=r"^shard 2/3 is missing \(run `structnmt prepare CONFIG --shard 2/3`\)$"):
        merge_shards(cfg, verbose=False)
    prepare_shard(cfg, 1, 3, verbose=False)
    shutil.copytree(work / "shard-001-of-003", work / "shard-001-of-003.copy")
    with pytest.raises(ShardError, match=r"^shard 1/3 is there 2 times \("):
        merge_shards(cfg, verbose=False)
    shutil.rmtree(work / "shard-001-of-003.copy")
    # a shard made with another sub-word model (another vocabulary size, elsewhere) dropped in
    other = make_config(tmp_path / "other", vocab=70)
    prepare_subwords(other, verbose=False)
    prepare_shard(other, 2, 3, verbose=False)
    shutil.rmtree(work / "shard-003-of-003")
    shutil.copytree(shards_dir(other.data) / "shard-003-of-003", work / "shard-003-of-003")  # type: ignore[arg-type]
    with pytest.raises(ShardError, match=r"shard-003-of-003: made with another sub-word model \(spm.model "):
        merge_shards(cfg, verbose=False)
    prepare_shard(cfg, 2, 3, verbose=False)  # not from this plan: encoded again
    # shards of two different counts
    prepare_shard(cfg, 0, 2, verbose=False)
    with pytest.raises(ShardError, match=r"shards of different counts \(\[2, 3\]\) are mixed"):
        merge_shards(cfg, verbose=False)
    shutil.rmtree(work / "shard-001-of-002")
    assert not Path(cfg.data.dir).exists()  # type: ignore[union-attr]
    assert_same_dataset(prepare(elsewhere(cfg, "one"), verbose=False), merge_shards(cfg, verbose=False))


def test_merge_without_a_plan_or_with_a_stale_one_says_what_to_run(tmp_path: Path) -> None:
    cfg = make_config(tmp_path)
    with pytest.raises(ShardError, match=r"no sub-word plan; run `structnmt prepare CONFIG --subwords-only` first"):
        prepare_shard(cfg, 0, 2, verbose=False)
    prepare_subwords(cfg, verbose=False)
    (tmp_path / "train.de").write_text((tmp_path / "train.de").read_text().replace("DOG", "DOGS", 1))
    with pytest.raises(ShardError, match=r"the sub-word plan is stale \(.*train.de changed since"):
        prepare_shard(cfg, 0, 2, verbose=False)


# ---------------------------------------------------------------------------
# killed runs


#: run ``structnmt`` in a real process that stops dead (SIGSTOP-like wait) when it reaches a stage,
#: after telling the test through a file; the test then kills it with SIGKILL
PAUSING = """
import sys, time
from pathlib import Path
import structnmt.data.stream as stream
reached, module, name = Path(sys.argv[1]), sys.argv[2], sys.argv[3]
target = __import__(module, fromlist=[name])
real = getattr(target, name)
def pause(*args, **kwargs):
    reached.touch()
    while True:
        time.sleep(1)
setattr(target, name, pause)
import structnmt.data.prepare as prepare
if hasattr(prepare, name):
    setattr(prepare, name, pause)
from structnmt.cli.main import main
sys.exit(main(sys.argv[4:]))
"""


def killed_at(tmp_path: Path, module: str, name: str, *argv: str) -> None:
    """Run ``structnmt ARGV`` until it reaches ``module.name``, then SIGKILL it."""
    reached = tmp_path / f"reached-{name}"
    reached.unlink(missing_ok=True)
    proc = subprocess.Popen([sys.executable, "-c", PAUSING, str(reached), module, name, *argv], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 300
    while not reached.exists():
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "the run never reached the stage"
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=60)
    assert proc.returncode == -signal.SIGKILL


def yaml_config(cfg: ExperimentConfig, path: Path) -> Path:
    import yaml

    from structnmt.config import to_dict

    raw = to_dict(cfg)
    raw.pop("path")
    path.write_text(yaml.safe_dump({"data": raw["data"]}), encoding="utf-8")
    return path


def run(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "structnmt.cli.main", *argv], cwd=ROOT, capture_output=True,
                          text=True, timeout=300)


def test_a_killed_prepare_leaves_the_previous_dataset(tmp_path: Path) -> None:
    cfg = make_config(tmp_path)
    config = yaml_config(cfg, tmp_path / "exp.yaml")
    assert run("prepare", str(config)).returncode == 0
    dataset = tmp_path / "dataset"
    before = {p.relative_to(dataset): p.read_bytes() for p in dataset.rglob("*") if p.is_file()}
    # killed while joining the new dataset (after the plan and the encoding), over the old one
    killed_at(tmp_path, "structnmt.data.stream", "assemble", "prepare", str(config), "--force")
    after = {p.relative_to(dataset): p.read_bytes() for p in dataset.rglob("*") if p.is_file()}
    assert after == before
    left = [p for p in tmp_path.iterdir() if p.name.startswith(".dataset.") and p.name.endswith(".tmp")]
    assert len(left) == 1
    done = run("prepare", str(config), "--force")
    assert done.returncode == 0, done.stderr
    assert f"{left[0]}: removing what an earlier prepare left behind" in done.stdout
    assert not left[0].exists()
    assert_same_dataset(prepare(elsewhere(cfg, "fresh"), verbose=False), dataset)


def test_a_killed_shard_is_simply_run_again(tmp_path: Path) -> None:
    cfg = make_config(tmp_path)
    config = yaml_config(cfg, tmp_path / "exp.yaml")
    assert run("prepare", str(config), "--subwords-only").returncode == 0
    assert run("prepare", str(config), "--shard", "2/2").returncode == 0
    killed_at(tmp_path, "structnmt.data.dataset", "npy_header", "prepare", str(config), "--shard", "1/2")
    work = tmp_path / "dataset.shards"
    assert not (work / "shard-001-of-002").exists()
    merge = run("prepare", str(config), "--merge")
    assert merge.returncode == 2
    assert merge.stderr == "error: shard 1/2 is missing (run `structnmt prepare CONFIG --shard 1/2`)\n"
    again = run("prepare", str(config), "--shard", "1/2")
    assert again.returncode == 0 and "removing what an earlier prepare left behind" in again.stdout
    merge = run("prepare", str(config), "--merge")
    assert merge.returncode == 0, merge.stderr
    assert_same_dataset(prepare(elsewhere(cfg, "one"), verbose=False), tmp_path / "dataset")


def test_shards_as_submitit_local_jobs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("submitit")
    monkeypatch.setenv("PYTHONPATH", str(ROOT))  # the jobs import this checkout's structnmt
    cfg = make_config(tmp_path)
    merged = prepare_sharded(elsewhere(cfg, "sharded"), jobs=2, verbose=False)
    assert json.loads((merged / "meta.json").read_text())["shards"] == 2
    assert_same_dataset(prepare(cfg, verbose=False), merged)


def test_a_failing_shard_job_is_reported_in_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("submitit")
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    cfg = make_config(tmp_path)
    # a stored parse that does not match its sentence: only the encoding (in the jobs) finds it
    conllu = Path(cfg.data.src.parser.conllu["val"])  # type: ignore[union-attr]
    conllu.write_text(conllu.read_text().replace("\t", "\tX", 1))
    prepare_subwords(cfg, verbose=False)
    from structnmt.data.prepare import run_shards
    from structnmt.data.shards import ShardJobError

    with pytest.raises(ShardJobError, match=r"^shard 1/2: .*val.conllu:1: word 'Xcat' does not match the text here: "
                                            r".*; fix it and run the same command again \(finished shards are kept\)$"):
        run_shards(cfg, 2, verbose=False)
    work = shards_dir(cfg.data)  # type: ignore[arg-type]
    assert [p.name for p in work.glob("shard-*")] == ["shard-002-of-002"]  # the good one is kept


# ---------------------------------------------------------------------------
# sample and progress


def test_subword_sample_is_capped_and_fixed(tmp_path: Path) -> None:
    cfg = make_config(tmp_path)
    cfg.data.subwords.sample_pairs = 40  # type: ignore[union-attr]
    meta = json.loads((prepare(cfg, verbose=False) / "meta.json").read_text())
    assert meta["subword_sample"] == {"pairs": 40, "of": 149, "seed": 12345}
    again = elsewhere(cfg, "again")
    meta_again = json.loads((prepare(again, verbose=False) / "meta.json").read_text())
    assert meta_again["inputs"]["subwords"] == meta["inputs"]["subwords"]  # the same sample, the same model
    cfg_all = elsewhere(cfg, "all")
    cfg_all.data.subwords.sample_pairs = 0  # type: ignore[union-attr]
    assert json.loads((prepare(cfg_all, verbose=False) / "meta.json").read_text())["subword_sample"]["pairs"] == 149


def test_progress_prints_plain_lines_without_a_terminal(capsys: pytest.CaptureFixture) -> None:
    with Progress("train: encode", total=1000, unit="lines", every=0.0, tty=False) as bar:
        bar.update(250)
        bar.update(250)
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("train: encode: 250/1,000 lines (25%), ") and "lines/s" in lines[0]
    assert "left" in lines[0] and lines[-1].startswith("train: encode: 500/1,000 lines (50%)")
    with Progress("quiet", total=10, every=3600.0, tty=False) as bar:
        bar.update(10)
    assert capsys.readouterr().out == ""  # a short stage prints nothing


def test_batch_planner_is_the_plain_greedy_loop() -> None:
    """``_plan`` loops over plain ints (a WMT-size epoch planned in about a second, not many); its
    batches are exactly those of the straightforward greedy loop over numpy items."""
    from structnmt.data.batching import _plan

    def reference(order, sizes, budget, min_count):
        batches, start, longest = [], 0, 0
        for k, i in enumerate(order):
            size = int(sizes[i])
            if k - start >= min_count and max(longest, size) * (k - start + 1) > budget:
                batches.append(order[start:k])
                start, longest = k, 0
            longest = max(longest, size)
        tail = order[start:]
        if len(tail) < min_count and batches:
            batches[-1] = np.concatenate([batches[-1], tail])
        else:
            batches.append(tail)
        return batches

    rng = np.random.default_rng(0)
    for _ in range(500):
        n = int(rng.integers(1, 300))
        sizes = rng.integers(1, int(rng.integers(2, 200)), n)
        order = rng.permutation(n)
        budget, min_count = int(rng.integers(1, 2000)), int(rng.integers(1, 5))
        got, want = _plan(order, sizes, budget, min_count), reference(order, sizes, budget, min_count)
        assert len(got) == len(want) and all(np.array_equal(a, b) for a, b in zip(got, want))
