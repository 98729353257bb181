"""Simulated capture: an audio device and a camera on their own crystals, stamped by the host.

The truth is kept so alignment can be scored: audio sample ``n`` was captured at host time
``audio_start_s + n / (audio_rate * (1 + audio_drift_ppm / 1e6))`` and frame ``i`` at
``i / (video_fps * (1 + video_drift_ppm / 1e6))``. A stamp is the capture time plus a delivery
delay: ``jitter="latency"`` draws it uniformly from [0, jitter_s] (a scheduler's wake-up
latency, never early), ``"uniform"`` from [-jitter_s, jitter_s] (bounded symmetric error),
``"gaussian"`` from N(0, jitter_s) (unbounded symmetric noise, the hard case for a drift estimate:
no floor to lean on). Frames are dropped and duplicated at the given rates; audio chunks can be lost.
Events come in stamp order, lazily, so an hour of 16 kHz audio never sits in memory.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

TONE_HZ = 440.0  # the audio content: a tone of the true capture time, so output can be checked


@dataclass(frozen=True, kw_only=True)
class StreamSpec:
    duration_s: float = 60.0
    audio_rate: float = 16000
    video_fps: float = 25
    audio_drift_ppm: float = 0.0
    video_drift_ppm: float = 0.0
    jitter_s: float = 0.005
    jitter: str = "latency"  # or "uniform", "gaussian"
    drop_frame_rate: float = 0.01
    duplicate_frame_rate: float = 0.0
    drop_audio_chunk_rate: float = 0.0
    audio_chunk_samples: int = 320
    audio_start_s: float = 0.013  # audio starts this long after frame 0
    seed: int = 0

    @property
    def audio_rate_true_hz(self) -> float:
        return self.audio_rate * (1 + self.audio_drift_ppm / 1e6)

    @property
    def video_fps_true(self) -> float:
        return self.video_fps * (1 + self.video_drift_ppm / 1e6)

    @property
    def true_drift_ppm(self) -> float:
        """Audio rate relative to the video clock: what ``ClockEstimate.drift_ppm`` estimates."""
        return ((1 + self.audio_drift_ppm / 1e6) / (1 + self.video_drift_ppm / 1e6) - 1) * 1e6

    def audio_time_s(self, sample: np.ndarray | float) -> np.ndarray | float:
        return self.audio_start_s + np.asarray(sample, dtype=np.float64) / self.audio_rate_true_hz

    def frame_time_s(self, index: np.ndarray | float) -> np.ndarray | float:
        return np.asarray(index, dtype=np.float64) / self.video_fps_true


@dataclass(frozen=True)
class Event:
    t_s: float  # the stamp as delivered (capture time plus delay)
    kind: str  # "audio" or "video"
    index: int  # first sample of the chunk, or the frame's true index
    count: int  # samples in the chunk; 0 for video
    samples: np.ndarray | None  # audio content; None for video or when only timing is simulated


def _delays(spec: StreamSpec, rng: np.random.Generator, n: int) -> np.ndarray:
    if spec.jitter == "gaussian":
        return rng.normal(0.0, spec.jitter_s, n)
    if spec.jitter == "uniform":
        return rng.uniform(-spec.jitter_s, spec.jitter_s, n)
    return rng.uniform(0.0, spec.jitter_s, n)


def _audio_events(spec: StreamSpec, with_samples: bool) -> Iterator[Event]:
    rng = np.random.default_rng([spec.seed, 1])
    chunk = spec.audio_chunk_samples
    total = int((spec.duration_s - spec.audio_start_s) * spec.audio_rate_true_hz) // chunk
    starts = np.arange(total, dtype=np.int64) * chunk
    stamps = np.asarray(spec.audio_time_s(starts)) + _delays(spec, rng, total)
    lost = rng.random(total) < spec.drop_audio_chunk_rate
    lost[:50] = False  # the aligner needs a first estimate before a loss can be told from jitter
    stamps = np.maximum.accumulate(stamps)  # one device delivers in order
    offsets = np.arange(chunk)
    for i in range(total):
        if lost[i]:
            continue
        samples = None
        if with_samples:
            t = np.asarray(spec.audio_time_s(starts[i] + offsets))
            samples = np.sin(2 * np.pi * TONE_HZ * t).astype(np.float32)
        yield Event(float(stamps[i]), "audio", int(starts[i]), chunk, samples)


def _video_events(spec: StreamSpec) -> Iterator[Event]:
    rng = np.random.default_rng([spec.seed, 2])
    total = int(spec.duration_s * spec.video_fps_true)
    stamps = np.asarray(spec.frame_time_s(np.arange(total))) + _delays(spec, rng, total)
    dropped = rng.random(total) < spec.drop_frame_rate
    dropped[0] = False
    duplicated = rng.random(total) < spec.duplicate_frame_rate
    for i in range(total):
        if dropped[i]:
            continue
        yield Event(float(stamps[i]), "video", i, 0, None)
        if duplicated[i]:
            yield Event(float(stamps[i]) + 1e-4, "video", i, 0, None)


def events(spec: StreamSpec, *, with_samples: bool = True) -> Iterator[Event]:
    """Both streams merged in stamp order (how one consumer thread would see them)."""
    return heapq.merge(_audio_events(spec, with_samples), _video_events(spec), key=lambda e: e.t_s)
