"""A study's records folder and run states: another study's records, signals, hypothesis files, bad options.

Hand-made records of tests/test_faults.py's tiny study (nothing trained), and run processes faked.
"""

from __future__ import annotations

import json
import signal
import subprocess
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

from structnmt.errors import ConfigError
from structnmt.study import format_status, load_study, run_study, study_status
from structnmt.study.report import write_report
from tests.test_bad_input import failing
from tests.test_faults import damage, study_with_records
from tests.test_study import _study_file, _write_recipes


def _other_study(root: Path, records: Path, name: str = "other") -> Path:
    """A second study file of the same recipes whose ``records:`` is ``records``."""
    recipes = {"vanilla": root / "base.yaml", "pascal": root / "pascal.yaml"}
    return _study_file(root, recipes, name=name, seeds=(1,), records=str(records))


# -- 1: two study files with one records folder


def test_a_records_folder_of_another_study_is_refused_before_anything_is_touched(tmp_path, capsys):
    # before: the second study called the first's records stale, trained over them and replaced its report
    path = study_with_records(tmp_path)
    study = load_study(path)
    write_report(study)
    before = {p: p.read_bytes() for p in sorted(study.records.rglob("*")) if p.is_file()}
    other = _other_study(tmp_path, study.records)
    said = (f"{other}: records: {study.records} holds the records of study 'records' "
            f"({study.record_dir('pascal', 1) / 'record.json'}); give this study its own records folder")
    for call in (lambda: run_study(other), lambda: study_status(other), lambda: write_report(load_study(other))):
        with pytest.raises(ConfigError) as caught:
            call()
        assert str(caught.value).startswith(said), caught.value
    for flags in ([], ["--status"], ["--report"]):
        assert failing(capsys, "study", str(other), *flags).startswith(said)
    assert {p: p.read_bytes() for p in sorted(study.records.rglob("*")) if p.is_file()} == before
    assert not load_study(other).work_dir.exists()
    assert {r["state"] for r in study_status(path)} == {"done"}  # the owner reads them as ever
    # a report alone (its records deleted) is the other study's too
    for folder in ("vanilla", "pascal"):
        for file in (study.records / folder).rglob("*"):
            file.unlink() if file.is_file() else None
    with pytest.raises(ConfigError, match=r"holds the records of study 'records' \(.*report\.md\)"):
        study_status(other)


# -- 2: a run stopped by a signal; a stale failed.json


def _fake_runs(monkeypatch: pytest.MonkeyPatch, code: int, failed_while_running: list[bool] | None = None,
               study=None) -> None:
    """Run processes that end at once with exit status ``code``."""
    from structnmt.study import executors

    class Run:
        def __init__(self, command, **_kwargs):
            if failed_while_running is not None:
                failed_while_running.append((study.record_dir(command[-3], int(command[-2])) / "failed.json").exists())

        def wait(self) -> int:
            return code

        def terminate(self) -> None:
            pass

    monkeypatch.setattr(executors, "subprocess", SimpleNamespace(Popen=Run, STDOUT=subprocess.STDOUT))


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_run_ended_by_a_signal_is_interrupted_and_a_new_try_clears_an_old_failure(sig, tmp_path, monkeypatch):
    # before: SIGTERM while the run process was starting recorded "failed ... status -15", and that
    # failed.json outlived every later try in --status
    from structnmt.study import executors

    recipes = _write_recipes(tmp_path)
    study = load_study(_study_file(tmp_path, {"vanilla": recipes["vanilla"]}, seeds=(1,)))
    failed = study.record_dir("vanilla", 1) / "failed.json"
    failed.parent.mkdir(parents=True)
    failed.write_text(json.dumps({"error": "the run process ended with status -15"}))
    seen: list[bool] = []
    _fake_runs(monkeypatch, -sig, seen, study)
    assert executors.run_local(study, [("vanilla", 1)], 1, lambda *_: None) == {("vanilla", 1): "interrupted"}
    assert seen == [False] and not failed.exists()
    # its log has gone on: the status says where it stands, not the old failure
    run_dir = study.run_dir("vanilla", 1)
    (run_dir / "log.jsonl").write_text(json.dumps({"kind": "train", "step": 5, "elapsed_s": 1.0}) + "\n")
    failed.write_text(json.dumps({"error": "an old failure"}))
    _fake_runs(monkeypatch, 75)
    executors.run_local(study, [("vanilla", 1)], 1, lambda *_: None)
    [row] = study_status(study.path)
    assert row["state"] == "interrupted" and row["note"].startswith("resumes from its last checkpoint"), row
    # a real crash is still a failure
    _fake_runs(monkeypatch, -signal.SIGKILL)
    assert executors.run_local(study, [("vanilla", 1)], 1, lambda *_: None) == {("vanilla", 1): "failed"}
    assert "status -9" in json.loads(failed.read_text())["error"]


def test_a_run_started_by_its_worker_clears_an_old_failure(tmp_path, monkeypatch):
    # the SLURM path and `python -m structnmt.study.runs` start runs without run_local
    from structnmt.study import runs

    recipes = _write_recipes(tmp_path)
    study = load_study(_study_file(tmp_path, {"vanilla": recipes["vanilla"]}, seeds=(1,)))
    failed = study.record_dir("vanilla", 1) / "failed.json"
    failed.parent.mkdir(parents=True)
    failed.write_text(json.dumps({"error": "the run process ended with status -15"}))
    monkeypatch.setattr(runs, "_train_test_record", lambda *_: runs.INTERRUPTED)
    assert runs.execute_run(study, "vanilla", 1) == "interrupted" and not failed.exists()


# -- 3: a hypothesis file with the wrong number of lines


def _scored_sentences(path: Path) -> None:
    """Give each record the sentence count real records keep (the hand-made ones have none)."""
    study = load_study(path)
    for recipe in ("vanilla", "pascal"):
        n = len((study.record_dir(recipe, 1) / "hyps" / "test.hyp").read_text().splitlines())
        damage(study.record_dir(recipe, 1) / "record.json", lambda r, n=n: r["scores"]["test"].update(sentences=n))


HYP_DAMAGE = {
    "truncated": (lambda text: "".join(text.splitlines(keepends=True)[:10]), "have 10 lines"),
    "empty": (lambda text: "", "have 0 lines"),
    "doubled": (lambda text: text + text, "have {twice} lines"),
    "not_utf8": (lambda text: text + "\udcff\n", "are not valid UTF-8"),
}


@pytest.mark.parametrize("case", sorted(HYP_DAMAGE))
def test_a_hypothesis_file_of_the_wrong_length_is_damaged(case, tmp_path, capsys):
    # before: the run read as done, and --report failed with "the baseline has 24 hypotheses but system 2 has 10"
    path = study_with_records(tmp_path)
    _scored_sentences(path)
    study = load_study(path)
    hyp = study.record_dir("pascal", 1) / "hyps" / "test.hyp"
    text = hyp.read_text()
    n = len(text.splitlines())
    assert {r["state"] for r in study_status(path)} == {"done"}  # the control: whole records
    change, what = HYP_DAMAGE[case]
    hyp.write_bytes(change(text).encode("utf-8", "surrogateescape"))
    record = study.record_dir("pascal", 1) / "record.json"
    why = (f"{record} is damaged: scores.test: its hypotheses {hyp} {what.format(twice=2 * n)}, but the record "
           f"scored {n} sentences; restore it from version control (git checkout -- {record.parent})")
    rows = {r["recipe"]: r for r in study_status(path)}
    assert rows["pascal"]["state"] == "damaged" and rows["pascal"]["note"].startswith(why), rows["pascal"]
    assert rows["vanilla"]["state"] == "done"
    message = failing(capsys, "study", str(path), "--report")
    assert message == f"1 damaged record, listed in the report; the first: {why}, or delete {record.parent} " \
                      "to run it again", message
    assert run_study(path, report=False)["runs"] == {"pascal/seed1": "damaged"}  # never trained over
    assert hyp.read_bytes() == change(text).encode("utf-8", "surrogateescape")


def test_a_short_hypothesis_file_of_a_record_without_a_count_is_named_in_the_report(tmp_path):
    # records that keep no sentence count are checked against the test set's references
    path = study_with_records(tmp_path)
    study = load_study(path)
    hyp = study.record_dir("pascal", 1) / "hyps" / "test.hyp"
    hyp.write_text("".join(hyp.read_text().splitlines(keepends=True)[:10]))
    text = write_report(study).read_text()
    assert f"{hyp} has 10 lines for the 24 sentences of test" in text, text


# -- 4: options and folders


@pytest.mark.parametrize("field, value, said", [
    ("records", "afile", "records: afile is a file, not a folder; name a folder for the study's records"),
    ("work_dir", "afile/runs", "work_dir: afile/runs lies under afile, a file, not a folder; name a folder"),
])
def test_a_folder_field_naming_a_file_is_refused_on_load(field, value, said, tmp_path, monkeypatch, capsys):
    # before: "afile: File exists", then "afile/vanilla: Not a directory" once per run, "4 interrupted"
    recipes = _write_recipes(tmp_path)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "afile").write_text("a file\n")
    path = _study_file(tmp_path, recipes, **{field: value})
    with pytest.raises(ConfigError, match=f"^{path}: {said}"):
        load_study(path)
    assert failing(capsys, "study", str(path), "--status").startswith(f"{path}: {said}")


def test_jobs_zero_and_out_without_report_are_refused(tmp_path, capsys):
    # before: --jobs 0 meant the study file's count, silently (-1 was refused); --out without --report was ignored
    recipes = _write_recipes(tmp_path)
    path = _study_file(tmp_path, recipes)
    with pytest.raises(ConfigError, match=r"^--jobs: must be at least 1, got 0"):
        run_study(path, jobs=0)
    with pytest.raises(ConfigError, match=r"^--jobs: must be at least 1, got 0"):
        format_status(study_status(path), jobs=0)
    assert failing(capsys, "study", str(path), "--status", "--jobs", "0").startswith("--jobs: must be at least 1")
    out = tmp_path / "x.md"
    assert failing(capsys, "study", str(path), "--out", str(out)) == \
        "--out only names a report's file: give --report with it"
    assert not out.exists() and not load_study(path).work_dir.exists()
    # with --status they were ignored too, and --status --report printed the status alone
    assert failing(capsys, "study", str(path), "--status", "--out", str(out)) == \
        "--out only names a report's file: give --report with it"
    assert failing(capsys, "study", str(path), "--status", "--baseline", "vanilla").startswith("--baseline only")
    assert failing(capsys, "study", str(path), "--status", "--report") == \
        "--status and --report are two commands: give one of them"
    assert not out.exists()
    assert yaml.safe_load(path.read_text())["executor"]["jobs"] == 1
