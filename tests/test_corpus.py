"""Reading and cleaning parallel text: values kept, and errors that name file and line."""

from __future__ import annotations

import gzip
from pathlib import Path

import pytest

from structnmt.config import CleanConfig, SplitFiles
from structnmt.data.corpus import read_lines, read_parallel
from structnmt.errors import DataError


def write(path: Path, data: bytes) -> str:
    path.write_bytes(data)
    return str(path)


def test_plain_and_gzip_lines_strip_newline_and_cr(tmp_path: Path) -> None:
    data = "Ein Hund läuft.\r\nZwei Katzen\tschlafen.\n\nletzte Zeile".encode()
    plain = write(tmp_path / "a.txt", data)
    gz = write(tmp_path / "a.gz", gzip.compress(data))
    expected = ["Ein Hund läuft.", "Zwei Katzen\tschlafen.", "", "letzte Zeile"]
    assert read_lines(plain) == expected
    assert read_lines(gz) == expected


def test_invalid_utf8_names_file_and_line(tmp_path: Path) -> None:
    path = write(tmp_path / "bad.txt", b"one\ntwo\nthr\xffee\nfour\n")
    with pytest.raises(DataError) as info:
        read_lines(path)
    assert info.value.path == path and info.value.line == 3
    assert f"{path}:3:" in str(info.value)


def test_control_character_refused_or_dropped(tmp_path: Path) -> None:
    path = write(tmp_path / "ctl.txt", b"ok\nbell\x07here\nfine\n")
    with pytest.raises(DataError) as info:
        read_lines(path)
    assert info.value.line == 2 and "U+0007" in str(info.value)
    assert read_lines(path, drop_bad_lines=True) == ["ok", "fine"]


def test_line_count_mismatch_names_both_files(tmp_path: Path) -> None:
    src = write(tmp_path / "s.txt", b"a b\nc d\ne f\n")
    tgt = write(tmp_path / "t.txt", b"a b\nc d\n")
    with pytest.raises(DataError) as info:
        read_parallel(SplitFiles(src=src, tgt=tgt), CleanConfig())
    message = str(info.value)
    assert src in message and tgt in message and "has 3" in message and "has 2" in message
    assert message.endswith(f"({tgt} ends after line 2)")
    with pytest.raises(DataError) as info:  # the source may be the shorter one
        read_parallel(SplitFiles(src=tgt, tgt=src), CleanConfig())
    assert str(info.value).endswith(f"{tgt} has 2, {src} has 3 ({tgt} ends after line 2)")


def test_empty_file(tmp_path: Path) -> None:
    src = write(tmp_path / "s.txt", b"a b\n")
    tgt = write(tmp_path / "t.txt", b"")
    with pytest.raises(DataError) as info:
        read_parallel(SplitFiles(src=src, tgt=tgt), CleanConfig())
    assert info.value.path == tgt and "empty" in str(info.value)


def test_tsv_line_without_exactly_one_tab(tmp_path: Path) -> None:
    tsv = write(tmp_path / "p.tsv", b"a b\tx y\nc d\te\tf\n")
    with pytest.raises(DataError) as info:
        read_parallel(SplitFiles(tsv=tsv), CleanConfig())
    assert info.value.path == tsv and info.value.line == 2 and "found 2" in str(info.value)


def test_cleaning_counts_each_reason_and_keeps_line_numbers(tmp_path: Path) -> None:
    src_lines = ["a b c", "", "one two three four five six", "x", "p q", "bad\x01line"]
    tgt_lines = ["A B C", "E", "O T", "X Y Z W V", "P Q", "fine"]
    src = write(tmp_path / "s.txt", "\n".join(src_lines).encode())
    tgt = write(tmp_path / "t.txt", "\n".join(tgt_lines).encode())
    clean = CleanConfig(max_len=5, max_ratio=3.0, drop_bad_lines=True)
    pairs, report = read_parallel(SplitFiles(src=src, tgt=tgt), clean)
    assert pairs == [(1, "a b c", "A B C"), (5, "p q", "P Q")]
    # line 3: 6 words > max_len 5; line 4: ratio 5 > 3
    assert report == {"bad_line": 1, "empty": 1, "too_long": 1, "ratio": 1, "read": 6, "kept": 2}
