"""Bad input to ``evaluate``, ``test``, ``report`` and ``average``: one line naming the option, status 2.

From Python the same settings raise :class:`~structnmt.errors.StructNMTError` subclasses naming the
argument, never a ``KeyError``, ``TypeError`` or a metric list spelt out letter by letter.
"""

from __future__ import annotations

import importlib.util
import io
import sys
from pathlib import Path

import pytest

import structnmt
from structnmt.errors import ConfigError, DataError
from tests.test_bad_input import cli, experiment, failing, tiny_checkpoint

TOKENISERS = "none, zh, 13a, intl, char, ja-mecab, ko-mecab, spm, flores101, flores200, spBLEU-1K"


def write(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    return path


@pytest.fixture
def texts(tmp_path: Path) -> tuple[Path, Path]:
    """A hypothesis file and its reference (the same text)."""
    text = "the cat sat on the mat\na dog barked at the postman\n"
    return write(tmp_path / "h.txt", text), write(tmp_path / "r.txt", text)


def evaluate_argv(texts: tuple[Path, Path], *extra: str) -> list[str]:
    return ["evaluate", "--hyp", str(texts[0]), "--ref", str(texts[1]), *extra]


# ---------------------------------------------------------------------------
# 1. --tokenize


def test_an_unknown_tokeniser_is_named_with_the_known_ones(texts: tuple[Path, Path],
                                                           capsys: pytest.CaptureFixture) -> None:
    message = failing(capsys, *evaluate_argv(texts, "--tokenize", "foo"))
    assert message == f"--tokenize: unknown sacreBLEU tokeniser 'foo' (known: {TOKENISERS})"
    with pytest.raises(ConfigError, match=r"^tokenize: unknown sacreBLEU tokeniser 'xx' \(known: none, "):
        structnmt.evaluate(*texts, tokenize="xx")


def test_a_tokeniser_without_its_packages_says_what_to_install(texts: tuple[Path, Path],
                                                               capsys: pytest.CaptureFixture) -> None:
    if importlib.util.find_spec("MeCab") is not None:
        pytest.skip("MeCab is installed: ja-mecab works here")
    message = failing(capsys, *evaluate_argv(texts, "--tokenize", "ja-mecab"))
    assert message == "--tokenize: tokeniser 'ja-mecab' needs packages that are not installed: " \
                      "pip install sacrebleu[ja]"
    with pytest.raises(ConfigError, match=r"^tokenize: tokeniser 'ja-mecab' needs packages"):
        structnmt.evaluate(*texts, tokenize="ja-mecab")


def test_a_known_tokeniser_still_scores(texts: tuple[Path, Path], capsys: pytest.CaptureFixture) -> None:
    code, out, _ = cli(capsys, *evaluate_argv(texts, "--tokenize", "intl"))
    assert code == 0 and "BLEU = 100.00" in out and "tok:intl" in out


# ---------------------------------------------------------------------------
# 2. metrics= from Python


def test_one_metric_as_a_string_is_that_metric(texts: tuple[Path, Path]) -> None:
    scores = structnmt.evaluate(*texts, metrics="bleu")
    assert scores["bleu"] == pytest.approx(100.0) and "chrf" not in scores


@pytest.mark.parametrize("metrics, expected", [
    (["rouge"], "metrics: unknown metric 'rouge' (known: bleu, chrf, ter, ribes)"),
    ("rouge", "metrics: unknown metric 'rouge' (known: bleu, chrf, ter, ribes)"),
    ([], "metrics: no metric given (known: bleu, chrf, ter, ribes)"),
    (5, "metrics: expected a metric name or a list of them (known: bleu, chrf, ter, ribes), got 5"),
])
def test_an_unknown_metric_is_named_with_the_known_ones(texts: tuple[Path, Path], metrics: object,
                                                        expected: str) -> None:
    with pytest.raises(ConfigError) as raised:
        structnmt.evaluate(*texts, metrics=metrics)  # type: ignore[arg-type]
    assert str(raised.value) == expected


# ---------------------------------------------------------------------------
# 3. test: a dataset without a test split


def test_testing_a_run_whose_dataset_has_no_test_split_is_an_error(tmp_path: Path,
                                                                    capsys: pytest.CaptureFixture) -> None:
    config = experiment(tmp_path)  # a training split only
    assert cli(capsys, "prepare", str(config))[0] == 0
    (tmp_path / "run").mkdir()
    tiny_checkpoint(config, tmp_path / "run" / "best.pt")
    message = failing(capsys, "test", str(tmp_path / "run"), "--device", "cpu")
    assert message.startswith(f"{tmp_path / 'dataset'}: no test split to translate: the dataset has only 'train' ")
    assert "--splits" in message
    with pytest.raises(DataError, match="no test split"):
        structnmt.test(tmp_path / "run", device="cpu")
    assert not (tmp_path / "run" / "eval").exists()


# ---------------------------------------------------------------------------
# 4. test: --long-dependency, splits=


def test_a_negative_long_dependency_is_named(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    message = failing(capsys, "test", str(tmp_path / "no-run"), "--long-dependency", "-1")
    assert message == "--long-dependency: must be at least 0, got -1 (0 turns the long-dependency sets off)"


@pytest.mark.parametrize("arguments, expected", [
    ({"long_dependency": "7"}, "long_dependency: expected an integer or None, got '7'"),
    ({"long_dependency": -1}, "long_dependency: must be at least 0, got -1"),
    ({"splits": 5}, "splits: expected a list of strings or None, got 5"),
    ({"splits": ["test", 2]}, "splits: expected a list of strings or None, got ['test', 2]"),
])
def test_the_api_test_names_the_argument(tmp_path: Path, arguments: dict, expected: str) -> None:
    with pytest.raises(ConfigError) as raised:
        structnmt.test(tmp_path / "no-run", **arguments)
    assert str(raised.value).startswith(expected)


# ---------------------------------------------------------------------------
# 5. report --samples


@pytest.mark.parametrize("samples", ["0", "-5"])
def test_report_refuses_fewer_than_one_bootstrap_sample(samples: str, tmp_path: Path,
                                                        capsys: pytest.CaptureFixture) -> None:
    message = failing(capsys, "report", str(tmp_path / "run"), "--samples", samples)
    assert message == f"--samples: must be at least 1, got {samples}"
    with pytest.raises(ConfigError, match=f"^samples: must be at least 1, got {samples}$"):
        structnmt.report([tmp_path / "run"], samples=int(samples))


# ---------------------------------------------------------------------------
# 6. average: an output that is an input, an input given twice


def test_average_refuses_to_write_over_one_of_its_inputs(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    a, b = (tmp_path / "A.pt", tmp_path / "B.pt")
    a.write_bytes(b"checkpoint A")
    b.write_bytes(b"checkpoint B")
    (tmp_path / "link.pt").symlink_to(b)
    message = failing(capsys, "average", str(a), str(b), "--out", str(tmp_path / "." / "A.pt"))
    assert message == f"--out: {tmp_path / 'A.pt'} is also checkpoint 1 to average: it would be replaced; " \
                      "choose another output"
    message = failing(capsys, "average", str(a), str(b), "--out", str(tmp_path / "link.pt"))
    assert message.startswith(f"--out: {tmp_path / 'link.pt'} is also checkpoint 2 to average")
    assert a.read_bytes() == b"checkpoint A" and b.read_bytes() == b"checkpoint B"


def test_average_refuses_a_checkpoint_given_twice(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    a = tmp_path / "A.pt"
    a.write_bytes(b"checkpoint A")
    twice = str(tmp_path / "sub" / ".." / "A.pt")
    (tmp_path / "sub").mkdir()
    message = failing(capsys, "average", str(a), twice, "--out", str(tmp_path / "avg.pt"))
    assert message == f"checkpoints: {twice} is given more than once: give each checkpoint once"
    with pytest.raises(ConfigError, match="given more than once"):
        structnmt.average([a, a], tmp_path / "avg.pt")
    (tmp_path / "last.pt").hardlink_to(a)  # as the trainer links last.pt to the step's checkpoint
    with pytest.raises(ConfigError, match=f"last.pt is given more than once as {a} \\(one file under two names"):
        structnmt.average([a, tmp_path / "last.pt"], tmp_path / "avg.pt")
    assert not (tmp_path / "avg.pt").exists()


# ---------------------------------------------------------------------------
# 7. evaluate --hyp -: standard input


def stdin(monkeypatch: pytest.MonkeyPatch, data: bytes) -> None:
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(data)))


def test_evaluate_reads_the_hypotheses_from_standard_input(texts: tuple[Path, Path], capsys: pytest.CaptureFixture,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    stdin(monkeypatch, texts[0].read_bytes())
    code, out, err = cli(capsys, "evaluate", "--hyp", "-", "--ref", str(texts[1]))
    assert code == 0, err
    assert "BLEU = 100.00" in out
    stdin(monkeypatch, b"the cat sat on the mat\n\n")
    assert failing(capsys, "evaluate", "--hyp", "-", "--ref", str(texts[1])).startswith(
        "<stdin>:2: empty hypothesis line")


def test_standard_input_is_read_once_only(texts: tuple[Path, Path], capsys: pytest.CaptureFixture,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    stdin(monkeypatch, texts[0].read_bytes())
    message = failing(capsys, "evaluate", "--hyp", "-", "--ref", "-")
    assert message.startswith("--ref: standard input ('-') can be read only once")
    with pytest.raises(ConfigError, match="standard input"):
        structnmt.evaluate("-", [Path("-"), texts[1]])


# ---------------------------------------------------------------------------
# 8. an empty hypothesis line: the flag that accepts it


def test_an_empty_hypothesis_line_names_the_allow_empty_flag(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    hyp, ref = write(tmp_path / "h.txt", "a b c\n\n"), write(tmp_path / "r.txt", "a b c\nd e f\n")
    message = failing(capsys, "evaluate", "--hyp", str(hyp), "--ref", str(ref))
    assert message.startswith(f"{hyp}:2: empty hypothesis line") and "--allow-empty" in message
    with pytest.raises(DataError, match="allow_empty=True"):
        structnmt.evaluate(hyp, ref)
