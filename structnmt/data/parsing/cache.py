"""A parse cache, so that preparing a dataset a second time does not parse it again.

Entries are keyed by (parser name, parser version, sha256 of the sentence): a new model
version or an edited sentence is parsed afresh. Each split has one JSON-lines file in
the cache directory, rewritten atomically after parsing with the entries that split uses.
Its first line records which parser made it (name, version and the digest of its model,
:func:`structnmt.data.identity.parser_identity`): a cache made by another parser, or one
that does not say, is never reused (it is rebuilt, with a message), so a retrained model
of the same name and version cannot hand back the old model's trees.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import asdict
from pathlib import Path

from structnmt.data.example import DepTree
from structnmt.data.parsing.base import Convention, Parser
from structnmt.io import atomic_open

Key = tuple[str, str, str]


def text_key(parser: Parser, text: str) -> Key:
    return (parser.name, parser.version, hashlib.sha256(text.encode("utf-8")).hexdigest())


def _tree_from_json(data: dict) -> DepTree:
    return DepTree(text=data["text"], words=data["words"], spans=[tuple(s) for s in data["spans"]],
                   heads=data["heads"], labels=data["labels"], parser=data.get("parser", ""))


class CachedParser:
    """Wraps a parser; behaves like one, but parses only sentences it has not seen."""

    def __init__(self, parser: Parser, cache_dir: str | Path, split: str, model_digest: str | None = None,
                 messages=print) -> None:
        self.parser = parser
        self.identity = {"name": parser.name, "version": parser.version, "digest": model_digest}
        self.messages = messages
        self.name = parser.name
        self.version = parser.version
        self.convention: Convention = parser.convention
        safe = re.sub(r"[^A-Za-z0-9_.-]", "_", split)
        self.path = Path(cache_dir) / f"{safe}.parses.jsonl"
        self.hits = 0
        self.misses = 0

    def _load(self) -> dict[Key, DepTree]:
        entries: dict[Key, DepTree] = {}
        if not self.path.is_file():
            return entries
        with open(self.path, encoding="utf-8") as handle:
            try:
                made_by = json.loads(handle.readline()).get("parser")
            except (ValueError, AttributeError):
                made_by = None
            if made_by != self.identity:
                self.messages(f"{self.path}: made by {_describe(made_by)}, not by {_describe(self.identity)}; "
                              "not reused (parsing afresh)")
                return entries
            for line in handle:
                try:
                    record = json.loads(line)
                    entries[tuple(record["key"])] = _tree_from_json(record["tree"])
                except (ValueError, KeyError, TypeError):
                    # a damaged cache is only a lost speed-up: reparse rather than fail
                    continue
        return entries

    def parse(self, texts: list[str], lines: list[int] | None = None) -> list[DepTree]:
        entries = self._load()
        keys = [text_key(self.parser, t) for t in texts]
        todo = [k for k, key in enumerate(keys) if key not in entries or entries[key].text != texts[k]]
        self.hits += len(texts) - len(todo)
        self.misses += len(todo)
        if todo:
            parsed = self.parser.parse([texts[k] for k in todo], [lines[k] for k in todo] if lines else
                                       [k + 1 for k in todo])
            for k, tree in zip(todo, parsed):
                entries[keys[k]] = tree
            used = dict.fromkeys(keys)
            with atomic_open(self.path) as handle:
                handle.write(json.dumps({"parser": self.identity}) + "\n")
                for key in used:
                    handle.write(json.dumps({"key": list(key), "tree": asdict(entries[key])},
                                            ensure_ascii=False) + "\n")
        return [entries[key] for key in keys]


def _describe(identity: dict | None) -> str:
    if not identity:
        return "an unknown parser"
    digest = identity.get("digest")
    model = f"model {digest[:12]}…" if digest else "model digest unknown"
    return f"{identity.get('name')} {identity.get('version')} ({model})"
