"""Atomic file output: write to a temporary file beside the target, flush, fsync, rename.

A crash (or a full disk) at any moment leaves either the old file or the new one,
never a half-written one.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import IO

from structnmt.errors import StructNMTError


class OutputError(StructNMTError):
    """An output path that cannot be written (a directory, under a file, no permission, a full disk)."""


#: kernel interfaces, not storage: a file "written" there is at best refused, at worst a setting changed
KERNEL_FILESYSTEMS = ("proc", "sys")


def check_output_path(path: str | Path, argument: str, directory: bool = False) -> Path:
    """Refuse, before any work, an output file that could not be written; returns it as a Path.

    Every command that writes a path the user named calls this first (one check for all):
    the atomic rename would replace a device such as ``/dev/null`` with a regular file (as
    root), and ``/proc`` or ``/sys`` are the kernel's settings, not a place for outputs. Then
    it tries what :func:`atomic_open` will do: a temporary file in the (nearest existing)
    directory that is to hold it. A full disk can only be found out when writing
    (:func:`output_error`). ``directory``: the path is a directory to write files into.
    """
    path = Path(path)
    if directory:
        if path.exists() and not path.is_dir():
            raise OutputError(f"{argument}: {path} is not a directory; give a directory name")
    elif path.is_dir():
        raise OutputError(f"{argument}: {path} is a directory; give a file name")
    elif path.exists() and not path.is_file():  # a device or a pipe would be replaced by the rename
        raise OutputError(f"{argument}: {path} is not a regular file; give a file name")
    folder = path if directory and path.is_dir() else path.parent
    while not folder.exists():
        folder = folder.parent
    if not folder.is_dir():
        raise OutputError(f"{argument}: {path}: {folder} is a file, not a directory")
    top = Path(os.path.realpath(path)).parts[1:2]  # through symbolic links too: /proc/self, /dev/stdout
    if top and top[0] in KERNEL_FILESYSTEMS:
        raise OutputError(f"{argument}: {path}: cannot write into {folder} (/{top[0]} is the kernel's "
                          "interface, not a place for files); give a path elsewhere")
    try:
        fd, probe = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=folder)
        os.close(fd)
        os.unlink(probe)
    except OSError as err:
        raise OutputError(f"{argument}: {path}: cannot write into {folder} ({err.strerror or err})") from None
    return path


def output_error(path: str | Path, err: OSError) -> OutputError:
    """An OS error met while writing ``path`` as one line naming the path and the reason."""
    return OutputError(f"{path}: cannot write the file ({err.strerror or err}); nothing was written there")


@contextlib.contextmanager
def atomic_open(path: str | Path, mode: str = "w", encoding: str | None = "utf-8") -> Iterator[IO]:
    """Open a temporary file next to ``path``; on success it replaces ``path`` atomically.

    The file gets the mode a plain ``open`` would give it (0666 less the umask), not
    ``mkstemp``'s private 0600: outputs are meant to be read by others.
    """
    path = Path(path)
    if path.exists() and not path.is_file():  # the last net: never replace a device, a pipe or a directory
        raise OutputError(f"{path} is not a regular file; nothing was written there")
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    binary = "b" in mode
    try:
        os.fchmod(fd, 0o666 & ~current_umask())
        with os.fdopen(fd, mode, encoding=None if binary else encoding) as handle:
            yield handle
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def make_temp_dir(prefix: str, suffix: str, dir: str | Path) -> Path:
    """``tempfile.mkdtemp`` with the mode a plain ``mkdir`` would give (0777 less the umask):
    a directory built in it and renamed into place is meant to be read by others."""
    path = Path(tempfile.mkdtemp(prefix=prefix, suffix=suffix, dir=dir))
    os.chmod(path, 0o777 & ~current_umask())
    return path


def current_umask() -> int:
    """The process's umask (reading it means setting it; set straight back)."""
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def same_file(a: str | Path, b: str | Path) -> bool:
    """Whether two paths name one file (same inode), e.g. an output that would replace its input."""
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


def atomic_write_text(path: str | Path, text: str) -> None:
    with atomic_open(path, "w") as handle:
        handle.write(text)


def atomic_write_bytes(path: str | Path, data: bytes) -> None:
    with atomic_open(path, "wb") as handle:
        handle.write(data)


def sha256_file(path: str | Path, chunk: int = 1 << 20) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while block := handle.read(chunk):
            digest.update(block)
    return digest.hexdigest()


def replace_dir(new: str | Path, target: str | Path) -> None:
    """Put the finished directory ``new`` in place of ``target``; the old one is removed only
    once the new one is there. A crash in between leaves ``.NAME.old.PID`` beside it; once a
    new ``target`` stands, every such leftover (this call's and earlier crashes') is superseded
    and is removed."""
    import shutil

    new, target = Path(new), Path(target)
    if target.exists():
        os.replace(target, target.with_name(f".{target.name}.old.{os.getpid()}"))
    os.replace(new, target)
    for old in target.parent.glob(f".{target.name}.old.*"):
        shutil.rmtree(old, ignore_errors=True)
