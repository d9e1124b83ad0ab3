"""Exclusive ownership of a run or dataset directory by one process at a time.

Two ``train`` runs writing one ``out_dir`` interleave their logs and overwrite each other's
checkpoints; two ``prepare`` runs into one ``data.dir`` race to rename their results into
place. Both therefore hold a :class:`DirectoryLock` while they write. Readers (trainings
that read a dataset, ``test``, ``translate``) take no lock and are never blocked.

The lock is ``fcntl.flock`` on a file *beside* the directory (``.NAME.lock``): ``prepare``
replaces its directory whole, so a lock inside it would be swapped away. The kernel drops
the lock when its holder dies, however it dies; the holder's PID, host and start time are
written into the file so that a refusal names who holds it, and so that a lock file still
holding a record when it is taken tells us its last holder died without cleaning up. A
holder that finishes, or fails, removes the file: nothing is left beside the directory.
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
import time
from pathlib import Path
from types import TracebackType

from structnmt.errors import StructNMTError


class LockedError(StructNMTError):
    """Another live process holds the directory."""


def lock_file(directory: str | Path) -> Path:
    directory = Path(directory).absolute()
    return directory.parent / f".{directory.name}.lock"


class DirectoryLock:
    """``with DirectoryLock(dir, "training"):`` or ``acquire()``/``release()``.

    ``messages`` receives what the lock has to say (taking over a dead holder's lock).
    """

    def __init__(self, directory: str | Path, purpose: str, messages=print) -> None:
        self.directory = Path(directory)
        self.path = lock_file(directory)
        self.purpose = purpose
        self.messages = messages
        self._fd: int | None = None

    def acquire(self) -> DirectoryLock:
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as err:  # an unwritable directory, or a file where a directory should be
            raise StructNMTError(f"{self.directory}: cannot create its lock file {self.path} "
                                 f"({err.strerror or err}); choose a directory you can write to") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _read_holder(fd)
            os.close(fd)
            raise LockedError(
                f"{self.directory} is in use by another process ({_describe(holder)}); "
                "wait for it to finish or choose another directory") from None
        if not _is_at(fd, self.path):  # its holder removed it on release after we opened it: take the new one
            os.close(fd)
            return self.acquire()
        previous = _read_holder(fd)
        if previous:
            self.messages(f"{self.directory}: taking over the lock left by {_describe(previous)}, "
                          "which is no longer running")
        record = {"pid": os.getpid(), "host": socket.gethostname(), "purpose": self.purpose,
                  "since": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
        os.ftruncate(fd, 0)
        os.pwrite(fd, (json.dumps(record) + "\n").encode(), 0)
        self._fd = fd
        return self

    def release(self) -> None:
        if self._fd is None:
            return
        # removed while still held, so that nothing is left beside the directory; a process that
        # opened this inode before then finds, once it holds it, that it is no longer at the path
        # (``_is_at``) and takes the path's new file instead
        os.ftruncate(self._fd, 0)
        if _is_at(self._fd, self.path):
            self.path.unlink()
        fcntl.flock(self._fd, fcntl.LOCK_UN)
        os.close(self._fd)
        self._fd = None

    @property
    def held(self) -> bool:
        return self._fd is not None

    def __enter__(self) -> DirectoryLock:
        return self.acquire()

    def __exit__(self, kind: type[BaseException] | None, value: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.release()


def holder(directory: str | Path) -> dict | None:
    """Who holds ``directory`` now (its record), or None when nobody does; takes no lock."""
    path = lock_file(directory)
    if not path.is_file():
        return None
    fd = os.open(path, os.O_RDONLY)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return _read_holder(fd) or {"pid": "?", "host": "?"}
        fcntl.flock(fd, fcntl.LOCK_UN)
        return None
    finally:
        os.close(fd)


def _is_at(fd: int, path: Path) -> bool:
    """Whether the open file ``fd`` is the file now at ``path`` (same device and inode)."""
    try:
        here = os.stat(path)
    except FileNotFoundError:
        return False
    mine = os.fstat(fd)
    return (mine.st_dev, mine.st_ino) == (here.st_dev, here.st_ino)


def _read_holder(fd: int) -> dict | None:
    raw = os.pread(fd, 4096, 0).decode("utf-8", errors="replace").strip()
    if not raw:
        return None
    try:
        record = json.loads(raw)
    except ValueError:
        return {"raw": raw[:80]}
    return record if isinstance(record, dict) else {"raw": raw[:80]}


def _describe(record: dict | None) -> str:
    if not record:
        return "unknown holder"
    if "pid" in record:
        what = f" ({record['purpose']})" if record.get("purpose") else ""
        return f"PID {record['pid']} on {record.get('host', '?')}{what} since {record.get('since', '?')}"
    return record.get("raw", "unknown holder")
