"""Child processes that end with their parent (Linux ``PR_SET_PDEATHSIG``).

Study runs and batch-collating workers both hold files their parent owns (a run directory's lock,
a study's records): if the parent dies, however it dies, they must not live on."""
from __future__ import annotations

import ctypes
import os
from typing import Any

PR_SET_PDEATHSIG = 1


def libc_prctl() -> Any:
    """libc's ``prctl``, or None off Linux. Load it in the parent: loading a library after a fork
    of a threaded process can deadlock."""
    try:
        return ctypes.CDLL("libc.so.6", use_errno=True).prctl
    except OSError:
        return None


def die_with_parent(prctl: Any, signal_number: int, parent: int) -> bool:
    """In a child: ask the kernel for ``signal_number`` when the parent dies. False when the
    parent (pid ``parent``) died before the request, so the caller stops now."""
    if prctl is None:
        return True
    prctl(PR_SET_PDEATHSIG, signal_number)
    return os.getppid() == parent
