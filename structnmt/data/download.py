"""Fetching the corpora's files over HTTP: resumed after a cut, checked, never half taken as done.

A file is written to ``NAME.part`` and renamed to ``NAME`` only once it is whole: as long as
the server said (``Content-Length``, ``Content-Range``) and, where a digest is known, with
that SHA-256. A cut connection leaves the ``.part`` file, and the next run asks for the rest
(an HTTP range request); a server that ignores ranges sends the whole file again, which
replaces the part. Every failure is one line that names the URL.

What is renamed into place is verified first: against the published SHA-256 when there is one,
otherwise by reading a ``.gz``/``.tgz`` whole (gzip's CRC, the tar headers), because a cut reply
that announced no size, or an HTML error page sent as the file, would otherwise be taken as done
and never fetched again. What fails is removed, with a message saying so. A file already in
place is checked again (its digest when published, else its first bytes) and fetched again when
it fails. Each file has a total deadline (``$STRUCTNMT_DOWNLOAD_DEADLINE`` seconds, default
:data:`DEADLINE_S`; the part is kept for the rerun to resume), and a transfer prints a progress
line every :data:`PROGRESS_EVERY_S` seconds, so that a server trickling bytes is neither silent
nor endless.

Where the files come from: each corpus's public home, or a mirror that holds the same files
under their names, given as a base URL (``base_url`` arguments, or the ``STRUCTNMT_DOWNLOAD_URL``
environment variable). A mirror may publish a ``SHA256SUMS`` file (``sha256sum``'s format)
beside them; its digests are then checked. The tests run this same path against a server on
127.0.0.1.
"""

from __future__ import annotations

import gzip
import hashlib
import http.client
import math
import os
import tarfile
import time
import urllib.error
import urllib.request
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

from structnmt.errors import ConfigError, DataError

BASE_URL_ENV = "STRUCTNMT_DOWNLOAD_URL"
CHECKSUMS = "SHA256SUMS"
TIMEOUT_S = 60  # per read: a server silent this long is a cut
#: the environment variable that sets the per-file deadline (seconds)
DEADLINE_ENV = "STRUCTNMT_DOWNLOAD_DEADLINE"
#: a file's whole transfer may take this long (an hour: the largest WMT14 archive at about 250 kB/s);
#: past it the part is kept and the rerun resumes it
DEADLINE_S = 3600.0
PROGRESS_EVERY_S = 10.0  # a progress line this often while a file arrives
_BLOCK = 1 << 16
_MAX_CHECKSUMS = 1 << 24  # bytes of a SHA256SUMS file (about 170,000 lines)


class DownloadError(DataError):
    """A file could not be fetched whole (the message names its URL)."""


class NotFoundError(DownloadError):
    """The server has no such file (HTTP 404)."""


def check_local_copy(folder: str | Path, holding: str) -> None:
    """Refuse a ``--from`` folder that is not there (or not a folder), saying so, rather than as
    a file it should hold that "is not here"; ``holding`` says what it was to hold."""
    if not Path(folder).is_dir():
        what = "is not a folder" if Path(folder).exists() else "no such folder"
        raise DataError(f"{what} ({holding})", folder)


def base_url(given: str | None = None) -> str | None:
    """The mirror to fetch from: ``given``, else ``$STRUCTNMT_DOWNLOAD_URL``, else None (public homes)."""
    value = given or os.environ.get(BASE_URL_ENV) or None
    return value.rstrip("/") if value else None


def url_of(name: str, public: str, base: str | None) -> str:
    """Where file ``name`` is fetched from: under the mirror ``base`` when there is one."""
    return f"{base}/{name}" if base else public


def deadline_s(given: float | None = None) -> float:
    """Seconds one file's transfer may take: ``given``, else ``$STRUCTNMT_DOWNLOAD_DEADLINE``, else
    :data:`DEADLINE_S` (an unreadable value is refused, not replaced by the default)."""
    value = given if given is not None else os.environ.get(DEADLINE_ENV) or None
    if value is None:
        return DEADLINE_S
    try:
        seconds = float(value)
    except ValueError:
        seconds = math.nan
    if not (math.isfinite(seconds) and seconds > 0):
        raise ConfigError(f"expected a positive number of seconds, got {value!r}",
                          "deadline" if given is not None else f"${DEADLINE_ENV}")
    return seconds


def _open(url: str, start: int, timeout: float = TIMEOUT_S) -> http.client.HTTPResponse:
    headers = {"Range": f"bytes={start}-"} if start else {}
    try:
        return urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=timeout)
    except urllib.error.HTTPError as err:
        if err.code == 404:
            raise NotFoundError(f"cannot download {url}: HTTP 404 {err.reason}") from None
        if err.code == 416 and start:  # the part is already as long as the file (or longer)
            raise
        raise DownloadError(f"cannot download {url}: HTTP {err.code} {err.reason}") from None
    except (urllib.error.URLError, OSError) as err:
        reason = getattr(err, "reason", None) or err
        raise DownloadError(f"cannot download {url}: {reason}") from None


def _total(response: http.client.HTTPResponse, start: int) -> int | None:
    """The whole file's size the server announced, or None when it did not say."""
    content_range = response.headers.get("Content-Range", "")
    if response.status == 206 and "/" in content_range and not content_range.endswith("/*"):
        return int(content_range.rsplit("/", 1)[1])
    length = response.headers.get("Content-Length")
    return int(length) + start if length is not None else None


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while block := handle.read(1 << 20):
            digest.update(block)
    return digest.hexdigest()


def damage(path: Path, whole: bool = True) -> str | None:
    """Why ``path`` is not the whole archive its name promises (``.gz``, ``.tgz``, ``.tar.gz``), or None.

    ``whole``: read it all (gzip's CRC and length, every tar header), which finds a cut; otherwise
    only its first bytes, which find an error page saved under the archive's name.
    """
    name = path.name.removesuffix(".part")
    if not name.endswith((".gz", ".tgz")):
        return None
    with open(path, "rb") as handle:
        head = handle.read(16)
    if head[:2] != b"\x1f\x8b":
        return f"is not a gzip archive (it begins {head!r})" if head else "is empty"
    if not whole:
        return None
    try:
        with gzip.open(path, "rb") as unzipped:
            if name.endswith((".tgz", ".tar.gz")):
                with tarfile.open(fileobj=unzipped, mode="r|") as tar:
                    for _ in tar:  # stream mode: each header read, the data skipped over
                        pass
            while unzipped.read(1 << 20):  # to the end, where gzip checks its CRC and length
                pass
    except (OSError, EOFError, zlib.error, tarfile.TarError) as err:
        return f"is not a whole {'tar.gz' if name.endswith(('.tgz', '.tar.gz')) else 'gzip'} archive ({err})"
    return None


def _in_place(target: Path, sha256: str | None, say: Callable[[str], object]) -> bool:
    """Whether ``target`` is a finished download to keep; a damaged one (an older structnmt renamed
    files unverified) is removed, said, and fetched again."""
    if not target.is_file():
        return False
    if sha256 is not None:
        got = sha256_of(target)
        why = None if got == sha256.lower() else f"has SHA-256 {got}, not the published {sha256.lower()}"
    else:
        why = damage(target, whole=False)
    if why is None:
        return True
    target.unlink()
    say(f"{target} {why}: removed, downloading it again")
    return False


def _clock(seconds: float) -> str:
    seconds = int(seconds)
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


def _open_resuming(url: str, partial: Path, timeout: float) -> tuple[http.client.HTTPResponse, int]:
    """The server's reply and how many bytes of ``partial`` it continues (0: start afresh)."""
    have = partial.stat().st_size if partial.is_file() else 0
    try:
        response = _open(url, have, timeout)
    except urllib.error.HTTPError:  # 416 on a resume: nothing sensible to append to, start again
        partial.unlink()
        have = 0
        response = _open(url, 0, timeout)
    return response, have if have > 0 and response.status == 206 else 0


def _transfer(response: http.client.HTTPResponse, handle: BinaryIO, have: int, total: int | None,
              started: float, limit: float, name: str, say: Callable[[str], object]) -> tuple[int, str | None, bool]:
    """Copy the reply into ``handle``: the bytes then held, why it broke off (or None), and
    whether the deadline (``limit`` seconds after ``started``, before the request) stopped it."""
    of = f" of {total:,}" if total is not None else ""
    first, shown = have, started
    try:
        # read1: whatever has arrived, so that a server trickling bytes still meets the deadline
        while block := response.read1(_BLOCK):
            handle.write(block)
            have += len(block)
            now = time.monotonic()
            if now - started > limit and (total is None or have < total):
                return have, None, True
            if now - shown >= PROGRESS_EVERY_S:
                shown = now
                share = f" ({100 * have / total:.0f}%)" if total else ""
                rate = (have - first) / 1e3 / max(now - started, 1e-9)
                say(f"  {name}: {have:,}{of} bytes{share}, {rate:,.1f} kB/s, {_clock(now - started)} elapsed")
    except (http.client.HTTPException, OSError) as err:
        partial_bytes = getattr(err, "partial", b"")  # IncompleteRead: what did arrive
        if isinstance(partial_bytes, bytes):
            handle.write(partial_bytes)
            have += len(partial_bytes)
        return have, str(err) or type(err).__name__, False
    return have, None, False


def _check_whole(url: str, partial: Path, sha256: str | None) -> None:
    """Refuse (and remove) a finished part whose SHA-256 or archive is wrong."""
    if sha256 is not None:
        got = sha256_of(partial)
        if got != sha256.lower():
            partial.unlink()
            raise DownloadError(f"{url} has SHA-256 {got}, not the published {sha256.lower()}; the download "
                                "was removed (run again, or fetch it from another mirror)")
    elif (why := damage(partial)) is not None:
        partial.unlink()
        raise DownloadError(f"{url} {why}; the download was removed (run again, or fetch it from another "
                            "mirror: --base-url)")


def fetch(url: str, target: Path, sha256: str | None = None, say: Callable[[str], object] = print,
          deadline: float | None = None) -> Path:
    """``target``, downloaded from ``url`` unless it is already there (a finished download).

    Resumes a ``.part`` left by a cut connection; checks the size the server announced and the
    SHA-256 when given, else that an archive reads whole (:func:`damage`); renames the part to
    ``target`` only then, and removes a part that fails. ``deadline``: seconds the transfer may
    take (default ``$STRUCTNMT_DOWNLOAD_DEADLINE``, else :data:`DEADLINE_S`); past it the part is
    kept for the rerun. A progress line is said every :data:`PROGRESS_EVERY_S` seconds.
    """
    target = Path(target)
    limit = deadline_s(deadline)
    if _in_place(target, sha256, say):
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(target.name + ".part")
    started = time.monotonic()
    response, have = _open_resuming(url, partial, min(TIMEOUT_S, limit))
    say(f"downloading {url}" + (f" (resuming after {have:,} bytes)" if have else ""))
    total = _total(response, have)
    of = f" of {total:,}" if total is not None else ""
    with response, open(partial, "ab" if have else "wb") as handle:
        have, cut, late = _transfer(response, handle, have, total, started, limit, target.name, say)
    if late:
        raise DownloadError(f"the download of {url} stopped after {have:,}{of} bytes: it took longer than the "
                            f"deadline of {limit:g} s; run the same command again to resume it, or allow more time "
                            f"with {DEADLINE_ENV}=SECONDS")
    if cut is not None or (total is not None and have != total):
        raise DownloadError(f"the download of {url} stopped after {have:,}{of} bytes "
                            f"({cut or 'the connection closed'}); run the same command again to resume it")
    _check_whole(url, partial, sha256)
    os.replace(partial, target)
    return target


def mirror_checksums(base: str | None) -> dict[str, str]:
    """The mirror's ``SHA256SUMS`` as {file name: digest}; empty without a mirror or without the file."""
    if base is None:
        return {}
    url = f"{base}/{CHECKSUMS}"
    limit, started, data = deadline_s(), time.monotonic(), b""
    try:
        with _open(url, 0, min(TIMEOUT_S, limit)) as response:
            while block := response.read1(_BLOCK):  # bounded in time and size, as every file is
                data += block
                if time.monotonic() - started > limit or len(data) > _MAX_CHECKSUMS:
                    raise DownloadError(f"cannot download {url}: more than {_MAX_CHECKSUMS:,} bytes, or longer "
                                        f"than the deadline of {limit:g} s (${DEADLINE_ENV})")
        text = data.decode("utf-8")
    except NotFoundError:
        return {}
    except (http.client.HTTPException, OSError) as err:
        raise DownloadError(f"cannot download {url}: {err or type(err).__name__}") from None
    except UnicodeDecodeError:
        raise DownloadError(f"{url}: not a SHA256SUMS file (not UTF-8 text)") from None
    sums = {}
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        parts = line.split()
        if len(parts) != 2 or len(parts[0]) != 64:
            raise DownloadError(f"{url}:{number}: expected 'SHA256  NAME', got {line.strip()[:80]!r}")
        sums[parts[1].lstrip("*")] = parts[0].lower()
    return sums
