"""SLURM without a cluster: a study and ``prepare --jobs N --slurm`` go through submitit's own SLURM
executor, with a fake ``sbatch``/``srun``/``sacct``/``squeue`` on PATH.

The fake ``sbatch`` keeps each script it is given and the arguments, answers "Submitted batch
job N", and runs the job as SLURM would, in the background: every array task with the
``SLURM_*`` variables submitit's job reads, through a fake ``srun`` that writes its output
files. ``sacct`` reports the jobs finished. The tests then read the sbatch scripts: partition,
time limit, GPUs and CPUs per task, memory, array size, the requeue signal and how often
submitit will requeue, as the study file or the ``--slurm-set`` flags asked.

Checked against the bugs: both tests failed on the code before this test existed, with
submitit's "Unknown argument 'max_num_timeout' for executor 'slurm'" (the requeue budget,
``slurm_max_num_timeout``, is an argument of ``AutoExecutor`` itself, not of
``update_parameters``: no study could be submitted to SLURM). With ``slurm_partition`` left out
of ``run_submitit``'s parameters the study test fails on the script's missing partition line.
"""

from __future__ import annotations

import json
import os
import pickle
import re
import sys
import time
from pathlib import Path

import pytest
import yaml

from structnmt.cli.main import main
from tests.test_prepare_stream import assert_same_dataset, make_config, yaml_config
from tests.test_study import _study_file, _write_recipes

pytest.importorskip("submitit")
ROOT = Path(__file__).resolve().parents[1]

SBATCH = r'''
import json, os, re, subprocess, sys
from pathlib import Path
state = Path(os.environ["FAKE_SLURM"])
script = Path(sys.argv[-1]).read_text()
job = 1000 + len(list(state.glob("sbatch-*.sh"))) + 1
(state / f"sbatch-{job}.sh").write_text(script)
with open(state / "calls.jsonl", "a") as log:
    log.write(json.dumps({"tool": "sbatch", "job": job, "argv": sys.argv[1:]}) + "\n")
array = re.search(r"^#SBATCH --array=(\d+)-(\d+)", script, re.M)
tasks = list(range(int(array[1]), int(array[2]) + 1)) if array else [None]
(state / f"tasks-{job}.json").write_text(json.dumps(tasks))
subprocess.Popen([sys.executable, str(state / "bin" / "run_job.py"), str(job)], start_new_session=True,
                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
print(f"Submitted batch job {job}")
'''

RUN_JOB = r'''
import json, os, shlex, shutil, subprocess, sys, time
from pathlib import Path
state = Path(os.environ["FAKE_SLURM"])
job = sys.argv[1]
tasks = json.loads((state / f"tasks-{job}.json").read_text())
script = (state / f"sbatch-{job}.sh").read_text()
folder = shlex.split([line for line in script.splitlines() if "submitit.core._submit" in line][0])[-1]
running = []
for task in tasks:
    name = job if task is None else f"{job}_{task}"
    submitted = Path(folder.replace("%j", name)) / f"{name}_submitted.pkl"
    for _ in range(300):  # submitit moves the job's pickle into place once sbatch has answered
        if submitted.exists():
            break
        time.sleep(0.1)
    shutil.copy(submitted, state / f"submitted-{name}.pkl")  # what submitit pickled (its requeue budget)
    env = {**os.environ, "SLURM_JOB_ID": job if task is None else str(int(job) * 100 + task), "SLURM_NTASKS": "1",
           "SLURM_JOB_NUM_NODES": "1", "SLURM_NODEID": "0", "SLURM_JOB_NODELIST": "node1", "SLURM_PROCID": "0",
           "SLURM_LOCALID": "0"}
    if task is not None:
        env.update(SLURM_ARRAY_JOB_ID=job, SLURM_ARRAY_TASK_ID=str(task))
    (state / f"state-{name}").write_text("RUNNING")
    running.append((name, subprocess.Popen(["bash", str(state / f"sbatch-{job}.sh")], env=env)))
for name, process in running:
    (state / f"state-{name}").write_text("COMPLETED" if process.wait() == 0 else "FAILED")
'''

SRUN = r'''
import os, subprocess, sys
args, files = sys.argv[1:], {}
while args and args[0].startswith("-"):
    flag = args.pop(0)
    if flag in ("--output", "--error"):
        files[flag] = args.pop(0)
env = os.environ
names = {"%j": env["SLURM_JOB_ID"], "%A": env.get("SLURM_ARRAY_JOB_ID", ""), "%a": env.get("SLURM_ARRAY_TASK_ID", ""),
         "%t": "0"}
def open_log(pattern):
    for key, value in names.items():
        pattern = pattern.replace(key, value)
    os.makedirs(os.path.dirname(pattern), exist_ok=True)
    return open(pattern, "a")
out = open_log(files["--output"])
err = open_log(files["--error"]) if "--error" in files else out
sys.exit(subprocess.call(args, stdout=out, stderr=err))
'''

SACCT = r'''
import json, os, sys
from pathlib import Path
state = Path(os.environ["FAKE_SLURM"])
ids = sys.argv[sys.argv.index("-j") + 1].split(",") if "-j" in sys.argv else []
print("JobID|State|NodeList")
for job in ids:
    job = job.split("_")[0]
    tasks_file = state / f"tasks-{job}.json"
    tasks = json.loads(tasks_file.read_text()) if tasks_file.exists() else []
    for task in tasks:
        name = job if task is None else f"{job}_{task}"
        path = state / f"state-{name}"
        print(f"{name}|{path.read_text() if path.exists() else 'PENDING'}|node1")
'''

QUIET = """
import sys
print("JOBID PARTITION NAME USER ST TIME NODES NODELIST(REASON)" if sys.argv[0].endswith("squeue") else "")
"""


@pytest.fixture
def slurm(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A fake SLURM on PATH; returns the folder where it keeps the scripts and its calls."""
    state = tmp_path / "slurm"
    bin_dir = state / "bin"
    bin_dir.mkdir(parents=True)
    for name, body in {"sbatch": SBATCH, "run_job.py": RUN_JOB, "srun": SRUN, "sacct": SACCT, "squeue": QUIET,
                       "scancel": QUIET, "scontrol": QUIET}.items():
        path = bin_dir / name
        path.write_text(f"#!{sys.executable}\n{body}")
        path.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_SLURM", str(state))
    monkeypatch.setenv("PYTHONPATH", str(ROOT))  # the jobs import this checkout's structnmt
    return state


def all_finished(state: Path, timeout_s: float = 60.0) -> bool:
    """Waits for the fake jobs' last steps (submitit may read a result before its job's process ends)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if all(p.read_text() in ("COMPLETED", "FAILED") for p in state.glob("state-*")):
            return True
        time.sleep(0.2)
    return False


def sbatch_calls(state: Path) -> list[dict]:
    calls = [json.loads(line) for line in (state / "calls.jsonl").read_text().splitlines()]
    return [c for c in calls if c["tool"] == "sbatch"]


def directives(state: Path, job: int) -> dict[str, str]:
    """The ``#SBATCH --key=value`` lines of a submitted script."""
    text = (state / f"sbatch-{job}.sh").read_text()
    return dict(re.findall(r"^#SBATCH --([\w-]+)(?:=(.*))?$", text, re.M))


def requeue_budget(state: Path) -> list[int]:
    """How often submitit will requeue each job that ran on a time-out or pre-emption."""
    return [pickle.loads(p.read_bytes())._timeout_countdown for p in sorted(state.glob("submitted-*.pkl"))]


@pytest.mark.slow
def test_a_study_is_submitted_as_the_study_file_asks(slurm: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    from structnmt.study import load_study, run_study

    recipes = _write_recipes(tmp_path / "recipes")
    asked = {"partition": "gpu-long", "time_min": 95, "gpus_per_run": 2, "cpus_per_run": 3, "mem_gb": 12,
             "max_requeue": 4, "options": {"account": "nmt", "qos": "high"}}
    path = _study_file(tmp_path, {"vanilla": recipes["vanilla"]}, name="onslurm", seeds=(1, 2), max_steps=4,
                       slurm=asked)
    spec = yaml.safe_load(path.read_text())
    spec["executor"]["kind"] = "slurm"
    path.write_text(yaml.safe_dump(spec))
    monkeypatch.chdir(tmp_path)
    result = run_study(path, report=False)
    assert result["runs"] == {"vanilla/seed1": "done", "vanilla/seed2": "done"}

    calls = sbatch_calls(slurm)
    assert len(calls) == 2  # one job per run, no array
    for call in calls:
        flags = directives(slurm, call["job"])
        assert flags["partition"] == "gpu-long" and flags["time"] == "95"
        assert flags["gpus-per-node"] == "2" and flags["cpus-per-task"] == "3" and flags["mem"] == "12GB"
        assert flags["account"] == "nmt" and flags["qos"] == "high"
        assert flags["job-name"] == "structnmt-onslurm" and "array" not in flags
        assert flags["signal"].startswith("USR2@")  # submitit's pre-emption / time-out signal, then requeue
    study = load_study(path)
    assert all_finished(slurm) and requeue_budget(slurm) == [4, 4]
    assert all((study.record_dir("vanilla", seed) / "record.json").is_file() for seed in (1, 2))


def test_prepare_shards_are_one_job_array_as_the_flags_ask(slurm: Path, tmp_path: Path):
    cfg = make_config(tmp_path / "data")
    config = yaml_config(cfg, tmp_path / "exp.yaml")
    args = ["prepare", str(config), "--jobs", "3", "--slurm", "--slurm-set", "slurm_partition=cpu",
            "--slurm-set", "timeout_min=720", "--slurm-set", "cpus_per_task=4", "--slurm-set", "mem_gb=8",
            "--slurm-set", "slurm_max_num_timeout=2"]
    assert main(args) == 0

    calls = sbatch_calls(slurm)
    assert len(calls) == 1
    flags = directives(slurm, calls[0]["job"])
    assert flags["array"] == "0-2%3"  # three shards, all at once
    assert flags["partition"] == "cpu" and flags["time"] == "720"
    assert flags["cpus-per-task"] == "4" and flags["mem"] == "8GB" and "gpus-per-node" not in flags
    assert all_finished(slurm) and requeue_budget(slurm) == [2, 2, 2]
    merged = json.loads((Path(cfg.data.dir) / "meta.json").read_text())
    assert merged["shards"] == 3
    from structnmt.data.prepare import prepare
    from tests.test_prepare_stream import elsewhere

    assert_same_dataset(prepare(elsewhere(cfg, "one"), verbose=False), Path(cfg.data.dir))
