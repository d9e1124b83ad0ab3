"""Where a study's runs execute: here, one or several at a time, or as SLURM jobs via submitit.

Each run is its own process (a crash or an out-of-memory kill takes one run down, not the
study). Locally the run process is niced, gets the machine's cores divided between the
runs at once, and is told by the kernel to stop (SIGTERM, which the trainer turns into a
checkpoint and exit status 75) when the study process dies, so that a killed study leaves
no orphan training behind and its rerun resumes from that checkpoint.

On a cluster, submitit submits each run as a job; a job that is pre-empted or reaches its
time limit is requeued by submitit (``Checkpointable``) and resumes from its newest
checkpoint, since every run resumes from its own run folder.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from structnmt.errors import ConfigError
from structnmt.processes import die_with_parent, libc_prctl
from structnmt.study.runs import (
    BUSY,
    DONE,
    FAILED_STATUS,
    INTERRUPTED,
    RECORD,
    clear_failure,
    execute_run,
    write_failure,
)
from structnmt.study.spec import Study
from structnmt.wording import counted

#: a run process's exit status: 75 is the trainer's "stopped at a checkpoint"; one ended by SIGTERM
#: or SIGINT before the trainer could catch it (still importing, say) was stopped too, not broken:
#: it resumes from its last checkpoint, if any, when the study runs again
EXIT_TO_STATUS = {0: DONE, 75: INTERRUPTED, 3: BUSY, -signal.SIGTERM: INTERRUPTED, -signal.SIGINT: INTERRUPTED}


def _child_setup(niceness: int) -> Callable[[], None]:
    """What a run process does between fork and exec: nice itself to ``niceness`` (never less
    than the study's own), and ask the kernel for
    SIGTERM when the study dies (Linux ``PR_SET_PDEATHSIG``). libc is loaded here, in the
    parent, because loading a library after a fork of a threaded process can deadlock."""
    prctl = libc_prctl()
    parent = os.getpid()

    autogroup = niceness > 0 and _autogroups()

    def setup() -> None:
        # the study file's nice is the run's niceness, not an increment: a study started under
        # `nice -n 15` with nice 15 would otherwise run its trainings at 19 (the cap)
        os.nice(max(0, niceness - os.nice(0)))
        if autogroup:
            # With autogroup scheduling (most Linux desktops, and the machines studies ran on) the
            # kernel shares the CPU between sessions first and looks at nice only within one: a
            # run niced 10 still took half the cores from a test suite started in another shell.
            # Its own session, niced as a whole, makes the nice count (the user's shell is not
            # touched; the run still stops with the study, through the signal below).
            os.setsid()
            with contextlib.suppress(OSError), open("/proc/self/autogroup", "w") as group:
                group.write(str(niceness))
        if not die_with_parent(prctl, signal.SIGTERM, parent):  # the study died before the request
            os.kill(os.getpid(), signal.SIGTERM)
    return setup


class Terminated(KeyboardInterrupt):
    """SIGTERM to the study, handled as Ctrl-C is: a study started in the background by a script
    (`nohup structnmt study … &`) ignores SIGINT, so `kill` is how it is stopped."""

    exit_status = 143  # 128 + SIGTERM, as a shell reports a process the signal ended


@contextlib.contextmanager
def _terminate_as_interrupt() -> Iterator[None]:
    """While runs go, SIGTERM raises :class:`Terminated` in the study, which then stops its runs
    (they checkpoint) instead of dying and leaving them to ``PR_SET_PDEATHSIG``."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def stop(signum: int, _frame: object) -> None:
        raise Terminated(f"signal {signum}")

    before = signal.signal(signal.SIGTERM, stop)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, before)


@contextlib.contextmanager
def _signals_held() -> Iterator[None]:
    """Ctrl-C and SIGTERM are held (noted, then raised again at the end) while the study tells its
    runs to stop: a second Ctrl-C in the middle would leave runs untold, and the study waiting
    for them to train to their end. Python runs signal handlers in the main thread only, so only
    there is there anything to hold."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    heard: list[int] = []
    before = {sig: signal.signal(sig, lambda signum, _frame: heard.append(signum))
              for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, handler in before.items():
            signal.signal(sig, handler)
        for sig in heard[:1]:  # as it would have been handled (an ignored SIGINT stays ignored)
            signal.raise_signal(sig)


def _autogroups() -> bool:
    """Whether the kernel schedules this process by session: ``CONFIG_SCHED_AUTOGROUP`` switched
    on, and this process in an autogroup of its session's (``/proc/self/autogroup`` is empty for
    a process left in the kernel's default group, as one was under a CI runner)."""
    try:
        enabled = Path("/proc/sys/kernel/sched_autogroup_enabled").read_text().strip() == "1"
        return enabled and bool(Path("/proc/self/autogroup").read_text().strip())
    except OSError:
        return False


def _cores() -> int:
    """The cores this process may use (a container or ``taskset`` may allow fewer than the host has)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def threads_per_run(configured: int, jobs: int) -> int:
    """The study file's threads per run, but never more than the cores divided by the runs at
    once: two-thread runs sharing a core stall each other at every parallel region."""
    fair = max(1, _cores() // jobs)
    return min(configured, fair) if configured else fair


def check_device(study: Study, runs: list[tuple[str, int]]) -> None:
    """Refuse, before any run starts, runs that would train on a CUDA GPU this machine lacks
    (the study file's ``executor.device``, else a recipe's ``training.device``); ``auto``
    trains on the CPU where there is no GPU."""
    import torch

    for recipe, seed in runs:
        device = study.run_config(recipe, seed).training.device
        if not device.startswith("cuda"):
            continue
        where = "executor.device" if study.executor.device is not None else f"recipe {recipe!r}: training.device"
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if not count:
            raise ConfigError(f"{device} asked for, but this machine has no CUDA GPU (torch {torch.__version__}); "
                              "use auto or cpu to run on the CPU", where, study.path)
        index = int(device.partition(":")[2] or 0)
        if index >= count:
            raise ConfigError(f"{device} asked for, but this machine has {counted(count, 'CUDA GPU')}", where,
                              study.path)


_COMMITTING = threading.Lock()  # one git call at a time: runs finish together, and git locks its index


def commit_record(study: Study, recipe: str, seed: int) -> str:
    """Commit a run's record folder, and only its files, to the git repository that holds it
    (``executor.commit``), so that a machine lent for a while keeps every run that finished on
    it. Returns the line to show: ``committed <commit>``, or a warning when git would not
    (no repository, nothing to commit, git missing): never an error of the study."""
    folder = study.record_dir(recipe, seed)
    record: dict = {}
    with contextlib.suppress(OSError, ValueError):  # only the commit message reads it
        record = json.loads((folder / RECORD).read_text(encoding="utf-8"))
    record = record if isinstance(record, dict) else {}
    device = record.get("device") or "device unknown"
    if str(device).startswith("cuda") and record.get("gpu"):
        device = f"{device} {record['gpu']}"
    scores = record.get("scores") or {}
    test = next((t for t in study.test_sets or [] if t in scores), next(iter(scores), None))
    bleu = (scores.get(test) or {}).get("bleu")
    message = (f"{study.name}: {recipe} seed {seed} recorded ({device}, "
               + (f"BLEU {bleu:.2f} {test})" if isinstance(bleu, (int, float)) else "no BLEU)"))
    with _COMMITTING:
        for step in (["add", "--", "."], ["commit", "-q", "-m", message, "--", "."], ["rev-parse", "--short", "HEAD"]):
            try:
                done = subprocess.run(["git", "-C", str(folder), *step], capture_output=True, text=True, timeout=120)
            except (OSError, subprocess.SubprocessError) as err:
                return f"warning: record not committed (git {step[0]}: {err})"
            if done.returncode != 0:  # git's own words: its first error line, else its last ("nothing to commit")
                errors = [line.strip() for line in done.stderr.splitlines() if line.strip() and "hint:" not in line]
                said = errors[:1] or [line.strip() for line in done.stdout.splitlines() if line.strip()][-1:]
                said = said or [f"status {done.returncode}"]
                return f"warning: record not committed (git {step[0]}: {said[0]})"
    return f"committed to git as {done.stdout.strip()}"


def run_local(study: Study, runs: list[tuple[str, int]], jobs: int,
              report: Callable[[str, int, str], None]) -> dict[tuple[str, int], str]:
    """Run each (recipe, seed) in its own niced process, ``jobs`` at a time (on one GPU too, with
    ``executor.device: cuda``); with ``executor.commit`` each record is committed as it is written."""
    check_device(study, runs)
    threads = threads_per_run(study.executor.threads, jobs)
    if study.executor.threads and threads < study.executor.threads:
        print(f"[study] {jobs} runs at once on {_cores()} cores: {counted(threads, 'thread')} each instead of the "
              f"study file's executor.threads {study.executor.threads}", flush=True)
    results: dict[tuple[str, int], str] = {}

    def one(run: tuple[str, int]) -> None:
        if stopping.is_set():
            return
        recipe, seed = run
        log = study.run_dir(recipe, seed) / "worker.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}
        command = [sys.executable, "-m", "structnmt.study.runs", str(study.path), recipe, str(seed), str(threads)]
        report(recipe, seed, "running")
        with open(log, "a", encoding="utf-8") as handle:
            with starting:  # a run started once the study is stopping would never hear of it
                if stopping.is_set():
                    return
                clear_failure(study, recipe, seed)  # even one that dies before it runs: this try's status stands
                handle.write(f"$ {' '.join(command)}\n")
                handle.flush()
                process = subprocess.Popen(command, stdout=handle, stderr=subprocess.STDOUT, env=env,
                                           preexec_fn=_child_setup(study.executor.nice))  # noqa: PLW1509
                running.add(process)
            try:
                code = process.wait()
            finally:
                running.discard(process)
        status = EXIT_TO_STATUS.get(code, FAILED_STATUS)
        if status == FAILED_STATUS and code != 1:  # killed, crashed or refused (2) without a record
            write_failure(study, recipe, seed, f"the run process ended with status {code}", log)
        results[run] = status
        report(recipe, seed, status)
        if status == DONE and study.executor.commit:
            report(recipe, seed, commit_record(study, recipe, seed))

    running: set[subprocess.Popen] = set()
    starting = threading.Lock()  # held from the stop check to ``running.add``
    stopping = threading.Event()
    with ThreadPoolExecutor(max_workers=jobs) as pool, _terminate_as_interrupt():
        try:
            list(pool.map(one, runs))
        except BaseException:
            # Ctrl-C (or any stop) of the study: a run in its own session (see _child_setup) does
            # not get the terminal's SIGINT, so it is told here, and checkpoints and exits; a
            # worker between two runs starts no other
            with _signals_held():
                pool.shutdown(wait=False, cancel_futures=True)
                with starting:
                    stopping.set()
                for process in list(running):
                    with contextlib.suppress(OSError):
                        process.terminate()
            raise
    return results


class RunJob:
    """A study run as a submitit job; requeued (and so resumed) on pre-emption or timeout."""

    def __call__(self, study_path: str, recipe: str, seed: int, cwd: str) -> str:
        from structnmt.study.provenance import select_gpu
        from structnmt.study.spec import load_study

        os.chdir(cwd)  # recipes name their files relative to the project's root
        study = load_study(study_path)
        with contextlib.suppress(Exception):  # so that the record names the GPU it trained on
            select_gpu(study.run_config(recipe, seed).training.device)
        return execute_run(study, recipe, seed)

    def checkpoint(self, *args, **kwargs):
        import submitit

        return submitit.helpers.DelayedSubmission(self, *args, **kwargs)


def run_submitit(study: Study, runs: list[tuple[str, int]], cluster: str | None,
                 report: Callable[[str, int, str], None]) -> dict[tuple[str, int], str]:
    """Submit every run as a job (``cluster="slurm"``: SLURM, refused where there is none;
    ``"local"``: submitit's local executor, real processes on this machine) and wait for them."""
    try:
        import submitit
    except ImportError:
        raise ConfigError("the slurm executor needs submitit (pip install submitit)", "executor.kind") from None
    s = study.slurm
    # how often submitit requeues a job on time-out or pre-emption: a constructor argument, not a parameter
    try:
        executor = submitit.AutoExecutor(folder=str(study.work_dir / "submitit" / "%j"), cluster=cluster,
                                         slurm_max_num_timeout=s.max_requeue)
    except RuntimeError as err:  # "Could not detect srun": asked for SLURM on a machine without it
        raise ConfigError(f"no SLURM cluster here ({err}): choose the local or submitit-local executor",
                          "executor.kind") from None
    params = {"timeout_min": s.time_min, "gpus_per_node": s.gpus_per_run, "cpus_per_task": s.cpus_per_run,
              "name": f"structnmt-{study.name}"}
    if s.mem_gb:
        params["mem_gb"] = s.mem_gb
    if executor.cluster == "slurm":
        if s.partition:
            params["slurm_partition"] = s.partition
        if s.options:
            params["slurm_additional_parameters"] = dict(s.options)
    executor.update_parameters(**params)
    cwd = os.getcwd()
    submitted = []
    for recipe, seed in runs:
        job = executor.submit(RunJob(), str(Path(study.path).absolute()), recipe, seed, cwd)
        report(recipe, seed, f"submitted as job {job.job_id}")
        submitted.append(((recipe, seed), job))
    results: dict[tuple[str, int], str] = {}
    for (recipe, seed), job in submitted:
        attempts = 0
        while True:
            try:
                status = job.result()
            except Exception as err:  # noqa: BLE001 (a job that died is one failed run)
                status = FAILED_STATUS
                write_failure(study, recipe, seed, f"job {job.job_id} failed: {str(err).strip()[-2000:]}",
                              Path(str(job.paths.stderr)))
            # SIGTERM (pre-emption, scancel) makes the trainer save and return "interrupted"
            # rather than die, so submitit sees a finished job: submit it again to go on
            if status != INTERRUPTED or attempts >= s.max_requeue:
                break
            attempts += 1
            job = executor.submit(RunJob(), str(Path(study.path).absolute()), recipe, seed, cwd)
            report(recipe, seed, f"interrupted; resubmitted as job {job.job_id} ({attempts} of {s.max_requeue})")
        results[(recipe, seed)] = status
        report(recipe, seed, status)
        if status == DONE and study.executor.commit:
            report(recipe, seed, commit_record(study, recipe, seed))
    return results
