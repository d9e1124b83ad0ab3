"""Studies on the synthetic task with tiny models: validation, records, resume, reruns, report, executors."""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from structnmt.data.synthetic import demo_config, write_task
from structnmt.errors import ConfigError
from structnmt.study import format_status, load_study, run_study, study_status
from structnmt.study.report import write_report

ROOT = Path(__file__).resolve().parents[1]


def _write_recipes(work: Path) -> dict[str, Path]:
    write_task(work / "data", sizes={"train": 300, "val": 24, "test": 24}, seed=3)
    raw = demo_config(work, 0)
    raw["data"]["subwords"]["vocab_size"] = 300
    raw["model"].update({"d_model": 32, "d_ff": 64, "enc_layers": 1, "dec_layers": 1, "n_heads": 2})
    raw["training"].update({"max_tokens": 1024, "warmup": 10, "lr": 3e-3, "valid_every": 10, "progress": False,
                            "tensorboard": False, "log_every": 5, "keep_last": 1, "valid_beam": 1})
    raw["decoding"]["beam"] = 2
    base = work / "base.yaml"
    base.write_text(yaml.safe_dump(raw))
    pascal = work / "pascal.yaml"
    pascal.write_text(yaml.safe_dump({"base": "base.yaml", "model": {
        "methods": [{"name": "pascal", "layers": [1], "heads": 1}]}}))
    return {"vanilla": base, "pascal": pascal}


def _study_file(work: Path, recipes: dict[str, Path], name: str = "tiny", seeds=(1, 2), max_steps: int = 20,
                extra: list[dict] | None = None, **more) -> Path:
    spec = {"name": name, "baseline": "vanilla", "seeds": list(seeds), "max_steps": max_steps,
            "test_sets": ["test"], "records": str(work / name / "records"), "work_dir": str(work / name / "runs"),
            "recipes": [{"name": n, "config": str(p)} for n, p in recipes.items()] + (extra or []),
            "executor": {"kind": "local", "jobs": 1, "threads": 1, "nice": 0}, **more}
    path = work / f"{name}.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


@pytest.fixture(scope="module")
def recipes(tmp_path_factory) -> dict[str, Path]:
    return _write_recipes(tmp_path_factory.mktemp("study"))


# -- validation -------------------------------------------------------------------------------


@pytest.mark.parametrize("change, field", [
    ({"recipes": [{"name": "vanilla", "config": "nowhere.yaml"}]}, "recipes[0].config"),
    ({"seeds": [1, "two"]}, "seeds[1]"),
    ({"baseline": "nobody"}, "baseline"),
    ({"max_steps": 0}, "max_steps"),
    ({"colour": "red"}, "colour"),
    ({"recipes": [{"name": "vanilla", "config": "base.yaml", "seeds": [1, 1.5]}]}, "recipes[0].seeds[1]"),
    ({"recipes": [{"name": "vanilla", "config": "base.yaml", "seeds": []}]}, "recipes[0].seeds"),
    ({"test_checkpoint": "average"}, "test_checkpoint"),
    ({"trees": {"file": "trees.jsonl.gz", "sha256": "not a digest"}}, "trees.sha256"),
    ({"executor": {"kind": "local", "jobs": 0}}, "executor.jobs"),
    ({"executor": {"kind": "local", "device": "gpu"}}, "executor.device"),
    ({"executor": {"kind": "local", "device": "cuda:one"}}, "executor.device"),
    ({"executor": {"kind": "local", "device": "cuda:"}}, "executor.device"),
    ({"executor": {"kind": "local", "device": "cpu:0"}}, "executor.device"),
    ({"executor": {"kind": "local", "commit": "yes"}}, "executor.commit"),
    ({"test_sets": ["tst"]}, "test_sets"),  # not a split of the recipes' data: refused before any run trains
    ({"overrides": {"model.methods.0.heads": 1}}, "model.methods"),  # vanilla has no method 0
])
def test_a_bad_study_file_names_the_field(recipes, tmp_path, change, field):
    path = _study_file(tmp_path, recipes)
    spec = yaml.safe_load(path.read_text())
    spec.update(change)
    for recipe in spec["recipes"]:
        recipe["config"] = str(recipes["vanilla"]) if recipe["config"] == "base.yaml" else recipe["config"]
    path.write_text(yaml.safe_dump(spec))
    with pytest.raises(ConfigError) as err:
        load_study(path)
    assert f"{field}:" in str(err.value) and str(path) in str(err.value)


def test_an_empty_overrides_key_means_no_overrides(recipes, tmp_path):
    path = _study_file(tmp_path, recipes)
    spec = yaml.safe_load(path.read_text())
    spec["overrides"] = None
    spec["recipes"][0]["overrides"] = None
    path.write_text(yaml.safe_dump(spec))
    study = load_study(path)
    assert study.overrides == {} and study.recipes[0].overrides == {}


def test_one_seed_on_another_device_is_one_call_that_leaves_the_study_file_alone(recipes, tmp_path, monkeypatch):
    import structnmt.study as study_module
    import structnmt.study.executors as executors

    path = _study_file(tmp_path, recipes, seeds=(1, 2, 3))
    before = path.read_text()
    seen: dict = {}

    def run_local(study, runnable, jobs, progress):
        seen.update(runs=list(runnable), jobs=jobs, commit=study.executor.commit,
                    devices={study.run_config(r, s).training.device for r, s in runnable})
        return {run: "done" for run in runnable}

    monkeypatch.setattr(study_module, "prepare_datasets", lambda *_: {})
    monkeypatch.setattr(executors, "run_local", run_local)
    run_study(path, report=False, seeds=[2], device="cpu", commit=True, jobs=3)
    assert seen == {"runs": [("vanilla", 2), ("pascal", 2)], "jobs": 3, "commit": True, "devices": {"cpu"}}
    run_study(path, report=False, seeds=[3, 1], only=["pascal"])
    assert seen["runs"] == [("pascal", 1), ("pascal", 3)] and seen["commit"] is False and seen["devices"] == {"auto"}
    assert path.read_text() == before
    with pytest.raises(ConfigError, match=r"--seeds: not a seed of the study: 4, 7 \(seeds: 1, 2, 3\)"):
        run_study(path, seeds=[7, 2, 4])
    with pytest.raises(ConfigError, match=r"--device: expected auto, cpu, cuda or cuda:N"):
        run_study(path, seeds=[1], device="gpu")


def test_duplicate_names_and_unknown_override_fields_are_refused(recipes, tmp_path):
    twice = _study_file(tmp_path, recipes, extra=[{"name": "pascal", "config": str(recipes["pascal"])}])
    with pytest.raises(ConfigError, match=r"recipes\[2\]\.name: duplicate recipe name 'pascal'"):
        load_study(twice)
    bad = _study_file(tmp_path, recipes, name="bad",
                      extra=[{"name": "odd", "config": str(recipes["vanilla"]), "overrides": {"model.colour": 1}}])
    with pytest.raises(ConfigError) as err:
        load_study(bad)
    assert "recipes[2]" in str(err.value) and "model.colour" in str(err.value)


def test_unknown_recipes_and_bad_job_counts_are_refused_before_anything_runs(recipes, tmp_path):
    path = _study_file(tmp_path, recipes)
    with pytest.raises(ConfigError, match=r"--only: not a recipe of the study: pasqual"):
        run_study(path, only=["pasqual"])
    with pytest.raises(ConfigError, match=r"--jobs: must be at least 1"):
        run_study(path, jobs=-1)
    spec = yaml.safe_load(path.read_text())
    spec["executor"] = "local"
    path.write_text(yaml.safe_dump(spec))
    with pytest.raises(ConfigError, match=r"executor: expected a mapping"):
        load_study(path)


def test_one_run_by_hand_names_a_recipe_the_study_lacks_and_leaves_nothing(recipes, tmp_path, capsys):
    # `python -m structnmt.study.runs` is how executors and pinned lanes start a run; a person may
    # type it too: a wrong recipe, seed or file is one line and status 2, no traceback, no folder
    from structnmt.study import runs

    path = _study_file(tmp_path, recipes)
    assert runs.main([str(path), "pasqual", "1"]) == 2
    err = capsys.readouterr().err
    assert "no recipe 'pasqual': the study's recipes are vanilla" in err and str(path) in err
    assert runs.main([str(path), "vanilla", "one"]) == 2
    assert "usage:" in capsys.readouterr().err
    assert runs.main([str(tmp_path / "absent.yaml"), "vanilla", "1"]) == 2
    assert "absent.yaml" in capsys.readouterr().err
    assert not (tmp_path / "tiny" / "runs").exists() and not (tmp_path / "tiny" / "records").exists()


@pytest.mark.skipif(shutil.which("git") is None or not (ROOT / ".git").exists(), reason="needs the git checkout")
@pytest.mark.parametrize("args, said", [
    ([], "Runs of a study, one after another"),
    (["no-such-commit", "studies/multi30k_en_de.yaml", "vanilla:1"], "is not a commit"),
    (["HEAD", str(ROOT / "studies" / "multi30k_en_de.yaml"), "vanilla:1"], "from the repository's root"),
    (["HEAD", "studies/../studies/multi30k_en_de.yaml", "vanilla:1"], "from the repository's root"),
    (["HEAD", "studies/absent.yaml", "vanilla:1"], "has no studies/absent.yaml"),
])
def test_a_pinned_lane_refuses_what_it_cannot_pin_before_it_makes_a_worktree(args, said, tmp_path):
    # studies/pinned_lane.sh makes a worktree and trains in it: a wrong commit or study path must
    # stop it at once with one line, not leave a worktree or lanes that skip every run in silence
    env = {**os.environ, "PINNED_DIR": str(tmp_path / "worktree")}
    done = subprocess.run(["bash", str(ROOT / "studies" / "pinned_lane.sh"), *args], capture_output=True, text=True,
                          env=env, timeout=60)
    assert done.returncode == 2 and said in done.stdout + done.stderr
    assert not (tmp_path / "worktree").exists()


def test_a_lane_is_told_when_its_seed_trained_on_another_kind_of_machine(recipes, tmp_path, capsys):
    # seed 5 of the converged study began on an AVX-512 CPU in bf16; a lane on an AVX2 CPU (fp32
    # there) must hear so before it spends hours, held-back records counted
    from structnmt.study.same_machine import main, other_kinds, seed_records

    path = _study_file(tmp_path, {"vanilla": recipes["vanilla"], "pascal": recipes["pascal"]}, seeds=(1, 5))
    study = load_study(path)

    def record(isa: str, precision: str) -> dict:
        return {"cpu": "AMD EPYC", "cpu_info": {"isa": isa}, "precision": precision, "calls": []}

    recorded = Path(study.records) / "vanilla" / "seed5"
    held = tmp_path / "pending" / Path(study.records).name / "pascal" / "seed5"
    for folder, isa in ((recorded, "AVX512"), (held, "AVX2")):
        folder.mkdir(parents=True)
        (folder / "record.json").write_text(json.dumps(record(isa, "bfloat16")))
    assert set(seed_records(study, 5)) == {"vanilla"}
    found = seed_records(study, 5, tmp_path / "pending")
    assert set(found) == {"vanilla", "pascal"} and seed_records(study, 1, tmp_path / "pending") == {}
    assert other_kinds(found, "AMD EPYC (AVX512)") == {"AMD EPYC (AVX2)": ["pascal"]}
    assert other_kinds(found, "AMD EPYC (AVX512)", "float32") == {
        "AMD EPYC (AVX2)": ["pascal"], "bfloat16, not float32": ["vanilla", "pascal"]}
    assert other_kinds({"vanilla": found["vanilla"]}, "AMD EPYC (AVX512)", "bfloat16") == {}
    assert main([str(path), "vanilla", "5", str(tmp_path / "pending")]) == 3  # two kinds: one is not this one
    assert main([str(path), "vanilla", "1"]) == 0  # nothing recorded yet
    assert "seed 1: no records yet, so any kind of machine will do (this one: " in capsys.readouterr().out
    assert main([str(path), "nobody", "1"]) == 2 and main([str(path), "vanilla", "one"]) == 2
    (held / "record.json").write_text("{not json")  # a damaged record stops the lane, named
    assert main([str(path), "vanilla", "5", str(tmp_path / "pending")]) == 2
    (held / "record.json").write_text("[]")  # JSON, but not a record
    assert main([str(path), "vanilla", "5", str(tmp_path / "pending")]) == 2
    stray = Path(study.records) / "notarecipe" / "seed5"  # a folder the study does not name is not its run
    stray.mkdir(parents=True)
    (stray / "record.json").write_text("{not json")
    assert set(seed_records(study, 5)) == {"vanilla"}


def test_same_machine_passes_a_matching_seed_and_refuses_on_precision_alone(recipes, tmp_path, monkeypatch, capsys):
    from structnmt.study import same_machine

    path = _study_file(tmp_path, {"vanilla": recipes["vanilla"], "pascal": recipes["pascal"]}, seeds=(5,))
    study = load_study(path)
    held = tmp_path / "pending"
    for root, recipe, precision in ((Path(study.records), "vanilla", "bfloat16"),
                                    (held / Path(study.records).name, "vanilla", "float32"),
                                    (held / Path(study.records).name, "pascal", "bfloat16")):
        (root / recipe / "seed5").mkdir(parents=True)
        record = {"cpu": "AMD EPYC", "cpu_info": {"isa": "AVX512"}, "precision": precision, "calls": []}
        (root / recipe / "seed5" / "record.json").write_text(json.dumps(record))
    assert same_machine.seed_records(study, 5, held)["vanilla"]["precision"] == "bfloat16"  # the study's wins
    monkeypatch.setattr(same_machine, "kind_here", lambda: "AMD EPYC (AVX512)")
    monkeypatch.setattr(same_machine, "precision_here", lambda *a: "bfloat16")
    assert same_machine.main([str(path), "pascal", "5", str(held)]) == 0
    assert "2 records, all on AMD EPYC (AVX512)" in capsys.readouterr().out
    monkeypatch.setattr(same_machine, "precision_here", lambda *a: "float32")  # same CPU, another precision
    assert same_machine.main([str(path), "pascal", "5", str(held)]) == 3
    assert "bfloat16, not float32: vanilla, pascal" in capsys.readouterr().out
    monkeypatch.setattr(same_machine, "precision_here", lambda *a: None)
    monkeypatch.setattr(same_machine, "kind_here", lambda: "AMD EPYC (AVX2)")
    assert same_machine.main([str(path), "pascal", "5", str(held)]) == 3
    assert "pascal precision unknown" in capsys.readouterr().out
    monkeypatch.setattr(same_machine, "kind_here", lambda: 1 / 0)  # a crash is an error, never "another machine"
    assert same_machine.main([str(path), "pascal", "5", str(held)]) == 2


def test_runs_are_ordered_seed_by_seed_with_the_baseline_first(recipes, tmp_path):
    study = load_study(_study_file(tmp_path, {"pascal": recipes["pascal"], "vanilla": recipes["vanilla"]}))
    assert study.runs() == [("vanilla", 1), ("pascal", 1), ("vanilla", 2), ("pascal", 2)]
    cfg = study.run_config("pascal", 2)
    assert (cfg.training.seed, cfg.training.max_steps, cfg.training.max_minutes) == (2, 20, 0)
    assert cfg.training.out_dir == str(tmp_path / "tiny" / "runs" / "pascal" / "seed2")


def test_a_recipe_with_seeds_of_its_own_runs_them_after_the_studys(recipes, tmp_path):
    path = _study_file(tmp_path, {"pascal": recipes["pascal"]}, name="more",
                       extra=[{"name": "vanilla", "config": str(recipes["vanilla"]), "seeds": [3, 1, 2]}])
    study = load_study(path)
    assert study.runs() == [("vanilla", 1), ("pascal", 1), ("vanilla", 2), ("pascal", 2), ("vanilla", 3)]
    assert study.seeds_of("vanilla") == [3, 1, 2] and study.seeds_of("pascal") == [1, 2]
    assert study.run_config("vanilla", 3).training.seed == 3


def test_status_forecasts_the_runs_left_from_the_finished_runs_median():
    def row(state: str, seconds: float | None = None) -> dict:
        return {"recipe": "r", "seed": 1, "state": state, "step": None, "bleu": None, "note": "",
                **({"seconds": seconds} if seconds else {})}

    done = [row("done", 600), row("done", 1800), row("done", 3600)]
    text = format_status(done + [row("pending"), row("running"), row("failed")])
    assert text.splitlines()[-1] == ("3 runs not done (1 running); at the finished runs' median of 30 min each, "
                                     "about 1.5 h of runs at that pace (less for a run that resumes)")
    assert "not done" not in format_status(done)  # nothing left
    assert "not done" not in format_status([row("pending")])  # nothing to go by


def test_the_training_rate_spans_readings_whose_clocks_differ(tmp_path):
    # a fast model can log twice within one tick of the logged clock: the rate must come from
    # the latest earlier reading that differs, not vanish (it did, and the time left with it)
    from structnmt.study import _log_progress

    records = [{"kind": "train", "step": 5, "elapsed_s": 1.0}, {"kind": "train", "step": 10, "elapsed_s": 1.2},
               {"kind": "valid", "step": 10, "bleu": 3.5}, {"kind": "train", "step": 15, "elapsed_s": 1.2}]
    (tmp_path / "log.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    step, bleu, rate = _log_progress(tmp_path)
    assert (step, bleu) == (15, 3.5) and rate == pytest.approx(0.2 / 10)


@pytest.mark.slow
def test_a_record_held_until_its_seed_is_whole_reads_held_and_is_not_run_again(recipes, tmp_path):
    """A seed-major study holds a finished run's record in ``pending/`` beside its records: the
    status calls it held (its BLEU, where it is) and leaves it out of the forecast, and a study
    run does not train it again, unless the call names its seed on another kind of machine (the
    seed is then trained whole there). A damaged held record is named, never trained over."""
    path = _study_file(tmp_path, {"vanilla": recipes["vanilla"], "pascal": recipes["pascal"]}, name="heldout",
                       seeds=(1,), max_steps=4)
    assert run_study(path, report=False)["runs"] == {"vanilla/seed1": "done", "pascal/seed1": "done"}
    study = load_study(path)
    held = study.held_dir("pascal", 1)
    assert held == tmp_path / "heldout" / "pending" / "records" / "pascal" / "seed1"
    held.parent.mkdir(parents=True)
    shutil.move(study.record_dir("pascal", 1), held)
    bleu = json.loads((held / "record.json").read_text())["scores"]["test"]["bleu"]
    rows = {r["recipe"]: r for r in study_status(path)}
    assert rows["pascal"]["state"] == "held" and rows["pascal"]["step"] == 4 and rows["pascal"]["bleu"] == bleu
    held_record = json.loads((held / "record.json").read_text())
    assert rows["pascal"]["seconds"] == held_record["train_seconds"] + held_record["test_seconds"] > 0
    assert str(held) in rows["pascal"]["note"] and "until seed 1 is whole" in rows["pascal"]["note"]
    table = format_status(list(rows.values()))
    assert "1 done, 1 held" in table and "not done" not in table  # vanilla's time is known, nothing is left
    assert run_study(path, report=False)["runs"] == {"pascal/seed1": "held"}
    assert not study.record_dir("pascal", 1).exists()  # not trained again into the study's records

    from structnmt.study import _held_elsewhere

    record = json.loads((held / "record.json").read_text())
    assert _held_elsewhere(study, path, "pascal", 1, record, None) is None
    assert _held_elsewhere(study, path, "pascal", 1, record, "cuda") == "it trained on cpu, this run trains on cuda"
    # held from another kind of CPU: a plain run keeps it held; one that names seed 1 trains it here
    record["cpu"] = "Another CPU"
    (held / "record.json").write_text(json.dumps(record))
    assert run_study(path, report=False)["runs"] == {"pascal/seed1": "held"}
    assert run_study(path, report=False, seeds=[1])["runs"] == {"pascal/seed1": "done"}
    assert study.record_dir("pascal", 1).is_dir()
    # damaged while held: named, in the status and by a study run, and never trained over
    shutil.rmtree(study.record_dir("pascal", 1))
    (held / "record.json").write_text("{not json")
    (row,) = [r for r in study_status(path) if r["recipe"] == "pascal"]
    assert row["state"] == "damaged" and str(held / "record.json") in row["note"], row
    assert run_study(path, report=False)["runs"] == {"pascal/seed1": "damaged"}
    assert not study.record_dir("pascal", 1).exists()


def test_the_status_shows_a_seed_that_trains_beside_the_study_before_it_joins_its_file(recipes, tmp_path, capsys):
    # seeds 6 and 7 of the converged study train whole in pinned lanes before the study file names
    # them: `--status --seeds 7` must show where each of their runs stands, every recipe listed
    from structnmt.cli.main import main

    costly = {"name": "costly", "config": str(recipes["vanilla"]), "seeds": [1]}  # a recipe with seeds of its own
    path = _study_file(tmp_path, {"vanilla": recipes["vanilla"], "pascal": recipes["pascal"]}, seeds=(1, 2),
                       extra=[costly])
    assert [(r["recipe"], r["seed"]) for r in study_status(path, [7, 1, 7])] == [
        ("vanilla", 7), ("pascal", 7), ("vanilla", 1), ("pascal", 1), ("costly", 1)]  # each seed once
    assert [r["seed"] for r in study_status(path)] == [1, 1, 1, 2, 2]  # no seeds: the study's own
    import structnmt

    # the API reads an empty list as run_study does: the study's own seeds, not no rows
    assert [r["seed"] for r in structnmt.study_status(path, [])] == [1, 1, 1, 2, 2]
    assert [r["seed"] for r in structnmt.study_status(path, (7,))] == [7, 7]
    with pytest.raises(ConfigError, match="--seeds"):
        study_status(path, [-1])
    assert main(["study", str(path), "--status", "--seeds", "7"]) == 0
    out = capsys.readouterr().out
    assert "vanilla                     7  pending" in out and " 1  pending" not in out and "2 pending" in out


# -- running ----------------------------------------------------------------------------------


@pytest.mark.slow
def test_a_study_runs_records_reports_and_reruns_only_what_changed(recipes, tmp_path):
    broken = {"name": "broken", "config": str(recipes["vanilla"]), "overrides": {"model.max_positions": 4}}
    path = _study_file(tmp_path, recipes, extra=[broken])
    assert {r["state"] for r in study_status(path)} == {"pending"}

    result = run_study(path)
    assert result["runs"] == {"vanilla/seed1": "done", "pascal/seed1": "done", "broken/seed1": "failed",
                              "vanilla/seed2": "done", "pascal/seed2": "done", "broken/seed2": "failed"}
    study = load_study(path)
    record = json.loads((study.record_dir("pascal", 2) / "record.json").read_text())
    assert record["updates"] == 20 and record["seed"] == 2 and record["reads_trees"] is True
    assert set(record["scores"]) >= {"test"} and 0 <= record["scores"]["test"]["bleu"] <= 100
    assert record["scores"]["test"]["signature"]["bleu"].startswith("nrefs:1")
    hyps = (study.record_dir("pascal", 2) / "hyps" / "test.hyp").read_text().splitlines()
    assert len(hyps) == 24
    # the failed recipe is in the status with its reason, and in the report
    rows = {(r["recipe"], r["seed"]): r for r in study_status(path)}
    assert rows[("broken", 1)]["state"] == "failed" and "max_positions" in rows[("broken", 1)]["note"]
    assert rows[("vanilla", 1)]["state"] == "done" and rows[("vanilla", 1)]["bleu"] == \
        json.loads((study.record_dir("vanilla", 1) / "record.json").read_text())["scores"]["test"]["bleu"]
    vanilla_record = json.loads((study.record_dir("vanilla", 1) / "record.json").read_text())
    assert rows[("vanilla", 1)]["seconds"] == vanilla_record["train_seconds"] + vanilla_record["test_seconds"] > 0
    report = Path(result["report"]).read_text()
    assert "## Failed runs" in report and "broken seed 1" in report
    assert "| pascal |" in report and "| vanilla |" in report and "Verdicts against `vanilla`" in report
    assert Path(result["report"]).with_suffix(".png").stat().st_size > 1000
    # with nothing left to run the standing report is kept, not rewritten
    written = Path(result["report"]).stat().st_mtime_ns
    assert run_study(path, only=["vanilla", "pascal"]) == {"runs": {}, "report": result["report"]}
    assert Path(result["report"]).stat().st_mtime_ns == written
    assert "so far (" not in report and "*: so far" not in report  # every seed is in: no provisional verdict
    # the length ratio column: from the records; for records made before BLEU's parts were kept,
    # from the hypotheses and the references, to the same number
    ratios = [json.loads((study.record_dir("pascal", s) / "record.json").read_text())["scores"]["test"]
              ["bleu_parts"]["ratio"] for s in (1, 2)]
    cell = f"{statistics.mean(ratios):.3f} ± {statistics.stdev(ratios):.3f}"

    def pascal_detail(text: str) -> str:
        return [line for line in text.splitlines() if line.startswith("| pascal |") and "s1:" in line][0]

    assert pascal_detail(report).split(" | ")[3] == cell
    for s in (1, 2):
        file = study.record_dir("pascal", s) / "record.json"
        old = json.loads(file.read_text())
        del old["scores"]["test"]["bleu_parts"]
        file.write_text(json.dumps(old))
    assert pascal_detail(write_report(load_study(path)).read_text()).split(" | ")[3] == cell
    # against another recipe: its own report beside the study's, which is left alone
    standing = Path(result["report"]).read_text()
    versus = write_report(load_study(path), baseline="pascal")
    assert versus.name == "report_vs_pascal.md" and versus.with_suffix(".png").exists()
    text = versus.read_text()
    assert "Verdicts against `pascal`" in text and "--report --baseline pascal" in text
    vanilla_row = [line for line in text.splitlines() if line.startswith("| vanilla |") and "s1:" in line][0]
    assert "baseline" not in vanilla_row.split(" | ")[-3] and "1/1: " in vanilla_row
    # the gap turns round: vanilla against pascal is minus pascal against vanilla
    assert float(vanilla_row.split(" | ")[5]) == -float(pascal_detail(standing).split(" | ")[5])
    assert Path(result["report"]).read_text() == standing
    with pytest.raises(ConfigError, match="baseline: 'nope' is not one of the study's recipes"):
        write_report(load_study(path), baseline="nope")

    # a change of how runs are tested re-tests their last checkpoints: nothing is trained again
    last = study.run_dir("pascal", 1) / "last.pt"
    trained_at = last.stat().st_mtime_ns
    spec = yaml.safe_load(path.read_text())
    spec["overrides"] = {"decoding.beam": 1}
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    rows = {(r["recipe"], r["seed"]): r for r in study_status(path)}
    assert rows[("pascal", 1)]["state"] == "stale" and "testing changed (decoding.beam)" in rows[("pascal", 1)]["note"]
    retest = run_study(path, report=False, only=["vanilla", "pascal"])
    assert set(retest["runs"].values()) == {"done"} and len(retest["runs"]) == 4
    assert last.stat().st_mtime_ns == trained_at
    assert json.loads((study.record_dir("pascal", 1) / "record.json").read_text())["test"]["decoding"]["beam"] == 1
    # and the re-test decoded as recorded: with the study's decoding, not the checkpoint's own
    assert json.loads((study.run_dir("pascal", 1) / "eval" / "test.json").read_text())["beam"] == 1

    # without any checkpoint, the records alone keep every finished run finished
    shutil.rmtree(study.work_dir)
    again = run_study(path, report=False)
    assert again["runs"] == {"broken/seed1": "failed", "broken/seed2": "failed"}

    # a changed recipe reruns its runs only, and the status says why first
    spec = yaml.safe_load(path.read_text())
    spec["recipes"][1]["overrides"] = {"model.dropout": 0.3}
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    rows = {(r["recipe"], r["seed"]): r for r in study_status(path)}
    assert rows[("pascal", 1)]["state"] == "stale" and "model.dropout" in rows[("pascal", 1)]["note"]
    assert rows[("vanilla", 1)]["state"] == "done"
    third = run_study(path, report=False, only=["vanilla", "pascal"])
    assert third["runs"] == {"pascal/seed1": "done", "pascal/seed2": "done"}

    # with a seed missing, a verdict says it is provisional (the rule asks for every seed pair)
    shutil.rmtree(study.record_dir("pascal", 2))
    partial = write_report(load_study(path)).read_text()
    # the first detail row (it lists BLEU per seed), not the summary table's row above it
    (pascal_row,) = [line for line in partial.splitlines() if line.startswith("| pascal |") and "s1:" in line][:1]
    assert "so far (1 of 2 seeds)" in pascal_row and "1/1:" in pascal_row
    # on a machine without the dataset (a fresh clone with the committed records) the references
    # come from the corpus files the config names; without those either, the scores stay and the
    # tests say what is missing instead of guessing (written elsewhere: the standing report keeps
    # its tests; see test_a_fresh_clone_without_data_regenerates_the_report_byte_for_byte)
    data_dir = Path(load_study(path).run_config("pascal", 1).data.dir)
    tgt = Path(load_study(path).run_config("pascal", 1).data.splits["test"].tgt)
    data_dir.rename(data_dir.with_name("moved_away"))
    try:
        (bare_row,) = [line for line in write_report(load_study(path)).read_text().splitlines()
                       if line.startswith("| pascal |") and "s1:" in line][:1]
        assert "1/1:" in bare_row and "not tested" not in bare_row
        tgt.rename(tgt.with_name("moved_away.tgt"))
        bare = write_report(load_study(path), out=tmp_path / "bare" / "report.md").read_text()
    finally:
        data_dir.with_name("moved_away").rename(data_dir)
        if tgt.with_name("moved_away.tgt").exists():
            tgt.with_name("moved_away.tgt").rename(tgt)
    (bare_row,) = [line for line in bare.splitlines() if line.startswith("| pascal |") and "s1:" in line][:1]
    assert f"not tested: no references on this machine (prepare `{data_dir}` first or put `{tgt}` there)" in bare_row
    assert "1/1:" not in bare_row and "s1: " in bare_row

    # the heads analysis scores the runs whose checkpoints are here and keeps the scores beside
    # their records; a run with neither is left out (vanilla's checkpoints were deleted above)
    sys.path.insert(0, str(ROOT / "studies"))
    import attention_heads

    assert attention_heads.main([str(path)]) == 0
    table = (study.records / "attention_heads.md").read_text()
    assert "| pascal seed 1 |" in table and "vanilla seed" not in table
    kept = json.loads((study.record_dir("pascal", 1) / "heads" / "test.json").read_text())
    assert len(kept["accuracy"]) == 1 and len(kept["accuracy"][0]) == 2 and kept["checkpoint_step"] == 20

    # re-decoding with other length penalties: the recipe's own α gives the record's BLEU again
    import length_penalty

    record = json.loads((study.record_dir("pascal", 1) / "record.json").read_text())
    alpha = record["test"]["decoding"]["length_penalty"]
    assert length_penalty.main([str(path), "--split", "test", "--alphas", str(alpha), "2.0"]) == 0
    kept = json.loads((study.record_dir("pascal", 1) / "length_penalty" / "test.json").read_text())
    assert set(kept) == {f"{alpha:g}", "2"} and kept["2"]["beam"] == record["test"]["decoding"]["beam"]
    assert kept[f"{alpha:g}"]["bleu"] == pytest.approx(record["scores"]["test"]["bleu"], abs=1e-9)
    assert kept[f"{alpha:g}"]["ratio"] == pytest.approx(record["scores"]["test"]["bleu_parts"]["ratio"])

    # the output-length analysis: per recipe, BLEU and length ratio as the records have them, and
    # BLEU without the brevity penalty is BLEU over BP
    import output_length

    # deviations (-1.5, -0.5, 0.5, 1.5) and (-3, -1, 0, 4): r = 11 / sqrt(5 * 26)
    assert output_length.pearson([1, 2, 3, 4], [2, 4, 5, 9]) == pytest.approx(11 / 130 ** 0.5)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert output_length.main([str(path)]) == 0
    (row,) = [line for line in out.getvalue().splitlines() if line.startswith("| vanilla |")]
    cells = row.split(" | ")
    records = [json.loads((study.record_dir("vanilla", s) / "record.json").read_text())["scores"]["test"]
               for s in (1, 2)]
    assert float(cells[2]) == pytest.approx(statistics.mean(r["bleu"] for r in records), abs=0.006)
    assert float(cells[3]) == pytest.approx(statistics.mean(r["bleu_parts"]["ratio"] for r in records), abs=6e-4)
    # BLEU without BP: each run's BLEU over its BP, then the mean
    assert float(cells[5]) == pytest.approx(statistics.mean(r["bleu"] / r["bleu_parts"]["bp"] for r in records),
                                            abs=0.006)
    assert "Pearson's r between length ratio and BLEU" in out.getvalue()
    # the table against the baseline: pascal's gap in BLEU is its mean minus vanilla's
    (gaps,) = [line for line in out.getvalue().splitlines() if line.startswith("| pascal |") and line.count("|") == 6]
    pascal = [json.loads((study.record_dir("pascal", 1) / "record.json").read_text())["scores"]["test"]["bleu"]]
    assert not (study.record_dir("pascal", 2) / "record.json").exists()  # removed above
    gap = statistics.mean(pascal) - statistics.mean(r["bleu"] for r in records)
    assert float(gaps.split(" | ")[2]) == pytest.approx(gap, abs=0.006)

    # two records of one run: a copy of vanilla's seed 1 is the same run (every line the same, no
    # gap); its seeds 1 and 2 as the yardstick, each with its own recorded BLEU (`structnmt study
    # compare`; `structnmt study FILE --report` and the rest still take the study file first)
    from structnmt.cli.main import main

    shutil.copytree(study.record_dir("vanilla", 1), tmp_path / "copy")
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(["study", "compare", str(path), "vanilla", "1", str(tmp_path / "copy"), "--seed-of", "1", "2"]) == 0
        assert main(["study", str(path), "--report", "--out", str(tmp_path / "again.md")]) == 0
    same, seeds = [line for line in out.getvalue().splitlines() if line.startswith("test:")]
    assert "B − A +0.00," in same and "identical lines 24 of 24 (100%)" in same
    assert f"A {records[0]['bleu']:.2f}, B {records[1]['bleu']:.2f}," in seeds


#: more updates than any machine trains in a test's time: an interrupted run is still training
LONG_RUN = 1_000_000


def _step(run_dir: Path) -> int:
    log = run_dir / "log.jsonl"
    if not log.is_file():
        return 0
    steps = [json.loads(line).get("step", 0) for line in log.read_text().splitlines() if line.strip()]
    return max([s for s in steps if isinstance(s, int)], default=0)


def _hang_report(study: subprocess.Popen, run_dir: Path) -> tuple[str, list[int]]:
    """Where a study and its run stand when they did not stop: the study and every process under
    it, with state, kernel wait, signal masks and, where py-spy is installed, Python stacks; the
    study's stderr so far and the run's last log lines. Also the pids, for the caller to kill."""
    table: list[str] = []
    with contextlib.suppress(OSError):
        table = subprocess.run(["ps", "-eo", "pid,ppid,sid,stat,wchan:24,etime,time,args"], capture_output=True,
                               text=True).stdout.splitlines()
    parent = {int(row.split()[0]): int(row.split()[1]) for row in table[1:]}
    pids = [study.pid]
    while more := [pid for pid, up in parent.items() if up in pids and pid not in pids]:
        pids += more
    lines = table[:1] + [row for row in table[1:] if int(row.split()[0]) in pids]
    for pid in pids:
        with contextlib.suppress(OSError):
            status = Path(f"/proc/{pid}/status").read_text().splitlines()
            lines += [f"{pid}: " + " ".join(x for x in status if x.split(":")[0] in ("State", "Threads", "SigBlk",
                                                                                   "SigIgn", "SigCgt"))]
        if shutil.which("py-spy"):
            with contextlib.suppress(OSError, subprocess.SubprocessError):
                dump = subprocess.run(["py-spy", "dump", "--pid", str(pid)], capture_output=True, text=True, timeout=30)
                lines.append(dump.stdout + dump.stderr)  # py-spy says why where it may not attach
    with contextlib.suppress(OSError, TypeError):  # the study's stderr so far, without waiting for more
        os.set_blocking(study.stderr.fileno(), False)
        lines += ["-- the study's stderr", (study.stderr.read() or b"").decode(errors="replace")[-2000:]]
    for name in ("worker.log", "log.jsonl"):
        with contextlib.suppress(OSError):
            lines += [f"-- {name}", *(run_dir / name).read_text().splitlines()[-8:]]
    return "\n".join(lines), pids


@pytest.mark.slow
@pytest.mark.parametrize("how", ["ctrl_c", "kill"])
def test_ctrl_c_stops_a_niced_study_and_its_run(recipes, tmp_path, how):
    # a niced run has a session of its own (test_a_niced_run_is_niced_against_other_sessions_too),
    # so the terminal's Ctrl-C reaches the study only: the study must pass it on, or wait for ever.
    # A study started in the background by a script ignores SIGINT: `kill` (SIGTERM) stops it alike
    # The run is far longer than the test (a million updates): on a busy machine the test may
    # see its 20th update late, and a run short enough to finish first would make the study exit 0
    # whatever it does with the signal. The signal goes only to a study whose run is training.
    study_file = _study_file(tmp_path, {"vanilla": recipes["vanilla"]}, name=how, seeds=(1,), max_steps=LONG_RUN,
                             executor={"kind": "local", "jobs": 1, "threads": 1, "nice": 5})
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    # the study starts as a terminal's foreground command does, with SIGINT at its default. Tests
    # started in the background by a non-interactive shell (`pytest … &`) ignore SIGINT, and an
    # ignored signal stays ignored across exec: the study would then rightly not hear Ctrl-C (the
    # case `kill` is for), and this test hung. A handled signal is reset to the default across
    # exec, so it is handled here while the study starts
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        process = subprocess.Popen([sys.executable, "-m", "structnmt.cli.main", "study", str(study_file)], env=env,
                                   stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
    finally:
        signal.signal(signal.SIGINT, before)
    run_dir = load_study(study_file).run_dir("vanilla", 1)
    deadline = time.time() + 300
    while _step(run_dir) < 20 and time.time() < deadline and process.poll() is None:
        time.sleep(0.05)
    assert process.poll() is None, process.stderr.read().decode()[-2000:]
    assert _step(run_dir) >= 20, "the run did not log its 20th update within 300 s"
    if how == "ctrl_c":
        os.killpg(process.pid, signal.SIGINT)  # what a terminal sends its foreground process group
    else:
        process.terminate()  # the study alone
    try:
        try:
            code = process.wait(timeout=120)
        except subprocess.TimeoutExpired:
            report, pids = _hang_report(process, run_dir)
            (tmp_path.parent / f"hang_{how}.txt").write_text(report)  # kept with pytest's last folders
            for pid in pids:  # no orphan run trains on beside the rest of the suite
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)
            pytest.fail(f"the study did not stop within 120 s of the signal:\n{report}")
        assert code == (130 if how == "ctrl_c" else 143), process.stderr.read().decode()[-2000:]
    finally:
        process.kill()
    from structnmt.locks import holder

    assert holder(run_dir) is None  # the run has stopped too: no orphan training on
    (row,) = study_status(study_file)
    assert row["state"] == "interrupted" and 20 <= row["step"] < LONG_RUN


@pytest.mark.slow
def test_a_killed_study_resumes_its_run_to_the_same_result(recipes, tmp_path):
    only_vanilla = {"vanilla": recipes["vanilla"]}
    killed = _study_file(tmp_path, only_vanilla, name="killed", seeds=(1,), max_steps=150)
    whole = _study_file(tmp_path, only_vanilla, name="whole", seeds=(1,), max_steps=150)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    process = subprocess.Popen([sys.executable, "-m", "structnmt.cli.main", "study", str(killed)], env=env,
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    study = load_study(killed)
    run_dir = study.run_dir("vanilla", 1)
    deadline = time.time() + 300
    while _step(run_dir) < 30 and time.time() < deadline and process.poll() is None:
        time.sleep(0.05)
    assert process.poll() is None, process.stderr.read().decode()[-2000:]
    (row,) = study_status(killed)
    assert row["state"] == "running" and "min of training left" in row["note"]  # from the log's clock
    process.send_signal(signal.SIGKILL)
    process.wait()
    # the run process is told by the kernel, saves a checkpoint and stops
    while (run_dir.parent / f".{run_dir.name}.lock").exists() and time.time() < deadline:
        from structnmt.locks import holder

        if holder(run_dir) is None:
            break
        time.sleep(0.1)
    rows = study_status(killed)
    assert rows[0]["state"] == "interrupted" and 0 < rows[0]["step"] < 150

    assert run_study(killed, report=False)["runs"] == {"vanilla/seed1": "done"}
    assert run_study(whole, report=False)["runs"] == {"vanilla/seed1": "done"}
    a, b = load_study(killed), load_study(whole)
    assert (a.record_dir("vanilla", 1) / "hyps" / "test.hyp").read_text() == \
        (b.record_dir("vanilla", 1) / "hyps" / "test.hyp").read_text()
    ra = json.loads((a.record_dir("vanilla", 1) / "record.json").read_text())
    rb = json.loads((b.record_dir("vanilla", 1) / "record.json").read_text())
    assert ra["scores"]["test"]["bleu"] == rb["scores"]["test"]["bleu"] and ra["updates"] == 150
    # the resumed run's log holds each step once
    steps = [json.loads(line)["step"] for line in (a.record_dir("vanilla", 1) / "log.jsonl").read_text().splitlines()
             if json.loads(line)["kind"] == "train"]
    assert len(steps) == len(set(steps))
    # the record keeps each call that trained it (before: only the log showed the resume), and
    # the report lists them
    calls = ra["calls"]
    assert [c["threads"] for c in calls] == [1, 1] and calls[0]["from_step"] == 0 and 0 < calls[1]["from_step"] < 150
    assert [c["from_step"] for c in rb["calls"]] == [0]
    text = write_report(a).read_text()
    assert "| vanilla | 1 | 150 |" in text and f"| 1, 1 | {calls[1]['from_step']} |" in text


@pytest.mark.slow
def test_the_submitit_path_runs_a_study_with_its_local_executor(recipes, tmp_path):
    pytest.importorskip("submitit")
    path = _study_file(tmp_path, {"vanilla": recipes["vanilla"]}, name="sub", seeds=(1,), max_steps=10)
    result = run_study(path, executor="submitit-local", report=False)
    assert result["runs"] == {"vanilla/seed1": "done"}
    study = load_study(path)
    assert json.loads((study.record_dir("vanilla", 1) / "record.json").read_text())["updates"] == 10
    assert any((study.work_dir / "submitit").rglob("*_result.pkl"))


@pytest.mark.parametrize("name, budget", [("multi30k_en_de", 1200), ("multi30k_en_fr", 1200),
                                          ("syncattn_lambda", 1200), ("multi30k_en_de_converged", 3200),
                                          ("multi30k_en_fr_converged", 3200)])
def test_the_committed_study_files_are_valid(name, budget, monkeypatch):
    monkeypatch.chdir(ROOT)  # recipes are named from the project's root
    study = load_study(Path("studies") / f"{name}.yaml")
    assert study.max_steps == budget and study.runs()[0][0] == study.baseline
    for recipe in study.recipes:  # every run trains exactly the budget, no wall-clock stop
        cfg = study.run_config(recipe.name, study.seeds[0])
        assert (cfg.training.max_steps, cfg.training.max_minutes) == (budget, 0)


@pytest.mark.slow
def test_a_study_can_test_every_run_on_the_checkpoint_its_validation_picks(recipes, tmp_path):
    from structnmt.evaluation.run_eval import evaluate_run

    path = _study_file(tmp_path, {"vanilla": recipes["vanilla"]}, seeds=(1,), max_steps=30, test_checkpoint="best",
                       overrides={"training.lr": 3e-2})  # a rate that overshoots: the best is not the last
    study = load_study(path)
    cfg = study.run_config("vanilla", 1)
    assert study.test_view(cfg)["checkpoint"] == {"rule": "best", "valid_every": 10, "valid_beam": 1, "metric": "bleu"}
    # the default adds nothing to the test view, so records made before the rule existed stand
    assert "checkpoint" not in load_study(_study_file(tmp_path, recipes, name="plain")).test_view(cfg)
    assert run_study(path)["runs"] == {"vanilla/seed1": "done"}
    record = json.loads((study.record_dir("vanilla", 1) / "record.json").read_text())
    assert record["checkpoint"] == "best.pt" and record["test"]["checkpoint"]["rule"] == "best"
    run_dir = study.run_dir("vanilla", 1)
    best = evaluate_run(run_dir, checkpoint=str(run_dir / "best.pt"), splits=["test"], quiet=True,
                        decoding=cfg.decoding)["test"]["bleu"]
    assert record["scores"]["test"]["bleu"] == best
    assert "best validation score" in Path(write_report(study)).read_text()


def test_threads_per_run_never_oversubscribe_the_cores(monkeypatch):
    from structnmt.study import executors

    monkeypatch.setattr(executors, "_cores", lambda: 2)
    assert executors.threads_per_run(0, 1) == 2  # default: the cores divided by the runs
    assert executors.threads_per_run(0, 2) == 1
    assert executors.threads_per_run(2, 1) == 2  # the study file's count when it fits
    assert executors.threads_per_run(2, 2) == 1  # --jobs 2 on a file written for one run at a time
    assert executors.threads_per_run(1, 2) == 1
    assert executors.threads_per_run(0, 4) == 1


def test_a_run_trains_with_the_threads_its_executor_chose_after_loading(recipes, tmp_path):
    # the local executor passes each worker its share of the cores; the study file's own count
    # (here 2) was already in the configs cached while the file was checked
    study = load_study(_study_file(tmp_path, recipes, executor={"kind": "local", "jobs": 1, "threads": 2}))
    assert study.run_config("pascal", 1).training.threads == 2
    study.executor.threads = 1
    assert study.run_config("pascal", 1).training.threads == 1
    assert study.run_config("vanilla", 2).training.threads == 1


def test_every_run_trains_on_the_executors_device_which_is_not_part_of_its_digest(recipes, tmp_path):
    from structnmt.study.spec import config_digest, train_view

    plain = load_study(_study_file(tmp_path, recipes, name="plain"))
    assert {plain.run_config(r, s).training.device for r, s in plain.runs()} == {"auto"}  # the recipes' own
    for device in ("cuda", "cuda:1", "cpu", "auto"):
        study = load_study(_study_file(tmp_path, recipes, name="gpu", executor={
            "kind": "local", "jobs": 4, "threads": 1, "nice": 0, "device": device}))
        for recipe, seed in study.runs():
            cfg = study.run_config(recipe, seed)
            assert cfg.training.device == device and cfg.training.threads == 1
            # where a run trains is not what it is: a seed recorded on the CPU stays current when the
            # study goes on on a GPU, and the other way round
            assert train_view(cfg)["training"]["device"] == "auto"
            assert config_digest(cfg) == config_digest(plain.run_config(recipe, seed))


def test_runs_packed_on_a_gpu_host_keep_their_data_workers_within_their_share_of_the_cores(recipes, tmp_path,
                                                                                          monkeypatch):
    # num_workers auto would give every run two workers on a GPU host: eight runs at once would
    # then start 24 processes on 16 cores; the executor's share (training.threads) bounds them
    import torch

    from structnmt.training.environment import data_workers

    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(16)), raising=False)
    for device in ("cuda", "auto"):  # whatever the executor's device is spelt, the share is the run's threads
        for threads, workers in ((1, 0), (2, 1), (4, 2)):
            study = load_study(_study_file(tmp_path, recipes, name=f"w{device}{threads}", executor={
                "kind": "local", "jobs": 2, "threads": threads, "device": device}))
            t = study.run_config("pascal", 1).training
            assert t.num_workers == "auto" and t.threads == threads
            assert data_workers(t.num_workers, torch.device("cuda"), 1, t.threads)[0] == workers
    assert data_workers("auto", torch.device("cuda"), 1, 0)[0] == 2  # a run of its own: the host's cores


def test_cuda_asked_for_without_a_gpu_is_refused_before_any_run(recipes, tmp_path, monkeypatch):
    import torch

    import structnmt.study as study_module
    from structnmt.study.executors import run_local

    def no_preparing(*_args):
        raise AssertionError("a dataset was prepared for a study that cannot run")

    monkeypatch.setattr(study_module, "prepare_datasets", no_preparing)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    path = _study_file(tmp_path, recipes, executor={"kind": "local", "jobs": 2, "threads": 1, "device": "cuda"})
    with pytest.raises(ConfigError) as err:
        run_study(path)
    assert str(err.value) == (f"{path}: executor.device: cuda asked for, but this machine has no CUDA GPU "
                              f"(torch {torch.__version__}); use auto or cpu to run on the CPU")
    study = load_study(path)
    assert not study.work_dir.exists() and not study.records.exists()
    with pytest.raises(ConfigError, match="executor.device: cuda asked for"):  # the executor's own guard
        run_local(study, study.runs(), 2, lambda *_: None)
    assert not study.work_dir.exists()
    # asked for on the command line: the argument is named, not the study file
    cpu = _study_file(tmp_path, recipes, name="on_cpu", executor={"kind": "local", "device": "cpu"})
    with pytest.raises(ConfigError) as err:
        run_study(cpu, device="cuda")
    assert str(err.value).startswith("--device: cuda asked for, but this machine has no CUDA GPU")
    # a GPU that is not there, on a machine with one
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    path = _study_file(tmp_path, recipes, name="second", executor={"kind": "local", "device": "cuda:1"})
    with pytest.raises(ConfigError, match=r"executor\.device: cuda:1 asked for, but this machine has 1 CUDA GPU"):
        run_study(path)
    # auto runs on the CPU where there is no GPU, as before: nothing to refuse
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    from structnmt.study.executors import check_device

    auto = load_study(_study_file(tmp_path, recipes, name="auto", executor={"kind": "local", "device": "auto"}))
    check_device(auto, auto.runs())


def test_ctrl_c_between_two_runs_starts_no_other(recipes, tmp_path, monkeypatch):
    # Ctrl-C may come while a worker is between two runs: a run it started after the study told
    # its runs to stop would never hear of it, and the study would wait for it to train to its end
    import threading

    from structnmt.study import executors

    study = load_study(_study_file(tmp_path, {"vanilla": recipes["vanilla"]}, seeds=(1, 2),
                                   executor={"kind": "local", "jobs": 1, "threads": 1}))
    started = []

    class Run:  # seed 1 finishes at once; seed 2 trains until it is stopped (or 30 s, then it says done)
        def __init__(self, command, **_kwargs):
            self.seed, self.stopped = int(command[-2]), threading.Event()
            started.append(self)

        def wait(self):
            return 0 if self.seed == 1 or not self.stopped.wait(30) else 75

        def terminate(self):
            self.stopped.set()

    heard = threading.Event()

    def ctrl_c(_signum, _frame):
        heard.set()
        raise KeyboardInterrupt

    def report(_recipe, seed, status):
        if seed == 2 and status == "running":  # the worker, about to start seed 2
            os.kill(os.getpid(), signal.SIGINT)
            assert heard.wait(30)
            time.sleep(0.3)  # the study stops what runs meanwhile (nothing: seed 1 is done)

    from types import SimpleNamespace

    monkeypatch.setattr(executors, "subprocess", SimpleNamespace(Popen=Run, STDOUT=subprocess.STDOUT))
    before = signal.signal(signal.SIGINT, ctrl_c)
    try:
        with pytest.raises(KeyboardInterrupt):
            executors.run_local(study, study.runs(), 1, report)
    finally:
        signal.signal(signal.SIGINT, before)
    assert [run.seed for run in started if not run.stopped.is_set()] == [1]  # seed 2 never ran, or was stopped


def test_a_second_ctrl_c_waits_until_the_runs_are_told_to_stop(recipes, tmp_path, monkeypatch):
    # a second Ctrl-C while the study tells its runs to stop is held, not lost: it is raised once
    # every run is told (raised in the middle, it would leave runs untold, and the study waiting)
    import threading
    from types import SimpleNamespace

    from structnmt.study import executors

    study = load_study(_study_file(tmp_path, {"vanilla": recipes["vanilla"]}, seeds=(1, 2),
                                   executor={"kind": "local", "jobs": 2, "threads": 1}))
    started = []
    heard = []

    class Run:  # trains until it is stopped (or 30 s, then it says done)
        def __init__(self, command, **_kwargs):
            self.stopped = threading.Event()
            started.append(self)
            if len(started) == 2:  # both runs going: the first Ctrl-C
                os.kill(os.getpid(), signal.SIGINT)

        def wait(self):
            return 75 if self.stopped.wait(30) else 0

        def terminate(self):
            self.stopped.set()
            if len(heard) == 1:  # the second Ctrl-C, while the study tells its runs
                os.kill(os.getpid(), signal.SIGINT)
                time.sleep(0.2)

    def ctrl_c(signum, _frame):
        heard.append(signum)
        raise KeyboardInterrupt

    monkeypatch.setattr(executors, "subprocess", SimpleNamespace(Popen=Run, STDOUT=subprocess.STDOUT))
    before = signal.signal(signal.SIGINT, ctrl_c)
    try:
        with pytest.raises(KeyboardInterrupt):
            executors.run_local(study, study.runs(), 2, lambda *_: None)
        assert signal.getsignal(signal.SIGINT) is ctrl_c  # the study's own handlers put back
    finally:
        signal.signal(signal.SIGINT, before)
    assert len(started) == 2 and all(run.stopped.is_set() for run in started)  # both told
    assert heard == [signal.SIGINT, signal.SIGINT]  # the second Ctrl-C was raised, not lost


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, check=True).stdout


def _git_repo(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    _git(path, "init", "-q")
    for key, value in (("user.name", "study test"), ("user.email", "study@example.org"), ("commit.gpgsign", "false")):
        _git(path, "config", key, value)
    return path


def test_a_record_is_committed_alone_and_git_failures_are_one_warning(recipes, tmp_path, monkeypatch):
    from structnmt.study.executors import commit_record

    repo = _git_repo(tmp_path / "repo")
    study = load_study(_study_file(repo, recipes, seeds=(1,)))
    folder = study.record_dir("vanilla", 1)
    (folder / "hyps").mkdir(parents=True)
    (folder / "hyps" / "test.hyp").write_text("a b c\n")
    (folder / "record.json").write_text(json.dumps({"device": "cuda:0", "gpu": "NVIDIA H100 80GB HBM3",
                                                    "scores": {"test": {"bleu": 12.345}}}))
    (repo / "elsewhere.txt").write_text("someone's work in progress\n")
    _git(repo, "add", "elsewhere.txt")  # staged by someone else: not the study's to commit
    said = commit_record(study, "vanilla", 1)
    assert said == f"committed to git as {_git(repo, 'rev-parse', '--short', 'HEAD').strip()}"
    assert _git(repo, "log", "--format=%s").splitlines() == [
        "tiny: vanilla seed 1 recorded (cuda:0 NVIDIA H100 80GB HBM3, BLEU 12.35 test)"]
    assert sorted(_git(repo, "show", "--name-only", "--format=", "HEAD").split()) == [
        "tiny/records/vanilla/seed1/hyps/test.hyp", "tiny/records/vanilla/seed1/record.json"]
    assert _git(repo, "diff", "--cached", "--name-only").split() == ["elsewhere.txt"]  # still staged, uncommitted
    # nothing new: a warning, not an error
    said = commit_record(study, "vanilla", 1)
    assert said.startswith("warning: record not committed (git commit: nothing ") and "\n" not in said
    # records outside any repository
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path))
    (tmp_path / "plain").mkdir()
    outside = load_study(_study_file(tmp_path / "plain", recipes, seeds=(1,)))
    outside.record_dir("vanilla", 1).mkdir(parents=True)
    said = commit_record(outside, "vanilla", 1)
    assert said.startswith("warning: record not committed (git add: fatal: not a git repository") and "\n" not in said


@pytest.mark.slow
def test_a_study_commits_each_record_as_it_is_written(recipes, tmp_path, capsys):
    repo = _git_repo(tmp_path / "repo")
    path = _study_file(repo, {"vanilla": recipes["vanilla"]}, seeds=(1, 2), max_steps=5,
                       executor={"kind": "local", "jobs": 1, "threads": 1, "nice": 0, "commit": True})
    assert run_study(path, report=False)["runs"] == {"vanilla/seed1": "done", "vanilla/seed2": "done"}
    study = load_study(path)
    subjects = _git(repo, "log", "--reverse", "--format=%s").splitlines()
    for seed, subject in zip((1, 2), subjects, strict=True):  # one commit a run, in the order they finished
        record = json.loads((study.record_dir("vanilla", seed) / "record.json").read_text())
        assert record["device"] == "cpu" and "gpu" in record
        assert subject == f"tiny: vanilla seed {seed} recorded (cpu, BLEU {record['scores']['test']['bleu']:.2f} test)"
    committed = _git(repo, "ls-files").split()  # the record folders only: no study file, no checkpoints
    assert committed and all(f.startswith("tiny/records/vanilla/seed") for f in committed)
    assert "tiny/records/vanilla/seed2/record.json" in committed
    assert capsys.readouterr().err.count(": committed to git as ") == 2


def test_the_summary_table_marks_verdicts_and_gaps_to_the_baseline():
    from structnmt.study.report import summary_legend, summary_lines

    def row(bleu: dict[int, float], verdict: str | None = None) -> dict:
        return {"bleu": bleu, "chrf": {}, "signature": {}, **({"verdict": {"verdict": verdict}} if verdict else {})}

    table = {
        "t1": {"base": row({1: 30.0, 2: 31.0}), "good": row({1: 32.0, 2: 33.0}, "better"),
               "bad": row({1: 28.0, 2: 29.5}, "worse"), "half": row({1: 31.5}, "better so far (1 of 2 seeds)")},
        "t2": {"base": row({1: 20.0, 2: 20.0}), "good": row({1: 20.5, 2: 20.1}, "no significant difference")},
    }
    lines = summary_lines("base", table)
    assert lines[0] == "| recipe | seeds | t1 | t2 |"
    rows = {line.split(" | ")[0][2:]: line for line in lines[2:]}
    assert rows["base"] == "| base | 2 | 30.50 | 20.00 |"
    assert rows["good"] == "| good | 2 | 32.50 (+2.00) ▲ | 20.30 (+0.30) |"
    assert rows["bad"] == "| bad | 2 | 28.75 (-1.75) ▼ |  |"  # a recipe missing from a test set: empty cell
    assert rows["half"] == "| half | 1 | 31.50 (+1.00) ▲* |  |"
    assert summary_lines("base", {}) == []
    # the key explains * where a provisional better/worse is shown, and only there
    assert "*: so far" in summary_legend("base", table)
    table["t1"]["half"]["verdict"]["verdict"] = "no significant difference so far (1 of 2 seeds)"  # no mark
    assert "*: so far" not in summary_legend("base", table) and "▲ better" in summary_legend("base", table)


def test_a_provisional_verdict_counts_each_sides_seeds():
    from structnmt.study.report import _seeds_so_far

    assert _seeds_so_far((1, 2), (2, 2)) == "1 of 2 seeds"
    assert _seeds_so_far((2, 2), (2, 3)) == "2 of 2 seeds, baseline 2 of 3"


# -- audit mends (issue 26) ---------------------------------------------------------------------


def _record_file(study, recipe: str, seed: int) -> Path:
    path = study.record_dir(recipe, seed) / "record.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    return path


def test_a_damaged_record_is_named_with_what_to_do_never_run_over(recipes, tmp_path):
    # before: a truncated record read as "pending" (and was trained over), a list raised a traceback
    path = _study_file(tmp_path, recipes, name="damaged", seeds=(1,))
    study = load_study(path)
    _record_file(study, "vanilla", 1).write_text('{"recipe": "vanilla", "scores": {"te')
    _record_file(study, "pascal", 1).write_text('["not", "an", "object"]')
    rows = {r["recipe"]: r for r in study_status(path)}
    assert rows["vanilla"]["state"] == rows["pascal"]["state"] == "damaged"
    assert "not valid JSON" in rows["vanilla"]["note"] and "a list, not an object" in rows["pascal"]["note"]
    for row in rows.values():
        assert "is damaged" in row["note"] and "restore it" in row["note"] and "delete" in row["note"]
    assert "2 damaged" in format_status(list(rows.values()))
    text = write_report(load_study(path)).read_text()
    assert "## Damaged records" in text and "**pascal seed 1**" in text and "2 damaged" in text
    # a study call leaves them alone: nothing is trained over a record someone can restore
    assert run_study(path, report=False)["runs"] == {"vanilla/seed1": "damaged", "pascal/seed1": "damaged"}
    assert _record_file(study, "pascal", 1).read_text() == '["not", "an", "object"]'


def test_p_values_print_on_their_side_of_the_threshold(recipes, tmp_path):
    # before: 0.04994 printed as 0.050; then 50/1001 = 0.04995 (a real p of the converged study,
    # 1,000 resamples) printed as 0.0500, both on the wrong side of the 0.05 they are read against
    from structnmt.study.report import render

    study = load_study(_study_file(tmp_path, recipes, name="pvals"))
    table = {"test": {"vanilla": {"bleu": {1: 30.0, 2: 31.0}, "chrf": {1: 50.0, 2: 51.0}, "signature": {}},
                      "pascal": {"bleu": {1: 31.0, 2: 32.0}, "chrf": {1: 51.0, 2: 52.0}, "signature": {},
                                 "verdict": {"verdict": "no significant difference", "pooled_p": 50 / 1001,
                                             "p": {"1/1": 0.04994, "2/2": 0.001, "1/2": 0.05}, "aso": (0.25, 1.0)}}}}
    data = {"records": {}, "missing": [], "failed": [], "stale": []}
    text = render(study, data, table, None, tmp_path / "report.md")
    (row,) = [line for line in text.splitlines() if line.startswith("| pascal |") and "s1:" in line]
    assert "1/1: 0.0499, 2/2: 0.0010, 1/2: 0.0500" in row and "| 0.04995 |" in row and "| 0.25 / 1.00 |" in row
    assert "Almost Stochastic Order" in text and "It asks whether" in text


def test_format_p_keeps_a_p_value_on_its_side_of_alpha():
    from structnmt.evaluation.significance import format_p

    assert format_p(0.0123) == "0.0123" and format_p(0.05) == "0.0500" and format_p(0.2) == "0.2000"
    assert format_p(50 / 1001) == "0.04995"            # 1,000 resamples
    assert format_p(500 / 10001) == "0.049995"         # 10,000
    assert format_p(0.0500004) == "0.0500"             # above alpha: four decimals say so already
    assert format_p(0.0096, alpha=0.01) == "0.0096" and format_p(0.009996, alpha=0.01) == "0.009996"


def test_status_time_left_honours_jobs_and_runs_in_progress(monkeypatch):
    # before: every run not done counted a whole median, running ones too, one at a time
    def row(state: str, **more) -> dict:
        return {"recipe": "r", "seed": 1, "state": state, "step": None, "bleu": None, "note": "", **more}

    rows = [row("done", seconds=600), row("done", seconds=1800), row("done", seconds=3600),
            row("running", seconds_left=600), row("pending"), row("pending"),
            row("interrupted", share_left=0.5), row("damaged")]
    one = format_status(rows).splitlines()[-1]
    # 600 + 1800 + 1800 + 900 = 5100 s of runs; the damaged record is not a run to do
    assert one.startswith("4 runs not done (1 running, 1 with its time left from its log)")
    assert "about 1.4 h of runs at that pace" in one
    two = format_status(rows, jobs=2).splitlines()[-1]
    # places: [600 | 1800] -> [2400 | 1800] -> [2400 | 2700]: 0.75 h of wall time
    assert "about 1.4 h of runs, 0.8 h with 2 at a time" in two
    # without --jobs, the study file's executor.jobs (each row carries it)
    assert format_status([{**r, "jobs": 2} for r in rows]).splitlines()[-1] == two
    # and the command line's --status passes its --jobs on
    from structnmt import api
    from structnmt.cli.main import main

    monkeypatch.setattr(api, "study_status", lambda _path, seeds=None: rows)
    with contextlib.redirect_stdout(io.StringIO()) as out:
        assert main(["study", "any.yaml", "--status", "--jobs", "2"]) == 0
    assert out.getvalue().splitlines()[-1] == two


def test_a_record_stands_when_only_fields_added_since_at_their_defaults_differ():
    # a new config field, off by default, must not make every committed record stale
    from structnmt.study.spec import added_at_default, field_default

    assert field_default("data.clean.max_len") == 250 and field_default("model.d_model") == 256
    old = {"data": {"clean": {"max_len": 80}}, "model": {"d_model": 256}}
    assert added_at_default(old, {"data": {"clean": {"max_len": 80, "drop_bad_lines": False}},
                                  "model": {"d_model": 256}})
    assert not added_at_default(old, {"data": {"clean": {"max_len": 80, "drop_bad_lines": True}},
                                      "model": {"d_model": 256}})
    assert not added_at_default(old, {"data": {"clean": {"max_len": 81}}, "model": {"d_model": 256}})
    assert not added_at_default(old, old)


def test_aso_compares_trainings_both_ways():
    from structnmt.evaluation.significance import aso_seeds

    assert aso_seeds([33.0], [32.0, 32.5]) is None  # one seed is no distribution
    better, worse = aso_seeds([34.0, 34.5, 34.2], [32.0, 32.4])
    assert better == 0.0 and worse > 0.95
    assert aso_seeds([34.0, 34.5, 34.2], [32.0, 32.4]) == (better, worse)  # seeded: repeatable


def test_aso_with_the_array_quantile_function_gives_deepsigs_own_epsilon_bit_for_bit():
    # deepsig's quantile function is replaced by an array version (a study report: minutes to
    # seconds); every ε must stay what deepsig computes with its own, or committed reports change
    import sys

    import numpy as np
    from deepsig import aso

    from structnmt.evaluation.significance import _fast_deepsig_quantiles, _quantile_function

    p = np.array([0.0, 1e-9, 0.2, 1 / 3, 0.5, 0.6, 2 / 3, 0.999, 1.0])
    for scores in ([34.0, 34.5, 34.2], [30.1, 29.8, 30.5, 30.4, 29.9]):
        sorted_scores = sorted(scores)
        expected = [sorted_scores[min(max(int(np.ceil(len(scores) * q)) - 1, 0), len(scores) - 1)] for q in p]
        assert list(_quantile_function(scores)(p)) == expected
    pairs = [([34.0, 34.5, 34.2], [32.0, 32.4, 34.3]), ([30.1, 29.8, 30.5, 30.4, 29.9], [30.0, 30.2, 29.7, 30.3]),
             ([26.3, 26.1], [26.4, 25.9, 26.2])]
    for a, b in pairs:
        own = aso(a, b, num_bootstrap_iterations=60, num_jobs=1, show_progress=False, seed=12345)
        with _fast_deepsig_quantiles():
            fast = aso(a, b, num_bootstrap_iterations=60, num_jobs=1, show_progress=False, seed=12345)
        assert 0.0 < own < 1.0 and fast == own  # measured: 0.0096, 0.708, 0.866
    assert sys.modules["deepsig.aso"].get_quantile_function is not _quantile_function  # put back


def test_aso_is_kept_on_disk_by_its_exact_inputs(monkeypatch, tmp_path):
    # a report made again after one new record computes only that record's rows anew (50 bootstrap
    # iterations, not 1,000: the test is of the cache, not of epsilon; 1,000 took a minute on a slow CPU)
    import json

    from structnmt.evaluation import significance

    N = 50
    monkeypatch.setenv("STRUCTNMT_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(significance, "_ASO_DISK", None)
    significance._aso.cache_clear()
    both = significance.aso_seeds([34.0, 34.5], [33.9, 34.4, 34.1], n_bootstrap=N)
    kept = json.loads((tmp_path / "aso.json").read_text())
    assert sorted(kept.values()) == sorted(both) and len(kept) == 2
    # read back in another process (here: after the in-memory caches are gone), not computed
    (tmp_path / "aso.json").write_text(json.dumps({k: 0.123 for k in kept}))
    monkeypatch.setattr(significance, "_ASO_DISK", None)
    significance._aso.cache_clear()
    assert significance.aso_seeds([34.0, 34.5], [33.9, 34.4, 34.1], n_bootstrap=N) == (0.123, 0.123)
    # other inputs (another seed of the test) are computed, and join the file
    assert significance.aso_seeds([34.0, 34.5], [33.9, 34.4, 34.1], seed=7, n_bootstrap=N) != (0.123, 0.123)
    assert len(json.loads((tmp_path / "aso.json").read_text())) == 4
    # a damaged file is only a lost speed-up
    (tmp_path / "aso.json").write_text("{not json")
    monkeypatch.setattr(significance, "_ASO_DISK", None)
    significance._aso.cache_clear()
    assert significance.aso_seeds([34.0, 34.5], [33.9, 34.4, 34.1], n_bootstrap=N) == both
    significance._aso.cache_clear()


@pytest.mark.slow
def test_a_fresh_clone_without_data_regenerates_the_report_byte_for_byte(tmp_path):
    # before: without the prepared dataset every verdict became "not tested" and --report wrote that
    from structnmt.study.report import ReportError

    recipes = _write_recipes(tmp_path)
    path = _study_file(tmp_path, recipes, name="clone", records=str(tmp_path / "studies" / "clone"),
                       long_dependency=3)  # a subset of the short synthetic sentences, for the trees below
    assert set(run_study(path)["runs"].values()) == {"done"}
    study = load_study(path)
    report = study.records / "report.md"
    written = {name: (study.records / name).read_bytes() for name in ("report.md", "report.json")}
    assert "not tested" not in written["report.md"].decode()

    # records pin what a reader needs to redo the run
    record = json.loads((study.record_dir("pascal", 1) / "record.json").read_text())
    assert record["calls"] == [{**record["calls"][0], "from_step": 0, "threads": 1}]
    assert set(record["versions"]) >= {"python", "numpy", "spacy", "sentencepiece", "torch"}
    assert record["cpu_info"]["model"] and "isa" in record["cpu_info"] and record["git_commit"]
    assert set(record["corpora"]) >= {"train.src", "test.tgt"} and set(record["references"]) == {"test"}
    assert record["reads_trees"] and set(record["trees"]) >= {"src"}
    assert "| pascal | 1 | 20 |" in written["report.md"].decode()
    (runs_row,) = [line for line in written["report.md"].decode().splitlines() if line.startswith("| pascal | 1 |")]
    assert runs_row.split(" | ")[7:9] == ["1", "-"]  # one call, one thread, never resumed
    # machines of one model name differ in instruction set (and so in speed and precision)
    machine = f"{record['cpu']} ({record['cpu_info']['isa']}), cpu,"
    assert f"Where the runs trained: {machine}" in written["report.md"].decode()

    # a fresh clone: the records, no prepared dataset, the corpus files where the config names them
    data_dir = Path(study.run_config("pascal", 1).data.dir)
    data_dir.rename(data_dir.with_name("away"))
    try:
        write_report(load_study(path))
        assert {name: (study.records / name).read_bytes() for name in written} == written
        # records made before reference digests were kept: checked by rescoring, the same report
        for recipe, seed in study.runs():
            file = study.record_dir(recipe, seed) / "record.json"
            old = json.loads(file.read_text())
            del old["references"]
            file.write_text(json.dumps(old, indent=2, ensure_ascii=False) + "\n")
        write_report(load_study(path))
        assert (study.records / "report.md").read_bytes() == written["report.md"]
        # other references (one line changed) are not used: the verdict says why
        tgt = Path(study.run_config("pascal", 1).data.splits["test"].tgt)
        kept = tgt.read_bytes()
        lines = kept.decode().splitlines(keepends=True)
        tgt.write_text("".join(["changed\n"] + lines[1:]))
        elsewhere = write_report(load_study(path), out=tmp_path / "other" / "report.md").read_text()
        assert "not tested: the references at" in elsewhere and "are not the ones" in elsewhere
        # no references at all: the standing report, which has its tests, is not replaced
        tgt.unlink()
        with pytest.raises(ReportError, match="keeps significance tests this machine cannot redo"):
            write_report(load_study(path))
        assert report.read_bytes() == written["report.md"]
        tgt.write_bytes(kept)
    finally:
        data_dir.with_name("away").rename(data_dir)

    # trees: a record whose trees are not today's is named in --status
    file = study.record_dir("pascal", 2) / "record.json"
    old = json.loads(file.read_text())
    old["trees"]["src"] = "0" * 64
    file.write_text(json.dumps(old))
    # a record made before tree digests were kept: its long-dependency subset tells
    file = study.record_dir("pascal", 1) / "record.json"
    old = json.loads(file.read_text())
    del old["trees"]
    lines = old["scores"]["test_longdep"]["lines"]
    old["scores"]["test_longdep"]["lines"] = lines[1:]
    file.write_text(json.dumps(old))
    rows = {(r["recipe"], r["seed"]): r for r in study_status(path)}
    assert rows[("pascal", 2)]["state"] == "done" and "today's trees" in rows[("pascal", 2)]["note"]
    assert "(src side)" in rows[("pascal", 2)]["note"] and "bring the parser" in rows[("pascal", 2)]["note"]
    then_today = f"the long-dependency subset of test: {len(lines) - 1} sentences then, {len(lines)} today"
    assert rows[("pascal", 1)]["state"] == "done" and then_today in rows[("pascal", 1)]["note"]
    assert "today's trees" not in rows[("vanilla", 1)]["note"]  # reads no trees

    # another study with a run of the same training digest adopts its record instead of training
    twin = _study_file(tmp_path, {"vanilla": recipes["vanilla"]}, name="twin", seeds=(1,),
                       records=str(tmp_path / "studies" / "twin"), work_dir=str(tmp_path / "twin_runs"),
                       long_dependency=3)
    (row,) = study_status(twin)
    assert row["state"] == "pending" and row["note"].startswith(f"will adopt {study.record_dir('vanilla', 1)}")
    assert run_study(twin, report=False)["runs"] == {"vanilla/seed1": "done"}
    assert not (tmp_path / "twin_runs").exists()  # nothing trained
    adopted = json.loads((load_study(twin).record_dir("vanilla", 1) / "record.json").read_text())
    assert adopted["study"] == "twin" and adopted["adopted_from"]["study"] == "clone"
    assert adopted["scores"] == json.loads((study.record_dir("vanilla", 1) / "record.json").read_text())["scores"]


@pytest.mark.slow
@pytest.mark.shared
@pytest.mark.parametrize("name", ["multi30k_en_fr", "syncattn_lambda"])
def test_the_committed_reports_regenerate_byte_for_byte(name, tmp_path, monkeypatch):
    # the committed records and the corpus files of ../shared, with or without data/ (a fresh
    # clone has none): every score, verdict, p-value and ASO ε as committed; a few minutes each
    monkeypatch.chdir(ROOT)
    study = load_study(Path("studies") / f"{name}.yaml")
    if not all(Path(f.tgt).is_file() for cfg in [study.run_config(r.name, study.seeds[0]) for r in study.recipes]
               for f in cfg.data.splits.values() if f.tgt):
        pytest.skip("the corpus files of ../shared are not on this machine")
    out = write_report(study, out=tmp_path / "report.md")
    for suffix in (".md", ".json", ".png"):
        assert out.with_suffix(suffix).read_bytes() == (study.records / "report").with_suffix(suffix).read_bytes()


def test_status_warns_when_this_machine_would_train_in_another_precision(recipes, tmp_path, monkeypatch):
    # precision: auto takes bf16 only where the CPU has it: a study carried from an AVX-512 machine
    # to an AVX2 one would go on in float32, silently, at under half the pace
    import torch

    from structnmt.study import format_status, precision_here, precision_mix

    study = load_study(_study_file(tmp_path, recipes))
    for native, name in ((True, "bfloat16"), (False, "float32")):
        monkeypatch.setattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", lambda native=native: native, raising=False)
        monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
        assert precision_here(study, "pascal", 1) == name
    done = {"recipe": "a", "seed": 1, "state": "done", "step": 20, "bleu": 1.0, "note": "", "precision": "bfloat16"}
    todo = {"recipe": "a", "seed": 2, "state": "pending", "step": None, "bleu": None, "note": "",
            "precision_here": "float32"}
    assert "note: this machine would train in float32; the records trained in bfloat16" in format_status([done, todo])
    assert precision_mix([done, {**todo, "precision_here": "bfloat16"}]) == ""  # the same precision: no note
    assert precision_mix([done]) == ""  # nothing left to run
    # a run stopped half-way on a machine with bf16: resumed here it would go on in float32
    run_dir = study.run_dir("vanilla", 1)
    run_dir.mkdir(parents=True)
    (run_dir / "log.jsonl").write_text(json.dumps({"kind": "train", "step": 10, "elapsed_s": 5.0}) + "\n")
    (run_dir / "run.json").write_text(json.dumps({"precision": "bfloat16"}))
    row = next(r for r in study_status(study) if (r["recipe"], r["seed"]) == ("vanilla", 1))
    assert row["state"] == "interrupted" and row["precision_here"] == "float32"
    assert row["note"].endswith("it trained in bfloat16, this machine would go on in float32")


def test_a_niced_run_is_niced_against_other_sessions_too():
    # autogroup scheduling shares the CPU between sessions before nice counts: a run niced 10 in
    # the study's session still took half the cores from a test suite started in another shell
    import subprocess
    import sys

    from structnmt.study.executors import _autogroups, _child_setup

    if not _autogroups():
        pytest.skip("this kernel does not schedule by session (no autogroup)")
    probe = "import os; print(os.getsid(0), os.nice(0), (open('/proc/self/autogroup').read().split() or ['-'])[-1])"
    out = subprocess.run([sys.executable, "-c", probe], preexec_fn=_child_setup(7),  # noqa: PLW1509
                         capture_output=True, text=True, check=True).stdout.split()
    niced = str(max(7, os.nice(0)))  # a run never gets a lower niceness than the tests run at
    assert int(out[0]) != os.getsid(0) and out[1] == niced  # its own session, niced
    if out[2] == "-":  # a CI runner's kernel once left the new session in its default group
        pytest.skip("the kernel gave the run's new session no autogroup of its own")
    assert out[2] == "7"  # and that session niced as a whole, whatever the tests' own niceness
    plain = subprocess.run([sys.executable, "-c", probe], preexec_fn=_child_setup(0),  # noqa: PLW1509
                           capture_output=True, text=True, check=True).stdout.split()
    assert int(plain[0]) == os.getsid(0)  # nice 0: left in the study's session


def test_a_run_is_niced_to_the_study_files_value_not_by_it():
    # a study started under `nice -n 5` with nice 7 runs its trainings at 7 (not 12), and one
    # started at 9 keeps 9 (a run is never less nice than its study)
    import subprocess
    import sys

    script = ("import os, subprocess, sys\n"
              "from structnmt.study.executors import _child_setup\n"
              "print(os.nice(int(sys.argv[1])))\n"
              "print(subprocess.run([sys.executable, '-c', 'import os; print(os.nice(0))'],\n"
              "      preexec_fn=_child_setup(7), capture_output=True, text=True, check=True).stdout.strip())\n")
    here = os.nice(0)  # pytest itself may run niced, and the study below starts from here
    for more in (max(0, 5 - here), max(0, 9 - here)):  # a study at 5 runs at 7, one at 9 keeps 9
        study, run = subprocess.run([sys.executable, "-c", script, str(more)], capture_output=True, text=True,
                                    check=True).stdout.split()
        assert int(run) == max(7, int(study)), (study, run)


def test_status_time_left_takes_the_pace_of_runs_recorded_on_this_cpu(monkeypatch):
    # a study carried across machines: two slow runs on another CPU, one fast run on this one
    import structnmt.study as study_module

    def done(seconds: int, machine: tuple[str, int]) -> dict:
        return {"recipe": "r", "seed": 1, "state": "done", "step": 10, "bleu": 1.0, "note": "", "seconds": seconds,
                "machine": machine, "threads_setting": 0, "jobs": 1}

    rows = [done(9000, ("AMD EPYC", 1)), done(9600, ("AMD EPYC", 1)), done(3600, ("Xeon", 2)),
            {"recipe": "r", "seed": 2, "state": "pending", "step": None, "bleu": None, "note": "", "jobs": 1,
             "threads_setting": 0}]
    monkeypatch.setattr(study_module, "machine_here", lambda threads, jobs: ("Xeon", 2 // jobs))
    one = format_status(rows, jobs=1).splitlines()[-1]
    assert "at the median of the 1 run recorded on this CPU at 2 threads of 60 min each" in one
    assert "about 1.0 h of runs" in one
    # two at a time here gives one thread each: no record at that pace, so every record's median
    two = format_status(rows, jobs=2).splitlines()[-1]
    assert "at the finished runs' median of 150 min each" in two


def test_status_time_left_takes_the_pace_of_held_records_of_a_seed_beside_the_study(monkeypatch):
    # --status --seeds N for a seed not yet in the study file: its finished runs are all held
    import structnmt.study as study_module

    def row(state: str, **more) -> dict:
        return {"recipe": "r", "seed": 6, "state": state, "step": None, "bleu": None, "note": "", "jobs": 1,
                "threads_setting": 0, **more}

    rows = [row("held", seconds=6000, machine=("AMD EPYC", 2)), row("held", seconds=7200, machine=("AMD EPYC", 2)),
            row("held", seconds=12000, machine=("AMD EPYC", 2)), row("running", seconds_left=1800), row("pending")]
    monkeypatch.setattr(study_module, "machine_here", lambda threads, jobs: ("AMD EPYC", 2 // jobs))
    last = format_status(rows).splitlines()[-1]
    # 1800 s left of the running run + the held runs' median, 7200 s: 2.5 h
    assert last.startswith("2 runs not done (1 running, 1 with its time left from its log)")
    assert "the median of the 3 runs recorded on this CPU at 2 threads of 120 min each" in last
    assert "about 2.5 h of runs" in last
    assert "not done" not in format_status([r for r in rows if r["state"] == "held"])  # nothing left to do


# -- the report survives review (issue: Holm, provenance by seed, fixed long-dependency subsets) -----------------


def _hand_made_study(work: Path, trees_file: Path | None, **more) -> Path:
    """A study of hand-made records (no training): vanilla and pascal, seeds 1 and 2, tested on
    ``test`` and its long-dependency subset (arcs of 3+ words); pascal seed 1 chose its subset from
    other trees, on another machine at another commit."""
    import gzip
    import hashlib

    from structnmt.data.corpus import read_lines
    from structnmt.evaluation.scores import corpus_scores
    from structnmt.io import sha256_file
    from structnmt.study.provenance import lines_digest
    from structnmt.study.spec import config_digest, train_view

    recipes = _write_recipes(work)
    extra = {"trees": {"file": str(trees_file), "sha256": "0" * 64}} if trees_file else {}
    path = _study_file(work, recipes, name="review", long_dependency=3, **extra, **more)
    study = load_study(path)
    cfg = study.run_config("vanilla", 1)
    sources, refs = read_lines(cfg.data.splits["test"].src), read_lines(cfg.data.splits["test"].tgt)
    long = [n for n, s in enumerate(sources) if n % 3 == 0 and len(s.split()) >= 4]  # 0-based
    if trees_file:  # word 0 headed by the last word (an arc of len - 1), else a chain of one-word arcs
        with gzip.open(trees_file, "wt", encoding="utf-8") as out:
            out.write(json.dumps({"structnmt_trees": 1, "side": "src", "convention": "ud", "parser": None}) + "\n")
            for n, text in enumerate(sources):
                words = len(text.split())
                heads = [words - 1] * words if n in long else [min(i + 1, words - 1) for i in range(words)]
                key = hashlib.sha256(text.encode()).hexdigest()[:16]
                out.write(json.dumps({"key": key, "side": "src", "tree": {"heads": heads}}) + "\n")
        spec = yaml.safe_load(path.read_text())
        spec["trees"]["sha256"] = sha256_file(trees_file)
        path.write_text(yaml.safe_dump(spec, sort_keys=False))
        study = load_study(path)
    machines = {("vanilla", 1): ("AMD EPYC", "a" * 40), ("pascal", 1): ("Intel Xeon", "b" * 40 + "+dirty")}
    for recipe, seed in study.runs():
        cfg = study.run_config(recipe, seed)
        # vanilla drops a word of every other line; pascal is the references (seed 2: but one line)
        hyps = [" ".join(r.split()[:-1]) if recipe == "vanilla" and (n + seed) % 2 == 0 else r
                for n, r in enumerate(refs)]
        if recipe == "pascal" and seed == 2:
            hyps[1] = "x"
        own = long[1:] if (recipe, seed) == ("pascal", 1) else long  # other trees: other sentences
        cpu, commit = machines.get((recipe, seed), ("AMD EPYC", "a" * 40))
        record = {
            "study": study.name, "recipe": recipe, "seed": seed, "digest": config_digest(cfg),
            "config": train_view(cfg), "test": study.test_view(cfg), "updates": 20, "train_seconds": 60.0,
            "test_seconds": 6.0, "valid": [], "device": "cpu", "precision": "float32", "cpu": cpu,
            "cpu_info": {"model": cpu, "isa": "AVX512", "simd": []}, "git_commit": commit,
            # a record of the executor's share says threads 0: its calls say what it had
            "threads": 0 if (recipe, seed) == ("pascal", 2) else 1,
            "calls": [{"from_step": 0, "threads": 2 if (recipe, seed) == ("pascal", 2) else 1}],
            "reads_trees": recipe == "pascal", "trees": {"src": ("0" if own != long else "a") * 64}
            if recipe == "pascal" else None, "references": {"test": lines_digest(refs)},
            "scores": {"test": corpus_scores(hyps, [refs], metrics=("bleu", "chrf")),
                       "test_longdep": {**corpus_scores([hyps[n] for n in own], [[refs[n] for n in own]],
                                                        metrics=("bleu", "chrf")),
                                        "subset_of": "test", "lines": [n + 1 for n in own]}},
            "finished": "2026-11-30T12:00:00+0000",
        }
        if (recipe, seed) == ("vanilla", 2):
            record.update(cores=2, memory_gib=7.8, gpu=None)
        folder = study.record_dir(recipe, seed)
        (folder / "hyps").mkdir(parents=True)
        (folder / "record.json").write_text(json.dumps(record))
        (folder / "hyps" / "test.hyp").write_text("".join(h + "\n" for h in hyps))
        (folder / "hyps" / "test_longdep.hyp").write_text("".join(hyps[n] + "\n" for n in own))
    return path


def test_the_report_leads_with_the_primary_rule_and_gives_holm_beside_the_pooled_p(tmp_path):
    from structnmt.evaluation.significance import format_p, holm

    path = _hand_made_study(tmp_path, tmp_path / "trees.jsonl.gz")
    text = write_report(load_study(path)).read_text()
    summary = json.loads((load_study(path).records / "report.json").read_text())
    # the primary rule first, the pooled bootstrap and ASO after it, as suggestive
    primary, secondary = text.index("**Primary verdict**"), text.index("**Secondary, suggestive only**")
    assert text.index("## Scores") < primary < secondary < text.index("| recipe | seeds |")
    assert "of the 2 recipe × test-set comparisons against `vanilla` tested here" in text
    # Holm over every comparison of the report (both test sets), beside each raw pooled p
    raw = [summary[test]["pascal"]["pooled_p"] for test in ("test", "test_longdep")]
    assert all(p is not None for p in raw)
    for test, adjusted in zip(("test", "test_longdep"), holm(raw)):
        assert summary[test]["pascal"]["pooled_p_holm"] == pytest.approx(adjusted)
        assert summary[test]["pascal"]["holm_family"] == 2 and summary[test]["vanilla"]["pooled_p_holm"] is None
        section = text.split(f"### {test}\n")[1].split("\n#")[0]
        (row,) = [line for line in section.splitlines() if line.startswith("| pascal |")]
        assert row.split(" | ")[8:10] == [format_p(raw[("test", "test_longdep").index(test)]), format_p(adjusted)]
    assert "over the family of all 2 recipe × test-set comparisons against `vanilla`" in text
    assert "p pooled, Holm" in text and "verdict (primary)" in text
    assert "once in 6 with 2 seeds against 2" in text  # what ASO's epsilon 0 amounts to with two seeds a side


def test_the_report_scores_every_run_on_one_fixed_long_dependency_subset_from_the_pinned_trees(tmp_path):
    from structnmt.data.corpus import read_lines
    from structnmt.evaluation.scores import corpus_scores
    from structnmt.study.report import hypothesis_lines

    path = _hand_made_study(tmp_path, tmp_path / "trees.jsonl.gz")
    study = load_study(path)
    text = write_report(study).read_text()
    summary = json.loads((study.records / "report.json").read_text())
    cfg = study.run_config("vanilla", 1)
    sources, refs = read_lines(cfg.data.splits["test"].src), read_lines(cfg.data.splits["test"].tgt)
    long = [n for n, s in enumerate(sources) if n % 3 == 0 and len(s.split()) >= 4]
    # one set of sentences, named with its size and source; pascal seed 1's own subset is not used
    assert f"has an arc of 3 or more words (test {len(long)} sentences)" in text and "trees.jsonl.gz" in text
    assert f"scored here on the fixed ones (by their subsets' sizes): {len(long) - 1}: pascal s1." in text
    assert f"Scored on {len(long)} sentences, the same for every run" in text
    for recipe in ("vanilla", "pascal"):
        row = summary["test_longdep"][recipe]
        assert row["subset"] == {"fixed": True, "sentences": [len(long)]}
        for seed in (1, 2):
            hyps = hypothesis_lines(study.record_dir(recipe, seed), "test")  # the whole test set's
            expected = corpus_scores([hyps[n] for n in long], [[refs[n] for n in long]], metrics=("bleu",))["bleu"]
            assert row["bleu"][str(seed)] == pytest.approx(expected)
    # compared now: a verdict by the rule, not "not compared"
    assert summary["test_longdep"]["pascal"]["verdict"].startswith(("better", "worse", "no significant"))
    assert "not compared" not in text
    # without the references here the fixed subset cannot be scored: each run's own, untested, saying why
    tgt = Path(cfg.data.splits["test"].tgt)
    tgt.rename(tgt.with_name("away.tgt"))
    try:
        bare = write_report(load_study(path), out=tmp_path / "bare" / "report.md").read_text()
    finally:
        tgt.with_name("away.tgt").rename(tgt)
    assert "Each run's own subset, as its record keeps it" in bare
    assert "not the study's fixed one, which needs the references: no references on this machine" in bare
    assert json.loads((tmp_path / "bare" / "report.json").read_text())["test_longdep"]["pascal"]["verdict"] \
        .startswith("not tested: no references on this machine")

    # without pinned trees, each run's own subset, as before, and the report says so
    spec = yaml.safe_load(path.read_text())
    del spec["trees"]
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    plain = write_report(load_study(path), out=tmp_path / "plain" / "report.md").read_text()
    assert "the study pins no trees file, so each run's long-dependency subset is its own" in plain
    assert "not compared (the subset's sentences differ between runs)" in plain
    assert "Each run's own subset, as its record keeps it" in plain

    # a trees file that lacks a sentence of the test set: not fixed for it, and why
    import gzip

    file = tmp_path / "trees.jsonl.gz"
    with gzip.open(file, "rt", encoding="utf-8") as lines:
        kept = lines.read().splitlines()
    with gzip.open(file, "wt", encoding="utf-8") as out:
        out.write("\n".join(kept[:-1]) + "\n")  # the last sentence's tree left out
    from structnmt.io import sha256_file

    spec["trees"] = {"file": str(file), "sha256": sha256_file(file)}
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    partial = write_report(load_study(path), out=tmp_path / "partial" / "report.md").read_text()
    assert f"not fixed for test: line {len(sources)} has no tree in the file" in partial


def test_the_report_lists_provenance_by_seed_and_warns_where_a_seed_mixes_machines_commits_or_trees(tmp_path):
    path = _hand_made_study(tmp_path, tmp_path / "trees.jsonl.gz")
    text = write_report(load_study(path)).read_text()
    lines = text.splitlines()
    # seed 1 pooled runs of two machines and two commits: said in a visible line, naming the runs
    assert any(line.startswith("- **Warning: seed 1 pools runs on 2 kinds of machine**, AMD EPYC (AVX512): vanilla; "
                               "Intel Xeon (AVX512): pascal.") for line in lines[2:8])
    assert "- **Warning: seed 1 pools runs of 2 commits**, aaaaaaa: vanilla; bbbbbbb+dirty: pascal." in text
    assert "seed 2 pools" not in text
    # pascal seed 1 read other trees (its digest and its subset say so); seed 2 the study's
    (warning,) = [line for line in lines if "read other trees" in line]
    assert "1 run read other trees than the study's pinned trees" in warning
    assert "pascal seed 1: digest 00000000, and long-dependency subsets of other sentences (7 against" in warning
    assert text.index(warning) < text.index("## Scores")
    # the table: machine, cores, memory, GPU, threads (from the calls where the record says 0), commit, trees
    section = text.split("## Provenance by seed")[1]
    rows = {tuple(line.split(" | ")[:2]): line.split(" | ") for line in section.splitlines() if line.startswith("| ")
            and line.split(" | ")[0][2:].isdigit()}
    assert rows[("| 2", "vanilla")][2:6] == ["AMD EPYC (AVX512)", "2", "7.8", "none"]
    assert rows[("| 1", "vanilla")][3:6] == ["-", "-", "-"]  # not recorded
    assert rows[("| 2", "pascal")][7] == "2" and "0 thread" not in text
    assert rows[("| 1", "pascal")][8] == "bbbbbbb+dirty" and rows[("| 1", "pascal")][9].startswith("**other**")
    assert rows[("| 2", "pascal")][9] == f"pinned ({'a' * 8}) |" and rows[("| 1", "vanilla")][9] == "reads none |"


def test_the_summary_marks_the_pooled_p_after_holm_and_before_it_only():
    from structnmt.study.report import headline, pooled_holm, summary_legend, summary_lines

    def row(bleu: dict[int, float], pooled: float | None = None, verdict: str = "no significant difference") -> dict:
        return {"bleu": bleu, "chrf": {}, "signature": {}, **({"verdict": {"verdict": verdict, "pooled_p": pooled,
                                                                          "pooled_n": 1000}} if pooled else {})}

    table = {"t1": {"base": row({1: 30.0, 2: 31.0}), "a": row({1: 32.0, 2: 33.0}, 0.001),
                    "b": row({1: 31.0, 2: 32.0}, 0.04), "c": row({1: 30.0, 2: 31.5}, 0.2)}}
    # Holm over 3: 0.001 * 3, 0.04 * 2, then 0.2 * 1 (raised to 0.08)
    assert pooled_holm(table) == pytest.approx({("t1", "a"): 0.003, ("t1", "b"): 0.08, ("t1", "c"): 0.2})
    rows = {line.split(" | ")[0][2:]: line for line in summary_lines("base", table)[2:]}
    assert rows["a"].endswith("(+2.00) † |") and rows["b"].endswith("(+1.00) (†) |") and rows["c"].endswith("(+0.25) |")
    assert "after Holm's correction over the 3 comparisons" in summary_legend("base", table)
    primary, secondary = headline("base", table)[0], headline("base", table)[2]
    assert primary.startswith("**Primary verdict**") and "3 no significant difference" in primary
    assert "p < 0.05 in 2 of the 3 comparisons, 1 after Holm's correction over all 3: a on t1 (0.0010, Holm 0.0030)" \
        in secondary
    # with 1,000 resamples no p is below 1/1001: over more than 50 comparisons Holm can keep none, and says so
    many = {f"t{k}": {"base": row({1: 30.0}), "a": row({1: 40.0}, 1 / 1001)} for k in range(51)}
    assert "none can stay below 0.05: a family this large needs more resamples" in headline("base", many)[2]
    assert "needs more resamples" not in headline("base", dict(list(many.items())[:50]))[2]


def test_training_cuda_graphs_at_auto_keeps_the_digest_it_had_before_the_key():
    """A run folder keeps a marker of its training digest and is cleared when it differs: a key
    added to the config at the value that trains as before must leave digests as they were, or
    every run half done would start over. ``cuda_graphs: auto`` is off on a CPU, as before."""
    from structnmt.config import config_from_dict
    from structnmt.study.spec import config_digest, train_view

    auto = config_from_dict({"training": {"cuda_graphs": "auto"}})
    assert "cuda_graphs" not in train_view(auto)["training"]
    on = config_from_dict({"training": {"cuda_graphs": "on"}})
    assert train_view(on)["training"]["cuda_graphs"] == "on" and config_digest(on) != config_digest(auto)


def test_a_copy_of_the_tree_names_the_commit_it_was_made_from(monkeypatch):
    # a borrowed GPU machine gets the working tree without .git: the record keeps the commit the
    # command names (STRUCTNMT_COMMIT), and None when nothing names one
    from structnmt.study import provenance

    def no_git(*args, **kwargs):
        raise FileNotFoundError("git")

    monkeypatch.setattr(provenance.subprocess, "run", no_git)
    monkeypatch.delenv("STRUCTNMT_COMMIT", raising=False)
    assert provenance.git_commit() is None
    monkeypatch.setenv("STRUCTNMT_COMMIT", " 0123456789abcdef0123456789abcdef01234567\n")
    assert provenance.git_commit() == "0123456789abcdef0123456789abcdef01234567"

    # a copy lying inside another repository: git answers with that one's commit, which is not ours
    import subprocess

    def other_repository(cmd, **kwargs):
        out = "/somewhere/else\nfeedfacefeedfacefeedfacefeedfacefeedface\n" if "rev-parse" in cmd else ""
        return subprocess.CompletedProcess(cmd, 0, stdout=out, stderr="")

    monkeypatch.setattr(provenance.subprocess, "run", other_repository)
    assert provenance.git_commit() == "0123456789abcdef0123456789abcdef01234567"
    monkeypatch.delenv("STRUCTNMT_COMMIT")
    assert provenance.git_commit() is None

    # a copy whose .git holds the last commit that landed, the commits since as changes: the named
    # commit wins over git's "+dirty" one
    root = str(Path(provenance.__file__).resolve().parent.parent.parent)

    def landed_and_changed(cmd, **kwargs):
        out = f"{root}\nfeedfacefeedfacefeedfacefeedfacefeedface\n" if "rev-parse" in cmd else " M structnmt/x.py\n"
        return subprocess.CompletedProcess(cmd, 0, stdout=out, stderr="")

    monkeypatch.setattr(provenance.subprocess, "run", landed_and_changed)
    assert provenance.git_commit() == "feedfacefeedfacefeedfacefeedfacefeedface+dirty"
    monkeypatch.setenv("STRUCTNMT_COMMIT", "0123456789abcdef0123456789abcdef01234567")
    assert provenance.git_commit() == "0123456789abcdef0123456789abcdef01234567"
    monkeypatch.setenv("STRUCTNMT_COMMIT", "feedface")  # naming git's own HEAD keeps git's word, "+dirty" too
    assert provenance.git_commit() == "feedfacefeedfacefeedfacefeedfacefeedface+dirty"


def test_methods_kept_outside_the_package_are_named_with_their_digest_by_seed(tmp_path):
    """No commit of structnmt pins a user's method module: the report names it with its file's
    digest beside the commit, and a seed whose runs ran different code of it is warned of."""
    path = _hand_made_study(tmp_path, None)
    study = load_study(path)
    for recipe, digest in (("vanilla", "1" * 64), ("pascal", "2" * 64)):
        file = study.record_dir(recipe, 2) / "record.json"
        record = json.loads(file.read_text())
        file.write_text(json.dumps({**record, "methods_outside": {"mymethods": digest}}))
    text = write_report(load_study(path)).read_text()
    assert ("- **Warning: seed 2 pools runs of 3 commits**, aaaaaaa: vanilla, pascal; mymethods@11111111: vanilla; "
            "mymethods@22222222: pascal.") in text
    assert "and each module of methods kept outside the package, with its file's digest" in text
    section = text.split("## Provenance by seed")[1]
    assert "| aaaaaaa, mymethods@22222222 |" in section
