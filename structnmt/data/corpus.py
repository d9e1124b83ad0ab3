"""Reading parallel text: plain or gzipped files, or one TSV of pairs, and cleaning it.

Input is refused loudly rather than repaired silently: a line that is not UTF-8, or that
holds a control character (other than tab), stops ``prepare`` with the file and the
1-based line, unless ``data.clean.drop_bad_lines`` asks to drop and count such lines.
Cleaning then drops empty pairs and pairs that are too long or too unbalanced (in
whitespace words), and reports how many it dropped for each reason; kept pairs keep their
original line number, so every later error can still point into the user's file.
"""

from __future__ import annotations

import codecs
import gzip
import io
import math
import re
import zlib
from collections import Counter, deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from itertools import zip_longest
from pathlib import Path
from typing import NamedTuple

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


def control_character(text: str) -> str | None:
    """The first control character other than tab, if any (Unicode category Cc)."""
    found = _CONTROL.search(text)
    return found.group() if found else None


def _open_bytes(path: Path):
    """A binary stream, gunzipped when the data starts with gzip's magic bytes; peeking rather
    than reopening, so pipes (standard input) work too."""
    raw = io.BufferedReader(open(path, "rb", buffering=0))  # noqa: SIM115 (the caller closes it)
    return gzip.GzipFile(fileobj=raw, mode="rb") if raw.peek(2)[:2] == b"\x1f\x8b" else raw


#: what a refused control character's message advises, where lines may be dropped
DROP_HINT = "set data.clean.drop_bad_lines to drop such lines"


def iter_raw(path: str | Path, drop_bad_lines: bool = False, hint: str = DROP_HINT,
             on_bad: Callable[[DataError], None] | None = None) -> Iterator[str | None]:
    """Lines of a plain or gzip file (detected by its magic bytes, not its name), one at a time.

    None stands for a bad line that ``drop_bad_lines`` dropped; ``on_bad`` is given the error it
    would have raised, so that the caller can say which lines went. Memory stays flat however
    long the file.
    """
    path = Path(path)
    if not path.exists():  # exists(): pipes such as /dev/stdin are not "files"
        raise DataError("file not found", path)
    if path.is_dir():
        raise DataError("is a directory, not a text file", path)
    try:
        with _open_bytes(path) as handle:
            for number, raw in enumerate(handle, start=1):
                raw = raw.rstrip(b"\n").rstrip(b"\r")
                if number == 1:  # a byte-order mark (Windows editors write one) is no part of the first line
                    raw = raw.removeprefix(codecs.BOM_UTF8)
                try:
                    text = raw.decode("utf-8", errors="strict")
                except UnicodeDecodeError as err:
                    bad = DataError(f"invalid UTF-8 at byte {err.start + 1} of the line "
                                    f"({raw[err.start:err.end]!r})", path, number)
                else:
                    ch = control_character(text)
                    if ch is None:
                        yield text
                        continue
                    advice = "" if drop_bad_lines else f" ({hint})"
                    bad = DataError(f"control character U+{ord(ch):04X} in the line{advice}", path, number)
                if not drop_bad_lines:
                    raise bad
                if on_bad is not None:
                    on_bad(bad)
                yield None
    except (OSError, EOFError, gzip.BadGzipFile, zlib.error) as err:
        raise DataError(f"cannot read the file: {err}", path) from None


def read_raw(path: str | Path, drop_bad_lines: bool = False, hint: str = DROP_HINT) -> RawLines:
    """All lines of a plain or gzip file (detected by its magic bytes, not its name)."""
    out = RawLines(lines=list(iter_raw(path, drop_bad_lines, hint)))
    out.bad = [number for number, line in enumerate(out.lines, start=1) if line is None]
    return out


def read_lines(path: str | Path, drop_bad_lines: bool = False, hint: str = DROP_HINT) -> list[str]:
    """Lines of a plain or .gz file, strict UTF-8, trailing newline/CR removed.

    With ``drop_bad_lines`` undecodable or control-character lines are left out (use
    :func:`read_raw` to know which); ``hint`` is what a refused control character's message advises.
    """
    return [line for line in read_raw(path, drop_bad_lines, hint).lines if line is not None]


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


class _Row(NamedTuple):
    """One pair as :class:`AlignmentWatch` sees it: log character lengths, and which side is blank."""

    line: int
    src: float
    tgt: float
    src_blank: bool
    tgt_blank: bool


class AlignmentWatch:
    """Finds the line where source and target files slip against each other, anywhere in a file.

    The length of a translation follows that of its source (Gale & Church 1993): the log
    ratio of target to source length in characters varies little from pair to pair, while a
    target ``k`` lines away gives ratios spread far wider. For every pair the evidence that
    source line n goes with target line n - k rather than with target line n is a
    log-likelihood ratio under that model, a robust one (any pair may be an odd one out, so
    one pair counts for at most a few units), less ``drift``. A CUSUM per offset
    k = ±1..±``max_offset`` adds it up: it stays at zero over aligned pairs and climbs over
    shifted ones, and crosses ``threshold`` after about ten of them. A slip is thus found
    wherever it is: in the first or the last lines, in a split of a few dozen pairs, or over a
    stretch of 80 pairs that a second slip sets right again. Pairs that give no evidence either
    way (a period that makes several offsets alike) never climb: each costs ``drift``.

    The model (centre and spread of the log ratio) is fitted to the first ``calibrate`` pairs
    (the whole file when shorter), block by block at the offset where they fit best, so a file
    shifted from its first lines, or from its 50th, is judged right; memory is those pairs,
    however long the file. A file of fewer than ``min_pairs`` pairs is too short to fit a model
    to, and one whose lengths follow each other at no offset (equal everywhere, unrelated
    text) cannot be judged by them: it is not refused, and :attr:`unchecked` says why.
    """

    #: width (in log length ratio) of the broad part of the model that odd pairs fall into
    ODD_WIDTH = 10.0
    #: the smallest spread of the log length ratio the model assumes (2%: text of equal lengths)
    MIN_SPREAD = 0.02
    #: pairs kept to find a blank line near where the slip starts
    KEEP = 256
    #: pairs per block when fitting the model
    BLOCK = 50
    #: how much wider than at the best offset the log ratios must be at the worst one for the
    #: lengths to tell aligned pairs from shifted ones at all (Multi30k: 1.9, MSCOCO En-De, to 4.4)
    EVIDENCE = 1.5

    def __init__(self, calibrate: int = 1000, max_offset: int = 3, threshold: float = 25.0, drift: float = 0.3,
                 odd: float = 0.05, min_pairs: int = 20) -> None:
        self.calibrate, self.max_offset, self.threshold = calibrate, max_offset, threshold
        self.drift, self.odd, self.min_pairs = drift, odd, min_pairs
        self.offsets = [k for k in range(-max_offset, max_offset + 1) if k]
        self.pending: list[_Row] | None = []  # pairs read before the model is fitted
        self.window: deque[_Row] = deque(maxlen=2 * max_offset + 1)  # the pair judged next and its neighbours
        self.judged = 0  # pairs of ``window`` already judged (the last ``max_offset`` wait for later targets)
        self.recent: deque[tuple[_Row, dict[int, float]]] = deque(maxlen=self.KEEP)  # with their evidence
        self.score = dict.fromkeys(self.offsets, 0.0)
        self.peak = 0.0  # the highest score met: how near an aligned file came to being refused
        self.seen = 0
        self.centre = self.spread = self.wide = 0.0  # the model: centre, spread; spread at the worst offset
        self._fitted = self._odd = 0.0  # log densities of the two parts of the model, less the normal's
        self.broken: tuple[int, int] | None = None  # (first line read out of step, offset k)
        self.unchecked: str | None = None  # why the file was not checked, when it was not

    def add(self, line: int, src: str | None, tgt: str | None) -> tuple[int, int] | None:
        """Feed one pair (None: a dropped bad line); returns (line, offset) when alignment broke."""
        if self.broken is not None or self.unchecked is not None or src is None or tgt is None:
            return None
        self.seen += 1
        row = _Row(line, math.log1p(len(src.strip())), math.log1p(len(tgt.strip())), not src.strip(), not tgt.strip())
        if self.pending is None:
            self._push(row)
        else:
            self.pending.append(row)
            if len(self.pending) >= self.calibrate:
                self._replay()
        return self.broken

    def finish(self) -> tuple[int, int] | None:
        """Judge what is left at the end of the file: the last pairs, or a file shorter than ``calibrate``."""
        if self.unchecked is not None:
            return None
        if self.broken is None and self.pending is not None:
            if len(self.pending) < self.min_pairs:
                self.unchecked = (f"only {len(self.pending)} pairs: too few to check that source and target lines "
                                  f"match (the check needs at least {self.min_pairs}); not checked")
                self.pending = None
                return None
            self._replay()
        while self.broken is None and self.judged < len(self.window):
            self._judge(self.judged)
            self.judged += 1
        return self.broken

    def _replay(self) -> None:
        """Fit the model to the pending pairs, then judge them."""
        assert self.pending is not None
        rows, self.pending = self.pending, None
        self._fit(rows)
        if self.wide < self.EVIDENCE * self.spread:
            self.unchecked = (f"the lengths of source and target lines do not follow each other in the first "
                              f"{len(rows)} pairs (as a translation's do) at any offset up to {self.max_offset} "
                              "lines, so they cannot tell whether the lines match; not checked")
            return
        for row in rows:
            if self._push(row) is not None:
                return

    def _fit(self, rows: list[_Row]) -> None:
        """Centre and spread (median, MAD) of the log length ratio, taken in every block of
        :data:`BLOCK` pairs at the offset where it is tightest there: a slip among these pairs
        (a file shifted from line 50) does not widen the model."""
        import numpy as np

        n = len(rows)
        src = np.fromiter((r.src for r in rows), dtype=np.float64, count=n)
        tgt = np.fromiter((r.tgt for r in rows), dtype=np.float64, count=n)
        best = []
        for first in range(0, n, self.BLOCK):
            last = n if n - first < 2 * self.BLOCK else first + self.BLOCK  # no short block at the end
            fits = []
            for k in range(-self.max_offset, self.max_offset + 1):
                i = np.arange(max(first, k), min(last, n + k))  # target i - k is in the file
                if len(i):
                    ratio = tgt[i - k] - src[i]
                    fits.append((float(np.median(np.abs(ratio - np.median(ratio)))), abs(k), k, ratio))
            best.append(min(fits, key=lambda fit: fit[:2])[3])
            if last == n:
                break
        ratio = np.concatenate(best)
        self.centre = float(np.median(ratio))
        # lengths are whole numbers: one character is the least difference the model may assume
        grain = 1.0 / float(np.median(np.exp(src)))
        self.spread = max(1.4826 * float(np.median(np.abs(ratio - self.centre))), grain, self.MIN_SPREAD)
        self.wide = max(1.4826 * float(np.median(np.abs(r - np.median(r)))) for r in (
            tgt[max(-k, 0):n - max(k, 0)] - src[max(k, 0):n + min(k, 0)] for k in self.offsets if abs(k) < n))
        self._fitted = math.log(1 - self.odd) - math.log(self.spread * math.sqrt(2 * math.pi))
        self._odd = math.log(self.odd / self.ODD_WIDTH)

    def _log_p(self, ratio: float) -> float:
        """Log density of a log length ratio: the fitted normal, or (rarely) anything at all."""
        z = (ratio - self.centre) / self.spread
        fitted = self._fitted - 0.5 * z * z
        high, low = (fitted, self._odd) if fitted > self._odd else (self._odd, fitted)
        return high + math.log1p(math.exp(low - high))

    def _push(self, row: _Row) -> tuple[int, int] | None:
        if len(self.window) == self.window.maxlen:
            self.judged -= 1  # the oldest, judged long ago, drops out
        self.window.append(row)
        if len(self.window) - self.judged > self.max_offset:  # its later neighbours are here
            self._judge(self.judged)
            self.judged += 1
        return self.broken

    def _judge(self, at: int) -> None:
        """Add the evidence of pair ``window[at]`` to every offset's score."""
        row = self.window[at]
        aligned = self._log_p(row.tgt - row.src)
        evidence = {k: self._log_p(self.window[at - k].tgt - row.src) - aligned for k in self.offsets
                    if 0 <= at - k < len(self.window)}  # target n - k is in the file
        self.recent.append((row, evidence))
        for k, value in evidence.items():
            score = max(0.0, self.score[k] + value - self.drift)
            self.score[k] = score
            self.peak = max(self.peak, score)
            if score > self.threshold:
                self.broken = (self._locate(k), k)
                return

    def _locate(self, k: int) -> int:
        """The line where the slip starts: where the pairs kept in memory are best split into aligned
        ones before and shifted ones after (the least evidence summed up to there), or a line blank
        on the side that gained one within 20 lines of that (loose translations blur the split)."""
        total, least, cut = 0.0, 0.0, 0
        for index, (_, evidence) in enumerate(self.recent):
            total += evidence.get(k, 0.0)
            if total < least:
                least, cut = total, index + 1
        cut = min(cut, len(self.recent) - 1)
        rows = [row for row, _ in self.recent]
        start = rows[cut].line
        blank = [r.line for r in rows[max(cut - 20, 0):cut + 21]
                 if (r.src_blank and not r.tgt_blank if k > 0 else r.tgt_blank and not r.src_blank)]
        return min(blank, key=lambda line: (abs(line - start), line)) if blank else start

    def message(self, split: SplitFiles) -> str:
        """What :func:`misaligned_error` says, without the file and line."""
        assert self.broken is not None
        _, k = self.broken
        src, tgt = (split.src, split.tgt) if split.tsv is None else ("the source column", "the target column")
        added, lost = (src, tgt) if k > 0 else (tgt, src)
        return (f"source and target stop matching here: from this line on, source line n reads like the "
                f"translation of target line n{-k:+d} (sentence lengths in characters); a line was "
                f"added to {added} or lost from {lost} about here. Fix the files, or set "
                "data.clean.allow_misaligned: true to go on with them as they are")


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


def iter_pairs(split: SplitFiles, drop_bad_lines: bool = False,
               on_bad: Callable[[DataError], None] | None = None) -> Iterator[Pair]:
    """The uncleaned pairs of a split as (1-based line, src, tgt), streamed; None marks a dropped
    bad line (its error goes to ``on_bad``, as in :func:`iter_raw`).

    Source and target files are read side by side: where one ends before the other the
    error names both files, both line counts and the line where the shorter one ends.
    """
    if split.tsv is not None:
        number = 0
        for number, line in enumerate(iter_raw(split.tsv, drop_bad_lines, on_bad=on_bad), start=1):
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
    sources = iter_raw(split.src, drop_bad_lines, on_bad=on_bad)
    targets = iter_raw(split.tgt, drop_bad_lines, on_bad=on_bad)
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
               watch: RatioWatch | None = None,
               on_empty: Callable[[int, str, str], None] | None = None) -> Iterator[tuple[int, str, str]]:
    """:func:`clean_pairs`, streamed: kept pairs are yielded, drops counted in ``report``; each pair
    dropped for an empty side also goes to ``on_empty`` (line, src, tgt)."""
    report.update({reason: 0 for reason in DROP_REASONS})
    for number, src, tgt in pairs:
        report["read"] += 1
        reason = _drop_reason(number, src, tgt, clean, watch)
        if reason is None:
            report["kept"] += 1
            yield number, src, tgt  # type: ignore[misc]
        else:
            report[reason] += 1
            if reason == "empty" and on_empty is not None:
                on_empty(number, src, tgt)  # type: ignore[arg-type]


def read_parallel(split: SplitFiles, clean: CleanConfig,
                  watch: RatioWatch | None = None) -> tuple[list[tuple[int, str, str]], dict[str, int]]:
    """Read and clean one split: the kept (line number, src, tgt) and the drop counts by reason."""
    return clean_pairs(read_pairs(split, clean.drop_bad_lines), clean, watch)


def long_lines(pairs: list[tuple[int, str, str]], max_len: int) -> list[int]:
    """Line numbers of pairs with a side over ``max_len`` words (kept in evaluation splits)."""
    return [n for n, src, tgt in pairs if _words(src) > max_len or _words(tgt) > max_len]
