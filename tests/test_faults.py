"""Faults a hostile but realistic user meets (issue 28), and no traceback for any of them.

* a source or target line left blank shifts every later pair: ``prepare`` refuses, naming the
  line where the files stop matching (``data.clean.allow_misaligned`` goes on knowingly);
* negative or nonsensical numbers in a config, an empty config file, a key written twice;
* ``average`` of checkpoints of another vocabulary, dataset or model config;
* output paths that cannot be written (a directory, under a file, no permission, ``/proc``,
  a full disk) and lock files that cannot be made: one line, before the work where possible;
* the Python API given the wrong types: the toolkit's own errors, naming the argument;
* a token id past the vocabulary, a damaged ``meta.json``: named when the dataset opens;
* no lock file left by a failed ``prepare``; ``--resume`` past an averaged ``last.pt``; an
  empty input line translated to an empty line by every model.

The last test runs every fault case of this file and of ``tests/test_bad_input.py`` through
``structnmt.cli.main`` in one real process and checks that none prints a Python traceback.
"""

from __future__ import annotations

import errno
import json
import os
import random
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import yaml

import structnmt
import structnmt.io
from structnmt.config import load_config, to_dict
from structnmt.errors import ConfigError, DataError
from structnmt.training.checkpoint import save_checkpoint
from tests.test_bad_input import cli, experiment, failing
from tests.test_prepare_safety import plain_experiment

ROOT = Path(__file__).resolve().parents[1]
#: the demo at a size that trains in seconds (as in tests/test_api.py)
TINY = {"model.d_model": 32, "model.d_ff": 64, "model.enc_layers": 2, "model.dec_layers": 2,
        "training.max_steps": 20, "training.valid_every": 20, "training.warmup": 10, "training.lr": 5e-3,
        "training.max_tokens": 512, "training.tensorboard": False, "training.threads": 1,
        "training.valid_bleu": False, "data.subwords.vocab_size": 400, "decoding.beam": 2}


def unwritable(tmp_path: Path) -> Path:
    """A directory nobody may create files in: /proc/self for root (who may write anywhere else)."""
    if os.geteuid() == 0:
        return Path("/proc/self")
    path = tmp_path / "read-only"
    path.mkdir()
    path.chmod(0o555)
    return path


# ---------------------------------------------------------------------------
# 1. a corpus whose lines slip against each other


def lengths_corpus(n: int, seed: int = 0) -> tuple[list[str], list[str]]:
    """Aligned pairs of varied lengths, the target about as long as its source (as translations are)."""
    rng = random.Random(seed)
    words = ["alpha", "beta", "gamma", "delta", "eps", "zeta"]
    src, tgt = [], []
    for _ in range(n):
        length = rng.randint(3, 30)
        src.append(" ".join(rng.choice(words) for _ in range(length)))
        tgt.append(" ".join(rng.choice(words).upper() for _ in range(max(1, round(length * 1.15 + rng.gauss(0, 2))))))
    return src, tgt


def blank_at(lines: list[str], line: int) -> list[str]:
    """A blank line inserted before ``line`` (1-based); the file keeps its length (the last line goes)."""
    return lines[:line - 1] + [""] + lines[line - 1:-1]


def test_alignment_watch_finds_the_line_where_pairs_start_to_slip() -> None:
    from structnmt.data.corpus import AlignmentWatch

    for line in (10, 1500, 2800):
        for side in ("src", "tgt"):
            src, tgt = lengths_corpus(3000)
            if side == "src":
                src = blank_at(src, line)
            else:
                tgt = blank_at(tgt, line)
            watch = AlignmentWatch()
            for number, (s, t) in enumerate(zip(src, tgt), start=1):
                watch.add(number, s, t)
            watch.finish()
            assert watch.broken == (line, 1 if side == "src" else -1), (line, side)
    for seed in range(10):  # aligned text of the same kind: never refused
        watch = AlignmentWatch()
        for number, (s, t) in enumerate(zip(*lengths_corpus(3000, seed)), start=1):
            watch.add(number, s, t)
        assert watch.finish() is None, seed
    constant = AlignmentWatch()  # equal lengths everywhere: no evidence either way
    for number in range(1, 1001):
        constant.add(number, "a b c", "x y z")
    assert constant.finish() is None


def test_real_parallel_text_passes_and_a_blank_line_in_it_is_found() -> None:
    """Multi30k (../shared): every split of En-De and En-Fr passes; a blank line at 20,000 is found there."""
    import gzip

    from structnmt.data.corpus import AlignmentWatch
    from tests.conftest import shared_path

    def read(name: str) -> list[str]:
        with gzip.open(shared_path("data", "multi30k", name), "rt", encoding="utf-8") as handle:
            return handle.read().splitlines()

    for split in ("train", "val", "test_2016_flickr", "test_2017_mscoco"):
        src = read(f"{split}.en.gz")
        for lang in ("de", "fr"):
            tgt = read(f"{split}.{lang}.gz")
            for shifted in (False, True) if split == "train" else (False,):
                watch = AlignmentWatch()
                for number, (s, t) in enumerate(zip(blank_at(src, 20000) if shifted else src, tgt), start=1):
                    if watch.add(number, s, t):
                        break
                assert watch.finish() == ((20000, 1) if shifted else None), (split, lang, shifted)


@pytest.mark.parametrize("line", [2800, 1500])
def test_a_blank_source_line_is_refused_naming_where_alignment_breaks(
        line: int, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    src, tgt = lengths_corpus(3000)
    config = plain_experiment(tmp_path, blank_at(src, line), tgt)
    message = failing(capsys, "prepare", str(config))
    assert message.startswith(f"{tmp_path / 'train.en'}:{line}: source and target stop matching here: from this "
                              "line on, source line n reads like the translation of target line n-1")
    assert "data.clean.allow_misaligned: true" in message
    assert not (tmp_path / "dataset").exists()
    if line == 2800:  # going on knowingly: a warning, and the dataset
        code, out, err = cli(capsys, "prepare", str(config), "--set", "data.clean.allow_misaligned=true", "--force")
        assert code == 0, err
        assert f"train: warning: {tmp_path / 'train.en'}:{line}: source and target stop matching here" in out


# ---------------------------------------------------------------------------
# 2. and 8. configs


BAD_NUMBERS = {
    "training.max_steps=-5": "training.max_steps: must not be negative, got -5",
    "training.max_minutes=-1": "training.max_minutes: must not be negative, got -1.0",
    "training.keep_last=-2": "training.keep_last: must not be negative, got -2",
    "training.valid_beam=0": "training.valid_beam: must be at least 1, got 0",
    "training.lr=.nan": "training.lr: expected a finite number, got nan",
    "training.eps=0": "training.eps: must be positive",
    "model.d_model=0": "model.d_model: must be at least 1, got 0",
    "model.max_positions=-1": "model.max_positions: must be at least 1, got -1",
    "decoding.max_len_a=-1": "decoding.max_len_a: must not be negative, got -1.0",
    "decoding.max_tokens=0": "decoding.max_tokens: must be at least 1, got 0",
    "data.subwords.character_coverage=0": "data.subwords.character_coverage: must be in (0, 1]",
    "data.src.parser.batch_size=0": "data.src.parser.batch_size: must be at least 1, got 0",
}


@pytest.mark.parametrize("override", sorted(BAD_NUMBERS))
def test_negative_or_nonsensical_numbers_are_refused_naming_the_field(
        override: str, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    config = experiment(tmp_path)
    assert failing(capsys, "train", str(config), "--set", override) == f"{config}: {BAD_NUMBERS[override]}"
    assert not (tmp_path / "run").exists()


def test_an_empty_config_file_is_named(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    for text in ("", "# nothing yet\n"):
        (tmp_path / "exp.yaml").write_text(text)
        for command in ("train", "prepare"):
            assert failing(capsys, command, str(tmp_path / "exp.yaml")) == f"{tmp_path / 'exp.yaml'}: " \
                                                                            "the config file is empty"


def test_a_key_written_twice_is_refused_naming_both_lines(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    config = experiment(tmp_path)
    text = config.read_text() + "training:\n  max_steps: 5\n"  # a second training section at the end
    config.write_text(text)
    last = len(text.splitlines()) - 1
    first = text.splitlines().index("training:") + 1
    assert failing(capsys, "train", str(config)) == (f"{config}: training: duplicate key 'training' on lines "
                                                     f"{first} and {last}: keep one")
    config.write_text("model:\n  d_model: 16\n  n_heads: 2\n  d_model: 32\n")
    assert failing(capsys, "train", str(config)) == (f"{config}: model.d_model: duplicate key 'd_model' on lines "
                                                     "2 and 4: keep one")


# ---------------------------------------------------------------------------
# 4. average


def checkpoint_of(config: Path, path: Path, change=None) -> Path:
    """An untrained model saved as the trainer saves one, with ``change(state)`` applied."""
    from structnmt.model.transformer import Transformer

    cfg = load_config(config)
    raw = to_dict(cfg)
    raw.pop("path")
    state = {"model": Transformer(cfg.model, 30, 30).state_dict(), "config": raw, "progress": {"step": 1},
             "vocab": {"src_vocab_size": 30, "tgt_vocab_size": 30, "fingerprint": "a" * 64}}
    if change is not None:
        change(state)
    return save_checkpoint(path, state)


def _other_vocabulary(state: dict) -> None:
    state["vocab"]["fingerprint"] = "b" * 64


def _other_dataset(state: dict) -> None:
    state["config"]["data"]["subwords"]["model_type"] = "bpe"


def _other_model(state: dict) -> None:
    state["config"]["model"]["norm"] = "post"  # the same shapes, another function


OTHER_ORIGINS = {
    "vocabulary": (_other_vocabulary, "trained on another vocabulary than {first} (fingerprint bbbbbbbbbbbb, "
                                      "not aaaaaaaaaaaa)"),
    "dataset": (_other_dataset, "another dataset than {first} (data.subwords.model_type: 'bpe' here, "
                                "'unigram' in a.pt)"),
    "model": (_other_model, "another model config than {first} (model.norm: 'post' here, 'pre' in a.pt)"),
}


@pytest.mark.parametrize("what", sorted(OTHER_ORIGINS))
def test_average_refuses_checkpoints_of_another_origin(what: str, tmp_path: Path,
                                                       capsys: pytest.CaptureFixture) -> None:
    change, expected = OTHER_ORIGINS[what]
    config = experiment(tmp_path)
    first = checkpoint_of(config, tmp_path / "a.pt")
    other = checkpoint_of(config, tmp_path / "b.pt", change)
    message = failing(capsys, "average", str(first), str(other), "--out", str(tmp_path / "avg.pt"))
    assert message.startswith(f"{other}: " + expected.format(first=first)), message
    assert not (tmp_path / "avg.pt").exists()
    same = checkpoint_of(config, tmp_path / "c.pt")  # the control: two of one kind average
    assert cli(capsys, "average", str(first), str(same), "--out", str(tmp_path / "avg.pt"))[0] == 0


@pytest.fixture
def prepared(tmp_path: Path, capsys: pytest.CaptureFixture) -> Path:
    config = experiment(tmp_path)
    assert cli(capsys, "prepare", str(config))[0] == 0
    return config


# ---------------------------------------------------------------------------
# 5. outputs and locks that cannot be written


def test_lock_files_that_cannot_be_made_are_one_line(prepared: Path, tmp_path: Path,
                                                      capsys: pytest.CaptureFixture) -> None:
    config = prepared
    (tmp_path / "a-file").write_text("x")
    for where in (unwritable(tmp_path) / "run", tmp_path / "a-file" / "run"):
        message = failing(capsys, "train", str(config), "--set", f"training.out_dir={where}",
                          "--set", "training.valid_every=0")
        assert message.startswith(f"{where}: cannot create its lock file {where.parent / '.run.lock'} ("), message
        message = failing(capsys, "prepare", str(config), "--set", f"data.dir={where}")
        assert message.startswith(f"{where}: cannot create its lock file"), message


def test_a_failed_prepare_leaves_no_lock_file(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    src, tgt = lengths_corpus(30)
    failing(capsys, "prepare", str(plain_experiment(tmp_path, src, tgt[:-1])))
    assert not [p.name for p in tmp_path.iterdir() if p.name.startswith(".dataset")]
    assert cli(capsys, "prepare", str(plain_experiment(tmp_path, src, tgt)))[0] == 0
    assert not (tmp_path / ".dataset.lock").exists()  # nor does a prepare that worked


# ---------------------------------------------------------------------------
# 7. a damaged dataset


def test_a_token_id_past_the_vocabulary_is_named_when_the_dataset_opens(
        prepared: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    ids = tmp_path / "dataset" / "train" / "tgt.ids.data.npy"
    stored = np.load(ids, mmap_mode="r+")
    offsets = np.load(tmp_path / "dataset" / "train" / "tgt.ids.offsets.npy")
    stored[int(offsets[6]) + 1] = 9999  # a flipped id in the 7th sentence
    stored.flush()
    del stored
    message = failing(capsys, "train", str(prepared), "--set", "training.valid_every=0")
    assert message.startswith(f"{ids}: token id 9999 (sentence 7) is outside the vocabulary of ")
    assert not (tmp_path / "run" / "last.pt").exists()


def test_a_damaged_meta_json_is_named(prepared: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    meta = tmp_path / "dataset" / "meta.json"
    meta.write_text(meta.read_text()[:40])
    for command in ("prepare", "train"):
        message = failing(capsys, command, str(prepared))
        assert message.startswith(f"{meta}: cannot read the dataset description ("), message
    meta.write_text("[1, 2]")
    assert failing(capsys, "prepare", str(prepared)).startswith(f"{meta}: not a dataset description")
    assert cli(capsys, "prepare", str(prepared), "--force")[0] == 0  # what the message says to do works


# ---------------------------------------------------------------------------
# a trained model of the demo task (seconds): translate, the API, average and resume


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("faults")
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(root)
        scores = structnmt.demo("demo", minutes=0, train_size=300, seed=3, overrides=TINY, verbose=False,
                                valid_size=8, test_size=8)
    assert scores["summary"]["status"] == "max_steps"
    (root / "in.txt").write_text("the clock sees a dog .\n\nthe dog .\n   \n", encoding="utf-8")
    return root


def translate_args(demo: Path, *extra: str) -> list[str]:
    return ["translate", "--checkpoint", str(demo / "demo/run/last.pt"), "--input", str(demo / "in.txt"),
            "--device", "cpu", "--beam", "1", *extra]


def test_outputs_that_cannot_be_written_are_refused_before_translating(
        demo: Path, tmp_path: Path, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "a-file").write_text("x")
    cases = {
        tmp_path: f"--output: {tmp_path} is a directory; give a file name",
        tmp_path / "a-file" / "out.txt": f"--output: {tmp_path / 'a-file' / 'out.txt'}: {tmp_path / 'a-file'} is "
                                         "a file, not a directory",
        unwritable(tmp_path) / "out.txt": f"--output: {unwritable(tmp_path) / 'out.txt'}: cannot write into "
                                          f"{unwritable(tmp_path)} (",
        Path("/proc/version"): "--output: /proc/version: cannot write into /proc (",
        Path("/dev/null"): "--output: /dev/null is not a regular file; give a file name",  # the rename would replace it
    }
    loaded = []
    monkeypatch.setattr(structnmt.api, "load", lambda *a, **k: loaded.append(a))  # the model is never loaded
    for output, expected in cases.items():
        assert failing(capsys, *translate_args(demo, "--output", str(output))).startswith(expected)
    assert not loaded


def test_a_full_disk_while_writing_the_translation_is_one_line(
        demo: Path, tmp_path: Path, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    def no_space(fd: int) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(structnmt.io.os, "fsync", no_space)
    out = tmp_path / "out.txt"
    message = failing(capsys, *translate_args(demo, "--output", str(out)))
    assert message == f"{out}: cannot write the file (No space left on device); nothing was written there"
    assert list(tmp_path.iterdir()) == []


def always_a_word(monkeypatch: pytest.MonkeyPatch, pre) -> None:
    """Decoding that answers every sentence with one word (a model this small answers with nothing),
    so that an empty line's output tells whether the line was decoded at all."""
    import structnmt.decoding.translate as translate
    from structnmt.model.search import Hypothesis

    word = [int(i) for i in pre.subwords["tgt"].encode("clock")[0]]
    monkeypatch.setattr(translate, "translate_batch", lambda model, batch, *a, **k: [
        [Hypothesis(word, 0.0, 0.0)] for _ in range(batch.src.shape[0])])


def test_an_empty_input_line_gives_an_empty_output_line(demo: Path, capsys: pytest.CaptureFixture,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    from structnmt.data.pipeline import Preprocessor

    always_a_word(monkeypatch, Preprocessor.from_dataset(demo / "demo/dataset"))
    code, out, err = cli(capsys, *translate_args(demo))
    assert code == 0, err
    assert out.split("\n")[:-1] == ["clock", "", "clock", ""]


def test_an_empty_line_through_a_model_that_reads_source_trees(demo: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A PASCAL model parses its input; an empty line must not stop the file (nor shift the lines)."""
    from structnmt.config import DecodingConfig, config_from_dict
    from structnmt.data.pipeline import Preprocessor
    from structnmt.decoding.translate import translate_lines
    from structnmt.model.transformer import Transformer
    from tests.test_parsing import CountingParser

    pre = Preprocessor.from_dataset(demo / "demo/dataset")
    parser = CountingParser()
    pre._parsers[("src", "translate")] = parser
    always_a_word(monkeypatch, pre)
    model_cfg = config_from_dict({"model": {"enc_layers": 1, "dec_layers": 1, "d_model": 16, "n_heads": 2,
                                            "d_ff": 16, "methods": [{"name": "pascal", "layers": [1]}]}}).model
    size = pre.subwords["src"].vocab_size
    model = Transformer(model_cfg, size, size).eval()
    assert model.structure_needs(inference=True)["src"]
    lines = ["the clock sees a dog .", "", "the dog .", "  "]
    out = translate_lines(model, pre, lines, DecodingConfig(beam=1, max_len_b=3), "cpu")
    assert out == [["clock"], [""], ["clock"], [""]]
    assert parser.calls == 2  # the empty lines were not parsed


def test_the_api_refuses_wrong_types_naming_the_argument(demo: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(demo)
    for bad in (None, 123, ["a.pt"]):
        with pytest.raises(ConfigError, match=r"^checkpoint: expected a path \(str or pathlib.Path\), got "):
            structnmt.load(bad)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=r"^config: expected a config path or an ExperimentConfig, got 5"):
        structnmt.train(5)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=r"^overrides: expected a mapping"):
        structnmt.load_config("configs/none.yaml", 7)  # type: ignore[arg-type]
    translator = structnmt.load("demo/run/last.pt", "cpu")
    with pytest.raises(ConfigError, match=r"^beam: expected an integer, got '5'$"):
        translator.translate(["the dog ."], beam="5")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=r"^length_penalty: expected a number, got 'high'$"):
        translator.translate(["the dog ."], length_penalty="high")  # type: ignore[arg-type]
    with pytest.raises(DataError, match=r"^sentences: sentence 2 is a int, not a str$"):
        translator.translate(["the dog .", 7])  # type: ignore[list-item]
    with pytest.raises(DataError, match=r"^sentences: expected a str or a list of str, got int$"):
        translator.translate(7)  # type: ignore[arg-type]
    assert translator.translate(["the dog ."], beam=1)  # the control


def test_resume_after_average_into_last_pt_falls_back_to_the_step_checkpoint(
        demo: Path, tmp_path: Path, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    from structnmt.config import set_dotted
    from structnmt.data.synthetic import demo_config

    run = tmp_path / "run"
    shutil.copytree(demo / "demo/run", run)
    step = run / "step_20.pt"
    assert step.exists()
    assert cli(capsys, "average", str(step), str(run / "best.pt"), "--out", str(run / "last.pt"))[0] == 0
    monkeypatch.chdir(demo)
    raw = demo_config(Path("demo"), 0)
    for key, value in {**TINY, "training.max_steps": 22, "training.out_dir": str(run)}.items():
        set_dotted(raw, key, value)
    config = tmp_path / "exp.yaml"
    config.write_text(yaml.safe_dump(raw))
    code, out, err = cli(capsys, "train", str(config), "--resume")
    assert code == 0, err
    assert f"not resuming from last.pt: {run / 'last.pt'}: holds model weights only" in err
    assert "falling back to step_20.pt" in err
    assert yaml.safe_load(out)["step"] == 22


# ---------------------------------------------------------------------------
# 8. a study whose runs did not all finish here says so


def test_a_study_that_did_not_finish_every_run_says_why(monkeypatch: pytest.MonkeyPatch,
                                                        capsys: pytest.CaptureFixture) -> None:
    result = {"runs": {"vanilla/seed1": "done", "pascal/seed1": "busy"}, "report": None}
    monkeypatch.setattr(structnmt.api, "run_study", lambda *a, **k: result)
    monkeypatch.setattr(structnmt.api, "study_status", lambda *a, **k: [])
    code, _, err = cli(capsys, "study", "s.yaml")
    assert code == 1
    assert err.strip() == ("study: 1 of 2 runs did not finish here: pascal/seed1 (busy: another process is "
                           "running it; its record appears when that one ends); `structnmt study s.yaml --status` "
                           "shows where each stands")


# ---------------------------------------------------------------------------
# no traceback, for any fault case


def test_no_fault_case_prints_a_traceback(demo: Path, tmp_path: Path) -> None:
    """Every fault case above and of tests/test_bad_input.py, through ``structnmt.cli.main`` in one
    real process: each ends with exit status 2 and one ``error:`` line, never a traceback."""
    from tests.test_bad_input import BAD_BYTES, BAD_CONFIGS, corpus

    cases: list[list[str]] = []

    def case(root: Path, *argv: str) -> None:
        cases.append([str(a) for a in argv])

    def fresh(name: str, **kwargs) -> Path:
        root = tmp_path / name
        root.mkdir()
        return experiment(root, **kwargs)

    src, tgt, blocks = corpus()
    case(tmp_path, "prepare", fresh("lengths", src=src, tgt=tgt[:-2]))
    case(tmp_path, "prepare", fresh("empty", tgt=b""))
    case(tmp_path, "prepare", fresh("all_empty", tgt=[""] * 30))
    for name, (bad, _) in BAD_BYTES.items():
        lines = [line.encode() for line in src]
        lines[11] = bad
        case(tmp_path, "prepare", fresh(name, src=b"\n".join(lines) + b"\n"))
    case(tmp_path, "prepare", fresh("few_parses", blocks=blocks[:25]))
    for name, (change, _) in BAD_CONFIGS.items():
        config = fresh(f"config_{name}")
        raw = yaml.safe_load(config.read_text())
        for section, fields in change.items():
            raw.setdefault(section, {}).update(fields)
        config.write_text(yaml.safe_dump(raw))
        case(tmp_path, "train", config)
    config = fresh("numbers")
    for override in BAD_NUMBERS:
        case(tmp_path, "train", config, "--set", override)
    case(tmp_path, "train", config, "--set", "training.out_dir=/proc/self/run")
    case(tmp_path, "prepare", config, "--set", "data.dir=/proc/self/dataset")
    (tmp_path / "empty.yaml").write_text("")
    case(tmp_path, "train", tmp_path / "empty.yaml")
    (tmp_path / "twice.yaml").write_text("model:\n  d_model: 16\n  d_model: 32\n")
    case(tmp_path, "train", tmp_path / "twice.yaml")
    misaligned = tmp_path / "misaligned"
    misaligned.mkdir()
    long_src, long_tgt = lengths_corpus(600)
    case(tmp_path, "prepare", plain_experiment(misaligned, blank_at(long_src, 300), long_tgt))
    first = checkpoint_of(config, tmp_path / "a.pt")
    case(tmp_path, "average", first, checkpoint_of(config, tmp_path / "b.pt", _other_model), "--out",
         tmp_path / "avg.pt")
    for output in (tmp_path, tmp_path / "empty.yaml" / "o.txt", "/proc/self/o.txt", "/proc/version"):
        case(tmp_path, *translate_args(demo, "--output", str(output)))
    case(tmp_path, "translate", "--checkpoint", tmp_path / "a.pt", "--input", tmp_path / "missing.txt")
    case(tmp_path, "demo", "--work", tmp_path / "no-demo", "--steps", "0")
    damaged = tmp_path / "damaged"
    shutil.copytree(demo / "demo/dataset", damaged)
    (damaged / "meta.json").write_text("{")
    case(tmp_path, *translate_args(demo, "--dataset", str(damaged)))

    script = ("import contextlib, io, json, sys\n"
              "from structnmt.cli.main import main\n"
              "for argv in json.loads(sys.argv[1]):\n"
              "    err = io.StringIO()\n"
              "    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):\n"
              "        code = main(argv)\n"
              "    print(json.dumps([argv, code, err.getvalue()]), flush=True)\n")
    done = subprocess.run([sys.executable, "-c", script, json.dumps(cases)], capture_output=True, text=True,
                          cwd=demo, timeout=900, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    assert done.returncode == 0, done.stderr[-3000:]
    results = [json.loads(line) for line in done.stdout.splitlines()]
    assert len(results) == len(cases)
    for argv, code, err in results:
        assert "Traceback" not in err, (argv, err)
        assert code == 2 and len(err.splitlines()) == 1 and err.startswith("error: "), (argv, code, err)


# ---------------------------------------------------------------------------
# the demo on a busy machine

#: the demo's task and pipeline at a size a test can afford; its quality after these updates is
#: the same on a busy machine as on an idle one, because it is a number of updates, not of minutes
BUSY_DEMO = {"model.d_model": 64, "model.d_ff": 128, "model.enc_layers": 2, "model.dec_layers": 2,
             "model.dropout": 0.0, "training.max_tokens": 1024, "training.lr": 5e-3, "training.warmup": 100,
             "training.valid_every": 1000, "training.tensorboard": False, "decoding.beam": 2}
BUSY_STEPS = 450


def test_the_demo_refuses_no_updates(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    for argv, expected in ((["--steps", "0"], "--steps: must be at least 1, got 0"),
                           (["--minutes", "-1"], "--minutes: must not be negative, got -1.0")):
        assert failing(capsys, "demo", "--work", str(tmp_path / "demo"), *argv) == expected
    assert not (tmp_path / "demo").exists()


def test_the_stall_watch_says_what_to_do_when_updates_collapse(tmp_path: Path,
                                                               capsys: pytest.CaptureFixture) -> None:
    from structnmt.training.cpu import StallWatch
    from structnmt.training.logger import RunLogger

    def steady(watch: StallWatch) -> list:
        return [watch.add(step, step / 4.0) for step in range(0, 400, 50)]  # 4 updates/s up to step 350

    watch = StallWatch()
    assert steady(watch) == [None] * 8
    assert watch.add(450, 87.5 + 100 / 0.5) is None  # one slow stretch may be an epoch's batch planning
    warning = watch.add(550, 87.5 + 200 / 0.5)  # two in a row at 0.5 updates/s
    assert warning.startswith("training slowed from 4.00 to 0.50 updates/s: other processes are using the CPU cores")
    assert "training.threads" in warning
    assert watch.add(650, 87.5 + 300 / 0.5) is None  # said once
    paused = StallWatch()
    steady(paused)
    paused.restart()  # a validation of 100 s: not a slow stretch
    assert [paused.add(400, 187.5), paused.add(450, 200.0), paused.add(500, 212.5)] == [None] * 3
    # every training run says it: the run's logger keeps a watch on its train records
    log = RunLogger(tmp_path, tensorboard=False, progress=False)
    for step in range(50, 400, 50):
        log.log("train", {"step": step, "elapsed_s": step / 4.0})
    log.log("train", {"step": 450, "elapsed_s": 287.5})
    log.log("train", {"step": 550, "elapsed_s": 487.5})
    log.close()
    assert "warning: training slowed from 4.00 to 0.50 updates/s" in capsys.readouterr().err


@pytest.mark.slow
def test_the_demo_trains_every_update_beside_two_busy_processes(tmp_path: Path, capsys: pytest.CaptureFixture,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """Two processes that keep two cores busy: the demo takes one thread per free core, trains
    every update it was asked for and reaches its quality (it used to train for three minutes
    with two stalling threads: 146 updates and BLEU 2.37)."""
    from structnmt.training.cpu import available_cores

    monkeypatch.chdir(tmp_path)
    busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(2)]
    try:
        time.sleep(1.0)  # they hold their cores before the demo looks
        scores = structnmt.demo("demo", train_size=3000, seed=1, overrides=BUSY_DEMO, valid_size=20,
                                test_size=60, steps=BUSY_STEPS)
    finally:
        for process in busy:
            process.kill()
            process.wait()
    out = capsys.readouterr().out
    threads = int(out.split("[demo] training with ")[1].split(" CPU thread")[0])
    assert threads <= max(1, available_cores() - 1), out  # fewer threads than cores: two are taken
    assert f"[demo] training {BUSY_STEPS} updates" in out
    assert scores["summary"]["status"] == "max_steps" and scores["summary"]["step"] == BUSY_STEPS
    assert scores["bleu"] >= 25.0, out  # 32.4 measured (1 thread); 2.37 was the three-minute demo beside them
    assert " left" in out  # the progress lines (no terminal here) give the time left
    with capsys.disabled():
        print(f"\nbusy demo: {threads} thread(s), {BUSY_STEPS} updates, test BLEU {scores['bleu']:.2f}, "
              f"{scores['summary']['train_seconds']:.0f} s of training")
