"""``structnmt download`` and ``structnmt prepare multi30k`` end to end against an HTTP server on
127.0.0.1 that the test starts, serving small archives built in the published layouts.

The base URL goes through ``$STRUCTNMT_DOWNLOAD_URL`` (``--base-url`` in one test), the same path a
user's mirror takes.
Covered: success (the files land where the recipes read them), a connection cut mid-file (no
half file is taken as done, the rerun resumes with a range request, or restarts when the
server ignores ranges), a 404 and a checksum mismatch (one-line errors naming the URL).

Also (issue 28, item 8): an error page sent as an archive, or a reply cut short that announced no
size at all, is verified before it is renamed (removed, and a good mirror then serves it); a
damaged file an older structnmt left in place is fetched again; a server trickling a byte at a
time meets the per-file deadline (``$STRUCTNMT_DOWNLOAD_DEADLINE``) with progress lines on the way,
and the rerun resumes.

Checked against the bugs: with the size check in ``download.fetch`` removed, the cut tests
fail (the half archive is renamed as done and the rerun has nothing to resume); with only the
size checked, a chunked reply (no size announced) cut short is taken as done ("cannot read
the archive" instead of a resumable cut); with the
digest check removed, the mismatch test fails; with ``multi30k`` skipping any failed split
(as it did) rather than a 404 only, ``test_multi30k_stops_on_a_cut_test_split`` fails.
"""

from __future__ import annotations

import gzip
import hashlib
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from structnmt.cli.main import main
from structnmt.config import load_config
from structnmt.data import download
from structnmt.data.download import BASE_URL_ENV, CHECKSUMS, DEADLINE_ENV
from structnmt.errors import ConfigError
from tests.test_corpora import tgz

CONFIGS = Path(__file__).resolve().parents[1] / "configs"


class Mirror:
    """A tiny HTTP server: ``files`` by name, optional range support, cuts and stand-ins served once."""

    def __init__(self, files: dict[str, bytes], ranges: bool = True) -> None:
        self.files = {f"mirror/{name}": body for name, body in files.items()}  # served under /mirror/
        self.ranges = ranges
        self.cut: dict[str, int] = {}  # name -> bytes sent before the connection is dropped (once)
        self.chunked: set[str] = set()  # names sent with chunked transfer encoding (no size announced)
        self.unsized: set[str] = set()  # names sent with no size at all: the body ends where the connection does
        self.slow: dict[str, float] = {}  # name -> seconds between bytes (one byte at a time, from the start)
        self.closing = threading.Event()  # ends a slow reply when the test is done
        self.requests: list[tuple[str, str | None]] = []  # (name, Range header)
        mirror = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # chunked replies need it

            def log_message(self, *args) -> None:
                pass

            def send_chunked(self, body: bytes, stop: int | None) -> None:
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                for k in range(0, len(body), 100):
                    piece = body[k:k + 100]
                    if stop is not None and k + len(piece) > stop:  # the connection drops inside this chunk
                        self.wfile.write(b"%x\r\n" % len(piece) + piece[: stop - k])
                        self.close_connection = True
                        return
                    self.wfile.write(b"%x\r\n" % len(piece) + piece + b"\r\n")
                self.wfile.write(b"0\r\n\r\n")

            def do_GET(self) -> None:  # noqa: N802 (http.server's name)
                name = self.path.lstrip("/")
                mirror.requests.append((name, self.headers.get("Range")))
                body = mirror.files.get(name)
                if body is None:
                    self.send_error(404, "Not Found")
                    return
                if name in mirror.chunked and not self.headers.get("Range"):
                    self.send_response(200)
                    self.send_chunked(body, mirror.cut.pop(name, None))
                    return
                if name in mirror.unsized and not self.headers.get("Range"):
                    self.send_response(200)
                    self.send_header("Connection", "close")
                    self.end_headers()
                    self.wfile.write(body[:mirror.cut.pop(name, None)])
                    self.close_connection = True
                    return
                if name in mirror.slow:
                    self.send_response(200)
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    for k in range(len(body)):  # bounded: one byte a step, until the client hangs up
                        if mirror.closing.wait(mirror.slow[name] if k else 0):
                            break
                        try:
                            self.wfile.write(body[k:k + 1])
                        except OSError:
                            break
                    self.close_connection = True
                    return
                start = 0
                wanted = self.headers.get("Range")
                if mirror.ranges and wanted and wanted.startswith("bytes="):
                    start = int(wanted[6:].split("-")[0])
                    if start >= len(body):
                        self.send_error(416, "Range Not Satisfiable")
                        return
                    self.send_response(206)
                    self.send_header("Content-Range", f"bytes {start}-{len(body) - 1}/{len(body)}")
                else:
                    self.send_response(200)
                self.send_header("Content-Length", str(len(body) - start))
                self.end_headers()
                stop = mirror.cut.pop(name, None)
                self.wfile.write(body[start:stop] if stop is not None else body[start:])
                if stop is not None:
                    self.wfile.flush()
                    self.close_connection = True

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/mirror"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def publish_checksums(self) -> None:
        lines = [f"{hashlib.sha256(body).hexdigest()}  {name.split('/', 1)[1]}\n" for name, body in self.files.items()]
        self.files[f"mirror/{CHECKSUMS}"] = "".join(lines).encode()

    def __enter__(self) -> Mirror:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.closing.set()
        self.server.shutdown()
        self.server.server_close()


def _tgz_bytes(members: dict[str, str], tmp: Path, name: str) -> bytes:
    tgz(tmp / name, members)
    return (tmp / name).read_bytes()


def wmt14_archives(tmp: Path) -> dict[str, bytes]:
    """The five WMT14 archives in their published layouts, with a few lines each (and padding, so
    that a cut lands mid-file)."""
    filler = "".join(f"filler line {k} of a bigger file\n" for k in range(400))
    seg = '<doc>\n<seg id="1"> A test. </seg>\n<seg id="2">Two</seg>\n</doc>\n'
    members = {
        "training-parallel-europarl-v7.tgz": {"training/europarl-v7.de-en.en": "e1\ne2\n",
                                              "training/europarl-v7.de-en.de": "d1\nd2\n",
                                              "training/europarl-v7.fr-en.en": filler},
        "training-parallel-commoncrawl.tgz": {"commoncrawl.de-en.en": "c1\n", "commoncrawl.de-en.de": "k1\n"},
        "training-parallel-nc-v9.tgz": {"training/news-commentary-v9.de-en.en": "n1\n",
                                        "training/news-commentary-v9.de-en.de": "m1\n"},
        "dev.tgz": {"dev/newstest2013.en": "dev en\n", "dev/newstest2013.de": "dev de\n", "dev/README": filler},
        "test-full.tgz": {"test-full/newstest2014-deen-src.en.sgm": seg,
                          "test-full/newstest2014-deen-ref.de.sgm": seg.replace("test", "Test")},
    }
    return {name: _tgz_bytes(m, tmp, name) for name, m in members.items()}


def iwslt14_archive(tmp: Path) -> dict[str, bytes]:
    de = "\n".join(["<url>http://x</url>"] + [f"Das ist Satz Nummer {k} ." for k in range(1, 47)]) + "\n"
    en = "\n".join(["<url>http://x</url>"] + [f"This is sentence number {k} ." for k in range(1, 47)]) + "\n"
    members = {"de-en/train.tags.de-en.de": de, "de-en/train.tags.de-en.en": en}
    for name in ["IWSLT14.TED.dev2010", "IWSLT14.TEDX.dev2012", "IWSLT14.TED.tst2010", "IWSLT14.TED.tst2011",
                 "IWSLT14.TED.tst2012"]:
        for lang in ("de", "en"):
            members[f"de-en/{name}.de-en.{lang}.xml"] = f'<doc>\n<seg id="1"> {name} {lang} </seg>\n</doc>\n'
    return {"de-en.tgz": _tgz_bytes(members, tmp, "de-en.tgz")}


def multi30k_files() -> dict[str, bytes]:
    """Multi30k task 1's raw files as its repository publishes them (``SPLIT.LANG.gz``), en and de."""
    words = ["a", "dog", "man", "woman", "runs", "sits", "on", "the", "grass", "in", "red", "shirt", "street"]
    files = {}
    for split, n in (("train", 60), ("val", 8), ("test_2016_flickr", 8), ("test_2017_flickr", 6),
                     ("test_2017_mscoco", 6)):
        for lang in ("en", "de"):
            lines = [" ".join(words[(k + i) % len(words)] for i in range(3 + k % 5)) + (" ." if lang == "en" else
                                                                                        " !") for k in range(n)]
            files[f"{split}.{lang}.gz"] = gzip.compress(("\n".join(lines) + "\n").encode(), mtime=0)
    return files


def run(args: list[str], capsys: pytest.CaptureFixture) -> tuple[int, str]:
    code = main(args)
    return code, capsys.readouterr().err


@pytest.fixture
def at(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    """Points ``$STRUCTNMT_DOWNLOAD_URL`` at a mirror and runs in ``tmp_path`` (the recipes' paths are relative)."""
    monkeypatch.chdir(tmp_path)

    def use(mirror: Mirror) -> Mirror:
        monkeypatch.setenv(BASE_URL_ENV, mirror.url)
        return mirror
    return use


def test_wmt14_download_lands_where_the_recipe_reads(tmp_path, at, capsys):
    archives = wmt14_archives(tmp_path)
    with at(Mirror(archives)) as mirror:
        mirror.publish_checksums()
        code, err = run(["download", "wmt14-en-de", "--out", "data/raw/wmt14_en_de"], capsys)
    assert code == 0, err
    data = load_config(CONFIGS / "wmt14_en_de_transformer.yaml").data
    for split in data.splits.values():
        assert Path(split.src).is_file() and Path(split.tgt).is_file(), split
    assert Path(data.splits["train"].src).read_text() == "e1\ne2\nc1\nn1\n"
    assert Path("data/raw/wmt14_en_de/newstest2014.de").read_text() == "A Test.\nTwo\n"
    downloads = Path("data/raw/wmt14_en_de/downloads")
    assert sorted(p.name for p in downloads.iterdir()) == sorted(archives)  # no .part left
    assert all((downloads / n).read_bytes() == body for n, body in archives.items())


def test_iwslt14_download_lands_where_the_recipe_reads(tmp_path, at, capsys, monkeypatch):
    with Mirror(iwslt14_archive(tmp_path)) as mirror:
        monkeypatch.setenv(BASE_URL_ENV, "http://127.0.0.1:9/nothing-here")  # --base-url wins over it
        code, err = run(["download", "iwslt14-de-en", "--out", "data/raw/iwslt14_de_en", "--base-url", mirror.url],
                        capsys)
    assert code == 0, err
    data = load_config(CONFIGS / "iwslt14_de_en_transformer.yaml").data
    assert {name: len(Path(s.src).read_text().splitlines()) for name, s in data.splits.items()} == {
        "train": 44, "valid": 2, "test": 5}


@pytest.mark.parametrize("ranges", [True, False], ids=["resumes", "restarts"])
def test_a_cut_connection_leaves_no_file_taken_as_done_and_the_rerun_finishes(tmp_path, at, capsys, ranges):
    archives = wmt14_archives(tmp_path)
    dev = archives["dev.tgz"]
    with at(Mirror(archives, ranges=ranges)) as mirror:
        mirror.publish_checksums()
        mirror.cut["mirror/dev.tgz"] = len(dev) // 2
        code, err = run(["download", "wmt14-en-de", "--out", "out"], capsys)
        assert code == 2
        assert err.count("\n") == 1 and f"{mirror.url}/dev.tgz stopped after {len(dev) // 2:,} of {len(dev):,}" in err
        assert not Path("out/downloads/dev.tgz").exists() and Path("out/downloads/dev.tgz.part").exists()
        assert not Path("out/newstest2013.en").exists()

        code, err = run(["download", "wmt14-en-de", "--out", "out"], capsys)
        assert code == 0, err
        asked = [r for name, r in mirror.requests if name == "mirror/dev.tgz"]
        assert asked == [None, f"bytes={len(dev) // 2}-"]  # the rerun asked for the rest only
        before = [name for name, _ in mirror.requests].count("mirror/training-parallel-europarl-v7.tgz")
        assert before == 1  # finished files are not fetched again
    assert Path("out/downloads/dev.tgz").read_bytes() == dev
    assert not Path("out/downloads/dev.tgz.part").exists()
    assert Path("out/newstest2013.en").read_text() == "dev en\n"


def test_a_cut_reply_without_a_size_is_not_taken_as_done(tmp_path, at, capsys):
    archive = iwslt14_archive(tmp_path)["de-en.tgz"]
    with at(Mirror({"de-en.tgz": archive})) as mirror:
        mirror.chunked.add("mirror/de-en.tgz")
        mirror.cut["mirror/de-en.tgz"] = 250  # two whole chunks of 100 bytes, then half of the third
        code, err = run(["download", "iwslt14-de-en", "--out", "out"], capsys)
        # every byte that arrived is kept, half a chunk too (read1 hands it over), and resumed after
        assert code == 2 and err.count("\n") == 1 and f"{mirror.url}/de-en.tgz stopped after 250 bytes (" in err
        assert not Path("out/downloads/de-en.tgz").exists()
        code, err = run(["download", "iwslt14-de-en", "--out", "out"], capsys)
    assert code == 0, err
    assert Path("out/downloads/de-en.tgz").read_bytes() == archive


def test_a_missing_file_is_one_line_naming_its_url(tmp_path, at, capsys):
    archives = wmt14_archives(tmp_path)
    del archives["test-full.tgz"]
    with at(Mirror(archives)) as mirror:
        code, err = run(["download", "wmt14-en-de", "--out", "out"], capsys)
    assert code == 2 and err.count("\n") == 1
    assert err == f"error: cannot download {mirror.url}/test-full.tgz: HTTP 404 Not Found\n"
    assert not list(Path("out/downloads").glob("test-full*"))


def test_a_checksum_mismatch_is_one_line_naming_its_url_and_keeps_nothing(tmp_path, at, capsys):
    with at(Mirror(iwslt14_archive(tmp_path))) as mirror:
        mirror.publish_checksums()
        good = mirror.files["mirror/de-en.tgz"]
        mirror.files["mirror/de-en.tgz"] = good[:-1] + bytes([good[-1] ^ 1])  # one bit flipped
        code, err = run(["download", "iwslt14-de-en", "--out", "out"], capsys)
        assert code == 2 and err.count("\n") == 1
        assert err.startswith(f"error: {mirror.url}/de-en.tgz has SHA-256 ")
        assert hashlib.sha256(good).hexdigest() in err
        assert not list(Path("out/downloads").iterdir())
        mirror.files["mirror/de-en.tgz"] = good  # the mirror repaired: the rerun goes through
        code, err = run(["download", "iwslt14-de-en", "--out", "out"], capsys)
    assert code == 0, err


def test_prepare_multi30k_downloads_and_prepares(tmp_path, at, capsys):
    with at(Mirror(multi30k_files())) as mirror:
        mirror.publish_checksums()
        del mirror.files["mirror/test_2017_mscoco.de.gz"]  # as for Czech: a split a language lacks is left out
        code, err = run(["prepare", "multi30k", "--pair", "en-de", "--out", "data/m30k"], capsys)
    assert code == 0, err
    raw = Path("data/m30k_raw/raw")
    assert sorted(p.name for p in raw.iterdir()) == sorted(n for n in multi30k_files() if n != "test_2017_mscoco.de.gz")
    meta = (Path("data/m30k") / "meta.json").read_text()
    assert '"train"' in meta and '"test_2016_flickr"' in meta and "test_2017_mscoco" not in meta


def test_multi30k_stops_on_a_cut_test_split(tmp_path, at, capsys):
    files = multi30k_files()
    with at(Mirror(files)) as mirror:
        mirror.cut["mirror/test_2016_flickr.de.gz"] = 10
        code, err = run(["prepare", "multi30k", "--pair", "en-de", "--out", "data/m30k"], capsys)
        assert code == 2 and err.count("\n") == 1 and f"{mirror.url}/test_2016_flickr.de.gz stopped after 10" in err
        code, err = run(["prepare", "multi30k", "--pair", "en-de", "--out", "data/m30k"], capsys)
    assert code == 0, err
    assert gzip.decompress(Path("data/m30k_raw/raw/test_2016_flickr.de.gz").read_bytes()).count(b"\n") == 8


def test_without_a_mirror_the_public_homes_are_asked(monkeypatch):
    from structnmt.data import corpora, multi30k
    from structnmt.data.download import base_url, url_of

    monkeypatch.delenv(BASE_URL_ENV, raising=False)
    assert base_url() is None
    assert url_of("dev.tgz", corpora.WMT14_ARCHIVES["dev.tgz"], None) == "http://statmt.org/wmt14/dev.tgz"
    monkeypatch.setenv(BASE_URL_ENV, "http://mirror.example/nmt/")
    assert url_of("train.en.gz", multi30k.URL.format(name="train.en.gz"), base_url()) == \
        "http://mirror.example/nmt/train.en.gz"
    assert base_url("http://other/") == "http://other"  # an explicit base wins over the variable


# ---------------------------------------------------------------------------
# issue 28, item 8: verified before renaming; a deadline and progress lines


def test_an_error_page_sent_as_the_archive_is_removed_and_a_good_mirror_then_serves_it(tmp_path, at, capsys):
    archive = iwslt14_archive(tmp_path)["de-en.tgz"]
    page = b"<html><body>503 Service Unavailable</body></html>\n"  # a size announced, no digest published
    with at(Mirror({"de-en.tgz": page})) as bad, Mirror({"de-en.tgz": archive}) as good:
        code, err = run(["download", "iwslt14-de-en", "--out", "out"], capsys)
        assert code == 2 and err.count("\n") == 1
        assert err.startswith(f"error: {bad.url}/de-en.tgz is not a gzip archive (it begins b'<html><body>503 '); "
                              "the download was removed (run again, or fetch it from another mirror: --base-url)")
        assert not list(Path("out/downloads").iterdir())  # nothing taken as done, no part to append to
        code, err = run(["download", "iwslt14-de-en", "--out", "out", "--base-url", good.url], capsys)
    assert code == 0, err
    assert Path("out/downloads/de-en.tgz").read_bytes() == archive


def test_a_reply_cut_short_without_any_size_is_removed_and_fetched_again(tmp_path, at, capsys):
    archive = iwslt14_archive(tmp_path)["de-en.tgz"]
    with at(Mirror({"de-en.tgz": archive})) as mirror:
        mirror.unsized.add("mirror/de-en.tgz")  # no Content-Length, not chunked: a close looks like the end
        mirror.cut["mirror/de-en.tgz"] = len(archive) // 2
        code, err = run(["download", "iwslt14-de-en", "--out", "out"], capsys)
        assert code == 2 and err.count("\n") == 1
        assert err.startswith(f"error: {mirror.url}/de-en.tgz is not a whole tar.gz archive ("), err
        assert "; the download was removed" in err
        assert not list(Path("out/downloads").iterdir())
        code, err = run(["download", "iwslt14-de-en", "--out", "out"], capsys)  # served whole this time
    assert code == 0, err
    assert Path("out/downloads/de-en.tgz").read_bytes() == archive


@pytest.mark.parametrize("published", [False, True], ids=["first-bytes", "digest"])
def test_a_damaged_file_left_in_place_is_fetched_again(tmp_path, at, capsys, published):
    """An older structnmt renamed whatever arrived: an error page (no digest published: its first
    bytes tell), or a gzip file that is not the published one (its digest tells)."""
    archive = iwslt14_archive(tmp_path)["de-en.tgz"]
    left = gzip.compress(b"not the archive", mtime=0) if published else b"<html>404</html>"
    Path("out/downloads").mkdir(parents=True)
    Path("out/downloads/de-en.tgz").write_bytes(left)
    with at(Mirror({"de-en.tgz": archive})) as mirror:
        if published:
            mirror.publish_checksums()
        code = main(["download", "iwslt14-de-en", "--out", "out"])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert "out/downloads/de-en.tgz " in out and ": removed, downloading it again" in out
    assert Path("out/downloads/de-en.tgz").read_bytes() == archive


def test_a_server_trickling_bytes_meets_the_deadline_with_progress_lines(tmp_path, monkeypatch):
    body = gzip.compress(b"slow server\n" * 50, mtime=0)  # 39 bytes: 4 s at a byte every 0.1 s
    monkeypatch.setenv(DEADLINE_ENV, "1")
    monkeypatch.setattr(download, "PROGRESS_EVERY_S", 0.25)
    lines: list[str] = []
    target = tmp_path / "slow.gz"
    with Mirror({"slow.gz": body}) as mirror:
        mirror.slow["mirror/slow.gz"] = 0.1
        started = time.monotonic()
        with pytest.raises(download.DownloadError) as caught:
            download.fetch(f"{mirror.url}/slow.gz", target, say=lines.append)
        assert time.monotonic() - started < 3.5  # the deadline and a byte, not the whole file
        message = str(caught.value)
        assert message.startswith(f"the download of {mirror.url}/slow.gz stopped after "), message
        assert message.endswith(f" of {len(body):,} bytes: it took longer than the deadline of 1 s; run the same "
                                f"command again to resume it, or allow more time with {DEADLINE_ENV}=SECONDS")
        progress = [line for line in lines if line.startswith("  slow.gz: ")]
        assert len(progress) >= 2 and all(f" of {len(body):,} bytes (" in line and " kB/s, 0:00:0" in line
                                          for line in progress), lines
        kept = Path(f"{target}.part").stat().st_size
        assert 0 < kept < len(body) and not target.exists()
        del mirror.slow["mirror/slow.gz"]  # a fast server again: the rerun asks for the rest only
        download.fetch(f"{mirror.url}/slow.gz", target, say=lines.append)
        assert mirror.requests[-1] == ("mirror/slow.gz", f"bytes={kept}-")
    assert target.read_bytes() == body
    monkeypatch.setenv(DEADLINE_ENV, "soon")
    with pytest.raises(ConfigError, match=rf"^\${DEADLINE_ENV}: expected a positive number of seconds, got 'soon'$"):
        download.fetch("http://127.0.0.1:9/x.gz", tmp_path / "x.gz")


def test_a_cut_archive_left_in_place_is_one_line_saying_to_delete_it(tmp_path, at, capsys):
    """Its first bytes are gzip's, so it is kept (reading whole archives on every run would cost minutes
    for WMT14); reading it fails in one line that says what to do, and doing it works."""
    archive = iwslt14_archive(tmp_path)["de-en.tgz"]
    Path("out/downloads").mkdir(parents=True)
    Path("out/downloads/de-en.tgz").write_bytes(archive[:len(archive) // 2])
    with at(Mirror({"de-en.tgz": archive})):
        code, err = run(["download", "iwslt14-de-en", "--out", "out"], capsys)
        assert code == 2 and err.count("\n") == 1, err
        assert err.startswith("error: out/downloads/de-en.tgz: cannot read the archive: ")
        assert err.endswith("(if it was downloaded, delete it and run the command again to fetch it again)\n")
        Path("out/downloads/de-en.tgz").unlink()
        code, err = run(["download", "iwslt14-de-en", "--out", "out"], capsys)
    assert code == 0, err
