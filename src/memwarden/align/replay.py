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

import io
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from memwarden.align import (
    MAX_AUDIO_PER_FRAME,
    MAX_AUDIO_RATE,
    MAX_VIDEO_FPS,
    MIN_VIDEO_FPS,
    AlignCounters,
    ClockEstimate,
    StreamAligner,
)
from memwarden.align.baselines import naive_concat, slop_match
from memwarden.align.simulate import Event
from memwarden.errors import InputError
from memwarden.untrusted import finite_float, read_regular, terminal_safe


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


# A log is a few dozen bytes a record: an hour at 25 fps with one chunk a frame is 180k records, 8 MB.
MAX_LOG_BYTES = 64 << 20
MAX_RECORDS = 2_000_000
MAX_CHUNK_SAMPLES = 1 << 20  # one audio record: 65 s at 16 kHz
_MAX_T_S = 1e11  # |t_s|: host clocks in seconds (epoch time is 1.7e9)


def read_log(path: str | Path) -> tuple[dict[str, Any], list[Event]]:
    """The header (or {}) and the events, validated; every problem is one InputError with its line.

    A regular file only (a FIFO would block for ever, ``/dev/zero`` never ends), at most
    ``MAX_LOG_BYTES`` and ``MAX_RECORDS`` records, ``samples`` at most ``MAX_CHUNK_SAMPLES`` a record."""
    label = terminal_safe(path)
    header: dict[str, Any] = {}
    events: list[Event] = []
    audio_received = frames = 0
    try:
        text = read_regular(path, MAX_LOG_BYTES, what="an align-check log (JSON lines)").decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InputError(f"{label}: cannot read as text (not UTF-8 at byte {exc.start})") from None
    for lineno, line in enumerate(io.StringIO(text), 1):  # lazily: no list of every line
        if not line.strip():
            continue
        if len(events) >= MAX_RECORDS:
            raise InputError(f"{label}: more than {MAX_RECORDS} records")
        try:
            record = json.loads(line)
        except (ValueError, RecursionError):
            raise InputError(f"{label}:{lineno}: not a JSON line") from None
        if not isinstance(record, dict):
            raise InputError(f"{label}:{lineno}: expected a JSON object")
        kind = record.get("type", record.get("stream"))
        if kind == "header":
            header = record
            continue
        t_s = record.get("t_s")
        if kind not in ("audio", "video") or isinstance(t_s, bool) or not isinstance(t_s, int | float):
            raise InputError(f'{label}:{lineno}: need "type": "audio" or "video" and a finite "t_s"')
        t = finite_float(t_s, f'{label}:{lineno}: need a finite "t_s"; "t_s"', lo=-_MAX_T_S, hi=_MAX_T_S)
        if kind == "audio":
            n = record.get("samples")
            if isinstance(n, bool) or not isinstance(n, int) or not 0 < n <= MAX_CHUNK_SAMPLES:
                raise InputError(
                    f'{label}:{lineno}: an audio record needs "samples": a positive count (at most {MAX_CHUNK_SAMPLES})'
                )
            events.append(Event(t, "audio", audio_received, n, None))
            audio_received += n
        else:
            events.append(Event(t, "video", frames, 0, None))
            frames += 1
    if not any(e.kind == "audio" for e in events) or not any(e.kind == "video" for e in events):
        raise InputError(f"{label}: needs both audio and video records")
    return header, events


# Far above any real stream (a 10 MHz "audio" rate, 10,000 fps): past these a value is a typo, and
# the aligner's buffers are sized by them.
_MAX = {"audio_rate": MAX_AUDIO_RATE, "video_fps": MAX_VIDEO_FPS, "audio_per_frame": MAX_AUDIO_PER_FRAME}
_MIN = {"audio_rate": 1.0, "video_fps": MIN_VIDEO_FPS, "audio_per_frame": 1}


def _number(header: dict[str, Any], key: str, given: float | None, default: float | None) -> float | None:
    value = given if given is not None else header.get(key, default)
    if value is not None and (
        isinstance(value, bool) or not isinstance(value, int | float) or not _MIN[key] <= value <= _MAX[key]
    ):
        shown = str(value) if not isinstance(value, int) or value.bit_length() < 200 else "a huge integer"
        raise InputError(
            f"{key} must be a number from {_MIN[key]:g} to {_MAX[key]:g} (got {terminal_safe(shown)[:40]})"
        )
    return value


MAX_REPLAY_SAMPLES = 1 << 31  # audio samples the aligner reads in one replay: 37 h at 16 kHz
_SLACK_SLOTS = 15_000  # frame slots a log may have beyond 4x its video records: 10 minutes at 25 fps
_SLACK_SAMPLES = 1 << 24  # samples the frames may read beyond 4x the audio the log declares


def _check_work(label: str, events: list[Event], rate: float, fps: float, k: int) -> None:
    """Refuse, before replaying, a log whose work is out of proportion to its records: the aligner
    makes a unit of ``k`` samples for every frame slot of the log's span, gaps included."""
    span_s = max(e.t_s for e in events) - min(e.t_s for e in events)
    frames = sum(e.kind == "video" for e in events)
    audio = sum(e.count for e in events if e.kind == "audio")
    slots = span_s * fps
    if slots > 4 * frames + _SLACK_SLOTS:
        raise InputError(
            f"{label}: spans {span_s:g} s ({slots:.0f} frame slots at {fps:g} fps) for {frames} video records: "
            "more than three quarters of it would be gaps"
        )
    if audio > 4 * span_s * rate + MAX_CHUNK_SAMPLES:
        raise InputError(
            f"{label}: {audio} audio samples in {span_s:g} s is over 4x the audio rate {rate:g} Hz (wrong --audio-rate?)"
        )
    reads = (slots + frames) * k
    if reads > min(4 * audio + _SLACK_SAMPLES, MAX_REPLAY_SAMPLES):
        raise InputError(
            f"{label}: {slots + frames:.0f} units of {k} samples would read {reads:.3g} samples, over 4x the "
            f"{audio} the log holds or the {MAX_REPLAY_SAMPLES}-sample limit (wrong --audio-per-frame?)"
        )


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
    _check_work(terminal_safe(path), events, rate, fps, k)
    violations = 0
    silence = np.zeros(max(e.count for e in events), np.float32)  # every chunk a view of one buffer
    for event in events:
        if event.kind == "audio":
            units = aligner.push_audio(event.t_s, silence[: event.count])
        else:
            units = aligner.push_frame(event.t_s, event.index)
        violations += sum(1 for u in units if u.audio.shape[0] != k)
    violations += sum(1 for u in aligner.flush() if u.audio.shape[0] != k)
    return ReplayReport(
        path=terminal_safe(path),
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
