"""Progress of a long ``prepare`` stage: a tqdm bar on a terminal, plain lines in a log.

A bar redrawn with carriage returns is unreadable in a SLURM log or a pipe, so when standard
output is not a terminal the stage prints one line every ``every`` seconds instead (count,
rate and, when the total is known, the share done and the time left), and a last line when
it ends if it ran long enough to have printed any.
"""

from __future__ import annotations

import sys
import time
from types import TracebackType


def _clock(seconds: float) -> str:
    seconds = int(seconds)
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


class Progress:
    """``with Progress("train: encode", total=n, unit="pairs") as bar: ... bar.update(k)``."""

    def __init__(self, desc: str, total: int | None = None, unit: str = "lines", enabled: bool = True,
                 every: float = 30.0, tty: bool | None = None) -> None:
        self.desc, self.total, self.unit, self.every = desc, total, unit, every
        self.enabled = enabled
        self.done = 0
        self.started = self.last = time.monotonic()
        self.printed = False
        self.bar = None
        if enabled and (sys.stdout.isatty() if tty is None else tty):
            from tqdm import tqdm

            self.bar = tqdm(total=total, desc=desc, unit=f" {unit}", unit_scale=True, dynamic_ncols=True,
                            mininterval=0.5, file=sys.stderr)

    def update(self, n: int = 1) -> None:
        self.done += n
        if self.bar is not None:
            self.bar.update(n)
            return
        if self.enabled and (now := time.monotonic()) - self.last >= self.every:
            self.last = now
            self._line(now)

    def _line(self, now: float) -> None:
        elapsed = max(now - self.started, 1e-9)
        rate = self.done / elapsed
        text = f"{self.desc}: {self.done:,}"
        if self.total:
            text += f"/{self.total:,} {self.unit} ({100 * self.done / self.total:.0f}%)"
        else:
            text += f" {self.unit}"
        text += f", {rate:,.0f} {self.unit}/s, {_clock(elapsed)} elapsed"
        if self.total and rate > 0 and self.done < self.total:
            text += f", about {_clock((self.total - self.done) / rate)} left"
        print(text, flush=True)
        self.printed = True

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None
        elif self.printed:
            self._line(time.monotonic())
            self.printed = False

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, kind: type[BaseException] | None, value: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()
