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
    path.mkdir(exist_ok=True)  # asked for more than once in a test
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
    "training.valid_beam=100000": "training.valid_beam: must be at most 1000, got 100000 (search memory and time "
                                  "grow with the beam; one wider than the target vocabulary finds nothing more)",
    "training.lr=.nan": "training.lr: expected a finite number, got nan",
    "training.eps=0": "training.eps: must be positive",
    "model.d_model=0": "model.d_model: must be at least 1, got 0",
    "model.max_positions=-1": "model.max_positions: must be at least 1, got -1",
    "decoding.max_len_a=-1": "decoding.max_len_a: must not be negative, got -1.0",
    "decoding.max_tokens=0": "decoding.max_tokens: must be at least 1, got 0",
    "decoding.beam=1000000": "decoding.beam: must be at most 1000, got 1000000 (search memory and time grow with the "
                             "beam; one wider than the target vocabulary finds nothing more)",
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
    with pytest.raises(ConfigError, match=r"^config: expected a path \(str or pathlib.Path\) or ExperimentConfig, "
                                          r"got 5"):
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
    case(tmp_path, "average", first, checkpoint_of(config, tmp_path / "seed2.pt", _other_seed), "--out",
         tmp_path / "avg.pt")
    writers = tmp_path / "writers"
    writers.mkdir()
    device = a_device(writers)
    for _, argv in writer_argv(writers).values():  # average, plot curves/attention, report, study --report, trees
        for output in (device, Path("/proc/self/o.png"), writers, writers / "train.en" / "o.png"):
            case(tmp_path, *_with(argv, output))
    foreign = tmp_path / "foreign"
    (foreign / "data").mkdir(parents=True)
    (foreign / "data" / "train.src").write_text("the user's own\n")
    case(tmp_path, "demo", "--work", foreign, "--steps", "1")
    for output in (tmp_path, tmp_path / "empty.yaml" / "o.txt", "/proc/self/o.txt", "/proc/version"):
        case(tmp_path, *translate_args(demo, "--output", str(output)))
    case(tmp_path, "translate", "--checkpoint", tmp_path / "a.pt", "--input", tmp_path / "missing.txt")
    case(tmp_path, "demo", "--work", tmp_path / "no-demo", "--steps", "0")
    damaged = tmp_path / "damaged"
    shutil.copytree(demo / "demo/dataset", damaged)
    (damaged / "meta.json").write_text("{")
    case(tmp_path, *translate_args(demo, "--dataset", str(damaged)))
    from structnmt.study import load_study

    for name, (change, _) in BAD_SCORES.items():  # study records that break the schema: study --report
        study_file = study_with_records(tmp_path / name)
        damage(load_study(study_file).record_dir("pascal", 1) / "record.json", change)
        case(tmp_path, "study", study_file, "--report")
    for argv, _ in compare_cases(tmp_path / "compare").values():  # study compare's seven (and one more)
        case(tmp_path, *argv)
    for argv in item8_cli_cases(demo, tmp_path / "item8"):  # export, evaluate, --beam, --nbest (issue 28, item 8)
        case(tmp_path, *argv)
    for argv in items_3_and_4_cli_cases(demo, tmp_path / "items_3_4"):  # slips, offsets, meta.json (items 3, 4)
        case(tmp_path, *argv)

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
BUSY_STEPS = 300


def test_progress_lines_say_the_rate_once_even_for_a_training_shorter_than_their_interval(tmp_path: Path) -> None:
    """No line came during the training (it was shorter than the interval): the last record is
    said on the way out, once; with a terminal (``lines`` false) nothing is."""
    from structnmt.demo_pipeline import ProgressLines

    log = tmp_path / "log.jsonl"
    log.write_text('{"kind": "train", "step": 100, "elapsed_s": 4.0}\n{"kind": "valid", "step": 100}\n'
                   '{"kind": "train", "step": 150, "elapsed_s": 5.0}\n{"kind": "train", "step": 1', encoding="utf-8")
    said: list[str] = []
    with ProgressLines(log, 300, said.append, lines=True, every=100.0):
        pass
    assert said == ["update 150/300 (50%), 30.0 updates/s, about 0:05 left"]
    quiet: list[str] = []
    with ProgressLines(log, 300, quiet.append, lines=False, every=100.0):
        pass
    assert quiet == []
    with pytest.raises(KeyboardInterrupt), ProgressLines(log, 300, quiet.append, lines=True, every=100.0):
        raise KeyboardInterrupt  # a training that stopped on an error: its error alone is said
    assert quiet == []
    done: list[str] = []
    with ProgressLines(log, 150, done.append, lines=True, every=100.0):
        pass
    assert done == ["update 150/150 (100%), 30.0 updates/s"]  # nothing is left to give a time for


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
def test_the_demo_trains_every_update_beside_a_busy_process(tmp_path: Path, capsys: pytest.CaptureFixture,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """A process that keeps a core busy: the demo takes one thread per free core (fewer than the
    cores), trains every update it was asked for and reaches its quality (beside two such
    processes it used to train for three minutes with two stalling threads: 146 updates and BLEU
    2.37). One busy process, not two: on a two-core machine the other test worker needs a core."""
    from structnmt.training.cpu import available_cores

    monkeypatch.chdir(tmp_path)
    # a line every second: on a fast machine the whole training takes less than the default 20 s
    monkeypatch.setattr("structnmt.demo_pipeline.PROGRESS_EVERY_S", 1.0)
    busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"])]
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
    assert threads <= max(1, available_cores() - 1), out  # fewer threads than cores: one is taken
    assert f"[demo] training {BUSY_STEPS} updates" in out
    assert scores["summary"]["status"] == "max_steps" and scores["summary"]["step"] == BUSY_STEPS
    assert scores["bleu"] >= 25.0, out  # 30.8 measured (1 thread); 2.37 was the three-minute demo beside two
    assert " left" in out  # the progress lines (no terminal here) give the time left
    with capsys.disabled():
        print(f"\nbusy demo: {threads} thread(s), {BUSY_STEPS} updates, test BLEU {scores['bleu']:.2f}, "
              f"{scores['summary']['train_seconds']:.0f} s of training")


# ---------------------------------------------------------------------------
# study records that break the record schema, and `structnmt study compare`


def record_of(study, recipe: str, seed: int, folder: Path | None = None) -> Path:
    """A well-formed, current record of a run of the tiny study, made by hand (nothing trained):
    its hypotheses are the references with a word dropped from every (2 + seed)th line."""
    from structnmt.data.corpus import read_lines
    from structnmt.study.provenance import lines_digest
    from structnmt.study.spec import config_digest, train_view

    cfg = study.run_config(recipe, seed)
    folder = folder or study.record_dir(recipe, seed)
    refs = read_lines(cfg.data.splits["test"].tgt)
    hyps = [" ".join(r.split()[:-1]) if i % (2 + seed) == 0 else r for i, r in enumerate(refs)]
    (folder / "hyps").mkdir(parents=True)
    (folder / "hyps" / "test.hyp").write_text("".join(h + "\n" for h in hyps), encoding="utf-8")
    record = {"study": study.name, "recipe": recipe, "seed": seed, "digest": config_digest(cfg),
              "config": train_view(cfg), "test": study.test_view(cfg), "reads_trees": False, "updates": 20,
              "train_seconds": 60.0, "test_seconds": 6.0, "cpu": "a test CPU", "device": "cpu",
              "precision": "float32", "threads": 1, "valid": [{"step": 20, "loss": 2.5, "bleu": 30.0}],
              "scores": {"test": {"bleu": 40.0 + seed, "chrf": 60.0}}, "references": {"test": lines_digest(refs)},
              "finished": "2026-12-01T12:00:00+0000"}
    (folder / "record.json").write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
    return folder / "record.json"


def study_with_records(root: Path, seeds: tuple[int, ...] = (1,)) -> Path:
    """tests/test_study.py's tiny study (vanilla, pascal; no dataset prepared) with a current record
    of each recipe's seed 1, in seconds; returns the study file."""
    from structnmt.study import load_study
    from tests.test_study import _study_file, _write_recipes

    root.mkdir(parents=True, exist_ok=True)
    recipes = _write_recipes(root)
    path = _study_file(root, recipes, name="records", seeds=seeds)
    study = load_study(path)
    for recipe in recipes:
        record_of(study, recipe, 1)
    return path


def damage(path: Path, change) -> None:
    """Rewrite a record.json with ``change(record)`` applied to it in place."""
    record = json.loads(path.read_text())
    change(record)
    path.write_text(json.dumps(record))


#: records that used to pass: scores [] was counted as recorded and left out of every table,
#: a record {} was called stale ("recipe changed"), scores {} a done run without a score
NO_SCORES = {
    "scores_a_list": (lambda r: r.update(scores=[]), "scores: expected an object of test sets, got list []"),
    "scores_empty": (lambda r: r.update(scores={}), "scores: no test set scored (an empty object)"),
    "record_empty": (lambda r: r.clear(), "no recipe, seed, digest, config, test, updates, train_seconds, "
                                          "test_seconds, valid, scores (missing keys)"),
}


@pytest.mark.parametrize("case", sorted(NO_SCORES))
def test_a_record_without_scores_is_damaged_in_status_and_report(case: str, tmp_path: Path) -> None:
    from structnmt.study import format_status, load_study, run_study, study_status
    from structnmt.study.report import write_report

    change, why = NO_SCORES[case]
    path = study_with_records(tmp_path)
    study = load_study(path)
    record = study.record_dir("pascal", 1) / "record.json"
    rows = {r["recipe"]: r for r in study_status(path)}
    assert rows["pascal"]["state"] == rows["vanilla"]["state"] == "done"  # the control: both well-formed
    damage(record, change)
    rows = {r["recipe"]: r for r in study_status(path)}
    assert rows["vanilla"]["state"] == "done"
    assert rows["pascal"]["state"] == "damaged", rows["pascal"]
    assert rows["pascal"]["note"].startswith(f"{record} is damaged: {why}; restore it"), rows["pascal"]["note"]
    assert "1 damaged, 1 done" in format_status(list(rows.values()))
    text = write_report(load_study(path)).read_text()
    assert "1 of 2 runs recorded (0 failed, 0 pending, 0 stale, 1 damaged)" in text
    assert f"- **pascal seed 1**: {record} is damaged: {why}" in text
    # nothing is trained over it
    assert run_study(path, report=False) == {"runs": {"pascal/seed1": "damaged"}, "report": None}


#: what `study --report` met with a traceback before: a string where BLEU goes (TypeError), no scores (KeyError)
BAD_SCORES = {
    "bleu_a_string": (lambda r: r["scores"]["test"].update(bleu="high"),
                      'scores.test.bleu: expected a number, got str "high"'),
    "no_scores_key": (lambda r: r.pop("scores"), "no scores (missing key)"),
}


@pytest.mark.parametrize("case", sorted(BAD_SCORES))
def test_study_report_names_a_record_with_bad_scores_in_one_line(case: str, tmp_path: Path,
                                                                  capsys: pytest.CaptureFixture) -> None:
    from structnmt.study import load_study

    change, why = BAD_SCORES[case]
    path = study_with_records(tmp_path)
    record = load_study(path).record_dir("pascal", 1) / "record.json"
    damage(record, change)
    message = failing(capsys, "study", str(path), "--report")
    assert message.startswith(f"1 damaged record, listed in the report; the first: {record} is damaged: {why}; "
                              f"restore it from version control (git checkout -- {record.parent})"), message
    text = (load_study(path).records / "report.md").read_text()
    assert "1 of 2 runs recorded" in text and f"- **pascal seed 1**: {record} is damaged: {why}" in text
    status = cli(capsys, "study", str(path), "--status")
    assert status[0] == 0 and "damaged" in status[1]


def compare_cases(root: Path) -> dict[str, tuple[list[str], str]]:
    """`study compare` argument lists that must each end in one error line, and the start of that line.
    The study has seeds 1 and 2 and records of seed 1 only."""
    from structnmt.study import load_study

    path = study_with_records(root, seeds=(1, 2))
    study = load_study(path)
    ours = study.record_dir("vanilla", 1)
    truncated, no_hyps = root / "truncated", root / "no_hyps"
    for copy in (truncated, no_hyps):
        shutil.copytree(ours, copy)
    (truncated / "record.json").write_text((ours / "record.json").read_text()[:200])
    shutil.rmtree(no_hyps / "hyps")
    args = [str(path), "vanilla", "1"]
    return {
        "missing_study_file": (["study", "compare", str(root / "nope.yaml"), "vanilla", "1", str(ours)],
                               f"{root / 'nope.yaml'}: study file not found"),
        "unknown_recipe": (["study", "compare", str(path), "vanila", "1", str(ours)],
                           f"RECIPE: 'vanila' is not a recipe of {path} (recipes: vanilla, pascal)"),
        "seed_not_in_the_study": (["study", "compare", str(path), "vanilla", "7", str(ours)],
                                  f"SEED: vanilla has no seed 7 in {path} (seeds: 1, 2)"),
        "unrecorded_seed": (["study", "compare", str(path), "vanilla", "2", str(ours)],
                            f"SEED: vanilla seed 2 has no record in {study.record_dir('vanilla', 2)}: run the study"),
        "unrecorded_seed_of": (["study", "compare", *args, str(ours), "--seed-of", "1", "2"],
                               f"--seed-of: vanilla seed 2 has no record in {study.record_dir('vanilla', 2)}"),
        "missing_folder": (["study", "compare", *args, str(root / "nowhere")],
                           f"OTHER_RECORD: {root / 'nowhere'}: no such folder"),
        "truncated_record": (["study", "compare", *args, str(truncated)],
                             f"{truncated / 'record.json'} is damaged: not valid JSON"),
        "record_without_hypotheses": (["study", "compare", *args, str(no_hyps)],
                                      f"{no_hyps / 'record.json'} is damaged: scores.test: its hypotheses "
                                      "hyps/test.hyp are missing"),
    }


@pytest.fixture(scope="module")
def compare_study(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[list[str], str]]:
    return compare_cases(tmp_path_factory.mktemp("compare"))


@pytest.mark.parametrize("case", ["missing_study_file", "unknown_recipe", "seed_not_in_the_study", "unrecorded_seed",
                                  "unrecorded_seed_of", "missing_folder", "truncated_record",
                                  "record_without_hypotheses"])
def test_study_compare_names_each_bad_argument_in_one_line(case: str, compare_study: dict,
                                                           capsys: pytest.CaptureFixture) -> None:
    argv, expected = compare_study[case]
    message = failing(capsys, *argv)
    assert message.startswith(expected), message
    # the script of before is a shim over the subcommand: the same one line, never a traceback
    sys.path.insert(0, str(ROOT / "studies"))
    import compare_records

    assert compare_records.main(argv[2:]) == 2
    assert capsys.readouterr().err == f"error: {message}\n"


def test_study_compare_refuses_a_record_of_another_recipe_or_config(tmp_path: Path,
                                                                     capsys: pytest.CaptureFixture) -> None:
    from structnmt.study import load_study

    path = study_with_records(tmp_path)
    study = load_study(path)
    ours = study.record_dir("vanilla", 1)
    args = ["study", "compare", str(path), "vanilla", "1"]
    pascal = tmp_path / "pascal_copy"
    shutil.copytree(study.record_dir("pascal", 1), pascal)
    message = failing(capsys, *args, str(pascal))
    assert message == (f"OTHER_RECORD: {pascal} (A): it is a record of recipe 'pascal', not 'vanilla'; not the same "
                       "run, so not compared (--any-recipe compares it knowingly)")
    dropout = tmp_path / "dropout"
    shutil.copytree(ours, dropout)

    def other_dropout(record: dict) -> None:
        record["config"]["model"]["dropout"] = 0.3
        record["digest"] = "0" * 64

    damage(dropout / "record.json", other_dropout)
    message = failing(capsys, *args, str(dropout))
    assert message.startswith(f"OTHER_RECORD: {dropout} (A): it was trained from another config than the study gives "
                              "vanilla seed 1 (model.dropout differ): training digest 000000000000…, the study's "), \
        message
    # knowingly: compared, with a note that says what it is
    code, out, err = cli(capsys, *args, str(pascal), "--any-recipe")
    assert code == 0, err
    assert out.splitlines()[0].startswith(f"note: {pascal} (A): it is a record of recipe 'pascal'")
    assert [line for line in out.splitlines() if line.startswith("test: ")]
    # the same run (a copy of the study's record): compared, every line the same; and two seeds of the study
    same = tmp_path / "same"
    shutil.copytree(ours, same)
    code, out, err = cli(capsys, *args, str(same))
    assert code == 0, err
    best = "(CPU a test CPU; best validation BLEU 30.00 at 20 updates, loss 2.5000)"
    assert out.splitlines()[:3] == [f"## vanilla seed 1: {same} (A) against the study's record (B)",
                                    f"A: {same} {best}", f"B: {ours} {best}"]
    (line,) = [line for line in out.splitlines() if line.startswith("test: ")]
    assert "B − A +0.00," in line and "identical lines 24 of 24 (100%)" in line


# ---------------------------------------------------------------------------
# every output path a user names goes through one check (io.check_output_path)


def a_device(tmp_path: Path) -> Path:
    """A character device of the test's own, a twin of /dev/null (as root), so that a writer that
    replaced it would not break the machine's /dev/null; a FIFO where devices cannot be made."""
    import stat

    path = tmp_path / "null-device"
    try:
        os.mknod(path, stat.S_IFCHR | 0o666, os.makedev(1, 3))
    except OSError:
        os.mkfifo(path)
    return path


def is_special(path: Path) -> bool:
    import stat

    mode = os.stat(path).st_mode
    return stat.S_ISCHR(mode) or stat.S_ISFIFO(mode)


def writer_argv(tmp_path: Path) -> dict[str, tuple[str, list[str]]]:
    """Every command that writes a file the user names: (the argument's name in errors, argv with
    ``OUT`` where the output goes). The check comes first, so the inputs need not be real."""
    config = experiment(tmp_path)
    run = tmp_path / "some-run"
    (run / "eval").mkdir(parents=True)
    (run / "log.jsonl").write_text('{"kind": "train", "step": 1, "loss": 3.0}\n')
    ckpt = tmp_path / "missing.pt"
    return {
        "average": ("--out", ["average", str(ckpt), str(ckpt), "--out", "OUT"]),
        "plot curves": ("--out", ["plot", "curves", str(run), "--out", "OUT"]),
        "plot attention": ("--out", ["plot", "attention", "--checkpoint", str(ckpt), "--sentence", "the dog .",
                                     "--out", "OUT"]),
        "report": ("--out", ["report", str(run), "--out", "OUT"]),
        "study --report": ("--out", ["study", str(tmp_path / "study.yaml"), "--report", "--out", "OUT"]),
        "trees export": ("file", ["trees", "export", str(config), "OUT"]),
    }


def _with(argv: list[str], out: Path) -> list[str]:
    return [str(out) if a == "OUT" else a for a in argv]


@pytest.mark.parametrize("command", ["average", "plot curves", "plot attention", "report", "study --report",
                                     "trees export"])
def test_every_writer_refuses_a_device_and_leaves_it_a_device(command: str, tmp_path: Path,
                                                              capsys: pytest.CaptureFixture,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """``average A B --out /dev/null`` exited 0 and, as root, replaced /dev/null with a regular file
    (the atomic rename); so did every writer but ``translate``. Now each refuses it before any work."""
    argument, argv = writer_argv(tmp_path)[command]
    loaded = []
    monkeypatch.setattr(structnmt.api, "load", lambda *a, **k: loaded.append(a))  # plot attention: never loaded
    own = a_device(tmp_path)  # first our own device: a writer that still replaced devices fails here
    assert failing(capsys, *_with(argv, own)) == f"{argument}: {own} is not a regular file; give a file name"
    assert is_special(own)
    for device in (Path("/dev/null"), Path("/dev/full")):
        if not device.exists() or not is_special(device):
            continue  # no such device here: our own above stood for it
        assert failing(capsys, *_with(argv, device)) == f"{argument}: {device} is not a regular file; give a file name"
        assert is_special(device), f"{device} was replaced"
    assert not loaded
    assert not [p for p in tmp_path.rglob("*.tmp")]


@pytest.mark.parametrize("command", ["average", "plot curves", "plot attention", "report", "study --report",
                                     "trees export"])
def test_every_writer_refuses_kernel_paths_directories_and_paths_under_a_file(
        command: str, tmp_path: Path, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    argument, argv = writer_argv(tmp_path)[command]
    monkeypatch.setattr(structnmt.api, "load", lambda *a, **k: pytest.fail("the model was loaded"))
    (tmp_path / "a-file").write_text("x")
    cases = {
        tmp_path: f"{argument}: {tmp_path} is a directory; give a file name",
        tmp_path / "a-file" / "o.png": f"{argument}: {tmp_path / 'a-file' / 'o.png'}: {tmp_path / 'a-file'} is a "
                                       "file, not a directory",
        Path("/proc/self/o.png"): f"{argument}: /proc/self/o.png: cannot write into /proc/self (/proc is the "
                                  "kernel's interface, not a place for files)",
        Path("/sys/kernel/o.png"): f"{argument}: /sys/kernel/o.png: cannot write into /sys/kernel (/sys is the "
                                   "kernel's interface, not a place for files)",
    }
    for out, expected in cases.items():
        if not out.parent.is_dir() and out.is_relative_to("/sys"):
            continue  # no sysfs in this container
        assert failing(capsys, *_with(argv, out)).startswith(expected), out


OUTPUT_DIR_COMMANDS = {  # command line with OUT where the output directory goes; the name it is known by
    "download": (["download", "iwslt14-de-en", "--from", "RAW", "--out", "OUT"], "--out"),
    "prepare multi30k": (["prepare", "multi30k", "--from", "RAW", "--out", "OUT"], "--out"),
    "parser train": (["parser", "train", "--lang", "en", "--conllu", "RAW/x.conllu", "--out", "OUT"], "--out"),
    "export ctranslate2": (["export", "ctranslate2", "RAW/best.pt", "OUT"], "OUT_DIR"),
    "inspect": (["inspect", "trees", "RAW", "--out", "OUT"], "--out"),
}


@pytest.mark.parametrize("command", sorted(OUTPUT_DIR_COMMANDS))
def test_an_output_directory_that_cannot_be_one_is_refused_before_any_work(
        command: str, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    argv, argument = OUTPUT_DIR_COMMANDS[command]
    (tmp_path / "a-file").write_text("x")
    cases = {
        tmp_path / "a-file": f"{argument}: {tmp_path / 'a-file'} is not a directory; give a directory name",
        tmp_path / "a-file" / "out": f"{argument}: {tmp_path / 'a-file' / 'out'}: {tmp_path / 'a-file'} is a file, "
                                     "not a directory",
        Path("/proc/self/out"): f"{argument}: /proc/self/out: cannot write into /proc/self (/proc is the "
                                "kernel's interface, not a place for files)",
    }
    for out, expected in cases.items():
        line = [str(out) if a == "OUT" else a.replace("RAW", str(tmp_path / "nowhere")) for a in argv]
        assert failing(capsys, *line).startswith(expected), (out, line)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a-file"]  # nothing made, nothing downloaded


def test_report_plots_must_be_a_directory(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    _, argv = writer_argv(tmp_path)["report"]
    plots = a_device(tmp_path)
    assert (failing(capsys, *_with(argv, tmp_path / "report.md"), "--plots", str(plots))
            == f"--plots: {plots} is not a directory; give a directory name")
    assert is_special(plots) and not (tmp_path / "report.md").exists()


def test_the_atomic_writers_never_replace_what_is_not_a_regular_file(tmp_path: Path) -> None:
    """The last net under the check: a writer reached some other way still refuses to rename over a device."""
    from structnmt.io import OutputError, atomic_write_bytes

    device = a_device(tmp_path)
    with pytest.raises(OutputError, match="is not a regular file; nothing was written there"):
        atomic_write_bytes(device, b"x")
    assert is_special(device)
    assert [p.name for p in tmp_path.iterdir()] == [device.name]


# ---------------------------------------------------------------------------
# the demo's work directory holds nothing of the user's


def test_the_demo_refuses_a_work_directory_it_did_not_write(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """``demo --work DIR`` replaced a user's DIR/data/train.src with synthetic text and removed a
    DIR/run/ holding notes.txt without a word."""
    mine = tmp_path / "mine"
    (mine / "data").mkdir(parents=True)
    (mine / "data" / "train.src").write_text("my own corpus\n")
    notes = tmp_path / "notes"
    (notes / "run").mkdir(parents=True)
    (notes / "run" / "notes.txt").write_text("do not lose\n")
    for work, kept, shown in ((mine, mine / "data" / "train.src", "data/"),
                              (notes, notes / "run" / "notes.txt", "run/")):
        before = kept.read_text()
        message = failing(capsys, "demo", "--work", str(work), "--steps", "1")
        assert message == (f"--work: {work} holds files the demo did not write ({shown}); the demo would replace "
                           "its data/, dataset/ and run/: choose another --work, or pass --force to let it")
        assert kept.read_text() == before
        assert sorted(p.name for p in work.iterdir()) == [shown.rstrip("/")]  # nothing written, no marker
    file = tmp_path / "a-file"
    file.write_text("x")
    assert failing(capsys, "demo", "--work", str(file)) == f"--work: {file} is a file, not a directory"


def test_the_demo_reruns_in_its_own_work_directory_and_takes_another_with_force(
        tmp_path: Path, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    from structnmt.demo_pipeline import MARKER

    monkeypatch.chdir(tmp_path)
    quick = {**TINY, "training.max_steps": 2, "training.valid_every": 2}
    for _ in range(2):  # the rerun finds its own marker: the README's `structnmt demo`, twice
        scores = structnmt.demo("demo", train_size=200, seed=3, overrides=quick, verbose=False, valid_size=8,
                                test_size=8)
        assert scores["summary"]["step"] == 2
    assert (tmp_path / "demo" / MARKER).is_file()
    (tmp_path / "demo" / "more").mkdir()  # README: a run of the user's own beside the demo's (demo/more) stays
    structnmt.demo("demo", train_size=200, seed=3, overrides=quick, verbose=False, valid_size=8, test_size=8)
    assert (tmp_path / "demo" / "more").is_dir()
    (tmp_path / "taken" / "run").mkdir(parents=True)
    (tmp_path / "taken" / "run" / "notes.txt").write_text("mine\n")
    sets = [arg for key, value in quick.items() for arg in ("--set", f"{key}={value}")]
    code, out, err = cli(capsys, "demo", "--work", "taken", "--train-size", "200", "--force", *sets)
    assert code == 0, err
    assert not (tmp_path / "taken" / "run" / "notes.txt").exists()  # --force: the user said so
    assert (tmp_path / "taken" / MARKER).is_file()


# ---------------------------------------------------------------------------
# average of checkpoints of two runs


def _other_seed(state: dict) -> None:
    state["config"]["training"]["seed"] = 2


def _other_out_dir(state: dict) -> None:
    state["config"]["training"]["out_dir"] = "runs/again"


def _later_step_of_a_longer_run(state: dict) -> None:
    state["progress"]["step"] = 9  # one run, resumed with a larger budget: the same run
    state["config"]["training"]["max_steps"] = 900


def test_average_refuses_checkpoints_of_two_runs_unless_asked(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """Seeds 1 and 2 of one config have the same shapes and origin, and their mean was accepted: a
    much worse model than either. Checkpoints of one run at different steps still average."""
    config = experiment(tmp_path)
    first = checkpoint_of(config, tmp_path / "a.pt")
    out_dir = os.path.normpath(load_config(config).training.out_dir)
    for change, differs in ((_other_seed, "training.seed: 2 here, 1 in a.pt"),
                            (_other_out_dir, f"training.out_dir: 'runs/again' here, {out_dir!r} in a.pt")):
        other = checkpoint_of(config, tmp_path / "b.pt", change)
        message = failing(capsys, "average", str(first), str(other), "--out", str(tmp_path / "avg.pt"))
        assert message.startswith(f"{other}: another run than {first} ({differs}); averaging the weights of two "
                                  "runs gives a worse model than either"), message
        assert "--across-runs" in message
        assert not (tmp_path / "avg.pt").exists()
        code, _, err = cli(capsys, "average", str(first), str(other), "--out", str(tmp_path / "avg.pt"),
                           "--across-runs")
        assert code == 0, err
        (tmp_path / "avg.pt").unlink()
    later = checkpoint_of(config, tmp_path / "c.pt", _later_step_of_a_longer_run)
    assert cli(capsys, "average", str(first), str(later), "--out", str(tmp_path / "avg.pt"))[0] == 0


# ---------------------------------------------------------------------------
# issue 28, item 8: arguments that raised tracebacks, beams that ran away, a run with no end


def item8_cli_cases(demo: Path, root: Path) -> list[list[str]]:
    """This section's command-line cases, for ``test_no_fault_case_prints_a_traceback``."""
    root.mkdir()
    (root / "empty.hyp").write_text("")
    (root / "empty.ref").write_text("")
    evaluate = ["evaluate", "--hyp", str(root / "empty.hyp"), "--ref", str(root / "empty.ref")]
    return [["export", "ctranslate2", str(demo / "demo/run/last.pt"), str(root / "ct2"), "--quantization", "garbage"],
            evaluate, [*evaluate, "--allow-empty"],
            translate_args(demo, "--beam", "1000000"), translate_args(demo, "--nbest", "5000"),
            ["test", str(demo / "demo/run"), "--beam", "1000000", "--device", "cpu"]]


def test_export_refuses_an_unknown_quantization_listing_the_known_ones(demo: Path, tmp_path: Path,
                                                                       capsys: pytest.CaptureFixture) -> None:
    """It was CTranslate2's ValueError, raised after the model was loaded and converted."""
    known = "int8, int8_float32, int8_float16, int8_bfloat16, int16, float16, bfloat16, float32"
    out = tmp_path / "ct2"
    message = failing(capsys, "export", "ctranslate2", str(demo / "demo/run/last.pt"), str(out),
                      "--quantization", "garbage")
    assert message == f"--quantization: unknown weight type 'garbage' (known: {known})"
    with pytest.raises(ConfigError, match=r"^quantization: unknown weight type 'garbage' \(known: int8, "):
        structnmt.api.export_ctranslate2(demo / "demo/run/last.pt", out, quantization="garbage")
    assert not out.exists()


#: API calls given what they cannot take -> (exception, its message from the start)
API_ARGUMENTS = {
    "nbest_n_as_a_string": (lambda t: t.nbest(["the dog ."], "2"), ConfigError, "n: expected an integer, got '2'"),
    "attention_of_a_list": (lambda t: t.attention(["the dog .", "a cat ."]), ConfigError,
                            "source: expected one sentence (a str), got list: attention maps are of one sentence "
                            "pair at a time"),
    "attention_of_none": (lambda t: t.attention(None), ConfigError, "source: expected one sentence (a str), got "
                                                                    "NoneType"),
    "evaluate_none": (lambda t: structnmt.evaluate(None, None), ConfigError,
                      "hypotheses: expected a file (str or pathlib.Path) or a list of sentences (str), got None"),
    "evaluate_no_references": (lambda t: structnmt.evaluate(["a"], None), ConfigError,
                               "references: expected a file (str or pathlib.Path), a list of sentences or a list of "
                               "either, got None"),
    "translate_bytes": (lambda t: t.translate(b"A man"), DataError,
                        "sentences: got bytes, not a str: decode them first (text.decode('utf-8'))"),
    "translate_a_list_holding_bytes": (lambda t: t.translate(["the dog .", b"A man"]), DataError,
                                       "sentences: sentence 2 is bytes, not a str: decode it first"),
    # `structnmt translate` refuses such a line of its input; the API the same sentence
    "translate_a_bell": (lambda t: t.translate(["the dog .", "a bell \x07 rings ."]), DataError,
                         "sentences: sentence 2 holds control character U+0007"),
    "translate_a_text_of_two_lines": (lambda t: t.translate("the dog .\nthe cat ."), DataError,
                                      "sentences: sentence 1 holds control character U+000A"),
    "score_a_line_break": (lambda t: t.score(["the dog ."], ["der hund .\nein"]), DataError,
                           "references: sentence 1 holds control character U+000A"),
}


@pytest.mark.parametrize("case", sorted(API_ARGUMENTS))
def test_the_api_names_each_argument_it_cannot_take(case: str, demo: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import re

    monkeypatch.chdir(demo)
    call, error, message = API_ARGUMENTS[case]
    translator = structnmt.load("demo/run/last.pt", "cpu")
    with pytest.raises(error, match="^" + re.escape(message)):
        call(translator)


@pytest.mark.parametrize("allow_empty", [False, True], ids=["refused", "allow-empty"])
def test_evaluating_an_empty_output_file_is_one_line(allow_empty: bool, tmp_path: Path,
                                                     capsys: pytest.CaptureFixture) -> None:
    """Empty hypothesis and reference files gave sacreBLEU's IndexError, with --allow-empty or not."""
    hyp, ref = tmp_path / "empty.hyp", tmp_path / "empty.ref"
    hyp.write_text("")
    ref.write_text("")
    message = failing(capsys, "evaluate", "--hyp", str(hyp), "--ref", str(ref), *(["--allow-empty"] * allow_empty))
    assert message == (f"{hyp}: no hypothesis lines: nothing to score (allow_empty accepts empty lines, not an "
                       "empty file)")
    with pytest.raises(DataError, match="^hypotheses: no hypothesis lines: nothing to score"):
        structnmt.evaluate([], [[]], allow_empty=allow_empty)


@pytest.fixture
def no_wide_search(monkeypatch: pytest.MonkeyPatch) -> None:
    """A search wider than 1000 fails at once instead of running for minutes into many GB (as it did)."""
    import structnmt.model.search as search

    real = search.translate_batch

    def guarded(model, batch, beam=5, *args, **kwargs):
        assert beam <= 1000, f"a beam of {beam} was searched"
        return real(model, batch, beam, *args, **kwargs)

    monkeypatch.setattr("structnmt.decoding.translate.translate_batch", guarded)


def test_a_beam_over_the_limit_is_refused_naming_it(demo: Path, no_wide_search: None, monkeypatch: pytest.MonkeyPatch,
                                                    capsys: pytest.CaptureFixture) -> None:
    why = "(search memory and time grow with the beam; one wider than the target vocabulary finds nothing more)"
    monkeypatch.chdir(demo)
    translator = structnmt.load("demo/run/last.pt", "cpu")
    with pytest.raises(ConfigError, match=r"^beam: must be at most 1000, got 1000000 \(search memory"):
        translator.translate(["the dog ."], beam=10**6)
    with pytest.raises(ConfigError, match=r"^n: must be at most 1000, got 5000"):
        translator.nbest(["the dog ."], 5000)
    beam = failing(capsys, *translate_args(demo, "--beam", "1000000"))
    assert beam == f"--beam: must be at most 1000, got 1000000 {why}"
    nbest = failing(capsys, *translate_args(demo, "--nbest", "5000"))
    assert nbest.startswith("--nbest: must be at most 1000, got 5000")
    assert failing(capsys, "test", "demo/run", "--beam", "1000000", "--device", "cpu") == beam
    # below 1, or an n-best list wider than its beam: the option on the command line, the argument in Python
    assert failing(capsys, *translate_args(demo, "--beam", "0")) == "--beam: must be at least 1, got 0"
    assert failing(capsys, *translate_args(demo, "--nbest", "3", "--beam", "2")) == \
        "--nbest: 3 best need a beam of at least 3, got --beam 2"
    with pytest.raises(ConfigError, match=r"^beam: must be at least 1, got 0$"):
        translator.translate(["the dog ."], beam=0)
    with pytest.raises(ConfigError, match=r"^max_len_a: must not be negative, got -1.0$"):
        translator.translate(["the dog ."], max_len_a=-1)
    with pytest.raises(ConfigError, match=r"^n: 3 best need a beam of at least 3, got beam=2$"):
        translator.nbest(["the dog ."], 3, beam=2)
    # decoding.beam in a config: BAD_NUMBERS["decoding.beam=1000000"]
    assert translator.translate(["the dog ."], beam=1000)  # the limit itself is searched (cut to the vocabulary)


def test_a_beam_wider_than_the_vocabulary_is_cut_to_it(demo: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Beam (and nbest) past the target vocabulary are searched as the vocabulary's size, and a wide
    beam's batches are cut so that sentences x beam x vocabulary stays under SEARCH_ELEMENTS."""
    import structnmt.decoding.translate as translate
    import structnmt.model.search as search

    monkeypatch.chdir(demo)
    translator = structnmt.load("demo/run/last.pt", "cpu")
    vocab = translator.model.tgt_embed.num_embeddings
    assert vocab < 1000
    searched: list[tuple[int, int, int]] = []  # (sentences, beam, nbest)

    def fake(model, batch, beam, length_penalty, max_len_a, max_len_b, nbest):
        searched.append((batch.src.shape[0], beam, nbest))
        return [[search.Hypothesis([], 0.0, 0.0)] * nbest for _ in range(batch.src.shape[0])]

    monkeypatch.setattr(search, "beam_search", fake)
    monkeypatch.setattr(translate, "SEARCH_ELEMENTS", 2 * vocab * vocab)  # two sentences at the widest beam
    out = translator.nbest(["the dog .", "a cat .", "the clock .", "a dog sees .", "the cat ."], vocab + 50)
    assert searched == [(2, vocab, vocab), (2, vocab, vocab), (1, vocab, vocab)]
    assert [len(hyps) for hyps in out] == [vocab] * 5


def test_training_with_no_limit_says_at_the_start_how_it_ends(prepared: Path, capsys: pytest.CaptureFixture,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """max_steps, max_epochs and max_minutes all 0 trained without end and without a word."""
    from structnmt.training.trainer import Trainer

    monkeypatch.setattr(Trainer, "_loop", lambda self, log: "interrupted")  # the start is what is checked
    code, _, err = cli(capsys, "train", str(prepared), "--set", "training.max_steps=0", "--set",
                       "training.valid_every=0")
    assert code == 75, err
    assert ("warning: training.max_steps, max_epochs and max_minutes are 0 (no limit): training stops only when "
            "stopped (Ctrl-C or SIGTERM; --resume continues it); set one of them, or training.early_stopping, for "
            "it to end by itself\n") in err
    for limit in ("training.max_steps=5", "training.max_epochs=1", "training.max_minutes=1"):  # the control
        code, _, err = cli(capsys, "train", str(prepared), "--set", "training.max_steps=0", "--set", limit,
                           "--set", "training.valid_every=0")
        assert code == 75 and "no limit" not in err, (limit, err)


# ---------------------------------------------------------------------------
# issue 28, item 3: a slip anywhere in any split; an evaluation split emptied by cleaning


def slipped(lines: list[str], added: int, lost: int) -> list[str]:
    """A blank line added before ``added`` and the line then numbered ``lost`` deleted (1-based):
    the lines in between are shifted by one, those after are in step again; the length is kept."""
    out = blank_at(lines, added)
    return out[:lost - 1] + out[lost:] + [lines[-1]]


def with_split(config: Path, name: str, src: list[str], tgt: list[str]) -> Path:
    """``config`` with a split ``name`` of these lines (files ``NAME.en`` and ``NAME.de`` beside it)."""
    root = config.parent
    (root / f"{name}.en").write_text("".join(s + "\n" for s in src), encoding="utf-8")
    (root / f"{name}.de").write_text("".join(t + "\n" for t in tgt), encoding="utf-8")
    raw = yaml.safe_load(config.read_text())
    raw["data"]["splits"][name] = {"src": str(root / f"{name}.en"), "tgt": str(root / f"{name}.de")}
    config.write_text(yaml.safe_dump(raw))
    return config


def test_a_slip_in_the_last_50_lines_is_found(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """The 200-pair windows checked every 50 pairs never judged a file's last ~130 lines."""
    from structnmt.data.corpus import AlignmentWatch

    src, tgt = lengths_corpus(3000)
    config = plain_experiment(tmp_path, blank_at(src, 2960), tgt)  # 41 pairs shifted, up to the last line
    message = failing(capsys, "prepare", str(config))
    assert message.startswith(f"{tmp_path / 'train.en'}:2960: source and target stop matching here: from this "
                              "line on, source line n reads like the translation of target line n-1"), message
    assert not (tmp_path / "dataset").exists()
    lost = AlignmentWatch()  # a target line lost (no blank line to point at), 40 lines from the end
    for number, (s, t) in enumerate(zip(src, tgt[:2959] + tgt[2960:] + ["lost"]), start=1):
        lost.add(number, s, t)
    line, offset = lost.finish()
    assert offset == 1 and abs(line - 2960) <= 3, (line, offset)


def test_a_200_line_split_shifted_at_line_50_is_found(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """Splits under 206 pairs were never checked; one too short to be checked now says so."""
    config = plain_experiment(tmp_path, *lengths_corpus(600))
    val_src, val_tgt = lengths_corpus(200, seed=1)
    with_split(config, "val", blank_at(val_src, 50), val_tgt)
    message = failing(capsys, "prepare", str(config))
    assert message.startswith(f"{tmp_path / 'val.en'}:50: source and target stop matching here: from this line "
                              "on, source line n reads like the translation of target line n-1"), message
    with_split(config, "val", val_src[:8], val_tgt[:8])
    code, out, err = cli(capsys, "prepare", str(config))
    assert code == 0, err
    assert (f"val: note: {tmp_path / 'val.en'}: only 8 pairs: too few to check that source and target lines "
            "match (the check needs at least 20); not checked") in out


def test_a_file_that_cannot_be_checked_says_why() -> None:
    """Too short to fit the model to, or lengths that tell nothing: not checked, and said (not refused)."""
    from structnmt.data.corpus import AlignmentWatch

    short = AlignmentWatch()
    for number, (s, t) in enumerate(zip(*lengths_corpus(8)), start=1):
        short.add(number, s, t)
    assert short.finish() is None
    assert short.unchecked == ("only 8 pairs: too few to check that source and target lines match (the check "
                               "needs at least 20); not checked")
    constant = AlignmentWatch()
    for number in range(1, 1001):
        constant.add(number, "a b c", "x y z")
    assert constant.finish() is None
    assert constant.unchecked == ("the lengths of source and target lines do not follow each other in the first "
                                  "1000 pairs (as a translation's do) at any offset up to 3 lines, so they cannot "
                                  "tell whether the lines match; not checked")
    aligned = AlignmentWatch()
    for number, (s, t) in enumerate(zip(*lengths_corpus(300)), start=1):
        aligned.add(number, s, t)
    assert aligned.finish() is None and aligned.unchecked is None


def test_a_local_slip_of_80_pairs_is_found(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """A blank line added at 1,000 and a line deleted at 1,080: no 200-pair window was mostly shifted."""
    from structnmt.data.corpus import AlignmentWatch

    src, tgt = lengths_corpus(2000)
    message = failing(capsys, "prepare", str(plain_experiment(tmp_path, slipped(src, 1000, 1080), tgt)))
    assert message.startswith(f"{tmp_path / 'train.en'}:1000: source and target stop matching here: from this "
                              "line on, source line n reads like the translation of target line n-1"), message
    watch = AlignmentWatch()  # the same slip on the target side
    for number, (s, t) in enumerate(zip(src, slipped(tgt, 1000, 1080)), start=1):
        watch.add(number, s, t)
    assert watch.finish() == (1000, -1)


def test_slips_in_real_multi30k_splits_are_found_and_clean_splits_pass_with_a_margin() -> None:
    """Multi30k (../shared): every split of En-De and En-Fr passes, its highest CUSUM score at most
    60% of the threshold (12.1 of 25 measured, train En-De); a slip in the last 50 lines of the
    loosest split (MSCOCO En-De), a 200-line split shifted at line 50 and an 80-pair slip are found."""
    import gzip

    from structnmt.data.corpus import AlignmentWatch
    from tests.conftest import shared_path

    def read(name: str) -> list[str]:
        with gzip.open(shared_path("data", "multi30k", name), "rt", encoding="utf-8") as handle:
            return handle.read().splitlines()

    def watch(src: list[str], tgt: list[str]) -> AlignmentWatch:
        seen = AlignmentWatch()
        for number, (s, t) in enumerate(zip(src, tgt), start=1):
            if seen.add(number, s, t):
                break
        seen.finish()
        return seen

    for split in ("train", "val", "test_2016_flickr", "test_2017_flickr", "test_2017_mscoco"):
        src = read(f"{split}.en.gz")
        for lang in ("de", "fr"):
            clean = watch(src, read(f"{split}.{lang}.gz"))
            assert clean.broken is None and clean.unchecked is None, (split, lang)
            assert clean.peak <= 0.6 * clean.threshold, (split, lang, clean.peak)
    src, tgt = read("test_2017_mscoco.en.gz"), read("test_2017_mscoco.de.gz")
    assert watch(blank_at(src, len(src) - 49), tgt).broken == (len(src) - 49, 1)
    src, tgt = read("val.en.gz"), read("val.de.gz")
    assert watch(blank_at(src[:200], 50), tgt[:200]).broken == (50, 1)
    src, tgt = read("train.en.gz"), read("train.fr.gz")
    assert watch(src, slipped(tgt, 1000, 1080)).broken == (1000, -1)


def test_a_validation_split_emptied_by_cleaning_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """It used to be prepared, and `train` then failed on a split without arrays."""
    src, tgt = lengths_corpus(300)
    config = with_split(plain_experiment(tmp_path, src, tgt), "val", src[:5], [""] * 5)
    message = failing(capsys, "prepare", str(config))
    assert message == (f"{tmp_path / 'val.en'}: no sentence pair of the val split is left after cleaning "
                       "(dropped: empty 5); every split needs at least one")
    assert not (tmp_path / "dataset").exists()


# ---------------------------------------------------------------------------
# issue 28, item 4: damaged offsets; a byte-order mark; an incomplete meta.json


DAMAGED_OFFSETS = {
    3: "offsets are out of order: offsets[5] = 3 (where sentence 6 starts) is below offsets[4] = ",
    99999999: "offsets[5] = 99999999 (where sentence 6 starts) is outside the ",
}


@pytest.mark.parametrize("value", sorted(DAMAGED_OFFSETS))
def test_damaged_offsets_are_named_when_the_dataset_opens(value: int, prepared: Path, tmp_path: Path,
                                                          capsys: pytest.CaptureFixture) -> None:
    """Out of order they sliced garbage silently; past the data they read as a sentence of 99999901 sub-words."""
    offsets = tmp_path / "dataset" / "train" / "src.ids.offsets.npy"
    stored = np.load(offsets, mmap_mode="r+")
    stored[5] = value
    stored.flush()
    del stored
    message = failing(capsys, "train", str(prepared), "--set", "training.valid_every=0")
    assert message.startswith(f"{offsets}: {DAMAGED_OFFSETS[value]}"), message
    assert message.endswith("the file is damaged; rebuild the dataset with `structnmt prepare CONFIG --force`")
    assert not (tmp_path / "run" / "last.pt").exists()


def test_a_conllu_file_with_a_byte_order_mark_is_read(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """A byte-order mark (as Windows editors write one) is no part of the first line or tree."""
    import codecs

    from tests.test_bad_input import corpus

    config = experiment(tmp_path)
    for name in ("train.conllu", "train.en"):
        (tmp_path / name).write_bytes(codecs.BOM_UTF8 + (tmp_path / name).read_bytes())
    code, _, err = cli(capsys, "prepare", str(config))
    assert code == 0, err
    first = (tmp_path / "dataset" / "train" / "raw.src.txt").read_text(encoding="utf-8").splitlines()[0]
    assert first == corpus()[0][0]


def test_a_reference_with_a_byte_order_mark_scores_as_without(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """An identical hypothesis scored 96.68 BLEU against a reference that starts with a byte-order mark."""
    import codecs

    from structnmt.cli.main import _read_input

    text = "".join(f"the {w} dog sees a cat near the river bank .\n" for w in ("old", "red", "big", "tall"))
    (tmp_path / "hyp.txt").write_text(text, encoding="utf-8")
    (tmp_path / "ref.txt").write_bytes(codecs.BOM_UTF8 + text.encode())
    for hyp, ref in (("hyp.txt", "ref.txt"), ("ref.txt", "hyp.txt")):
        code, out, err = cli(capsys, "evaluate", "--hyp", str(tmp_path / hyp), "--ref", str(tmp_path / ref))
        assert code == 0, err
        assert out.startswith("BLEU = 100.00 "), (hyp, out)
    assert _read_input(str(tmp_path / "ref.txt"))[0] == "the old dog sees a cat near the river bank ."  # translate


INCOMPLETE_META = {
    "empty": ({}, "'data' (the data config it was prepared from) is missing"),
    "subwords_null": ({"subwords": None}, "'subwords' (the sub-word model of each side) is null"),
}


def incomplete_meta(directory: Path, case: str) -> Path:
    """``directory``'s meta.json made incomplete as ``INCOMPLETE_META[case]`` says; returns its path."""
    meta = directory / "meta.json"
    change, _ = INCOMPLETE_META[case]
    meta.write_text(json.dumps({**json.loads(meta.read_text()), **change} if change else {}))
    return meta


@pytest.mark.parametrize("case", sorted(INCOMPLETE_META))
def test_an_incomplete_meta_json_is_named_by_train_and_translate(
        case: str, prepared: Path, demo: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """`{}` was a KeyError 'data' in train (and another vocabulary in translate); `subwords: null` a TypeError."""
    expected = (f"{INCOMPLETE_META[case][1]}: the dataset description is incomplete; the dataset is damaged: "
                "rebuild it with `structnmt prepare CONFIG --force`")
    meta = incomplete_meta(tmp_path / "dataset", case)
    assert failing(capsys, "train", str(prepared), "--set", "training.valid_every=0") == f"{meta}: {expected}"
    damaged = tmp_path / "demo_dataset"
    shutil.copytree(demo / "demo/dataset", damaged)
    meta = incomplete_meta(damaged, case)
    assert failing(capsys, *translate_args(demo, "--dataset", str(damaged))) == f"{meta}: {expected}"


def items_3_and_4_cli_cases(demo: Path, root: Path) -> list[list[str]]:
    """The command-line fault cases of issue 28, items 3 and 4, made under ``root``: slips in the
    last lines, in a short split and over 80 pairs, an emptied split, damaged offsets and meta.json."""
    cases: list[list] = []

    def fresh(name: str) -> Path:
        (root / name).mkdir(parents=True)
        return root / name

    src, tgt = lengths_corpus(600)
    cases.append(["prepare", plain_experiment(fresh("tail"), blank_at(src, 570), tgt)])
    val_src, val_tgt = lengths_corpus(200, seed=1)
    cases.append(["prepare", with_split(plain_experiment(fresh("short"), src, tgt), "val", blank_at(val_src, 50),
                                        val_tgt)])
    long_src, long_tgt = lengths_corpus(2000)
    cases.append(["prepare", plain_experiment(fresh("local"), slipped(long_src, 1000, 1080), long_tgt)])
    cases.append(["prepare", with_split(plain_experiment(fresh("emptied"), src, tgt), "val", src[:5], [""] * 5)])
    config = experiment(fresh("prepared"))
    structnmt.prepare(config, verbose=False)
    for value in DAMAGED_OFFSETS:
        copy = root / f"offsets_{value}"
        shutil.copytree(root / "prepared" / "dataset", copy)
        stored = np.load(copy / "train" / "src.ids.offsets.npy", mmap_mode="r+")
        stored[5] = value
        stored.flush()
        del stored
        cases.append(["train", config, "--set", f"data.dir={copy}", "--set", "training.valid_every=0"])
    for case in INCOMPLETE_META:
        copy = root / f"meta_{case}"
        shutil.copytree(root / "prepared" / "dataset", copy)
        incomplete_meta(copy, case)
        cases.append(["train", config, "--set", f"data.dir={copy}", "--set", "training.valid_every=0"])
        copy = root / f"demo_meta_{case}"
        shutil.copytree(demo / "demo/dataset", copy)
        incomplete_meta(copy, case)
        cases.append(translate_args(demo, "--dataset", str(copy)))
    return [[str(arg) for arg in argv] for argv in cases]


def test_inspect_align_refuses_no_sentences_and_no_gold_links(demo: Path, monkeypatch: pytest.MonkeyPatch,
                                                               capsys: pytest.CaptureFixture) -> None:
    """Empty source, target and gold files once printed AER 0.0 (perfect) over 0 sentences; gold
    files without a single link give 0.0 whatever the model does. Both are refused, naming the file."""
    monkeypatch.chdir(demo)
    for name in ("empty.src", "empty.tgt", "empty.gold"):
        (demo / name).write_text("", encoding="utf-8")
    message = failing(capsys, "inspect", "align", "demo/run", "--src", "empty.src", "--tgt", "empty.tgt",
                      "--gold", "empty.gold", "--out", str(demo / "aligned_empty"))
    assert message.startswith("empty.src: no sentences")
    (demo / "one.src").write_text("the dog sees a cat .\n", encoding="utf-8")
    (demo / "one.tgt").write_text("der hund sieht .\n", encoding="utf-8")
    (demo / "blank.gold").write_text("\n", encoding="utf-8")
    message = failing(capsys, "inspect", "align", "demo/run", "--src", "one.src", "--tgt", "one.tgt",
                      "--gold", "blank.gold", "--out", str(demo / "aligned_blank"))
    assert message.startswith("blank.gold: no gold link on any line")
