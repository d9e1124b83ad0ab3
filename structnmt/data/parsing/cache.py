"""A parse cache, so that preparing a dataset a second time does not parse it again.

One SQLite file per side (``<cache_dir>/parses.sqlite``) maps the SHA-256 of a sentence to
its tree (JSON). SQLite keeps it on disk, so a corpus of millions of sentences costs no
memory, and several prepare shards can read and add to it at once (WAL journal, waiting on
each other's writes). It records which parser made it (name, version and the digest of its
model, :func:`structnmt.data.identity.parser_identity`): a cache made by another parser, or
one that does not say, is never reused; it is emptied and rebuilt, with a message, so a
retrained model of the same name and version cannot hand back the old model's trees.
Entries are only ever added; delete the file to reclaim its space.

Trees travel between machines as one file (:func:`export_trees`, :func:`import_trees`): a
parser retrained on another machine from the same recipe may differ in a few arcs, so a study
that must be redone exactly carries the trees it was trained on. The file keeps no sentences:
each tree is (a prefix of) its sentence's SHA-256 with arcs, labels and character spans, and the words come
back from the corpus when ``prepare`` looks the sentence up (only a multi-word token's words,
which are not slices of the sentence, are kept), so a spaCy parser's file holds none of the
corpus's text and can be committed beside a study. An imported cache is *pinned*:
it is used whatever parser the config names, and a sentence it does not hold is an error, never
parsed afresh (a dataset with trees of two parsers would pass for either). A file's header names
the parser that made its trees, its recipe and its label convention, so a pinned cache needs no
parser at all (:class:`PinnedTrees`): a fresh machine prepares a study's dataset without
training or installing the parser.
"""

from __future__ import annotations

import contextlib
import gzip
import hashlib
import json
import sqlite3
from dataclasses import asdict
from pathlib import Path

from structnmt.data.example import DepTree
from structnmt.data.parsing.base import Convention, Parser
from structnmt.errors import DataError
from structnmt.io import atomic_open, sha256_file

#: how long a shard waits for another one's write to finish before giving up (seconds)
BUSY_TIMEOUT = 600.0


#: a trees file keys each tree by the first 8 bytes of its sentence's SHA-256: the keys are most
#: of the file, and 64 bits keep 32k sentences apart with odds of a clash below 1e-10
TREES_FILE_KEY_BYTES = 8
#: the first bytes of every gzip file, and the size of the smallest (a header, an empty stream, a trailer)
GZIP_MAGIC = b"\x1f\x8b"
GZIP_MIN_BYTES = 20


def text_key(text: str) -> bytes:
    return hashlib.sha256(text.encode("utf-8")).digest()


def _tree_from_json(data: dict, text: str | None = None) -> DepTree:
    """A stored tree; one without its sentence (an imported trees file) takes ``text``, the
    sentence it was looked up by (its key is that sentence's SHA-256, so they belong)."""
    spans = [(int(a), int(b)) for a, b in data["spans"]]
    if "text" in data:
        return DepTree(text=data["text"], words=data["words"], spans=spans, heads=data["heads"],
                       labels=data["labels"], parser=data.get("parser", ""))
    if text is None or any(not 0 <= a < b <= len(text) for a, b in spans):
        raise ValueError("a tree without its sentence needs the sentence its spans point into")
    words = data.get("words") or [text[a:b] for a, b in spans]  # kept where they are not slices (below)
    return DepTree(text=text, words=words, spans=spans, heads=data["heads"], labels=data["labels"],
                   parser=data.get("parser", ""))


def _without_text(tree: dict) -> dict:
    """A tree as a trees file keeps it: no sentence, and no words where each is its span's slice
    of the sentence. A multi-word token's words (Stanza's, UDPipe's: "zum" as "zu" + "dem") share
    one span and are not slices, so those trees keep their words."""
    text = tree.get("text", "")
    slices = [text[a:b] for a, b in tree["spans"]]
    return {k: v for k, v in tree.items() if k != "text" and not (k == "words" and v == slices)}


def _check_arcs(tree: dict) -> None:
    """Refuse a malformed tree of a trees file at import, not half-way through a prepare."""
    n = len(tree["heads"])
    if not (n > 0 and len(tree["labels"]) == len(tree["spans"]) == n and all(0 <= h < n for h in tree["heads"])
            and all(len(s) == 2 and 0 <= s[0] < s[1] for s in tree["spans"])
            and len(tree.get("words", tree["spans"])) == n):
        raise ValueError("heads, labels and spans do not fit one sentence")


class PinnedTrees:
    """Stands in for the parser of a pinned cache, named as the trees file's header names it.

    Every sentence is looked up among the imported trees (a missing one is an error before any
    parser is asked), so the parser that made them need not be on this machine.
    """

    def __init__(self, pin: dict, convention: Convention | None = None) -> None:
        made_by = pin.get("parser") or {}
        self.name = str(made_by.get("name"))
        self.version = str(made_by.get("version"))
        self.convention: Convention = convention or pin["convention"]  # the config's, as a parser honours it

    def parse(self, texts: list[str], lines: list[int] | None = None) -> list[DepTree]:
        raise AssertionError("a pinned cache never parses")  # CachedParser refuses a missing sentence first


class CachedParser:
    """Wraps a parser; behaves like one, but parses only sentences it has not seen."""

    def __init__(self, parser: Parser, cache_dir: str | Path, model_digest: str | None = None,
                 messages=print) -> None:
        self.parser = parser
        self.name = parser.name
        self.version = parser.version
        self.convention: Convention = parser.convention
        self.identity = {"name": parser.name, "version": parser.version, "digest": model_digest}
        self.messages = messages
        self.path = Path(cache_dir) / "parses.sqlite"
        self.hits = 0
        self.misses = 0
        self.pinned: dict | None = None  # the imported trees file this cache holds, if any
        self._db: sqlite3.Connection | None = None

    def _connect(self, retried: bool = False) -> sqlite3.Connection:
        if self._db is not None:
            return self._db
        self.path.parent.mkdir(parents=True, exist_ok=True)
        db = sqlite3.connect(self.path, timeout=BUSY_TIMEOUT, isolation_level=None)
        try:
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("BEGIN IMMEDIATE")  # one shard at a time decides whether the cache is reusable
            db.execute("CREATE TABLE IF NOT EXISTS info (key TEXT PRIMARY KEY, value TEXT)")
            db.execute("CREATE TABLE IF NOT EXISTS trees (key BLOB PRIMARY KEY, tree TEXT)")
            row = db.execute("SELECT value FROM info WHERE key = 'parser'").fetchone()
            made_by = json.loads(row[0]) if row else None
            pinned = db.execute("SELECT value FROM info WHERE key = 'pinned'").fetchone()
            self.pinned = json.loads(pinned[0]) if pinned else None
            if made_by != self.identity and self.pinned is None:
                if made_by is not None or db.execute("SELECT 1 FROM trees LIMIT 1").fetchone():
                    self.messages(f"{self.path}: made by {_describe(made_by)}, not by {_describe(self.identity)}; "
                                  "not reused (parsing afresh)")
                db.execute("DELETE FROM trees")
                db.execute("INSERT OR REPLACE INTO info VALUES ('parser', ?)", (json.dumps(self.identity),))
            db.execute("COMMIT")
        except sqlite3.OperationalError as err:
            # locked past the timeout, read-only, out of space: not damage; other shards may
            # have it open, so it is never deleted for this
            db.close()
            raise DataError(f"cannot use the parse cache ({err}); is another process holding it, or the disk "
                            "full or read-only?", self.path) from None
        except sqlite3.DatabaseError as err:
            # a damaged cache is only a lost speed-up: start a new one rather than fail (once)
            db.close()
            if retried:
                raise DataError(f"the parse cache is damaged and could not be made anew ({err})", self.path) from None
            self.messages(f"{self.path}: unreadable parse cache ({err}); starting a new one")
            for suffix in ("", "-wal", "-shm"):
                with contextlib.suppress(FileNotFoundError):
                    Path(f"{self.path}{suffix}").unlink()
            return self._connect(retried=True)
        self._db = db
        return db

    def parse(self, texts: list[str], lines: list[int] | None = None) -> list[DepTree]:
        db = self._connect()
        width = TREES_FILE_KEY_BYTES if self.pinned is not None else None  # an imported file's keys are short
        keys = [text_key(t)[:width] for t in texts]
        text_of = dict(zip(keys, texts))
        found: dict[bytes, DepTree] = {}
        unique = list(dict.fromkeys(keys))
        for start in range(0, len(unique), 500):  # SQLite's limit on bound parameters
            part = unique[start:start + 500]
            query = f"SELECT key, tree FROM trees WHERE key IN ({','.join('?' * len(part))})"
            for key, tree in db.execute(query, part):
                with contextlib.suppress(ValueError, KeyError, TypeError):
                    found[key] = _tree_from_json(json.loads(tree), text_of[key])
        todo = [k for k, key in enumerate(keys) if key not in found or found[key].text != texts[k]]
        self.hits += len(texts) - len(todo)
        self.misses += len(todo)
        if todo and self.pinned is not None:
            k = todo[0]
            line = lines[k] if lines else k + 1
            raise DataError(f"the sentence of line {line} ({texts[k][:60]!r}) is not among the imported trees "
                            f"({self.pinned['file']}, sha256 {self.pinned['sha256'][:12]}…): import the trees of "
                            f"this corpus, or delete {self.path.parent} to parse afresh")
        if todo:
            parsed = self.parser.parse([texts[k] for k in todo], [lines[k] for k in todo] if lines else
                                       [k + 1 for k in todo])
            rows = []
            for k, tree in zip(todo, parsed):
                found[keys[k]] = tree
                rows.append((keys[k], json.dumps(asdict(tree), ensure_ascii=False)))
            db.execute("BEGIN IMMEDIATE")
            try:
                db.executemany("INSERT OR REPLACE INTO trees VALUES (?, ?)", rows)
            finally:
                db.execute("COMMIT")
        return [found[key] for key in keys]

    def close(self) -> None:
        if self._db is not None:
            self._db.close()
            self._db = None


def _describe(identity: dict | None) -> str:
    if not identity:
        return "an unknown parser"
    digest = identity.get("digest")
    model = f"model {digest[:12]}…" if digest else "model digest unknown"
    return f"{identity.get('name')} {identity.get('version')} ({model})"


# ---------------------------------------------------------------------------
# trees that travel


def export_trees(cache_dir: str | Path, out: str | Path, about: dict[str, dict] | None = None) -> tuple[str, int]:
    """Every tree of a dataset's parse caches (``<cache_dir>/<side>/parses.sqlite``) as one
    gzip-compressed JSON-lines file: per side a header naming the parser that made them (and
    what ``about[side]`` adds: its ``recipe`` and label ``convention``), then one line per
    sentence (SHA-256 of its text, tree without the text, see :func:`_without_text`), in key
    order with no time stamp, so the same trees always give the same file. Returns (its
    SHA-256, number of trees)."""
    cache_dir, count = Path(cache_dir), 0
    sides = sorted(p.name for p in cache_dir.iterdir() if (p / "parses.sqlite").is_file()) if cache_dir.is_dir() else []
    if not sides:
        raise DataError("no parse cache here (prepare the dataset with a parser first)", cache_dir)
    with atomic_open(out, "wb", encoding=None) as raw, gzip.GzipFile(fileobj=raw, mode="wb", mtime=0) as gz:
        for side in sides:
            db = sqlite3.connect(f"file:{cache_dir / side / 'parses.sqlite'}?mode=ro", uri=True)
            try:
                row = db.execute("SELECT value FROM info WHERE key = 'parser'").fetchone()
                header = {**(about or {}).get(side, {}), "structnmt_trees": 1, "side": side,
                          "parser": json.loads(row[0]) if row else None}
                gz.write((json.dumps(header, sort_keys=True) + "\n").encode())
                for key, tree in db.execute("SELECT key, tree FROM trees ORDER BY key"):
                    line = {"side": side, "key": key[:TREES_FILE_KEY_BYTES].hex(),
                            "tree": _without_text(json.loads(tree))}
                    gz.write((json.dumps(line, sort_keys=True, ensure_ascii=False) + "\n").encode())
                    count += 1
            finally:
                db.close()
    return sha256_file(out), count


def pin_of(side_dir: str | Path) -> dict | None:
    """What one side's cache is pinned to (``file``, ``sha256``, and from the file's header
    ``parser`` and, when it names them, ``recipe`` and ``convention``), or None."""
    path = Path(side_dir) / "parses.sqlite"
    if not path.is_file():
        return None
    db = sqlite3.connect(f"file:{path}?mode=ro", timeout=BUSY_TIMEOUT, uri=True)
    try:
        row = db.execute("SELECT value FROM info WHERE key = 'pinned'").fetchone()
    except sqlite3.OperationalError as err:
        if "no such table" not in str(err):  # locked past the timeout: never read as "not pinned"
            raise DataError(f"cannot read the parse cache ({err}); is another process holding it?", path) from None
        row = None
    except sqlite3.DatabaseError:
        row = None  # damaged: not pinned; CachedParser starts it anew
    finally:
        db.close()
    return json.loads(row[0]) if row else None


def pinned_to(cache_dir: str | Path) -> str | None:
    """The SHA-256 of the trees file the caches here are pinned to (of each file, joined by "+",
    should two sides come from two files), or None. A side parsed here beside a pinned one does
    not count: the answer must not change when its cache appears half-way through a prepare."""
    root = Path(cache_dir)
    sides = [side for side in root.iterdir() if (side / "parses.sqlite").is_file()] if root.is_dir() else []
    found = sorted({pin["sha256"] for side in sides if (pin := pin_of(side))})
    return "+".join(found) or None


def import_trees(file: str | Path, cache_dir: str | Path, sha256: str | None = None) -> dict[str, int]:
    """Pin a dataset's parse caches to the trees of ``file`` (made by :func:`export_trees`),
    checked against ``sha256`` when given. Returns the number of trees per side."""
    file = Path(file)
    if not file.is_file():
        raise DataError("trees file not found", file)
    digest = sha256_file(file)
    if sha256 is not None and digest != sha256.lower():
        raise DataError(f"SHA-256 {digest} is not the expected {sha256}: another or a damaged file", file)
    by_side: dict[str, tuple[dict, list[tuple[bytes, str]]]] = {}  # side -> (header, trees)
    with file.open("rb") as raw:
        head = raw.read(GZIP_MIN_BYTES)
    # gzip reads an empty file as no lines, and a file cut inside its header as "not gzipped":
    # both are a file cut short (a copy that stopped), not a trees file without trees
    if len(head) < GZIP_MIN_BYTES and GZIP_MAGIC.startswith(head[:2]):
        raise DataError(f"truncated: not a complete gzip file ({len(head)} byte{'s' * (len(head) != 1)}, where "
                        f"a gzip file has at least {GZIP_MIN_BYTES}); copy it again", file)
    try:
        with gzip.open(file, "rt", encoding="utf-8") as lines:
            for number, text in enumerate(lines, start=1):
                item = json.loads(text)
                if "structnmt_trees" in item:
                    if item.get("convention") not in (None, "ud", "clearnlp", "other"):
                        raise DataError(f"unknown label convention {item['convention']!r} (ud, clearnlp or other)",
                                        file, number)
                    by_side[item["side"]] = (item, [])
                elif item.get("side") in by_side:
                    _check_arcs(item["tree"])
                    by_side[item["side"]][1].append((bytes.fromhex(item["key"])[:TREES_FILE_KEY_BYTES],
                                                     json.dumps(item["tree"], ensure_ascii=False)))
                else:
                    raise DataError("a tree before its side's header line", file, number)
    except EOFError:
        raise DataError("truncated: not a complete gzip file (its compressed stream stops before its end, "
                        f"after {file.stat().st_size} bytes); copy it again", file) from None
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise DataError(f"not a structnmt trees file ({type(err).__name__}: {err})", file) from None
    if not by_side:
        raise DataError("the file holds no trees", file)
    pin = {"file": file.name, "sha256": digest}
    for side, (header, rows) in by_side.items():
        parser = header.get("parser") or {}
        about = {k: header[k] for k in ("recipe", "convention") if header.get(k)}
        path = Path(cache_dir) / side / "parses.sqlite"
        path.parent.mkdir(parents=True, exist_ok=True)
        db = sqlite3.connect(path, timeout=BUSY_TIMEOUT, isolation_level=None)
        try:
            db.execute("BEGIN IMMEDIATE")
            db.execute("CREATE TABLE IF NOT EXISTS info (key TEXT PRIMARY KEY, value TEXT)")
            db.execute("CREATE TABLE IF NOT EXISTS trees (key BLOB PRIMARY KEY, tree TEXT)")
            db.execute("DELETE FROM trees")
            db.executemany("INSERT INTO trees VALUES (?, ?)", rows)
            db.execute("INSERT OR REPLACE INTO info VALUES ('parser', ?)", (json.dumps(parser),))
            db.execute("INSERT OR REPLACE INTO info VALUES ('pinned', ?)",
                       (json.dumps({**pin, "parser": parser, **about}),))
            db.execute("COMMIT")
        finally:
            db.close()
    return {side: len(rows) for side, (_, rows) in by_side.items()}
