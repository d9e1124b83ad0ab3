"""``inspect heads`` refuses what it cannot score before it reads a single batch."""

from __future__ import annotations

from pathlib import Path

import pytest

from structnmt.errors import ConfigError, DataError
from structnmt.evaluation.inspect_run import inspect_split


class _SplitWithoutTrees:
    """A split as inspect sees it, prepared without a parser: no stored heads on either side."""

    split = "test"
    path = Path("dataset/test")

    def __len__(self) -> int:
        return 3

    def has(self, side: str, field: str) -> bool:
        return False

    def side_arrays(self, i: int, side: str) -> dict:
        raise AssertionError("read a sentence of a split it should have refused")


def test_heads_names_the_side_and_the_missing_trees(tmp_path: Path) -> None:
    data = _SplitWithoutTrees()
    with pytest.raises(ConfigError, match="^--side: heads reads the encoder's self-attention: the side is src"):
        inspect_split(None, data, "heads", tmp_path, side="tgt")  # type: ignore[arg-type]
    with pytest.raises(DataError) as err:
        inspect_split(None, data, "heads", tmp_path)  # type: ignore[arg-type]
    assert err.value.path == str(Path("dataset/test"))
    assert "the split has no source trees to score heads against" in str(err.value)
    assert list(tmp_path.iterdir()) == []  # nothing written
