"""CPU cores that are actually free, and a watch for training that has stalled on busy ones.

PyTorch's intra-op threads meet at a barrier after every operation: with as many threads as
cores, one thread that loses its core to another process holds all the others up. On two
cores with two busy processes beside it, two threads made the demo do 146 updates in three
minutes where one thread would have done about half the idle 1,000 (issue 28). So a run that
may share its machine takes one thread per core that is *free now* (measured from
``/proc/stat`` over half a second), and a watch of the update rate says when it collapses
anyway and what to do about it (every training run's :class:`~structnmt.training.logger.RunLogger`
keeps one).
"""

from __future__ import annotations

import os
import time

from structnmt.wording import counted


def available_cores() -> int:
    """Cores this process may run on (its affinity mask), not those of the whole machine."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def _cpu_times() -> dict[int, tuple[int, int]] | None:
    """{core: (busy, total) jiffies since boot} of every core, from /proc/stat."""
    out = {}
    try:
        with open("/proc/stat", encoding="ascii") as handle:
            for line in handle:
                name, *values = line.split()
                if name.startswith("cpu") and name[3:].isdigit():
                    fields = [int(value) for value in values]
                    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
                    total = sum(fields[:8])  # guest time is already counted in user time
                    out[int(name[3:])] = (total - idle, total)
    except (OSError, ValueError, IndexError):
        return None
    return out or None


def busy_cores(sample_s: float = 0.5) -> float | None:
    """How many of this process's cores other processes keep busy (measured while this one
    sleeps), or None where it cannot be known (no /proc/stat). Not the load average: it lags
    by a minute and counts the whole machine."""
    before = _cpu_times()
    if before is None:
        return None
    time.sleep(sample_s)
    after = _cpu_times()
    if after is None:
        return None
    try:
        mine = os.sched_getaffinity(0)
    except (AttributeError, OSError):
        mine = set(after)
    busy = 0.0
    for core in mine:
        if core in before and core in after and after[core][1] > before[core][1]:
            busy += (after[core][0] - before[core][0]) / (after[core][1] - before[core][1])
    return busy


def choose_threads(sample_s: float = 0.5) -> tuple[int, str]:
    """(intra-op threads for a CPU run, a line saying why): one per free core, at least one."""
    cores = available_cores()
    busy = busy_cores(sample_s)
    if busy is None:
        return cores, f"{counted(cores, 'CPU thread')} (the load of other processes cannot be measured here)"
    free = max(0.0, cores - busy)
    threads = max(1, min(cores, int(free + 0.5)))
    if threads == cores:
        return threads, f"{counted(threads, 'CPU thread')}: all {cores} cores are free"
    return threads, (f"{counted(threads, 'CPU thread')}: other processes keep about {busy:.1f} of the {cores} "
                     "cores busy (more threads than free cores stall each other)")


class StallWatch:
    """Notices when the update rate falls far below the best rate seen so far.

    ``add(step, seconds)`` with the run's step count and elapsed time, as often as convenient;
    returns a warning (once) when the rate over ``patience`` stretches in a row is below
    ``share`` of the best stretch's (one slow stretch may be an epoch's batch planning), else
    None. ``restart()`` after a pause that is not training (a validation).
    """

    def __init__(self, share: float = 0.35, min_steps: int = 20, patience: int = 2) -> None:
        self.share, self.min_steps, self.patience = share, min_steps, patience
        self.last: tuple[int, float] | None = None
        self.best = 0.0
        self.slow = 0  # slow stretches in a row
        self.warned = False

    def restart(self) -> None:
        self.last = None

    def add(self, step: int, seconds: float) -> str | None:
        if self.last is None or step - self.last[0] < self.min_steps or seconds <= self.last[1]:
            if self.last is None:
                self.last = (step, seconds)
            return None
        rate = (step - self.last[0]) / (seconds - self.last[1])
        self.last = (step, seconds)
        self.best = max(self.best, rate)
        self.slow = self.slow + 1 if rate < self.share * self.best else 0
        if self.warned or self.slow < self.patience:
            return None
        self.warned = True
        return (f"training slowed from {self.best:.2f} to {rate:.2f} updates/s: other processes are using the "
                f"CPU cores. It still trains every update, only later; to speed it up, stop them, or set "
                f"training.threads to the number of free cores (1 when in doubt)")
