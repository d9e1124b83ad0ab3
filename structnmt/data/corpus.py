"""Reading parallel text: plain or gzipped files, or one TSV of pairs, and cleaning it.

Input is refused loudly rather than repaired silently: a line that is not UTF-8, or that
holds a control character (other than tab), stops ``prepare`` with the file and the
1-based line, unless ``data.clean.drop_bad_lines`` asks to drop and count such lines.
Cleaning then drops empty pairs and pairs that are too long or too unbalanced (in
whitespace words), and reports how many it dropped for each reason; kept pairs keep their
original line number, so every later error can still point into the user's file.
"""

from __future__ import annotations

import gzip
import io
import re
import zlib
from collections import Counter, deque
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from itertools import zip_longest
from pathlib import Path

from structnmt.config import CleanConfig, SplitFiles
from structnmt.errors import DataError

#: why a pair was dropped (the keys of the cleaning report)
DROP_REASONS = ("bad_line", "empty", "too_long", "ratio")


@dataclass
class RawLines:
    """Lines of one file; ``bad`` lists the 1-based numbers of lines that were refused."""

    lines: list[str | None]  # None where a bad line was dropped
    bad: list[int] = field(default_factory=list)


#: Unicode category Cc is exactly U+0000..U+001F and U+007F..U+009F; tab is allowed
_CONTROL = re.compile("[\x00-\x08\x0a-\x1f\x7f-\x9f]")


def _bad_char(text: str) -> str | None:
    """The first control character other than tab, if any (Unicode category Cc)."""
    found = _CONTROL.search(text)
    return found.group() if found else None


def _open_bytes(path: Path):
    """A binary stream, gunzipped when the data starts with gzip's magic bytes; peeking rather
    than reopening, so pipes (standard input) work too."""
    raw = io.BufferedReader(open(path, "rb", buffering=0))  # noqa: SIM115 (the caller closes it)
    return gzip.GzipFile(fileobj=raw, mode="rb") if raw.peek(2)[:2] == b"\x1f\x8b" else raw


def iter_raw(path: str | Path, drop_bad_lines: bool = False) -> Iterator[str | None]:
    """Lines of a plain or gzip file (detected by its magic bytes, not its name), one at a time.

    None stands for a bad line that ``drop_bad_lines`` dropped; memory stays flat however
    long the file.
    """
    path = Path(path)
    if not path.exists() or path.is_dir():  # exists(): pipes such as /dev/stdin are not "files"
        raise DataError("file not found", path)
    try:
        with _open_bytes(path) as handle:
            for number, raw in enumerate(handle, start=1):
                raw = raw.rstrip(b"\n").rstrip(b"\r")
                try:
                    text = raw.decode("utf-8", errors="strict")
                except UnicodeDecodeError as err:
                    if not drop_bad_lines:
                        raise DataError(
                            f"invalid UTF-8 at byte {err.start + 1} of the line ({raw[err.start:err.end]!r})",
                            path, number,
                        ) from None
                    yield None
                    continue
                ch = _bad_char(text)
                if ch is not None:
                    if not drop_bad_lines:
                        raise DataError(
                            f"control character U+{ord(ch):04X} in the line "
                            "(set data.clean.drop_bad_lines to drop such lines)",
                            path, number,
                        )
                    yield None
                    continue
                yield text
    except (OSError, EOFError, gzip.BadGzipFile, zlib.error) as err:
        raise DataError(f"cannot read the file: {err}", path) from None


def read_raw(path: str | Path, drop_bad_lines: bool = False) -> RawLines:
    """All lines of a plain or gzip file (detected by its magic bytes, not its name)."""
    out = RawLines(lines=list(iter_raw(path, drop_bad_lines)))
    out.bad = [number for number, line in enumerate(out.lines, start=1) if line is None]
    return out


def read_lines(path: str | Path, drop_bad_lines: bool = False) -> list[str]:
    """Lines of a plain or .gz file, strict UTF-8, trailing newline/CR removed.

    With ``drop_bad_lines`` undecodable or control-character lines are left out (use
    :func:`read_raw` to know which).
    """
    return [line for line in read_raw(path, drop_bad_lines).lines if line is not None]


def _words(text: str) -> int:
    return len(text.split())


class RatioWatch:
    """Notices when many pairs fail the length-ratio filter, and where they start to.

    A few unbalanced pairs are normal; many, bunched together, mean that source and target
    files have slipped against each other (a line missing in one of them). Pairs are fed in
    file order; a sliding window of the last ``window`` pairs finds the first place where most
    of them fail. Memory is one window, however long the corpus.
    """

    def __init__(self, window: int = 100, share: float = 0.01) -> None:
        self.window, self.share = window, share
        self.recent: deque[tuple[int, bool]] = deque(maxlen=window)
        self.failing = 0  # failures inside ``recent``
        self.failed = 0
        self.seen = 0
        self.cluster: int | None = None  # first failing line of the first window where most fail

    def add(self, line: int, failed: bool) -> None:
        if len(self.recent) == self.window and self.recent[0][1]:
            self.failing -= 1
        self.recent.append((line, failed))
        self.failing += failed
        self.failed += failed
        self.seen += 1
        if self.cluster is None and self.failing * 2 > self.window:
            self.cluster = next(n for n, bad in self.recent if bad)

    def warning(self, path: str | None, max_ratio: float) -> str | None:
        """A warning when more than ``share`` of the pairs failed, else None."""
        if not self.seen or self.failed <= self.share * self.seen:
            return None
        where = (f"failures cluster from line {self.cluster} of {path} (most of the {self.window} pairs from "
                 f"there fail)" if self.cluster is not None else
                 f"failures are spread out (no {self.window} consecutive pairs where most fail)")
        return (f"{self.failed} of {self.seen} pairs ({100 * self.failed / self.seen:.1f}%) fail the "
                f"length-ratio filter (data.clean.max_ratio {max_ratio:g}): source and target may be "
                f"misaligned; {where}")


class AlignmentWatch:
    """Finds the line where source and target files slip against each other.

    Sentence lengths of a translation follow those of its source: in a window of aligned
    pairs the source and target word counts correlate strongly, and a target ``k`` lines away
    does not correlate. After a line is added to or lost from one file (a blank line on one
    side), source line ``n`` reads like the translation of target line ``n - k``: the
    correlation at offset ``k`` beats the one at offset 0 by far. That is what is looked for,
    every ``stride`` pairs, over the last ``window`` pairs (offsets up to ``max_offset``);
    the place where alignment breaks is then found within the two windows kept in memory.
    Repetitive text (equal lengths everywhere, or a period that makes several offsets look
    alike) gives no evidence and is never refused.
    """

    def __init__(self, window: int = 200, stride: int = 50, max_offset: int = 3, high: float = 0.5,
                 margin: float = 0.3) -> None:
        self.window, self.stride, self.max_offset, self.high, self.margin = window, stride, max_offset, high, margin
        self.recent: deque[tuple[int, int, int]] = deque(maxlen=2 * window + 2 * max_offset)
        self.seen = 0
        self.broken: tuple[int, int] | None = None  # (first line read out of step, offset k)

    def add(self, line: int, src: str | None, tgt: str | None) -> tuple[int, int] | None:
        """Feed one pair (None: a dropped bad line); returns (line, offset) when alignment broke here."""
        if self.broken is not None or src is None or tgt is None:
            return None
        self.recent.append((line, _words(src), _words(tgt)))
        self.seen += 1
        span = self.window + 2 * self.max_offset
        if self.seen >= span and self.seen % self.stride == 0:
            self.broken = self._check(span)
            return self.broken
        return None

    def finish(self) -> tuple[int, int] | None:
        """Check the pairs read since the last check (at the end of the file)."""
        span = self.window + 2 * self.max_offset
        if self.broken is None and self.seen >= span and self.seen % self.stride:
            self.broken = self._check(span)
        return self.broken

    def _check(self, span: int) -> tuple[int, int] | None:
        import numpy as np

        rows = np.asarray(self.recent, dtype=np.float64)
        last, k_max = rows[-span:], self.max_offset
        src = last[k_max:k_max + self.window, 1]

        def corr(k: int) -> float:  # source line n against target line n - k
            return _correlation(src, last[k_max - k:k_max - k + self.window, 2])

        aligned = corr(0)
        offset = max((k for k in range(-k_max, k_max + 1) if k), key=lambda k: (round(corr(k), 6), -abs(k)))
        if corr(offset) < self.high or corr(offset) - aligned < self.margin:
            return None
        return self._locate(rows, offset), offset

    @staticmethod
    def _locate(rows, k: int) -> int:
        """The line where the pairs stop matching at offset 0 and start matching at offset ``k``:
        the split of the kept pairs that fits best (z-scored lengths, least squares)."""
        import numpy as np

        n = len(rows)
        zs, zt = _zscore(rows[:, 1]), _zscore(rows[:, 2])
        aligned = (zs - zt) ** 2
        shifted = np.zeros(n)
        first, stop = max(k, 0), n + min(k, 0)  # where target line i - k is in memory
        shifted[first:stop] = (zs[first:stop] - zt[first - k:stop - k]) ** 2
        before = np.concatenate([[0.0], np.cumsum(aligned)])
        after = np.concatenate([np.cumsum(shifted[::-1])[::-1], [0.0]])
        cut = first + int(np.argmin((before + after)[first:stop + 1]))
        cut = min(cut, n - 1)
        for j in sorted(range(cut - 5, cut + 6), key=lambda j: abs(j - cut)):  # a line blank on one side: there
            if 0 <= j < n and ((k > 0 and rows[j, 1] == 0 < rows[j, 2]) or (k < 0 and rows[j, 2] == 0 < rows[j, 1])):
                return int(rows[j, 0])
        return int(rows[cut, 0])

    def message(self, split: SplitFiles) -> str:
        """What :func:`misaligned_error` says, without the file and line."""
        assert self.broken is not None
        _, k = self.broken
        src, tgt = (split.src, split.tgt) if split.tsv is None else ("the source column", "the target column")
        added, lost = (src, tgt) if k > 0 else (tgt, src)
        return (f"source and target stop matching here: from this line on, source line n reads like the "
                f"translation of target line n{-k:+d} (sentence lengths over {self.window} pairs); a line was "
                f"added to {added} or lost from {lost} about here. Fix the files, or set "
                "data.clean.allow_misaligned: true to go on with them as they are")


def _correlation(a, b) -> float:
    """Pearson correlation; 0 when either side does not vary (no evidence either way)."""
    import numpy as np

    a, b = a - a.mean(), b - b.mean()
    scale = float(np.sqrt((a * a).sum() * (b * b).sum()))
    return float((a * b).sum() / scale) if scale > 0 else 0.0


def _zscore(values):
    spread = values.std()
    return (values - values.mean()) / spread if spread > 0 else values * 0.0


def clean_pairs(
    numbered: Iterable[tuple[int, str | None, str | None]], clean: CleanConfig, watch: RatioWatch | None = None
) -> tuple[list[tuple[int, str, str]], dict[str, int]]:
    """Drop bad, empty, too long and too unbalanced pairs; count the drops by reason.

    ``watch`` sees every pair that reached the ratio test (see :class:`RatioWatch`).
    """
    report: Counter[str] = Counter()
    kept = list(iter_clean(numbered, clean, report, watch))
    report_dict = {reason: report[reason] for reason in DROP_REASONS}
    report_dict["read"] = report["read"]
    report_dict["kept"] = report["kept"]
    return kept, report_dict


def _drop_reason(number: int, src: str | None, tgt: str | None, clean: CleanConfig,
                 watch: RatioWatch | None) -> str | None:
    """Why a pair is dropped, or None to keep it."""
    if src is None or tgt is None:
        return "bad_line"
    ns, nt = _words(src), _words(tgt)
    if ns == 0 or nt == 0:
        return "empty"
    if ns > clean.max_len or nt > clean.max_len:
        return "too_long"
    unbalanced = max(ns, nt) / min(ns, nt) > clean.max_ratio
    if watch is not None:
        watch.add(number, unbalanced)
    return "ratio" if unbalanced else None


Pair = tuple[int, str | None, str | None]


def iter_pairs(split: SplitFiles, drop_bad_lines: bool = False) -> Iterator[Pair]:
    """The uncleaned pairs of a split as (1-based line, src, tgt), streamed; None marks a dropped bad line.

    Source and target files are read side by side: where one ends before the other the
    error names both files, both line counts and the line where the shorter one ends.
    """
    if split.tsv is not None:
        number = 0
        for number, line in enumerate(iter_raw(split.tsv, drop_bad_lines), start=1):
            if line is None:
                yield number, None, None
                continue
            tabs = line.count("\t")
            if tabs != 1:
                raise DataError(f"expected exactly one tab between source and target, found {tabs}",
                                split.tsv, number)
            src, tgt = line.split("\t")
            yield number, src, tgt
        if number == 0:
            raise DataError("the file is empty", split.tsv)
        return
    assert split.src is not None and split.tgt is not None
    sources, targets = iter_raw(split.src, drop_bad_lines), iter_raw(split.tgt, drop_bad_lines)
    number = 0
    for number, (src, tgt) in enumerate(zip_longest(sources, targets, fillvalue=_END), start=1):
        if src is _END or tgt is _END:
            _different_lengths(split, number, src is _END, sources if src is not _END else targets)
        yield number, src, tgt  # type: ignore[misc]
    if number == 0:
        for path in (split.src, split.tgt):
            if Path(path).is_file() and Path(path).stat().st_size == 0:
                raise DataError("the file is empty", path)
        raise DataError("the file is empty", split.src)


_END = object()


def _different_lengths(split: SplitFiles, number: int, source_ended: bool, rest: Iterator) -> None:
    """Raise the error for files that part at line ``number`` (the shorter one has ``number - 1``)."""
    longer = number + sum(1 for _ in rest)
    shorter = number - 1
    if shorter == 0:
        raise DataError("the file is empty", split.src if source_ended else split.tgt)
    counts = (shorter, longer) if source_ended else (longer, shorter)
    ended = split.src if source_ended else split.tgt
    raise DataError(f"source and target have different line counts: {split.src} has {counts[0]}, "
                    f"{split.tgt} has {counts[1]} ({ended} ends after line {shorter})", split.src)


def read_pairs(split: SplitFiles, drop_bad_lines: bool = False) -> list[Pair]:
    """The uncleaned pairs of a split as (1-based line, src, tgt); None marks a dropped bad line."""
    return list(iter_pairs(split, drop_bad_lines))


def iter_clean(pairs: Iterable[Pair], clean: CleanConfig, report: Counter[str],
               watch: RatioWatch | None = None) -> Iterator[tuple[int, str, str]]:
    """:func:`clean_pairs`, streamed: kept pairs are yielded, drops counted in ``report``."""
    report.update({reason: 0 for reason in DROP_REASONS})
    for number, src, tgt in pairs:
        report["read"] += 1
        reason = _drop_reason(number, src, tgt, clean, watch)
        if reason is None:
            report["kept"] += 1
            yield number, src, tgt  # type: ignore[misc]
        else:
            report[reason] += 1


def read_parallel(split: SplitFiles, clean: CleanConfig,
                  watch: RatioWatch | None = None) -> tuple[list[tuple[int, str, str]], dict[str, int]]:
    """Read and clean one split: the kept (line number, src, tgt) and the drop counts by reason."""
    return clean_pairs(read_pairs(split, clean.drop_bad_lines), clean, watch)


def long_lines(pairs: list[tuple[int, str, str]], max_len: int) -> list[int]:
    """Line numbers of pairs with a side over ``max_len`` words (kept in evaluation splits)."""
    return [n for n, src, tgt in pairs if _words(src) > max_len or _words(tgt) > max_len]
