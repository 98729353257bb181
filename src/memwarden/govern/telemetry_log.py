"""Recorded telemetry: JSON-lines logs and tegrastats logs, parsed and replayed.

JSON lines, one sample each: ``{"t": seconds, "mem_total_bytes", "mem_available_bytes",
"temp_c", "power_w", "fps"}``; every field but ``t`` may be missing, and the other fields of
:class:`~memwarden.govern.telemetry.TelemetrySample` are read too. Every way a log can be
unusable ends as one :class:`~memwarden.errors.InputError` naming the file and the line.
"""

from __future__ import annotations

import itertools
import json
import math
import os
import re
from collections.abc import Iterable, Iterator
from datetime import datetime
from pathlib import Path
from typing import BinaryIO

from memwarden.errors import InputError
from memwarden.govern.telemetry import Reading, TelemetrySample, parse_tegrastats
from memwarden.untrusted import open_regular, terminal_safe

__all__ = [
    "MAX_LINES",
    "MAX_LINE_BYTES",
    "MAX_LOG_BYTES",
    "MAX_SAMPLES",
    "ReplaySource",
    "load_log",
    "parse_jsonl",
    "parse_tegrastats_log",
]
# Five days of 1 Hz samples (14 h at 10 Hz) is 432k lines of ~150 bytes (65 MB). Past these a log is
# not a recording: a replay costs ~0.15 ms and ~1 KiB a sample (--json), so 500k samples stay under
# 1 GB, and a file of blank lines is cut at 2M lines instead of read for minutes.
MAX_LOG_BYTES = 128 << 20
MAX_LINE_BYTES = 64 << 10
MAX_LINES = 2_000_000
MAX_SAMPLES = 500_000
_MAX_INTERVAL_S = 86400.0  # seconds between tegrastats lines without timestamps: a day at most

_TEGRA_RAM = re.compile(r"\bRAM \d+/\d+(?:kB|KB|MB|GB)")
_STAMP = re.compile(r"^\s*(\d\d-\d\d-\d{4} \d\d:\d\d:\d\d)\s")


def parse_tegrastats_log(
    lines: Iterable[str], *, label: str = "<log>", interval_s: float = 1.0
) -> list[TelemetrySample]:
    """A recorded tegrastats log. Time: the lines' timestamps (newer tegrastats prints
    ``MM-DD-YYYY HH:MM:SS``, 1 s resolution) relative to the first, else line index × interval_s."""
    samples: list[TelemetrySample] = []
    first: datetime | None = None
    for lineno, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            reading = parse_tegrastats(line)
        except ValueError as exc:
            raise InputError(f"{label}: line {lineno}: {terminal_safe(exc)}") from None
        if len(samples) >= MAX_SAMPLES:
            raise InputError(f"{label}: more than {MAX_SAMPLES} samples")
        stamp = _STAMP.match(line)
        if stamp is not None:
            try:
                when = datetime.strptime(stamp.group(1), "%m-%d-%Y %H:%M:%S")
            except ValueError:  # month 33, second 61: the shape of a stamp, not a date
                raise InputError(f"{label}: line {lineno}: bad timestamp {stamp.group(1)!r}") from None
            first = first or when
            t_s = (when - first).total_seconds()
        else:
            t_s = len(samples) * interval_s
        samples.append(TelemetrySample.from_reading(t_s, reading))
    return samples


# ---------------------------------------------------------------------------------------------
# Replay


def parse_jsonl(lines: Iterable[str], *, label: str = "<log>") -> list[TelemetrySample]:
    """JSON-lines telemetry -> samples sorted by ``t`` (stable: equal ``t`` keep file order).

    Blank lines are skipped. The first malformed line raises one InputError naming the line.
    Sorting, not rejecting, out-of-order ``t``: logs merged from several writers interleave.
    """
    rows: list[tuple[float, int, TelemetrySample]] = []
    for lineno, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            sample = TelemetrySample.from_json(json.loads(line))
        except (ValueError, RecursionError) as exc:  # json.JSONDecodeError is a ValueError
            raise InputError(f"{label}: line {lineno}: {terminal_safe(exc)}") from None
        if len(rows) >= MAX_SAMPLES:
            raise InputError(f"{label}: more than {MAX_SAMPLES} samples")
        rows.append((sample.t_s, lineno, sample))
    rows.sort(key=lambda r: (r[0], r[1]))
    return [s for _, _, s in rows]


def _lines(fh: BinaryIO, label: str) -> Iterator[str]:
    """The file's lines, one at a time, within ``MAX_LOG_BYTES`` in all and ``MAX_LINE_BYTES`` each
    (a file that grows while read is still cut at the budget)."""
    total = 0
    for lineno in itertools.count(1):
        raw = fh.readline(MAX_LINE_BYTES + 1)
        if not raw:
            return
        total += len(raw)
        if total > MAX_LOG_BYTES:
            raise InputError(f"{label}: over the {MAX_LOG_BYTES}-byte limit for a telemetry log")
        if lineno > MAX_LINES:
            raise InputError(f"{label}: more than {MAX_LINES} lines, over the limit for a telemetry log")
        if len(raw) > MAX_LINE_BYTES:
            raise InputError(f"{label}: line {lineno}: longer than {MAX_LINE_BYTES} bytes")
        try:
            yield raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise InputError(f"{label}: line {lineno}: not UTF-8 text (bad byte at column {exc.start + 1})") from None


def load_log(path: str | os.PathLike[str], *, interval_s: float = 1.0) -> list[TelemetrySample]:
    """A recorded log, JSON lines or tegrastats text (told apart by the first non-blank line).

    A regular file only, at most ``MAX_LOG_BYTES`` (lines at most ``MAX_LINE_BYTES``, at most
    ``MAX_SAMPLES`` samples); anything else is one ``InputError``."""
    label = terminal_safe(path)
    if not (math.isfinite(interval_s) and 0 < interval_s <= _MAX_INTERVAL_S):
        raise InputError(f"interval {interval_s!r}: expected more than 0 and at most {_MAX_INTERVAL_S:g} seconds")
    # Lines are read one at a time, never the whole file as a list: a log of 200 MB of blank lines
    # must not cost gigabytes (Python keeps every line of a list as an object of its own).
    with open_regular(path, label, "a telemetry log (JSON lines or tegrastats)") as fh:
        try:
            head = next((ln.lstrip() for ln in _lines(fh, label) if ln.strip()), "")
            if not head:
                raise InputError(f"{label}: empty telemetry log")
            fh.seek(0)
            if head.startswith("{") or not _is_tegrastats(head):
                return parse_jsonl(_lines(fh, label), label=label)  # its error then says why the line is not JSON
            return parse_tegrastats_log(_lines(fh, label), label=label, interval_s=interval_s)
        except OSError as exc:
            raise InputError(f"{label}: cannot read ({exc.strerror or exc})") from None


def _is_tegrastats(line: str) -> bool:
    # The RAM figure makes a tegrastats line; a bad value later in it is that line's error, not "not JSON".
    return _TEGRA_RAM.search(line) is not None


class ReplaySource:
    """A recorded log played back: iterate it, or call ``sample()`` like :class:`Telemetry`
    (each call gives the next sample; past the end the last one repeats)."""

    name = "replay"

    def __init__(self, path: str | os.PathLike[str], *, interval_s: float = 1.0) -> None:
        self.path = Path(path)
        self.samples: tuple[TelemetrySample, ...] = tuple(load_log(path, interval_s=interval_s))
        self._next = 0

    def __iter__(self) -> Iterator[TelemetrySample]:
        return iter(self.samples)

    def __len__(self) -> int:
        return len(self.samples)

    @property
    def exhausted(self) -> bool:
        return self._next >= len(self.samples)

    def sample(self) -> TelemetrySample:
        i = min(self._next, len(self.samples) - 1)
        self._next += 1
        return self.samples[i]

    def read(self) -> Reading:
        return {k: v for k, v in self.sample().to_json().items() if k != "t"}

    def close(self) -> None:
        pass
