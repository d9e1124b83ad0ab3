"""Bad input whose one-line error named the wrong thing, or nothing at all.

Each case runs the command in-process on small hand-written inputs and checks the exact
message of its one ``error:`` line (exit 2, no traceback) and that nothing was left behind:
more CoNLL-U sentences than text lines, a truncated trees file, impossible demo options, a
head count past the model's heads, and ``inspect`` given a checkpoint for its run folder or a
file name for its output folder. Nothing is trained.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from structnmt.data.parsing.cache import import_trees
from structnmt.errors import DataError
from structnmt.io import sha256_file
from tests.test_bad_input import assert_no_dataset, cli, corpus, experiment, failing

# ---------------------------------------------------------------------------
# 1. a CoNLL-U file with more sentences than the text has lines


def test_more_parses_than_lines(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """Sentence 31 of 32 starts on line 7*30+1 of the CoNLL-U file; the text has 30 lines."""
    _, _, blocks = corpus()
    message = failing(capsys, "prepare", str(experiment(tmp_path, blocks=blocks + blocks[:2])))
    assert message == (f"{tmp_path / 'train.conllu'}:211: sentence 31 starts here, but the text "
                       f"{tmp_path / 'train.en'} has only 30 lines (the file has 32 sentences, one per line "
                       "is expected)")
    assert_no_dataset(tmp_path)


def test_more_parses_than_lines_are_ignored_with_drop_bad_lines(tmp_path: Path,
                                                                 capsys: pytest.CaptureFixture) -> None:
    """As lines without a parse are dropped on request, the extra parses are ignored, and said so."""
    _, _, blocks = corpus()
    config = experiment(tmp_path, blocks=blocks + blocks[:2], data={"clean": {"drop_bad_lines": True}})
    code, out, err = cli(capsys, "prepare", str(config))
    assert code == 0, err
    assert (f"train: warning: {tmp_path / 'train.conllu'}:211: sentence 31 starts here" in out
            and "the extra sentences are ignored (data.clean.drop_bad_lines)" in out), out
    assert (tmp_path / "dataset" / "meta.json").is_file()


# ---------------------------------------------------------------------------
# 2. a trees file cut short


def _trees_file(path: Path) -> bytes:
    header = {"structnmt_trees": 1, "side": "src", "parser": {"name": "hand"}, "convention": "ud"}
    tree = {"side": "src", "key": "00" * 8,
            "tree": {"words": ["a"], "heads": [0], "labels": ["root"], "spans": [[0, 1]]}}
    data = gzip.compress("".join(json.dumps(item) + "\n" for item in [header, tree]).encode(), mtime=0)
    path.write_bytes(data)
    return data


@pytest.mark.parametrize("keep", [0, 1, 15, -3])
def test_a_truncated_trees_file_is_named_as_truncated(tmp_path: Path, capsys: pytest.CaptureFixture,
                                                      keep: int) -> None:
    """Empty, cut inside the gzip header, or before the stream's end: never "holds no trees"."""
    whole = _trees_file(tmp_path / "whole.gz")
    assert import_trees(tmp_path / "whole.gz", tmp_path / "whole_cache") == {"src": 1}
    cut = tmp_path / "trees.gz"
    cut.write_bytes(whole[:keep])
    size = len(whole[:keep])
    expected = (f"{cut}: truncated: not a complete gzip file ({size} byte{'s' * (size != 1)}, where a gzip file "
                "has at least 20); copy it again") if size < 20 else \
        (f"{cut}: truncated: not a complete gzip file (its compressed stream stops before its end, after {size} "
         "bytes); copy it again")
    assert failing(capsys, "trees", "import", str(experiment(tmp_path)), str(cut)) == expected
    assert not (tmp_path / "dataset").exists()  # nor its parse cache, dataset/.parse_cache
    # a study's `trees: {file, sha256}` imports through the same function, the digest checked first
    with pytest.raises(DataError) as err:
        import_trees(cut, tmp_path / "cache", sha256_file(cut))
    assert str(err.value) == expected


# ---------------------------------------------------------------------------
# 3. impossible demo options


@pytest.mark.parametrize(("argv", "expected"), [
    (["--train-size", "0"], "--train-size: must be at least 1, got 0"),
    (["--train-size", "-3"], "--train-size: must be at least 1, got -3"),
    (["--seed", "-1"], "--seed: must be at least 0, got -1"),
    (["--seed", str(2**64)], f"--seed: must be below 2**32, got {2**64}"),
    (["--minutes", "nan"], "--minutes: must be a finite number (0: no limit), got nan"),
])
def test_bad_demo_options_are_named_before_anything_is_written(tmp_path: Path, capsys: pytest.CaptureFixture,
                                                               argv: list[str], expected: str) -> None:
    assert failing(capsys, "demo", "--work", str(tmp_path / "demo"), *argv) == expected
    assert not (tmp_path / "demo").exists()


# ---------------------------------------------------------------------------
# 4. a head count past the model's heads


@pytest.mark.parametrize(("heads", "expected"), [
    (5, "5 heads asked (the first 5), the model has 2 (model.n_heads)"),
    (0, "a count of heads must be at least 1, got 0"),
    ([0, 2], "head 2 is outside 0..1: the model has 2 heads (model.n_heads), numbered from 0"),
])
def test_a_head_count_past_the_model_says_what_was_asked(tmp_path: Path, capsys: pytest.CaptureFixture,
                                                         heads: int | list[int], expected: str) -> None:
    config = experiment(tmp_path, model={"methods": [{"name": "dbsa", "heads": heads}]})
    assert failing(capsys, "prepare", str(config)) == f"{config}: model.methods[0].heads: {expected}"
    assert_no_dataset(tmp_path)


def test_a_sync_head_count_past_the_model_says_what_was_asked(tmp_path: Path,
                                                              capsys: pytest.CaptureFixture) -> None:
    config = experiment(tmp_path, model={"methods": [{"name": "syncattn", "stack": ["encoder", "decoder"],
                                                      "sync_heads": 3}]})
    assert failing(capsys, "prepare", str(config)) == \
        f"{config}: model.methods[0].sync_heads: 3 heads asked (the first 3), the model has 2 (model.n_heads)"


# ---------------------------------------------------------------------------
# 5. inspect: RUN is a folder, --out a folder


def test_inspect_given_a_checkpoint_for_its_run_names_run(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    run = tmp_path / "run"
    run.mkdir()
    (run / "best.pt").write_bytes(b"not read: RUN is checked first")
    for out in ([], ["--out", str(tmp_path / "out")]):
        assert failing(capsys, "inspect", "heads", str(run / "best.pt"), *out) == \
            f"RUN: {run / 'best.pt'} is a file, not a run directory (give the run folder, e.g. {run}; " \
            "--checkpoint names a checkpoint)"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]


def test_inspect_out_named_like_a_file_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """--out is a folder (the scores and what was read out go inside): heads.json became one."""
    run = tmp_path / "run"
    run.mkdir()
    out = tmp_path / "x" / "heads.json"
    assert failing(capsys, "inspect", "heads", str(run), "--out", str(out)) == \
        f"--out: {out} is a file name, but --out is the directory the outputs go to (the scores as " \
        f"SPLIT.WHAT.json, beside what was read out); give a directory, e.g. {tmp_path / 'x' / 'heads'}"
    assert not (tmp_path / "x").exists()
