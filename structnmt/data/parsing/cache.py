"""A parse cache, so that preparing a dataset a second time does not parse it again.

One SQLite file per side (``<cache_dir>/parses.sqlite``) maps the SHA-256 of a sentence to
its tree (JSON). SQLite keeps it on disk, so a corpus of millions of sentences costs no
memory, and several prepare shards can read and add to it at once (WAL journal, waiting on
each other's writes). It records which parser made it (name, version and the digest of its
model, :func:`structnmt.data.identity.parser_identity`): a cache made by another parser, or
one that does not say, is never reused; it is emptied and rebuilt, with a message, so a
retrained model of the same name and version cannot hand back the old model's trees.
Entries are only ever added; delete the file to reclaim its space.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import sqlite3
from dataclasses import asdict
from pathlib import Path

from structnmt.data.example import DepTree
from structnmt.data.parsing.base import Convention, Parser
from structnmt.errors import DataError

#: how long a shard waits for another one's write to finish before giving up (seconds)
BUSY_TIMEOUT = 600.0


def text_key(text: str) -> bytes:
    return hashlib.sha256(text.encode("utf-8")).digest()


def _tree_from_json(data: dict) -> DepTree:
    return DepTree(text=data["text"], words=data["words"], spans=[tuple(s) for s in data["spans"]],
                   heads=data["heads"], labels=data["labels"], parser=data.get("parser", ""))


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
            if made_by != self.identity:
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
        keys = [text_key(t) for t in texts]
        found: dict[bytes, DepTree] = {}
        unique = list(dict.fromkeys(keys))
        for start in range(0, len(unique), 500):  # SQLite's limit on bound parameters
            part = unique[start:start + 500]
            query = f"SELECT key, tree FROM trees WHERE key IN ({','.join('?' * len(part))})"
            for key, tree in db.execute(query, part):
                with contextlib.suppress(ValueError, KeyError, TypeError):
                    found[key] = _tree_from_json(json.loads(tree))
        todo = [k for k, key in enumerate(keys) if key not in found or found[key].text != texts[k]]
        self.hits += len(texts) - len(todo)
        self.misses += len(todo)
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
