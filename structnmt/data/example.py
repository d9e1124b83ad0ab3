"""In-memory forms of one prepared sentence pair: word-level tree, scenes, sub-word ids.

These are what the parser back ends produce and what the dataset writer stores; the
sub-word structures (``parent_mid`` ...) are derived from them in ``structures.py``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from structnmt.errors import DataError


@dataclass
class DepTree:
    """A word-level dependency tree over a raw sentence.

    ``heads[i]`` is the 0-based index of word i's head; the root points to itself (the
    convention of pascal-bugliarello2020, and what ``parent_mid`` needs). ``spans[i]`` are
    the character offsets of word i in ``text`` (end exclusive).
    """

    text: str
    words: list[str]
    spans: list[tuple[int, int]]
    heads: list[int]
    labels: list[str]
    parser: str = ""  # name (and version) of what produced it

    def __len__(self) -> int:
        return len(self.words)

    @property
    def root(self) -> int:
        return next(i for i, h in enumerate(self.heads) if h == i)

    def check(self, path: str | None = None, line: int | None = None) -> None:
        """Refuse trees the structure code cannot use: one root, heads in range, no cycles."""
        n = len(self.words)
        if not (len(self.spans) == len(self.heads) == len(self.labels) == n):
            raise DataError("tree fields have different lengths", path, line)
        if n == 0:
            raise DataError("empty tree", path, line)
        for i, h in enumerate(self.heads):
            if not 0 <= h < n:
                raise DataError(f"word {i + 1} ({self.words[i]!r}) has head {h + 1} outside 1..{n}", path, line)
        roots = [i for i, h in enumerate(self.heads) if h == i]
        if len(roots) != 1:
            raise DataError(f"tree has {len(roots)} roots, expected exactly one", path, line)
        for i in range(n):
            seen = 0
            j = i
            while self.heads[j] != j:
                j = self.heads[j]
                seen += 1
                if seen > n:
                    raise DataError(f"tree has a cycle through word {i + 1} ({self.words[i]!r})", path, line)
        for i, (start, end) in enumerate(self.spans):
            if not (0 <= start < end <= len(self.text)):
                raise DataError(f"word {i + 1} has character span {start}..{end} outside the text", path, line)


@dataclass
class Scenes:
    """Scene membership of words: a word may sit in several scenes (a relativised noun)."""

    members: list[tuple[int, int]]  # (word, scene) pairs
    parent: list[int]  # parent scene of each scene, -1 at the top
    source: str = "dependency"  # "dependency" (derived from the tree) or "ucca"

    @property
    def n_scenes(self) -> int:
        return len(self.parent)


@dataclass
class Side:
    """One side of a prepared pair: sub-word ids (without EOS) and, if parsed, its structure."""

    ids: np.ndarray  # int32 sub-word ids
    word_index: np.ndarray | None = None  # int32, the word each sub-word belongs to
    tree: DepTree | None = None
    scenes: Scenes | None = None


@dataclass
class Example:
    src: Side
    tgt: Side | None = None
    meta: dict = field(default_factory=dict)
