"""``prepare`` end to end on a tiny hand-made corpus with a hand-written CoNLL-U parse."""

from __future__ import annotations

import json
import random
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
from structnmt.data.dataset import ParallelDataset
from structnmt.data.pipeline import Preprocessor
from structnmt.data.prepare import prepare
from structnmt.errors import DataError

DET = {"the": "der", "a": "ein"}
NOUN = {"dog": "Hund", "cat": "Katze", "bird": "Vogel", "child": "Kind"}
VERB = {"sees": "sieht", "likes": "mag", "follows": "folgt"}


def make_corpus(n: int, seed: int) -> list[tuple[str, str, str]]:
    """(source, target, CoNLL-U block) for 'DET NOUN VERB DET NOUN.' sentences."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        d1, n1, v, d2, n2 = (rng.choice(list(DET)), rng.choice(list(NOUN)), rng.choice(list(VERB)),
                             rng.choice(list(DET)), rng.choice(list(NOUN)))
        src = f"{d1.capitalize()} {n1} {v} {d2} {n2}."
        tgt = f"{DET[d1].capitalize()} {NOUN[n1]} {VERB[v]} {DET[d2]} {NOUN[n2]}."
        rows = [(d1.capitalize(), 2, "det"), (n1, 3, "nsubj"), (v, 0, "root"), (d2, 5, "det"),
                (n2, 3, "obj"), (".", 3, "punct")]
        block = "".join(f"{i}\t{w}\t_\t_\t_\t_\t{h}\t{r}\t_\t_\n" for i, (w, h, r) in enumerate(rows, 1))
        out.append((src, tgt, block + "\n"))
    return out


def write_split(root: Path, name: str, rows: list[tuple[str, str, str]]) -> tuple[SplitFiles, str]:
    (root / f"{name}.en").write_text("".join(r[0] + "\n" for r in rows), encoding="utf-8")
    (root / f"{name}.de").write_text("".join(r[1] + "\n" for r in rows), encoding="utf-8")
    (root / f"{name}.conllu").write_text("".join(r[2] for r in rows), encoding="utf-8")
    files = SplitFiles(src=str(root / f"{name}.en"), tgt=str(root / f"{name}.de"))
    return files, str(root / f"{name}.conllu")


def make_config(root: Path, moses: bool = False, multitask: bool = False, val_rows=None) -> ExperimentConfig:
    train_rows = make_corpus(80, 1)
    train_rows[5] = (train_rows[5][0], "", train_rows[5][2])  # an empty target: dropped by cleaning
    train, train_conllu = write_split(root, "train", train_rows)
    val, val_conllu = write_split(root, "val", val_rows or make_corpus(10, 2))
    data = DataConfig(
        src=SideConfig(lang="en", parser=ParserConfig(backend="conllu",
                                                      conllu={"train": train_conllu, "val": val_conllu})),
        tgt=SideConfig(lang="de"),
        splits={"train": train, "val": val},
        dir=str(root / "dataset"),
        moses=moses,
        subwords=SubwordConfig(vocab_size=60),
        clean=CleanConfig(),
        multitask_parse=multitask,
    )
    return ExperimentConfig(data=data)


def test_prepare_end_to_end(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    cfg = make_config(tmp_path, moses=True)
    out = prepare(cfg)
    assert "train: kept 79 of 80 pairs; dropped empty 1" in capsys.readouterr().out
    meta = json.loads((out / "meta.json").read_text())
    assert meta["splits"]["train"]["clean"]["empty"] == 1 and meta["splits"]["train"]["n"] == 79
    assert meta["parsers"]["src"]["backend"] == "conllu" and meta["parsers"]["src"]["convention"] == "ud"
    assert meta["parsers"]["tgt"] is None and meta["structures"] == {"src": True, "tgt": False}
    assert {"det", "nsubj", "root", "obj", "punct"} <= set(meta["labels"])
    assert (out / "spm.model").is_file()

    ds = ParallelDataset(out, "val")
    raw_src, raw_tgt = ds.raw("src"), ds.raw("tgt")
    assert raw_src == [r[0] for r in make_corpus(10, 2)]  # raw (not Moses-tokenised) references
    pre = Preprocessor.from_dataset(out)
    for i in range(len(ds)):
        src = ds.side_arrays(i, "src")
        # ids round-trip to the (Moses-tokenised) text the model sees; the decoder detokenises
        assert pre.subwords["src"].decode(src["ids"]) == pre.tokenise("src", raw_src[i])
        assert pre.decode(ds.side_arrays(i, "tgt")["ids"]) == raw_tgt[i]
        np.testing.assert_array_equal(src["heads"], [1, 2, 2, 4, 2, 2])
        assert np.all(np.diff(src["word_index"]) >= 0) and src["word_index"][-1] == 5
    # translation input goes through the same path and gives the same ids
    (example,) = pre.encode_sources([raw_src[3]], with_structure=False)
    np.testing.assert_array_equal(example.src.ids, ds.side_arrays(3, "src")["ids"])
    assert example.src.tree is None

    # a second prepare from the same config keeps the dataset as it is
    stamp = (out / "meta.json").stat().st_mtime_ns
    assert prepare(cfg) == out and (out / "meta.json").stat().st_mtime_ns == stamp


def test_failed_prepare_leaves_no_dataset(tmp_path: Path) -> None:
    val_rows = make_corpus(10, 2)
    src, tgt, block = val_rows[4]
    val_rows[4] = ("Something else entirely.", tgt, block)  # the parse no longer matches line 5
    cfg = make_config(tmp_path, val_rows=val_rows)
    with pytest.raises(DataError) as info:
        prepare(cfg)
    assert info.value.path.endswith("val.conllu") and info.value.line == 29  # 5th block starts on line 29
    assert not (tmp_path / "dataset" / "meta.json").exists()
    assert not (tmp_path / "dataset" / "train").exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".dataset") and p.name != ".dataset.lock"]


def test_multitask_parse_examples(tmp_path: Path) -> None:
    out = prepare(make_config(tmp_path, multitask=True), verbose=False)
    meta = json.loads((out / "meta.json").read_text())
    assert meta["task_tag"] == "<translate>" and meta["structures"] == {"src": False, "tgt": False}
    ds = ParallelDataset(out, "train")
    assert len(ds) == 2 * 79
    pre = Preprocessor.from_dataset(out)
    sp = pre.subwords["src"]

    def pieces(ids) -> list[str]:  # a bare "▁" may precede a user-defined symbol
        return [p for p in map(sp.piece, ids) if p != "▁"]

    first = ds.side_arrays(0, "src")["ids"]
    assert pieces(first)[0] == pieces(first)[-1] == "<translate>"
    twin = ds.side_arrays(79, "src")["ids"]
    assert pieces(twin)[0] == pieces(twin)[-1] == "<parse>"
    target = pre.subwords["tgt"].decode(ds.side_arrays(79, "tgt")["ids"])
    raw = ds.raw("src")[0]
    words = raw[:-1].split()
    assert target == f"(root (nsubj (det {words[0]} ) {words[1]} ) {words[2]} (obj (det {words[3]} ) " \
                     f"{words[4]} ) (punct . ) )"
    # translation inputs are tagged the same way
    (example,) = pre.encode_sources([raw], with_structure=False)
    np.testing.assert_array_equal(example.src.ids, first)


SHARED = Path(__file__).resolve().parents[2] / "shared" / "data" / "multi30k"


@pytest.mark.shared
@pytest.mark.skipif(not SHARED.is_dir(), reason="../shared/data/multi30k is not here")
def test_multi30k_config_from_local_copy(tmp_path: Path) -> None:
    from structnmt.config import load_config
    from structnmt.data.corpus import read_parallel
    from structnmt.data.multi30k import SPLITS, build_multi30k

    data = build_multi30k("en-de", tmp_path, SHARED)
    assert list(data.splits) == list(SPLITS)
    assert data.splits["val"].src.endswith("val.en.gz") and data.dir.endswith("multi30k-en-de")
    pairs, report = read_parallel(data.splits["val"], data.clean)
    assert report["read"] == 1014 and len(pairs) == report["kept"] > 1000
    assert load_config(tmp_path / "multi30k.en-de.yaml").data.splits["train"].tgt == data.splits["train"].tgt


def test_a_one_shot_prepare_loads_its_parser_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The plan stage loads the parser early (to name a missing model before the sub-word model
    is trained); the encode stage reuses it rather than loading the model a second time."""
    import structnmt.data.pipeline as pipeline
    from tests.test_parsing import CountingParser

    loaded: list[CountingParser] = []

    def make_parser(cfg, split, processes=1, where="parser"):
        loaded.append(CountingParser())
        return loaded[-1]

    monkeypatch.setattr(pipeline, "make_parser", make_parser)
    cfg = make_config(tmp_path)
    cfg.data.src.parser = ParserConfig(backend="spacy", model="en_core_web_sm")  # type: ignore[union-attr]
    out = prepare(cfg, verbose=False)
    kept = [line for k, line in enumerate((tmp_path / "train.en").read_text().splitlines()) if k != 5]
    kept += (tmp_path / "val.en").read_text().splitlines()
    assert len(loaded) == 1 and len(set(kept)) <= loaded[0].calls <= len(kept)  # all parsed by the one parser
    assert ParallelDataset(out, "val").has("src", "heads")
