"""What people do instead of aligning, run on the same events, and one scorer for all methods.

- ``naive_concat``: each arriving frame gets the audio that arrived since the previous frame.
- ``naive_fixed``: each arriving frame takes the next ``k`` samples (the contract holds, the
  offset walks away with the drift and with every dropped frame).
- ``slop_match``: ROS message_filters ``ApproximateTimeSynchronizer`` for two topics: a frame
  and an audio chunk are paired when their stamps are within ``slop_s``; whatever cannot be
  paired is dropped; no drift estimate. Give it chunks of one frame period (its best case).

Every method yields ``Placement``s: which frame, where its audio starts in the device's sample
stream, how many samples. ``score`` turns them into the numbers the benchmark prints.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from memwarden.align.simulate import Event, StreamSpec


@dataclass(frozen=True)
class Placement:
    frame: int  # true frame index
    start_sample: float  # position of the unit's first audio sample in the device stream
    samples: int  # audio samples the unit carries
    span_samples: float | None = None  # device samples those cover, when resampled (default: samples)


@dataclass(frozen=True)
class Score:
    units: int
    frames_delivered: int
    frames_without_unit: int  # delivered frames the method never emitted
    contract_violations: int  # units whose audio is not exactly k samples
    audio_samples_lost: int  # device samples, between the first and last unit, that no unit carries
    offset_p50_ms: float  # |audio start time - frame time|, over units
    offset_p99_ms: float
    offset_max_ms: float

    def to_json(self) -> dict[str, float | int]:
        return dict(self.__dict__)


def naive_concat(stream: Iterable[Event]) -> list[Placement]:
    out: list[Placement] = []
    received = consumed = 0
    for event in stream:
        if event.kind == "audio":
            received = event.index + event.count
        else:
            out.append(Placement(event.index, float(consumed), received - consumed))
            consumed = received
    return out


def naive_fixed(stream: Iterable[Event], k: int) -> list[Placement]:
    out: list[Placement] = []
    for event in stream:
        if event.kind == "video":
            out.append(Placement(event.index, float(len(out) * k), k))
    return out


def slop_match(stream: Iterable[Event], slop_s: float, chunk_samples: int) -> list[Placement]:
    audio: deque[Event] = deque()
    video: deque[Event] = deque()
    out: list[Placement] = []
    for event in stream:
        (audio if event.kind == "audio" else video).append(event)
        while audio and video:
            a, v = audio[0], video[0]
            if abs(a.t_s - v.t_s) <= slop_s:
                out.append(Placement(v.index, float(a.index), chunk_samples))
                audio.popleft()
                video.popleft()
            elif a.t_s < v.t_s:
                audio.popleft()  # too old for this frame or any later one: dropped
            else:
                video.popleft()
    return out


def score(placements: list[Placement], spec: StreamSpec, k: int, frames_delivered: int, audio_total: int) -> Score:
    if not placements:
        return Score(0, frames_delivered, frames_delivered, 0, audio_total, float("nan"), float("nan"), float("nan"))
    frames = np.array([p.frame for p in placements])
    starts = np.array([p.start_sample for p in placements])
    lengths = np.array([p.samples for p in placements])
    offsets_ms = np.abs(np.asarray(spec.audio_time_s(starts)) - np.asarray(spec.frame_time_s(frames))) * 1e3
    covered = np.zeros(audio_total + 1, dtype=np.int32)  # +1/-1 at interval ends, then a prefix sum
    lo = np.clip(np.floor(starts).astype(np.int64), 0, audio_total)
    spans = np.array([p.samples if p.span_samples is None else p.span_samples for p in placements])
    hi = np.clip(np.ceil(starts + spans).astype(np.int64), 0, audio_total)
    np.add.at(covered, lo, 1)
    np.add.at(covered, hi, -1)
    # Only inside the span the units cover: the tail after the last frame is not a loss.
    span = slice(int(lo.min()), int(hi.max()))
    lost = int((np.cumsum(covered[:-1])[span] == 0).sum())
    return Score(
        units=len(placements),
        frames_delivered=frames_delivered,
        frames_without_unit=max(frames_delivered - len(set(frames.tolist())), 0),
        contract_violations=int((lengths != k).sum()),
        audio_samples_lost=lost,
        offset_p50_ms=float(np.percentile(offsets_ms, 50)),
        offset_p99_ms=float(np.percentile(offsets_ms, 99)),
        offset_max_ms=float(offsets_ms.max()),
    )
