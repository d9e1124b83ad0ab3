"""Fetching the corpora's files over HTTP: resumed after a cut, checked, never half taken as done.

A file is written to ``NAME.part`` and renamed to ``NAME`` only once it is whole: as long as
the server said (``Content-Length``, ``Content-Range``) and, where a digest is known, with
that SHA-256. A cut connection leaves the ``.part`` file, and the next run asks for the rest
(an HTTP range request); a server that ignores ranges sends the whole file again, which
replaces the part. Every failure is one line that names the URL.

Where the files come from: each corpus's public home, or a mirror that holds the same files
under their names, given as a base URL (``base_url`` arguments, or the ``STRUCTNMT_DOWNLOAD_URL``
environment variable). A mirror may publish a ``SHA256SUMS`` file (``sha256sum``'s format)
beside them; its digests are then checked. The tests run this same path against a server on
127.0.0.1.
"""

from __future__ import annotations

import hashlib
import http.client
import os
import urllib.error
import urllib.request
from pathlib import Path

from structnmt.errors import DataError

BASE_URL_ENV = "STRUCTNMT_DOWNLOAD_URL"
CHECKSUMS = "SHA256SUMS"
TIMEOUT_S = 60
_BLOCK = 1 << 16


class DownloadError(DataError):
    """A file could not be fetched whole (the message names its URL)."""


class NotFoundError(DownloadError):
    """The server has no such file (HTTP 404)."""


def base_url(given: str | None = None) -> str | None:
    """The mirror to fetch from: ``given``, else ``$STRUCTNMT_DOWNLOAD_URL``, else None (public homes)."""
    value = given or os.environ.get(BASE_URL_ENV) or None
    return value.rstrip("/") if value else None


def url_of(name: str, public: str, base: str | None) -> str:
    """Where file ``name`` is fetched from: under the mirror ``base`` when there is one."""
    return f"{base}/{name}" if base else public


def _open(url: str, start: int) -> http.client.HTTPResponse:
    headers = {"Range": f"bytes={start}-"} if start else {}
    try:
        return urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=TIMEOUT_S)
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


def fetch(url: str, target: Path, sha256: str | None = None, say=print) -> Path:
    """``target``, downloaded from ``url`` unless it is already there (a finished download).

    Resumes a ``.part`` left by a cut connection; checks the size the server announced and,
    when given, the SHA-256; renames the part to ``target`` only then.
    """
    target = Path(target)
    if target.is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(target.name + ".part")
    have = partial.stat().st_size if partial.is_file() else 0
    try:
        response = _open(url, have)
    except urllib.error.HTTPError:  # 416 on a resume: nothing sensible to append to, start again
        partial.unlink()
        have = 0
        response = _open(url, 0)
    resumed = have > 0 and response.status == 206
    if not resumed:
        have = 0
    say(f"downloading {url}" + (f" (resuming after {have:,} bytes)" if resumed else ""))
    total = _total(response, have)
    cut = None  # why the transfer broke off, if it did (a chunked reply announces no size)
    with response, open(partial, "ab" if resumed else "wb") as handle:
        try:
            while block := response.read(_BLOCK):
                handle.write(block)
                have += len(block)
        except (http.client.HTTPException, OSError) as err:
            partial_bytes = getattr(err, "partial", b"")  # IncompleteRead: what did arrive
            if isinstance(partial_bytes, bytes):
                handle.write(partial_bytes)
                have += len(partial_bytes)
            cut = str(err) or type(err).__name__
    if cut is not None or (total is not None and have != total):
        of = f" of {total:,}" if total is not None else ""
        raise DownloadError(f"the download of {url} stopped after {have:,}{of} bytes "
                            f"({cut or 'the connection closed'}); run the same command again to resume it")
    if sha256 is not None:
        got = sha256_of(partial)
        if got != sha256.lower():
            partial.unlink()
            raise DownloadError(f"{url} has SHA-256 {got}, not the published {sha256.lower()}; the download "
                                "was removed (run again, or fetch it from another mirror)")
    os.replace(partial, target)
    return target


def mirror_checksums(base: str | None) -> dict[str, str]:
    """The mirror's ``SHA256SUMS`` as {file name: digest}; empty without a mirror or without the file."""
    if base is None:
        return {}
    url = f"{base}/{CHECKSUMS}"
    try:
        with _open(url, 0) as response:
            text = response.read().decode("utf-8")
    except NotFoundError:
        return {}
    except http.client.HTTPException as err:
        raise DownloadError(f"cannot download {url}: {err}") from None
    sums = {}
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        parts = line.split()
        if len(parts) != 2 or len(parts[0]) != 64:
            raise DownloadError(f"{url}:{number}: expected 'SHA256  NAME', got {line.strip()[:80]!r}")
        sums[parts[1].lstrip("*")] = parts[0].lower()
    return sums
