"""The papers' corpora in the layout the recipes read (``docs/corpora.md``).

``structnmt download wmt14-en-de --out data/raw/wmt14_en_de`` fetches the public archives
(or a mirror's copies, ``$STRUCTNMT_DOWNLOAD_URL``, see :mod:`structnmt.data.download`; or, with
``--from DIR``, reads the same archives from a local copy) and writes plain text:

* **WMT14 En-De** (``configs/wmt14_en_de_*.yaml``): ``train.{en,de}`` = Europarl v7, Common
  Crawl and News Commentary v9, concatenated in that order (about 4.5M pairs, cleaned by
  ``prepare``); ``newstest2013.{en,de}`` (dev, 3,000) and ``newstest2014.{en,de}`` (test, the
  3,003-sentence "full" version, from its SGML).
* **IWSLT14 De-En** (``configs/iwslt14_de_en_*.yaml``), split the way fairseq's
  ``prepare-iwslt14.sh`` splits it, which Deps-SAN used: the TED training talks without their
  XML tag lines, pairs of 1..175 Moses tokens on both sides and a length ratio of at most
  1.5 kept, every 23rd kept pair to ``valid`` (7,283), the others to ``train`` (160,239);
  ``test`` (6,750) = dev2010, TEDX dev2012, tst2010, tst2011 and tst2012. Text is lowercased
  as there; tokenisation is left to ``prepare`` (``moses: true``). The counts are fairseq's
  with Perl Moses; sacremoses may tokenise a few lines differently (the command prints the
  counts it got).
"""

from __future__ import annotations

import re
import tarfile
from collections.abc import Iterator
from pathlib import Path

from structnmt.data.download import base_url, check_local_copy, mirror_checksums, url_of
from structnmt.data.download import fetch as fetch_file
from structnmt.errors import DataError
from structnmt.io import atomic_open

WMT14_ARCHIVES = {
    "training-parallel-europarl-v7.tgz": "http://statmt.org/wmt13/training-parallel-europarl-v7.tgz",
    "training-parallel-commoncrawl.tgz": "http://statmt.org/wmt13/training-parallel-commoncrawl.tgz",
    "training-parallel-nc-v9.tgz": "http://statmt.org/wmt14/training-parallel-nc-v9.tgz",
    "dev.tgz": "http://statmt.org/wmt14/dev.tgz",
    "test-full.tgz": "http://statmt.org/wmt14/test-full.tgz",
}
IWSLT14_ARCHIVES = {"de-en.tgz": "http://dl.fbaipublicfiles.com/fairseq/data/iwslt14/de-en.tgz"}
#: the IWSLT14 test set, in fairseq's order
IWSLT14_TEST = ["IWSLT14.TED.dev2010", "IWSLT14.TEDX.dev2012", "IWSLT14.TED.tst2010", "IWSLT14.TED.tst2011",
                "IWSLT14.TED.tst2012"]
#: training-file lines that are XML markup, not text (fairseq drops them; title/description keep their text)
_TAG_LINE = re.compile(r"^\s*<(url|talkid|keywords|speaker|reviewer|translator|doc|/doc)\b")
_INLINE_TAG = re.compile(r"</?(title|description)>")
_SEG = re.compile(r"<seg[^>]*>\s*(.*?)\s*</seg>")


def fetch(archives: dict[str, str], out: Path, local: Path | None, base: str | None = None) -> dict[str, Path]:
    """The archives, from ``local`` if given, else downloaded into ``out/downloads`` (from the mirror
    ``base`` or ``$STRUCTNMT_DOWNLOAD_URL`` when set, else from their public homes)."""
    if local is not None:
        check_local_copy(local, f"--from: the folder holding a local copy of {', '.join(archives)}")
    found = {}
    base = base_url(base) if local is None else None
    sums = mirror_checksums(base)
    for name, public in archives.items():
        if local is not None:
            path = local / name
            if not path.is_file():
                raise DataError(f"{name} is not here (expected the file downloaded from {public})", local)
        else:
            path = fetch_file(url_of(name, public, base), out / "downloads" / name, sums.get(name))
        found[name] = path
    return found


class ArchiveError(DataError):
    """An archive that cannot be read; :func:`download` says what to do about it, which depends on
    whether it was downloaded (fetch it again) or given with ``--from`` (nothing is fetched then)."""

    def __init__(self, why: str, archive: Path, advice: str = "if it was downloaded, delete it and run the "
                 "command again to fetch it again") -> None:
        self.why, self.archive = why, archive
        super().__init__(f"cannot read the archive: {why} ({advice})", archive)


def _lines(archive: Path, suffix: str) -> Iterator[str]:
    """Lines (no newline) of the one member of a .tgz whose name ends with ``suffix``."""
    try:
        with tarfile.open(archive, "r:*") as tar:
            members = [m for m in tar.getmembers() if m.isfile() and m.name.endswith(suffix)]
            if len(members) != 1:
                raise DataError(f"expected one file ending in {suffix!r} in the archive, found {len(members)}",
                                archive)
            handle = tar.extractfile(members[0])
            assert handle is not None
            for raw in handle:
                yield raw.decode("utf-8", errors="replace").rstrip("\r\n")
    except (tarfile.TarError, OSError, EOFError) as err:
        why = " ".join(str(err).split())  # tarfile lists each method it tried on a line of its own: one line here
        raise ArchiveError(why, archive) from None


def _write(path: Path, lines) -> int:
    count = 0
    with atomic_open(path) as handle:
        for line in lines:
            handle.write(line.replace("\n", " ") + "\n")
            count += 1
    return count


def build_wmt14_en_de(archives: dict[str, Path], out: Path) -> dict[str, int]:
    """``train``, ``newstest2013`` and ``newstest2014`` files in ``out``; their line counts."""
    train = [("training-parallel-europarl-v7.tgz", "europarl-v7.de-en"),
             ("training-parallel-commoncrawl.tgz", "commoncrawl.de-en"),
             ("training-parallel-nc-v9.tgz", "news-commentary-v9.de-en")]
    counts = {}
    for lang in ("en", "de"):
        counts[f"train.{lang}"] = _write(out / f"train.{lang}", (line for archive, stem in train
                                                                 for line in _lines(archives[archive],
                                                                                    f"{stem}.{lang}")))
        counts[f"newstest2013.{lang}"] = _write(out / f"newstest2013.{lang}",
                                                _lines(archives["dev.tgz"], f"newstest2013.{lang}"))
        side = "src" if lang == "en" else "ref"
        segs = (m.group(1) for line in _lines(archives["test-full.tgz"], f"newstest2014-deen-{side}.{lang}.sgm")
                if (m := _SEG.search(line)))
        counts[f"newstest2014.{lang}"] = _write(out / f"newstest2014.{lang}", segs)
    return counts


def iwslt14_training_text(lines: Iterator[str]) -> Iterator[str]:
    """The text lines of a ``train.tags`` file (markup lines dropped, title/description tags removed)."""
    for line in lines:
        if not _TAG_LINE.match(line):
            yield _INLINE_TAG.sub("", line).strip()


def build_iwslt14_de_en(archives: dict[str, Path], out: Path) -> dict[str, int]:
    """``train``, ``valid`` and ``test`` files in ``out``, split as fairseq splits IWSLT14; their line counts."""
    from sacremoses import MosesTokenizer

    archive = archives["de-en.tgz"]
    tokenisers = {"de": MosesTokenizer(lang="de"), "en": MosesTokenizer(lang="en")}
    de = list(iwslt14_training_text(_lines(archive, "train.tags.de-en.de")))
    en = list(iwslt14_training_text(_lines(archive, "train.tags.de-en.en")))
    if len(de) != len(en):
        raise DataError(f"train.tags.de-en.de has {len(de)} text lines, train.tags.de-en.en {len(en)}", archive)
    kept = []
    for d, e in zip(de, en):
        nd = len(tokenisers["de"].tokenize(d, escape=False))
        ne = len(tokenisers["en"].tokenize(e, escape=False))
        if 1 <= nd <= 175 and 1 <= ne <= 175 and max(nd, ne) <= 1.5 * min(nd, ne):
            kept.append((d.lower(), e.lower()))
    counts = {}
    for lang, k in (("de", 0), ("en", 1)):
        counts[f"train.{lang}"] = _write(out / f"train.{lang}", (p[k] for n, p in enumerate(kept, 1) if n % 23))
        counts[f"valid.{lang}"] = _write(out / f"valid.{lang}", (p[k] for n, p in enumerate(kept, 1) if not n % 23))
        test = (m.group(1).replace("\u2019", "'").lower() for name in IWSLT14_TEST
                for line in _lines(archive, f"{name}.de-en.{lang}.xml") if (m := _SEG.search(line)))
        counts[f"test.{lang}"] = _write(out / f"test.{lang}", test)
    return counts


CORPORA = {
    "wmt14-en-de": (WMT14_ARCHIVES, build_wmt14_en_de),
    "iwslt14-de-en": (IWSLT14_ARCHIVES, build_iwslt14_de_en),
}


def download(name: str, out: str | Path, local: str | Path | None = None, base: str | None = None) -> dict[str, int]:
    """Fetch (or read from ``local``) and lay out corpus ``name`` in ``out``; the line count of each file.
    ``base``: a mirror's URL holding the archives under their names (default ``$STRUCTNMT_DOWNLOAD_URL``)."""
    if name not in CORPORA:
        raise DataError(f"unknown corpus {name!r} (known: {', '.join(CORPORA)})")
    archives, build = CORPORA[name]
    out = Path(out)
    source = Path(local) if local is not None else None
    made = not out.exists()
    try:
        found = fetch(archives, out, source, base)  # a missing --from copy is named before OUT is made
        out.mkdir(parents=True, exist_ok=True)
        counts = build(found, out)
    except ArchiveError as err:
        if source is None:
            raise
        public = archives.get(err.archive.name, "its public home")  # nothing is fetched with --from
        raise ArchiveError(err.why, err.archive, f"replace it with a whole copy of the file from {public}") from None
    finally:
        if made and out.is_dir() and not any(out.iterdir()):  # a failed first run leaves no empty OUT behind
            out.rmdir()
    for file, count in counts.items():
        print(f"{out / file}: {count:,} lines")
    return counts
