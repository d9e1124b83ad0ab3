"""Bad input, as a user meets it on the command line (issue 8).

Every case runs ``structnmt prepare|train|translate`` in-process and checks the contract of
``structnmt.cli.main``: exit status 2, exactly one line ``error: <file>:<line>: ...`` or
``error: <config>: <field>: ...`` on stderr, no traceback, and nothing half-written (no
dataset directory, no temporary directory beside it, no output file). With
``data.clean.drop_bad_lines: true`` the same bad sentences are dropped and counted instead.

Corpora are tiny and hand-made: "The dog sees a cat." with a hand-written CoNLL-U parse,
so no spaCy model is needed and nothing is trained.
"""

from __future__ import annotations

import json
import logging
import random
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml

from structnmt.cli.main import main
from structnmt.config import load_config, parse_overrides, to_dict
from structnmt.data.dataset import ParallelDataset
from structnmt.data.example import DepTree
from structnmt.data.pipeline import Preprocessor
from structnmt.errors import DataError
from structnmt.training.checkpoint import dataset_fingerprint, save_checkpoint

NOUNS = ["dog", "cat", "bird", "child"]
VERBS = ["sees", "likes", "follows"]
TINY_MODEL = {"enc_layers": 1, "dec_layers": 1, "d_model": 16, "n_heads": 2, "d_ff": 32, "dropout": 0.0}
LINES_PER_BLOCK = 7  # six words and a blank line: sentence k starts on line 7(k-1)+1


def block(rows: list[tuple]) -> str:
    """One CoNLL-U sentence from (id, form, head, deprel) rows."""
    return "".join(f"{i}\t{form}\t_\t_\t_\t_\t{head}\t{rel}\t_\t_\n" for i, form, head, rel in rows) + "\n"


def corpus(n: int = 30, seed: int = 0) -> tuple[list[str], list[str], list[str]]:
    """Source lines, target lines and one CoNLL-U block per source line."""
    rng = random.Random(seed)
    src, tgt, blocks = [], [], []
    for _ in range(n):
        a, v, b = rng.choice(NOUNS), rng.choice(VERBS), rng.choice(NOUNS)
        src.append(f"The {a} {v} a {b}.")
        tgt.append(f"Der {a} {v} ein {b}.")
        blocks.append(block([(1, "The", 2, "det"), (2, a, 3, "nsubj"), (3, v, 0, "root"), (4, "a", 5, "det"),
                             (5, b, 3, "obj"), (6, ".", 3, "punct")]))
    return src, tgt, blocks


def experiment(root: Path, src: list[str] | bytes | None = None, tgt: list[str] | bytes | None = None,
               blocks: list[str] | None = None, data: dict | None = None, model: dict | None = None) -> Path:
    """Write the corpus files and an experiment YAML; returns the YAML's path."""
    default_src, default_tgt, default_blocks = corpus()
    files = {"train.en": src if src is not None else default_src,
             "train.de": tgt if tgt is not None else default_tgt}
    for name, content in files.items():
        raw = content if isinstance(content, bytes) else "".join(line + "\n" for line in content).encode()
        (root / name).write_bytes(raw)
    (root / "train.conllu").write_text("".join(blocks if blocks is not None else default_blocks), encoding="utf-8")
    cfg = {
        "data": {
            "src": {"lang": "en", "parser": {"backend": "conllu", "conllu": {"train": str(root / "train.conllu")}}},
            "tgt": {"lang": "de"},
            "splits": {"train": {"src": str(root / "train.en"), "tgt": str(root / "train.de")}},
            "dir": str(root / "dataset"),
            "subwords": {"vocab_size": 28},
            **(data or {}),
        },
        "model": {**TINY_MODEL, **(model or {})},
        "training": {"out_dir": str(root / "run"), "max_steps": 1, "tensorboard": False, "progress": False},
    }
    path = root / "exp.yaml"
    path.write_text(yaml.safe_dump(cfg), encoding="utf-8")
    return path


def cli(capsys: pytest.CaptureFixture, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def one_error(code: int, err: str) -> str:
    """The message of the single ``error:`` line the command must have printed."""
    assert code == 2, err
    assert "Traceback" not in err
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    return lines[0][len("error: "):]


def failing(capsys: pytest.CaptureFixture, *argv: str) -> str:
    """Run a command that must fail; the message of its one error line."""
    code, _, err = cli(capsys, *argv)
    return one_error(code, err)


def assert_no_dataset(root: Path) -> None:
    assert not (root / "dataset").exists()
    # no temporary directories, and no lock file: a prepare removes its .dataset.lock when it ends (issue 28)
    assert not [p.name for p in root.iterdir() if p.name.startswith(".dataset")]


@pytest.fixture(autouse=True)
def _quiet_vocab_resizing():
    """SentencePiece shrinking a too-large vocabulary is logged; that warning is not an error line."""
    logger = logging.getLogger("structnmt.data.tokenisation")
    level = logger.level
    logger.setLevel(logging.ERROR)
    yield
    logger.setLevel(level)


# ---------------------------------------------------------------------------
# parallel text


def test_parallel_files_of_different_lengths(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    src, tgt, _ = corpus()
    config = experiment(tmp_path, src=src, tgt=tgt[:-2])
    message = failing(capsys, "prepare", str(config))
    assert message.startswith(f"{tmp_path / 'train.en'}: source and target have different line counts")
    assert message == (f"{tmp_path / 'train.en'}: source and target have different line counts: "
                       f"{tmp_path / 'train.en'} has 30, {tmp_path / 'train.de'} has 28 "
                       f"({tmp_path / 'train.de'} ends after line 28)")
    assert_no_dataset(tmp_path)


def test_parallel_files_of_different_lengths_in_a_real_process(tmp_path: Path) -> None:
    """The same case through ``python -m structnmt.cli.main``: no traceback reaches the terminal."""
    src, tgt, _ = corpus()
    config = experiment(tmp_path, src=src, tgt=tgt[:-1])
    done = subprocess.run([sys.executable, "-m", "structnmt.cli.main", "prepare", str(config)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.count("\n") == 1 and done.stderr.startswith(f"error: {tmp_path / 'train.en'}: ")
    assert_no_dataset(tmp_path)


def test_empty_file(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    config = experiment(tmp_path, tgt=b"")
    message = failing(capsys, "prepare", str(config))
    assert message == f"{tmp_path / 'train.de'}: the file is empty"
    assert_no_dataset(tmp_path)


def test_empty_lines_are_dropped_and_counted(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    src, tgt, blocks = corpus()
    src[3], tgt[7] = "", "   "
    code, out, _ = cli(capsys, "prepare", str(experiment(tmp_path, src=src, tgt=tgt, blocks=blocks)))
    assert code == 0
    assert "train: kept 28 of 30 pairs; dropped empty 2" in out
    meta = json.loads((tmp_path / "dataset" / "meta.json").read_text())
    assert meta["splits"]["train"]["n"] == 28 and meta["splits"]["train"]["clean"]["empty"] == 2
    # the kept pairs keep their own parses: line 5 of the file is the 4th stored sentence
    ds = ParallelDataset(tmp_path / "dataset", "train")
    assert ds.raw("src")[3] == src[4]


def test_a_file_of_empty_lines_names_the_training_file(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    config = experiment(tmp_path, tgt=[""] * 30)
    message = failing(capsys, "prepare", str(config))
    assert message.startswith(f"{tmp_path / 'train.en'}: no sentence pair of the training split is left")
    assert message.endswith("(dropped: empty 30)")
    assert_no_dataset(tmp_path)


BAD_BYTES = {
    "invalid_utf8": (b"The dog sees a \xff\xfecat.", "invalid UTF-8 at byte 16 of the line (b'\\xff')"),
    "control_character": (b"The dog\x1b[31m sees a cat.", "control character U+001B in the line"),
}


def test_a_parser_that_is_not_here_is_named_before_the_sub_word_model(
        tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    pytest.importorskip("spacy", reason="the parsers extra is not installed")
    config = experiment(tmp_path, data={"src": {"lang": "en", "parser": {"backend": "spacy",
                                                                       "model": str(tmp_path / "none")}}})
    code, out, err = cli(capsys, "prepare", str(config))
    assert code == 2 and "sub-word" not in out, out
    assert err.strip() == (f"error: {config}: data.src.parser.model: no spaCy model directory at "
                           f"'{tmp_path / 'none'}' (train it, e.g. `structnmt parser train --preset en_ud`)")
    assert_no_dataset(tmp_path)


def test_the_same_file_on_both_sides_is_warned_of(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """A copy-paste slip (src: train.en, tgt: train.en) prepares a copying task: say so."""
    config = experiment(tmp_path, data={"splits": {"train": {"src": str(tmp_path / "train.en"),
                                                             "tgt": str(tmp_path / "train.en")}},
                                        "tgt": {"lang": "en"}})
    code, out, _ = cli(capsys, "prepare", str(config))
    assert code == 0
    assert (f"train: warning: data.splits.train: src and tgt are the same file ({tmp_path / 'train.en'}): the model "
            "will learn to copy") in out


def test_a_missing_input_is_named_by_its_field_before_any_folder_is_made(
        tmp_path: Path, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    config = experiment(tmp_path, data={"splits": {"train": {"src": "train.en", "tgt": "train.de"}},
                                        "dir": "data/ds"})
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)  # relative paths are read from here, not from the config's folder
    message = failing(capsys, "prepare", str(config))
    assert message == (f"{config}: data.splits.train.src: train.en: file not found (looked for in the current "
                       f"folder, {elsewhere})")
    assert list(elsewhere.iterdir()) == []  # not even data/
    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.conllu").unlink()
    assert failing(capsys, "prepare", str(config)) == \
        f"{config}: data.src.parser.conllu.train: {tmp_path / 'train.conllu'}: file not found"
    assert not (tmp_path / "data").exists()


@pytest.mark.parametrize("case", sorted(BAD_BYTES))
def test_undecodable_or_control_line_is_refused_with_file_and_line(
        case: str, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    src, _, _ = corpus()
    bad, expected = BAD_BYTES[case]
    lines = [line.encode() for line in src]
    lines[11] = bad
    config = experiment(tmp_path, src=b"\n".join(lines) + b"\n")
    message = failing(capsys, "prepare", str(config))
    assert message.startswith(f"{tmp_path / 'train.en'}:12: {expected}")
    assert_no_dataset(tmp_path)


@pytest.mark.parametrize("case", sorted(BAD_BYTES))
def test_undecodable_or_control_line_is_dropped_on_request(
        case: str, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    src, tgt, _ = corpus()
    lines = [line.encode() for line in src]
    lines[11] = BAD_BYTES[case][0]
    config = experiment(tmp_path, src=b"\n".join(lines) + b"\n", data={"clean": {"drop_bad_lines": True}})
    code, out, _ = cli(capsys, "prepare", str(config))
    assert code == 0
    assert "train: kept 29 of 30 pairs; dropped bad_line 1" in out
    # which line went, and why, as the refusal without drop_bad_lines says it
    assert f"train: dropped (bad_line) {tmp_path / 'train.en'}:12: {BAD_BYTES[case][1]}" in out
    ds = ParallelDataset(tmp_path / "dataset", "train")
    assert len(ds) == 29 and ds.raw("tgt")[11] == tgt[12]  # line 12 is gone, line 13 follows line 11


def test_bad_lines_dropped_are_named_once_a_pair_and_the_rest_counted(
        tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    src, tgt, _ = corpus()
    source, target = [line.encode() for line in src], [line.encode() for line in tgt]
    source[1] = target[1] = b"bad \xff"  # line 2: bad on both sides, one pair
    for i in (4, 6, 8, 10, 12, 14):
        source[i] = b"bad \x07"
    config = experiment(tmp_path, src=b"\n".join(source) + b"\n", tgt=b"\n".join(target) + b"\n",
                        data={"clean": {"drop_bad_lines": True}})
    code, out, _ = cli(capsys, "prepare", str(config))
    assert code == 0
    named = [line for line in out.splitlines() if line.startswith("train: dropped (bad_line) ")]
    assert [line.split(": ")[1].rsplit(":", 1)[1] for line in named] == ["2", "5", "7", "9", "11"]
    assert "train: ... and 2 more bad lines dropped" in out
    assert "dropped bad_line 7" in out


def test_lines_far_over_the_length_limit_are_dropped_and_counted(
        tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    src, tgt, blocks = corpus()
    src[2] = " ".join(["dog"] * 20000) + "."  # 20,000 words against max_len 50
    tgt[9] = "Der " * 60 + "Hund."
    config = experiment(tmp_path, src=src, tgt=tgt, blocks=blocks, data={"clean": {"max_len": 50}})
    code, out, _ = cli(capsys, "prepare", str(config))
    assert code == 0
    assert "dropped too_long 2" in out
    assert json.loads((tmp_path / "dataset" / "meta.json").read_text())["splits"]["train"]["n"] == 28


# ---------------------------------------------------------------------------
# CoNLL-U parses

THIRD = 2 * LINES_PER_BLOCK + 1  # the line the third sentence starts on


def _third(rows: list[tuple]) -> list[str]:
    _, _, blocks = corpus()
    blocks[2] = block(rows)
    return blocks


def _words_of_third() -> list[str]:
    return corpus()[0][2][:-1].split() + ["."]


def _rows(heads: list[int], words: list[str] | None = None) -> list[tuple]:
    words = words or _words_of_third()
    return [(i + 1, w, h, "root" if h == 0 else "dep") for i, (w, h) in enumerate(zip(words, heads))]


BAD_TREES = {
    "cycle": (_rows([2, 3, 0, 5, 4, 3]), "tree has a cycle through word 4"),
    "several_roots": (_rows([2, 3, 0, 5, 0, 3]), "tree has 2 roots, expected exactly one"),
    "head_out_of_range": (_rows([2, 3, 0, 5, 9, 3]), "word 5 ("),
    "own_head": (_rows([2, 3, 0, 4, 3, 3]), "word 4 ('a') is its own head"),
    "word_not_in_text": (_rows([2, 3, 0, 5, 3, 3], _words_of_third()[:4] + ["mouse", "."]),
                         "word 'mouse' does not match the text"),
    "malformed": ([(1, "The", "two", "det")], "malformed CoNLL-U"),
}


@pytest.mark.parametrize("case", sorted(BAD_TREES))
def test_bad_conllu_names_the_file_and_the_sentence_line(
        case: str, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    rows, expected = BAD_TREES[case]
    config = experiment(tmp_path, blocks=_third(rows))
    message = failing(capsys, "prepare", str(config))
    assert message.startswith(f"{tmp_path / 'train.conllu'}:{THIRD}: ")
    assert expected in message
    assert_no_dataset(tmp_path)


def test_bad_conllu_sentences_are_dropped_and_counted_on_request(
        tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    _, _, blocks = corpus()
    blocks[2] = block(BAD_TREES["cycle"][0])
    blocks[20] = block(BAD_TREES["several_roots"][0][:5] + [(6, "!", 3, "punct")])  # "!" is not in line 21
    config = experiment(tmp_path, blocks=blocks, data={"clean": {"drop_bad_lines": True}})
    code, out, _ = cli(capsys, "prepare", str(config))
    assert code == 0
    conllu = tmp_path / "train.conllu"
    assert f"train: dropped (bad_parse) {conllu}:{THIRD}: tree has a cycle" in out
    assert f"train: dropped (bad_parse) {conllu}:{20 * LINES_PER_BLOCK + 1}: " in out
    meta = json.loads((tmp_path / "dataset" / "meta.json").read_text())
    clean = meta["splits"]["train"]["clean"]
    assert (clean["bad_parse"], clean["kept"], meta["splits"]["train"]["n"]) == (2, 28, 28)
    src, _, _ = corpus()
    assert ParallelDataset(tmp_path / "dataset", "train").raw("src") == src[:2] + src[3:20] + src[21:]


def test_fewer_parses_than_lines(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    _, _, blocks = corpus()
    message = failing(capsys, "prepare", str(experiment(tmp_path, blocks=blocks[:25])))
    assert message == (f"{tmp_path / 'train.conllu'}: the text has a sentence on line 26 but the file has "
                       "only 25 sentences")
    assert_no_dataset(tmp_path)


def test_multiword_tokens_and_empty_nodes_are_read(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """A multi-word token becomes one tree word where its outward-pointing word attaches; empty nodes go."""
    src, _, blocks = corpus()
    words = _words_of_third()
    blocks[2] = (block(_rows([2, 3, 0, 5, 3], words[:4] + [words[4]]))
                 .replace(f"5\t{words[4]}", f"5-6\t{words[4]}.\t_\t_\t_\t_\t_\t_\t_\t_\n5\t{words[4]}")
                 .rstrip("\n") + "\n6\t.\t_\t_\t_\t_\t5\tpunct\t_\t_\n3.1\tsees\t_\t_\t_\t_\t_\t_\t3:dep\t_\n\n")
    code, _, err = cli(capsys, "prepare", str(experiment(tmp_path, blocks=blocks)))
    assert code == 0, err
    ds = ParallelDataset(tmp_path / "dataset", "train")
    third = ds.side_arrays(2, "src")
    np.testing.assert_array_equal(third["heads"], [1, 2, 2, 4, 2])  # five tree words; "cat." hangs from "sees"
    np.testing.assert_array_equal(ds.side_arrays(3, "src")["heads"], [1, 2, 2, 4, 2, 2])


# ---------------------------------------------------------------------------
# parser tokenisation that does not fit the sub-words


def test_parse_that_splits_a_sub_word_is_merged_into_one_word(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """A word-level vocabulary keeps "cat." whole and the parse splits it: the two words become one
    tree node (every sub-word has one word), and prepare goes on."""
    config = experiment(tmp_path, data={"subwords": {"kind": "none", "vocab_size": 24}})
    assert cli(capsys, "prepare", str(config))[0] == 0
    data = ParallelDataset(tmp_path / "dataset", "train")
    text = data.raw("src")[0]
    spans = data.side_arrays(0, "src")["word_spans"].reshape(-1, 2)
    words = [text[a:b] for a, b in spans]
    assert words[-1].endswith(".") and len(words[-1]) > 1, words
    assert len(words) == len(text.split())


class DisorderedParser:
    """A fake parser whose words do not come in the order of the text."""

    name, version, convention = "disordered", "1", "ud"

    def parse(self, texts: list[str], lines: list[int] | None = None) -> list[DepTree]:
        trees = []
        for text in texts:
            cut = text.find(" ")
            spans = [(cut + 1, len(text)), (0, cut)] if "dog" in text else [(0, len(text))]
            trees.append(DepTree(text, [text[a:b] for a, b in spans], spans, [0] * len(spans),
                                 ["root", "dep"][:len(spans)]))
        return trees


def test_parse_that_cannot_be_aligned_is_refused_or_dropped(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    config = experiment(tmp_path)
    assert cli(capsys, "prepare", str(config))[0] == 0
    pre = Preprocessor.from_dataset(tmp_path / "dataset")
    pre._parsers[("src", "extra")] = DisorderedParser()
    pairs = [(1, "a cat", "ein Katze"), (2, "a dog", "ein Hund")]
    with pytest.raises(DataError) as info:
        pre.encode_pairs(pairs, "extra", {"src": "extra.en"})
    assert str(info.value).startswith("extra.en:2: sub-word 3 aligns to a word before the previous sub-word's word")
    dropped: list = []
    examples = pre.encode_pairs(pairs, "extra", {"src": "extra.en"}, dropped=dropped)
    assert [ex.meta["line"] for ex in examples] == [1]
    assert [(reason, err.line) for reason, err in dropped] == [("unaligned", 2)]


# ---------------------------------------------------------------------------
# configs

BAD_CONFIGS = {
    "unknown_field": ({"model": {"d_modle": 16}}, "model.d_modle: unknown field"),
    "wrong_type": ({"training": {"max_steps": "ten"}}, "training.max_steps: expected an integer, got 'ten'"),
    "heads_do_not_divide": ({"model": {"n_heads": 3}}, "model.n_heads: n_heads (3) must divide d_model (16)"),
    "layer_past_depth": ({"model": {"methods": [{"name": "pascal", "layers": [4]}]}},
                         "model.methods[0].layers: layer 4 is outside the encoder's layers 1..1"),
    "impossible_dropout": ({"model": {"dropout": 1.5}}, "model.dropout: must be in [0, 1)"),
    "impossible_beam": ({"decoding": {"beam": 0}}, "decoding.beam: must be at least 1"),
    # inside data: the field, not the whole section
    "negative_vocabulary": ({"data": {"subwords": {"vocab_size": -8}}},
                            "data.subwords.vocab_size: must be at least 16"),
    "unknown_clean_key": ({"data": {"clean": {"foo": 1}}}, "data.clean.foo: unknown field"),
    "misspelled_backend": ({"data": {"src": {"lang": "en", "parser": {"backend": "spcy"}}}},
                           "data.src.parser.backend: must be one of ['spacy', 'stanza', 'udpipe', 'conllu', 'none'], "
                           "got 'spcy'"),
    "misspelled_stack": ({"model": {"methods": [{"name": "pascal", "stack": "encodr"}]}},
                         "model.methods[0].stack: must be one of ['encoder', 'decoder'], got 'encodr'"),
    "missing_train_split": ({"data": {"splits": {"val": {"src": "v.en", "tgt": "v.de"}}}},
                            "data.splits.train: the training split is missing (data.train_split is 'train'; "
                            "data.splits has ['val'])"),
}


@pytest.mark.parametrize("case", sorted(BAD_CONFIGS))
def test_bad_config_names_the_file_and_the_field(case: str, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    change, expected = BAD_CONFIGS[case]
    config = experiment(tmp_path)
    raw = yaml.safe_load(config.read_text())
    for section, fields in change.items():
        raw.setdefault(section, {}).update(fields)
    config.write_text(yaml.safe_dump(raw))
    for command in ("train", "prepare"):
        message = failing(capsys, command, str(config))
        assert message == f"{config}: {expected}" or message.startswith(f"{config}: {expected}")
    assert_no_dataset(tmp_path)
    assert not (tmp_path / "run").exists()


def test_bad_override_on_the_command_line(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    config = experiment(tmp_path)
    message = failing(capsys, "train", str(config), "--set", "model.n_heads=5")
    assert message == f"{config}: model.n_heads: n_heads (5) must divide d_model (16)"
    message = failing(capsys, "train", str(config), "--set", "training.max_steps")
    assert message == "--set: expected KEY=VALUE, got 'training.max_steps'"
    assert not (tmp_path / "run").exists()


def test_overrides_reach_into_lists_and_refuse_what_is_not_a_section(tmp_path: Path,
                                                                      capsys: pytest.CaptureFixture) -> None:
    config = experiment(tmp_path)
    pascal = "model.methods=[{name: pascal}]"
    for index in ("model.methods.0.heads=9", "model.methods[0].heads=9"):  # 9: outside the model's 2 heads
        assert "model.methods[0].heads" in failing(capsys, "train", str(config), "--set", pascal, "--set", index)
    assert failing(capsys, "train", str(config), "--set", pascal, "--set", "model.methods.1.heads=1") == \
        "model.methods: a list of 1: index with 0..0, not '1'"
    assert failing(capsys, "train", str(config), "--set", "model.methods.0.heads=1") == \
        "model.methods: has no entries: an index reaches into a list the config gives (set the whole list with " \
        "model.methods=[...])"
    assert failing(capsys, "train", str(config), "--set", "model.methods=[]", "--set", "model.methods.0.heads=1") == \
        "model.methods: an empty list: it has no item '0'"
    assert failing(capsys, "train", str(config), "--set", "model.d_model.x=1") == \
        "model.d_model: is 16, not a section: it has no field 'x'"
    assert failing(capsys, "train", str(config), "--set", "training.max_steps=[1") == \
        ("--set training.max_steps: line 1, column 3: the value is not valid YAML: "
         "expected ',' or ']', but got '<stream end>'")
    assert not (tmp_path / "run").exists()


def test_a_number_in_e_notation_is_a_number(tmp_path: Path) -> None:
    """YAML 1.1 (PyYAML) reads ``1e-3`` as a string; a config means the number."""
    config = experiment(tmp_path)
    raw = yaml.safe_load(config.read_text())
    raw["training"]["lr"] = "LR"
    raw.setdefault("decoding", {})["length_penalty"] = "ALPHA"
    config.write_text(yaml.safe_dump(raw).replace("LR", "1e-3").replace("ALPHA", "+2E0"))
    cfg = load_config(config)
    assert cfg.training.lr == 0.001 and isinstance(cfg.training.lr, float)
    assert cfg.decoding.length_penalty == 2.0
    assert load_config(config, parse_overrides(["training.lr=5e-4"])).training.lr == 0.0005


def test_yaml_syntax_error_is_one_line_with_its_place(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    config = tmp_path / "tab.yaml"
    config.write_text("data:\n\tdir: x\n")
    assert failing(capsys, "train", str(config)) == \
        f"{config}: line 2, column 1: not valid YAML: found character '\\t' that cannot start any token"
    study = tmp_path / "study.yaml"
    study.write_text("name: s\nrecipes: [\n")
    message = failing(capsys, "study", str(study), "--status")
    assert message.startswith(f"{study}: line 3, column 1: not valid YAML: ")


def test_a_method_whose_trees_the_dataset_lacks_is_refused_before_a_run_folder_is_made(
        tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    config = experiment(tmp_path, data={"src": {"lang": "en"}})  # no parser: the dataset stores no trees
    assert cli(capsys, "prepare", str(config))[0] == 0
    message = failing(capsys, "train", str(config), "--set", "model.methods=[{name: sh_labels}, {name: pascal}]")
    assert message == (f"{config}: model.methods[0]: sh_labels reads labels on the src side, which "
                       f"{tmp_path / 'dataset' / 'train'} does not store (labels, word_index missing): prepare the "
                       "dataset with data.src.parser set")
    assert not (tmp_path / "run").exists()
    # and a validation split the dataset lacks names the config too
    message = failing(capsys, "train", str(config), "--set", "model.methods=[]")
    assert message == (f"{config}: data.valid_split: the dataset has no split 'val' to validate on (splits: train): "
                       "add it to data.splits and prepare again, or train without validating "
                       "(training.valid_every: 0 and training.early_stopping: 0)")
    # as it says: without validating, the default split may be absent
    code, out, _ = cli(capsys, "train", str(config), "--set", "model.methods=[]", "--set", "training.valid_every=0",
                       "--set", "training.early_stopping=0", "--set", "training.max_steps=2")
    assert code == 0 and (tmp_path / "run" / "last.pt").is_file(), out
    shutil.rmtree(tmp_path / "run")
    from structnmt.data.dataset import ParallelDataset  # a split named elsewhere: the splits there, in the message

    with pytest.raises(DataError, match=r"dataset/test: no split 'test' in the dataset \(splits: train\)$"):
        ParallelDataset(tmp_path / "dataset", "test")
    with pytest.raises(DataError, match=r"no split 'test' in the dataset \(none prepared: run `structnmt prepare`\)"):
        ParallelDataset(tmp_path / "nowhere", "test")
    for command in ("prepare", "train"):  # a validation split named otherwise must be one of data.splits
        message = failing(capsys, command, str(config), "--set", "data.valid_split=dev")
        assert message == f"{config}: data.valid_split: 'dev' is not one of data.splits (train)"


def test_paths_of_the_wrong_kind_are_named_as_such(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    (tmp_path / "folder").mkdir()
    config = experiment(tmp_path, data={"splits": {"train": {"src": str(tmp_path / "folder"),
                                                             "tgt": str(tmp_path / "train.de")}}})
    assert failing(capsys, "prepare", str(config)) == f"{tmp_path / 'folder'}: is a directory, not a text file"
    config = experiment(tmp_path)
    assert cli(capsys, "prepare", str(config))[0] == 0
    (tmp_path / "afile").write_text("mine\n")
    message = failing(capsys, "train", str(config), "--set", f"training.out_dir={tmp_path / 'afile'}")
    assert message == f"training.out_dir: {tmp_path / 'afile'} is not a directory; give a directory name"
    assert (tmp_path / "afile").read_text() == "mine\n"


def test_a_model_that_parses_its_input_with_stored_conllu_says_it_cannot_translate_new_text(
        tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    config = experiment(tmp_path)
    assert cli(capsys, "train", str(config), "--prepare", "--set", "model.methods=[{name: pascal}]",
               "--set", "training.valid_every=0")[0] == 0
    (tmp_path / "in.txt").write_text("The dog sees a cat.\n")
    message = failing(capsys, "translate", "--checkpoint", str(tmp_path / "run" / "last.pt"),
                      "--input", str(tmp_path / "in.txt"), "--output", str(tmp_path / "out.txt"))
    assert message.startswith("data.src.parser.backend: the model reads source trees when it translates, and the "
                              "dataset's trees came from stored CoNLL-U files, which cannot parse new text")
    assert not (tmp_path / "out.txt").exists()


def test_output_dash_is_standard_output(tmp_path: Path, capsys: pytest.CaptureFixture,
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    config = experiment(tmp_path)
    assert cli(capsys, "train", str(config), "--prepare", "--set", "training.valid_every=0")[0] == 0
    (tmp_path / "in.txt").write_text("The dog sees a cat.\nThe cat sees a dog.\n")
    monkeypatch.chdir(tmp_path)
    code, out, _ = cli(capsys, "translate", "--checkpoint", "run/last.pt", "--input", "in.txt", "--output", "-")
    assert code == 0 and len(out.splitlines()) == 2
    assert not (tmp_path / "-").exists()
    # a control character cannot be dropped there (line n of the output is line n of the input)
    (tmp_path / "nul.txt").write_bytes(b"The dog sees a cat.\nThe cat\x00 sees.\n")
    message = failing(capsys, "translate", "--checkpoint", "run/last.pt", "--input", "nul.txt", "--output", "o.txt")
    assert message == ("nul.txt:2: control character U+0000 in the line (remove it from the input: translate "
                       "writes one output line for each input line)")
    assert not (tmp_path / "o.txt").exists()


def test_vocabulary_too_small_for_the_alphabet(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    config = experiment(tmp_path, data={"subwords": {"vocab_size": 16}})
    message = failing(capsys, "prepare", str(config))
    assert message.startswith(f"{config}: data.subwords.vocab_size: 16 is smaller than the 25 characters")
    assert_no_dataset(tmp_path)


# ---------------------------------------------------------------------------
# a vocabulary or checkpoint from a different model


def tiny_checkpoint(config: Path, path: Path) -> Path:
    """An untrained model saved the way the trainer saves one (what ``load_model`` reads)."""
    from structnmt.model.transformer import Transformer

    cfg = load_config(config)
    size = Preprocessor.from_dataset(cfg.data.dir).subwords["src"].vocab_size
    raw = to_dict(cfg)
    raw.pop("path")
    vocab = {"src_vocab_size": size, "tgt_vocab_size": size, "fingerprint": dataset_fingerprint(cfg.data.dir)}
    return save_checkpoint(path, {"model": Transformer(cfg.model, size, size).state_dict(), "config": raw,
                                  "vocab": vocab, "progress": {"step": 1}})


@pytest.fixture
def two_datasets(tmp_path: Path, capsys: pytest.CaptureFixture) -> tuple[Path, Path, Path]:
    """A checkpoint of dataset ``one`` and a dataset ``two`` with another SentencePiece model."""
    one, two = tmp_path / "one", tmp_path / "two"
    one.mkdir()
    two.mkdir()
    assert cli(capsys, "prepare", str(experiment(one)))[0] == 0
    assert cli(capsys, "prepare", str(experiment(two, data={"subwords": {"vocab_size": 26}})))[0] == 0
    checkpoint = tiny_checkpoint(one / "exp.yaml", tmp_path / "model.pt")
    (tmp_path / "in.txt").write_text("The dog sees a cat.\n")
    return checkpoint, one / "dataset", two / "dataset"


def test_checkpoint_with_a_dataset_of_another_vocabulary(
        two_datasets: tuple[Path, Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    checkpoint, own, other = two_datasets
    args = ["translate", "--checkpoint", str(checkpoint), "--input", str(tmp_path / "in.txt"),
            "--output", str(tmp_path / "out.txt"), "--device", "cpu", "--beam", "1"]
    code, _, err = cli(capsys, *args, "--dataset", str(other))
    message = one_error(code, err)
    assert message.startswith(f"{checkpoint}: trained with vocabulary fingerprint ")
    assert f"but dataset {other} has {dataset_fingerprint(other)[:12]}" in message
    assert not (tmp_path / "out.txt").exists()
    # the control: with its own dataset the same command works and writes one line
    code, _, err = cli(capsys, *args, "--dataset", str(own))
    assert code == 0, err
    assert len((tmp_path / "out.txt").read_text().splitlines()) == 1


def test_damaged_sentencepiece_model(two_datasets: tuple[Path, Path, Path], capsys: pytest.CaptureFixture) -> None:
    _, own, _ = two_datasets
    (own / "spm.model").write_bytes(b"not a model")
    with pytest.raises(DataError, match=r"spm\.model: not a readable SentencePiece model"):
        Preprocessor.from_dataset(own)


def test_truncated_checkpoint(two_datasets: tuple[Path, Path, Path], tmp_path: Path,
                              capsys: pytest.CaptureFixture) -> None:
    checkpoint, own, _ = two_datasets
    data = checkpoint.read_bytes()
    checkpoint.write_bytes(data[: len(data) // 2])
    code, _, err = cli(capsys, "translate", "--checkpoint", str(checkpoint), "--dataset", str(own),
                       "--input", str(tmp_path / "in.txt"), "--device", "cpu")
    assert one_error(code, err).startswith(f"{checkpoint}: truncated checkpoint (")


def test_weights_of_another_architecture(two_datasets: tuple[Path, Path, Path], tmp_path: Path,
                                         capsys: pytest.CaptureFixture) -> None:
    from structnmt.training.checkpoint import load_checkpoint

    checkpoint, own, _ = two_datasets
    state = load_checkpoint(checkpoint)
    state["config"]["model"]["d_ff"] = 64  # the config no longer describes the stored weights
    save_checkpoint(checkpoint, state)
    code, _, err = cli(capsys, "translate", "--checkpoint", str(checkpoint), "--dataset", str(own),
                       "--input", str(tmp_path / "in.txt"), "--device", "cpu")
    assert one_error(code, err).startswith(f"{checkpoint}: weights do not fit")
