"""``StreamAligner``: timestamped audio chunks and video frames in, aligned units out.

Every unit holds one video frame and exactly ``audio_per_frame`` audio samples (or feature frames),
the contract audio-visual LLM frontends assert ("Audio features and audio tokens do not match").
Two online straight-line fits map each stream's counter to host time: audio sample index ->
seconds (one point per chunk) and video frame index -> seconds. Their ratio is the drift between
the two clocks, their intercepts the offset. Each slope is least squares, or the lower envelope
of the stamps when their delays show a floor (``memwarden.align.fit``). Unit ``i`` covers the
host interval between the fitted times of frames ``i`` and ``i + 1``; its audio is read from the
sample buffer at the matching fractional positions (resampling to the nominal rate), starting
exactly where the previous unit's audio ended so nothing is lost or repeated. When an updated
fit moves the target, the unit absorbs the difference as a rate change bounded by ``max_slew``
(no clicks, no jumps).

Dropped frames (a gap in the fitted frame index) are filled with the previous frame's payload;
duplicates (an index already seen) are discarded; a lost audio chunk (a timestamp jump well past
the jitter) is filled with silence. Counters say how often each happened.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass
from typing import Any

import numpy as np

from memwarden.align.fit import LineFit
from memwarden.align.resample import HALF_TAPS, read_at
from memwarden.errors import InputError
from memwarden.untrusted import finite_float, finite_int

# Bounds checked before anything is sized by them (docs/security.md). A gap longer than MAX_GAP_S in
# either stream (a timestamp jump, a frame index jump) is an error, not minutes of silence or of
# repeated frames: at 16 kHz a 10^5 s jump would be 6 GiB of silence.
MAX_AUDIO_RATE = 1e7  # samples (or feature frames) per second: far above 384 kHz audio
MIN_VIDEO_FPS, MAX_VIDEO_FPS = 0.01, 1e4
MAX_AUDIO_PER_FRAME = 1 << 20
MAX_GAP_S = 60.0  # default; the most a caller may set is MAX_GAP_S_LIMIT
MAX_GAP_S_LIMIT = 3600.0


def _finite(t_s: object) -> bool:
    # A number whose float is finite: a 400-digit integer's float() overflows, so it is no timestamp.
    try:
        return not isinstance(t_s, bool) and math.isfinite(t_s)  # type: ignore[arg-type]
    except (TypeError, OverflowError):
        return False


@dataclass(frozen=True)
class AlignedUnit:
    frame_index: int  # slot on the video grid, 0 = the first frame received
    frame_t_s: float  # fitted host time of the frame (jitter removed)
    frame: Any  # the payload pushed with the frame; for a filled slot, the previous frame's
    audio: np.ndarray  # (audio_per_frame,) or (audio_per_frame, channels), float32
    audio_start_sample: float  # fractional position of audio[0] in the received audio stream
    filled: bool  # the frame was dropped upstream and this unit repeats the previous payload


@dataclass(frozen=True)
class ClockEstimate:
    offset_s: float  # fitted host time of audio sample 0 minus that of video frame 0
    drift_ppm: float  # audio clock rate relative to the video clock, beyond nominal
    audio_rate_hz: float  # audio samples per host second
    video_fps: float  # video frames per host second
    audio_points: int
    video_points: int
    audio_floor: bool = False  # the audio period came from the stamps' floor, not least squares
    video_floor: bool = False  # likewise the video period (see ``memwarden.align.fit``)


@dataclass(frozen=True)
class AlignCounters:
    frames_in: int
    frames_duplicate: int  # discarded: their slot was already taken
    frames_filled: int  # slots with no frame, given the previous frame's payload
    audio_chunks_in: int
    audio_samples_in: int
    audio_gaps: int  # timestamp jumps read as lost chunks
    audio_gap_samples_filled: int  # silence inserted for them
    units_emitted: int
    units_padded: int  # units whose audio reached outside what was received (stream start/end)
    max_correction_s: float  # largest offset correction still pending after a unit (slew-limited)


class StreamAligner:
    """Align audio to video online; ``push_audio``/``push_frame`` return the units now complete.

    ``audio_per_frame`` defaults to ``audio_rate / video_fps`` when that is a whole number. Audio
    timestamps mark a chunk's first sample; frame timestamps the frame's capture, both on the
    same host clock. The audio device's rate may differ from ``audio_rate`` by a clock drift
    (a few thousand ppm at most), not by a different nominal rate: check that with
    ``memwarden doctor --pipeline``.

    Limits, checked before anything is allocated (``InputError`` otherwise): ``audio_rate`` at most
    ``MAX_AUDIO_RATE``, ``video_fps`` within ``MIN_VIDEO_FPS``..``MAX_VIDEO_FPS``, ``audio_per_frame``
    at most ``MAX_AUDIO_PER_FRAME``; a timestamp more than ``max_gap_s`` (default 60 s, at most an
    hour) from its stream's previous one, and a gap that would be filled with more than ``max_gap_s``
    of silence or of repeated frames, is refused: restart the aligner for a new stream.
    """

    def __init__(
        self,
        audio_rate: float = 16000,
        video_fps: float = 25,
        audio_per_frame: int | None = None,
        *,
        max_slew: float = 0.01,
        quality: str = "sinc",
        detect_audio_gaps: bool = True,
        max_gap_s: float = MAX_GAP_S,
    ) -> None:
        rate = finite_float(audio_rate, "audio_rate", lo=1.0, hi=MAX_AUDIO_RATE)
        fps = finite_float(video_fps, "video_fps", lo=MIN_VIDEO_FPS, hi=MAX_VIDEO_FPS)
        if audio_per_frame is None:
            per_frame = rate / fps
            if abs(per_frame - round(per_frame)) > 1e-9:
                raise InputError(
                    f"audio_rate / video_fps = {per_frame:g} is not whole: pass audio_per_frame (the model's k)"
                )
            audio_per_frame = int(round(per_frame))
        audio_per_frame = finite_int(audio_per_frame, "audio_per_frame", lo=1, hi=MAX_AUDIO_PER_FRAME)
        self.max_gap_s = finite_float(max_gap_s, "max_gap_s", lo=0.001, hi=MAX_GAP_S_LIMIT)
        if quality not in ("sinc", "linear"):
            raise InputError(f"quality must be 'sinc' or 'linear' (got {quality!r})")
        self.audio_rate = rate
        self.video_fps = fps
        self.audio_per_frame = int(audio_per_frame)
        self.max_slew = float(max_slew)
        self.quality = quality
        self.detect_audio_gaps = detect_audio_gaps
        self._audio_fit = LineFit(prior_slope_s=1.0 / self.audio_rate)
        self._video_fit = LineFit(prior_slope_s=1.0 / self.video_fps)
        self._buf = np.zeros((0,), dtype=np.float32)
        self._buf_first = 0  # absolute index of self._buf[0]
        self._pending: list[np.ndarray] = []
        self._received = 0  # samples received, silence for gaps included
        self._residual_n = 0
        self._residual_sq_s2 = 0.0
        self._last_chunk_samples = 0
        self._slots: deque[tuple[int, Any, bool]] = deque()  # (frame index, payload, filled) awaiting audio
        self._last_index = -1
        self._last_payload: Any = None
        self._next_start: float | None = None
        self._c = dict.fromkeys(
            (
                "frames_in",
                "frames_duplicate",
                "frames_filled",
                "audio_chunks_in",
                "audio_samples_in",
                "audio_gaps",
                "audio_gap_samples_filled",
                "units_emitted",
                "units_padded",
            ),
            0,
        )
        self._max_correction_s = 0.0
        self._last_audio_t: float | None = None
        self._last_video_t: float | None = None
        self._max_jump_frames = int(self.max_gap_s * self.video_fps * 1.02) + 2  # the fit's slope is within 1%
        self._max_gap_samples = int(self.max_gap_s * self.audio_rate * 1.02) + 2

    # -- input -------------------------------------------------------------------------------

    def push_audio(self, t_s: float, samples: Any) -> list[AlignedUnit]:
        chunk = np.asarray(samples, dtype=np.float32)
        if chunk.ndim == 0 or chunk.shape[0] == 0 or not _finite(t_s):
            raise InputError("an audio chunk needs a finite timestamp and at least one sample")
        chunk_s = self._last_chunk_samples / self.audio_rate * 1.02  # a stamp marks its chunk's first sample
        self._last_audio_t = self._check_jump("audio", t_s, self._last_audio_t, chunk_s)
        if self._received == 0 and self._buf.size == 0 and not self._pending:
            self._buf = np.zeros((0,) + chunk.shape[1:], dtype=np.float32)
        elif chunk.shape[1:] != self._buf.shape[1:]:
            raise InputError(f"audio chunk shape {chunk.shape} does not match earlier chunks {self._buf.shape}")
        self._fill_audio_gap(t_s)
        self._audio_fit.push(float(self._received), t_s)
        self._pending.append(chunk)
        self._received += chunk.shape[0]
        self._last_chunk_samples = chunk.shape[0]
        self._c["audio_chunks_in"] += 1
        self._c["audio_samples_in"] += chunk.shape[0]
        return self._drain()

    def push_frame(self, t_s: float, frame: Any = None) -> list[AlignedUnit]:
        if not _finite(t_s):
            raise InputError("a video frame needs a finite timestamp")
        self._last_video_t = self._check_jump("video", t_s, self._last_video_t)
        self._c["frames_in"] += 1
        index = 0 if self._last_index < 0 else round(self._video_fit.counter_at(t_s))
        if index <= self._last_index:
            self._c["frames_duplicate"] += 1
            return []
        if index - self._last_index > self._max_jump_frames:  # checked before a slot is made for each
            raise InputError(
                f"a video frame at t={t_s:g} s lands {index - self._last_index} frames after the last one, "
                f"a gap over max_gap_s={self.max_gap_s:g} s"
            )
        for missing in range(self._last_index + 1, index):
            self._slots.append((missing, self._last_payload, True))
            self._c["frames_filled"] += 1
        self._slots.append((index, frame, False))
        self._video_fit.push(float(index), t_s)
        self._last_index, self._last_payload = index, frame
        return self._drain()

    def flush(self) -> list[AlignedUnit]:
        """Emit every queued unit, reading silence past the end of the received audio."""
        return self._drain(final=True)

    # -- state -------------------------------------------------------------------------------

    @property
    def estimate(self) -> ClockEstimate:
        audio_period_s = self._audio_fit.slope_s
        video_period_s = self._video_fit.slope_s
        samples_per_video_s = video_period_s * self.video_fps / audio_period_s
        return ClockEstimate(
            offset_s=self._audio_fit.at(0.0) - self._video_fit.at(0.0),
            drift_ppm=(samples_per_video_s / self.audio_rate - 1.0) * 1e6,
            audio_rate_hz=1.0 / audio_period_s,
            video_fps=1.0 / video_period_s,
            audio_points=self._audio_fit.count,
            video_points=self._video_fit.count,
            audio_floor=self._audio_fit.floor_used,
            video_floor=self._video_fit.floor_used,
        )

    @property
    def counters(self) -> AlignCounters:
        return AlignCounters(**self._c, max_correction_s=self._max_correction_s)

    # -- internals ---------------------------------------------------------------------------

    def _check_jump(self, stream: str, t_s: float, last_t_s: float | None, allow_s: float = 0.0) -> float:
        if last_t_s is not None and abs(t_s - last_t_s) > self.max_gap_s + allow_s:
            raise InputError(
                f"{stream} timestamp {t_s:g} s is {abs(t_s - last_t_s):g} s from the previous one "
                f"({last_t_s:g} s), over max_gap_s={self.max_gap_s:g} s"
            )
        return float(t_s)

    def _fill_audio_gap(self, t_s: float) -> None:
        # A chunk lost upstream shows as a timestamp later than the fit predicts by much more than
        # the jitter seen so far; reading on would shift all later audio earlier by the gap.
        fit = self._audio_fit
        if fit.count < 2:
            return
        residual_s = t_s - fit.at(float(self._received))
        if self._residual_n >= 20 and self.detect_audio_gaps:
            sigma_s = math.sqrt(self._residual_sq_s2 / self._residual_n)
            chunk_s = self._last_chunk_samples * fit.slope_s
            if residual_s > max(6.0 * sigma_s, 0.5 * chunk_s, 0.004):
                # Devices deliver whole periods: when the gap is close to a whole number of chunks,
                # fill exactly that many; the jitter in this one stamp must not shift all later audio.
                chunks = residual_s / chunk_s
                if round(chunks) >= 1 and abs(chunks - round(chunks)) < 0.25:
                    missing = int(round(chunks)) * self._last_chunk_samples
                else:
                    missing = int(round(residual_s / fit.slope_s))
                if missing > self._max_gap_samples:  # checked before the silence is allocated
                    raise InputError(
                        f"an audio chunk at t={t_s:g} s follows a gap of {missing} samples, "
                        f"over max_gap_s={self.max_gap_s:g} s"
                    )
                self._pending.append(np.zeros((missing,) + self._buf.shape[1:], dtype=np.float32))
                self._received += missing
                self._c["audio_gaps"] += 1
                self._c["audio_gap_samples_filled"] += missing
                return
        self._residual_n += 1
        self._residual_sq_s2 += residual_s * residual_s

    def _samples(self) -> np.ndarray:
        if self._pending:
            self._buf = np.concatenate([self._buf, *self._pending]) if self._buf.size else np.concatenate(self._pending)
            self._pending = []
        return self._buf

    def _drain(self, final: bool = False) -> list[AlignedUnit]:
        out: list[AlignedUnit] = []
        if not self._slots or self._audio_fit.count == 0:
            if final and self._slots:  # video without any audio: silence, still k samples each
                for index, payload, filled in self._slots:
                    out.append(self._silent_unit(index, payload, filled))
                self._slots.clear()
            return out
        k = self.audio_per_frame
        audio, video = self._audio_fit, self._video_fit
        expected_span = video.slope_s / audio.slope_s  # audio samples per frame period, drift included
        margin = HALF_TAPS if self.quality == "sinc" else 1
        while self._slots:
            index, payload, filled = self._slots[0]
            start = audio.counter_at(video.at(float(index))) if self._next_start is None else self._next_start
            target_end = audio.counter_at(video.at(float(index + 1)))
            span = min(
                max(target_end - start, expected_span * (1 - self.max_slew)), expected_span * (1 + self.max_slew)
            )
            end = start + span
            if not final and math.ceil(end) + margin > self._received:
                break
            positions = start + span * (np.arange(k, dtype=np.float64) / k)
            buf = self._samples()
            samples = read_at(buf, self._buf_first, positions, quality=self.quality)
            if start - margin < self._buf_first or math.ceil(end) + margin > self._received:
                self._c["units_padded"] += 1
            out.append(AlignedUnit(index, video.at(float(index)), payload, samples, start, filled))
            self._slots.popleft()
            self._next_start = end
            self._c["units_emitted"] += 1
            self._max_correction_s = max(self._max_correction_s, abs(target_end - end) * audio.slope_s)
            keep_from = max(int(math.floor(end)) - margin - 1, self._buf_first)
            if keep_from - self._buf_first > 4096:  # trim consumed audio now and then, not per unit
                self._buf = buf[keep_from - self._buf_first :]
                self._buf_first = keep_from
        return out

    def _silent_unit(self, index: int, payload: Any, filled: bool) -> AlignedUnit:
        self._c["units_emitted"] += 1
        self._c["units_padded"] += 1
        shape = (self.audio_per_frame,) + self._buf.shape[1:]
        return AlignedUnit(index, self._video_fit.at(float(index)), payload, np.zeros(shape, np.float32), 0.0, filled)
