"""Recorded telemetry: JSON-lines logs and tegrastats logs, parsed and replayed.

JSON lines, one sample each: ``{"t": seconds, "mem_total_bytes", "mem_available_bytes",
"temp_c", "power_w", "fps"}``; every field but ``t`` may be missing, and the other fields of
:class:`~memwarden.govern.telemetry.TelemetrySample` are read too. Every way a log can be
unusable ends as one :class:`~memwarden.errors.InputError` naming the file and the line.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterable, Iterator
from datetime import datetime
from pathlib import Path

from memwarden.errors import InputError
from memwarden.govern.telemetry import Reading, TelemetrySample, parse_tegrastats

__all__ = ["ReplaySource", "load_log", "parse_jsonl", "parse_tegrastats_log"]

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
            raise InputError(f"{label}: line {lineno}: {exc}") from None
        stamp = _STAMP.match(line)
        if stamp is not None:
            when = datetime.strptime(stamp.group(1), "%m-%d-%Y %H:%M:%S")
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
            raise InputError(f"{label}: line {lineno}: {exc}") from None
        rows.append((sample.t_s, lineno, sample))
    rows.sort(key=lambda r: (r[0], r[1]))
    return [s for _, _, s in rows]


def load_log(path: str | os.PathLike[str], *, interval_s: float = 1.0) -> list[TelemetrySample]:
    """A recorded log, JSON lines or tegrastats text (told apart by the first non-blank line)."""
    label = str(path)
    # Lines are read one at a time, never the whole file as a list: a log of 200 MB of blank lines
    # must not cost gigabytes (Python keeps every line of a list as an object of its own).
    try:
        if Path(path).is_dir():
            raise InputError(f"{label}: is a directory, expected a telemetry log (JSON lines or tegrastats)")
        with open(path, encoding="utf-8") as fh:
            head = next((ln.lstrip() for ln in fh if ln.strip()), "")
            if not head:
                raise InputError(f"{label}: empty telemetry log")
            fh.seek(0)
            if head.startswith("{") or not _is_tegrastats(head):
                return parse_jsonl(fh, label=label)  # its error then says why the line is not JSON
            return parse_tegrastats_log(fh, label=label, interval_s=interval_s)
    except FileNotFoundError:
        raise InputError(f"{label}: no such file") from None
    except UnicodeDecodeError as exc:
        raise InputError(f"{label}: not UTF-8 text (bad byte at offset {exc.start})") from None
    except OSError as exc:
        raise InputError(f"{label}: cannot read ({exc.strerror or exc})") from None


def _is_tegrastats(line: str) -> bool:
    try:
        parse_tegrastats(line)
    except ValueError:
        return False
    return True


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
