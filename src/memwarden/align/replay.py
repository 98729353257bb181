"""``align-check``: replay recorded timestamps through the aligner and the naive baselines.

A log is JSON lines, in arrival order::

    {"type": "header", "audio_rate": 16000, "video_fps": 25, "audio_per_frame": 640}   (optional)
    {"type": "audio", "t_s": 12.3456, "samples": 320}
    {"type": "video", "t_s": 12.3600}

Only timestamps and sample counts are needed (the audio itself is replayed as silence). The
report: the clock offset and drift, what the aligner corrected, and what concatenating whatever
arrived, or slicing k samples per frame, would have produced on the same log.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from memwarden.align import AlignCounters, ClockEstimate, StreamAligner
from memwarden.align.baselines import naive_concat, slop_match
from memwarden.align.simulate import Event
from memwarden.errors import InputError


@dataclass(frozen=True)
class NaiveOutcome:
    units: int
    contract_violations: int  # units whose audio is not exactly k samples
    samples_min: int
    samples_max: int
    fixed_k_offset_end_ms: float  # k samples per arriving frame: how far that audio ends up from its frame
    fixed_k_offset_max_ms: float
    slop_frames_unmatched: int  # ApproximateTimeSynchronizer-style pairing, slop = half a frame
    slop_audio_chunks_dropped: int


@dataclass(frozen=True)
class ReplayReport:
    path: str
    audio_rate: float
    video_fps: float
    audio_per_frame: int
    duration_s: float
    audio_chunks: int
    video_frames: int
    estimate: ClockEstimate
    counters: AlignCounters
    contract_violations: int  # units the aligner emitted with other than audio_per_frame samples
    naive: NaiveOutcome

    def to_json(self) -> dict[str, Any]:
        return {k: (v.__dict__ if hasattr(v, "__dataclass_fields__") else v) for k, v in self.__dict__.items()}


def read_log(path: str | Path) -> tuple[dict[str, Any], list[Event]]:
    """The header (or {}) and the events, validated; every problem is one InputError with its line."""
    header: dict[str, Any] = {}
    events: list[Event] = []
    audio_received = frames = 0
    try:
        fh = open(path, encoding="utf-8")
    except OSError as exc:
        raise InputError(f"{path}: cannot read ({exc.strerror or exc})") from None
    with fh:
        try:
            lines = list(fh)
        except (OSError, UnicodeDecodeError) as exc:
            raise InputError(f"{path}: cannot read as text ({exc})") from None
    for lineno, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except (ValueError, RecursionError):
            raise InputError(f"{path}:{lineno}: not a JSON line") from None
        if not isinstance(record, dict):
            raise InputError(f"{path}:{lineno}: expected a JSON object")
        kind = record.get("type", record.get("stream"))
        if kind == "header":
            header = record
            continue
        t_s = record.get("t_s")
        if (
            kind not in ("audio", "video")
            or isinstance(t_s, bool)
            or not isinstance(t_s, int | float)
            or not math.isfinite(t_s)
        ):
            raise InputError(f'{path}:{lineno}: need "type": "audio" or "video" and a finite "t_s"')
        if kind == "audio":
            n = record.get("samples")
            if isinstance(n, bool) or not isinstance(n, int) or not 0 < n <= 10_000_000:
                raise InputError(f'{path}:{lineno}: an audio record needs "samples": a positive count')
            events.append(Event(float(t_s), "audio", audio_received, n, None))
            audio_received += n
        else:
            events.append(Event(float(t_s), "video", frames, 0, None))
            frames += 1
    if not any(e.kind == "audio" for e in events) or not any(e.kind == "video" for e in events):
        raise InputError(f"{path}: needs both audio and video records")
    return header, events


# Far above any real stream (a 10 MHz "audio" rate, 10,000 fps): past these a value is a typo, and
# the aligner's buffers are sized by them.
_MAX = {"audio_rate": 1e7, "video_fps": 1e4, "audio_per_frame": 1e7}


def _number(header: dict[str, Any], key: str, given: float | None, default: float | None) -> float | None:
    value = given if given is not None else header.get(key, default)
    if value is not None and (
        isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value <= _MAX[key]
    ):
        raise InputError(f"{key} must be a positive number up to {_MAX[key]:g} (got {str(value)[:40]})")
    return value


def replay(
    path: str | Path,
    *,
    audio_rate: float | None = None,
    video_fps: float | None = None,
    audio_per_frame: int | None = None,
) -> ReplayReport:
    header, events = read_log(path)
    rate = _number(header, "audio_rate", audio_rate, 16000) or 16000.0
    fps = _number(header, "video_fps", video_fps, 25) or 25.0
    k_given = _number(header, "audio_per_frame", audio_per_frame, None)
    aligner = StreamAligner(rate, fps, None if k_given is None else int(k_given), quality="linear")
    k = aligner.audio_per_frame
    violations = 0
    silence: dict[int, np.ndarray] = {}
    for event in events:
        if event.kind == "audio":
            chunk = silence.setdefault(event.count, np.zeros(event.count, np.float32))
            units = aligner.push_audio(event.t_s, chunk)
        else:
            units = aligner.push_frame(event.t_s, event.index)
        violations += sum(1 for u in units if u.audio.shape[0] != k)
    violations += sum(1 for u in aligner.flush() if u.audio.shape[0] != k)
    return ReplayReport(
        path=str(path),
        audio_rate=rate,
        video_fps=fps,
        audio_per_frame=k,
        duration_s=max(e.t_s for e in events) - min(e.t_s for e in events),
        audio_chunks=sum(e.kind == "audio" for e in events),
        video_frames=sum(e.kind == "video" for e in events),
        estimate=aligner.estimate,
        counters=aligner.counters,
        contract_violations=violations,
        naive=_naive(events, aligner, k),
    )


def _naive(events: list[Event], aligner: StreamAligner, k: int) -> NaiveOutcome:
    concat = naive_concat(events)
    lengths = np.array([p.samples for p in concat]) if concat else np.zeros(1, np.int64)
    # k samples per arriving frame, scored against the aligner's final clock fit: where frame j's
    # audio should start is the audio position at the frame's fitted time.
    est = aligner.estimate
    frames_t = np.array([e.t_s for e in events if e.kind == "video"])
    first_audio_t = next(e.t_s for e in events if e.kind == "audio")
    ideal_start = (frames_t - first_audio_t) * est.audio_rate_hz
    naive_start = np.arange(frames_t.size) * k + max(ideal_start[0], 0.0)
    offset_ms = (naive_start - ideal_start) / est.audio_rate_hz * 1e3
    video_frames = frames_t.size
    audio_chunks = sum(e.kind == "audio" for e in events)
    chunk = int(np.median([e.count for e in events if e.kind == "audio"]))
    paired = slop_match(events, 0.5 / aligner.video_fps, chunk)
    return NaiveOutcome(
        units=len(concat),
        contract_violations=int((lengths != k).sum()) if concat else 0,
        samples_min=int(lengths.min()),
        samples_max=int(lengths.max()),
        fixed_k_offset_end_ms=float(offset_ms[-1]),
        fixed_k_offset_max_ms=float(np.abs(offset_ms).max()),
        slop_frames_unmatched=video_frames - len(paired),
        slop_audio_chunks_dropped=audio_chunks - len(paired),
    )
