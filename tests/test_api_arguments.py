"""The Python API checks its arguments against its own type hints before any work
(structnmt/arguments.py): a wrong type is one ConfigError naming the argument, never a
TypeError from deep inside, and one string where a list is asked for is a list of one."""

from __future__ import annotations

import inspect
from pathlib import Path

import pytest

import structnmt
import structnmt.api as api
from structnmt.arguments import checked
from structnmt.errors import ConfigError


@pytest.mark.parametrize("call, expected", [
    (lambda: structnmt.report(5), "runs: expected a list of paths (str or pathlib.Path), got 5"),
    (lambda: structnmt.report([5]), "runs: expected a list of paths (str or pathlib.Path), got [5]"),
    (lambda: structnmt.plot_curves(["a"], 5), "out: expected a path (str or pathlib.Path), got 5"),
    (lambda: structnmt.plot_attention("c.pt", "o.png", head="1"), "head: expected an integer, got '1'"),
    (lambda: structnmt.plot_attention("c.pt", "o.png", attention="crosss"),
     "attention: expected one of 'encoder', 'cross', got 'crosss'"),
    (lambda: structnmt.plot_attention("c.pt", "o.png", sentence=["a b"]),
     "sentence: expected a string or None, got ['a b']"),
    (lambda: structnmt.inspect("r", "trees", gold_format="xml"),
     "gold_format: expected one of 'auto', 'pharaoh', 'talp', got 'xml'"),
    (lambda: structnmt.inspect("r", "heads", layer="1"), "layer: expected an integer or None, got '1'"),
    (lambda: structnmt.run_study("s.yaml", executor="sge"),
     "executor: expected one of 'local', 'slurm', 'submitit-local' or None, got 'sge'"),
    (lambda: structnmt.run_study("s.yaml", seeds="1"), "seeds: expected a list of integers or None, got '1'"),
    (lambda: structnmt.train("c.yaml", resume="yes"), "resume: expected True or False, got 'yes'"),
    (lambda: structnmt.export_ctranslate2("c.pt", "out", force="no"), "force: expected True or False, got 'no'"),
    (lambda: structnmt.export_ctranslate2("c.pt", "out", dataset=5),
     "dataset: expected a path (str or pathlib.Path) or None, got 5"),
    (lambda: structnmt.demo(minutes="x"), "minutes: expected a number, got 'x'"),
    (lambda: structnmt.demo(True), "work: expected a path (str or pathlib.Path), got True"),
    (lambda: structnmt.load_config("c.yaml", {1: 2}),
     "overrides: expected a mapping or a list of strings or None, got {1: 2}"),
    (lambda: structnmt.load("c.pt", device=3), "device: expected a string or a torch.device or None, got 3"),
    (lambda: structnmt.study_status(5), "study: expected a path (str or pathlib.Path), got 5"),
    (lambda: structnmt.train(5), "config: expected a path (str or pathlib.Path) or ExperimentConfig, got 5"),
    (lambda: structnmt.test("r", nosuch=1), "test(): got an unexpected keyword argument 'nosuch'"),
    (lambda: structnmt.plot_curves([], "o.png"), "runs: no run to plot"),
])
def test_a_wrong_argument_is_named_before_any_work(call, expected, tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)  # nothing exists here: an argument that passed would fail on a missing file
    with pytest.raises(ConfigError) as raised:
        call()
    assert str(raised.value) == expected


def test_one_string_where_a_list_is_asked_for_is_a_list_of_one(tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    seen = {}

    @checked
    def take(runs: list[str | Path], names: list[str] | None = None, text: str | list[str] = "x") -> None:
        seen.update(runs=runs, names=names, text=text)

    take("runs/a", names="vanilla", text="one sentence")
    assert seen == {"runs": ["runs/a"], "names": ["vanilla"], "text": "one sentence"}  # str allowed: kept
    with pytest.raises(structnmt.DataError, match="^runs/a: run directory not found"):  # not "r: ..."
        structnmt.report("runs/a")


def test_every_public_function_of_the_api_checks_its_arguments() -> None:
    public = [value for name, value in vars(api).items()
              if inspect.isfunction(getattr(value, "__wrapped__", value)) and not name.startswith("_")
              and getattr(value, "__module__", "") == api.__name__]
    assert len(public) >= 25
    unchecked = [f.__name__ for f in public if not hasattr(f, "__wrapped__")]
    assert unchecked == []


def test_iterables_and_path_likes_are_taken_as_before(tmp_path: Path) -> None:
    """What the functions accepted before the checks stays accepted: any iterable where a list
    is asked for, any os.PathLike where a path is, a torch.device where a device is."""
    import torch

    seen = {}

    @checked
    def take(runs: list[str | Path], seeds: list[int] | None = None, *names: str) -> None:
        seen.update(runs=runs, seeds=seeds, names=names)

    class Folder:
        def __fspath__(self) -> str:
            return "runs/x"

    take((p for p in ["a", "b"]), range(1, 3))
    assert seen["runs"] == ["a", "b"] and seen["seeds"] == [1, 2]
    take(Folder(), None, "x", "y")
    assert isinstance(seen["runs"][0], Folder) and seen["names"] == ("x", "y")
    with pytest.raises(ConfigError, match=r"^names\[1\]: expected a string, got 5"):
        take("a", None, "x", 5)
    with pytest.raises(structnmt.DataError, match="no such run directory"):  # past the checks
        structnmt.test(tmp_path / "no-run", device=torch.device("cpu"))


def test_every_hint_of_the_api_resolves() -> None:
    """Hints are read on a function's first call: a bad name there would be a NameError then."""
    from structnmt.arguments import _HINT_NAMES, _resolve
    from structnmt.evaluation.alignment import GoldFormat

    assert _HINT_NAMES["GoldFormat"] == GoldFormat
    for name in api.__all__ if hasattr(api, "__all__") else dir(api):
        value = getattr(api, name)
        if hasattr(value, "__wrapped__"):
            _resolve(value.__wrapped__)


@pytest.mark.parametrize("call, expected", [
    (lambda tmp: api.demo(work=tmp / "d", minutes=-1.0), "minutes: must not be negative"),
    (lambda tmp: api.demo(work=tmp / "d", seed=2**40), "seed: must be below 2**32"),
    (lambda tmp: api.average([tmp / "a.pt", tmp / "b.pt"], out=tmp), "out: "),
    (lambda tmp: api.plot_curves([tmp], out=tmp), "out: "),
    (lambda tmp: api.report([tmp], out=tmp), "out: "),
])
def test_a_check_shared_with_the_command_line_names_the_argument(call, expected, tmp_path) -> None:
    """The API caller wrote ``minutes=``, not ``--minutes``: the message names what they wrote."""
    with pytest.raises(structnmt.StructNMTError) as caught:
        call(tmp_path)
    message = str(caught.value)
    assert message.startswith(expected), message
    if isinstance(caught.value, ConfigError):
        assert caught.value.field == expected.split(":")[0]


def test_an_option_that_is_no_argument_keeps_its_name() -> None:
    """Only a parameter of the function is renamed: an option the caller has no name for stays."""
    from structnmt.arguments import name_arguments

    err = ConfigError("bad", "--shard")
    name_arguments(err, {"jobs": None})
    assert (err.field, str(err)) == ("--shard", "--shard: bad")
    err = ConfigError("bad", "--seed-of", path="study.yaml")
    name_arguments(err, {"seed_of": None})
    assert (err.field, str(err)) == ("seed_of", "study.yaml: seed_of: bad")
    plain = structnmt.StructNMTError("--jobs: expected at least 1 shard; structnmt train --jobs 2")
    name_arguments(plain, {"jobs": None})
    assert str(plain) == "jobs: expected at least 1 shard; structnmt train --jobs 2"


def test_the_command_line_names_its_options(tmp_path, capsys) -> None:
    """The same check through ``structnmt demo``: its user gave ``--minutes``, and reads that."""
    from structnmt.cli.main import main

    assert main(["demo", "--work", str(tmp_path / "d"), "--minutes", "-1"]) == 2
    assert "error: --minutes: must not be negative" in capsys.readouterr().err
    assert main(["average", str(tmp_path / "a.pt"), str(tmp_path / "b.pt"), "--out", str(tmp_path)]) == 2
    assert f"error: --out: {tmp_path} is a directory" in capsys.readouterr().err


def test_hints_read_in_words() -> None:
    from structnmt.arguments import describe

    assert [describe(h) for h in (list[bool], list[int], list[float], list[str], list[int | str])] == [
        "a list of True or False values", "a list of integers", "a list of numbers", "a list of strings",
        "a list of (an integer or a string)"]
