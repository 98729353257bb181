"""memwarden align-check LOG.jsonl [--audio-rate HZ] [--video-fps FPS] [--audio-per-frame K] [--json]"""

from __future__ import annotations

import argparse
from typing import Any


def register(sub: Any) -> None:
    p = sub.add_parser(
        "align-check",
        help="replay recorded audio/video timestamps: clock offset, drift, drops, and what naive alignment would do",
        description=(
            'Replay a JSON-lines log of audio chunk and video frame timestamps ({"type": "audio", "t_s": .., '
            '"samples": N} / {"type": "video", "t_s": ..}) through memwarden\'s StreamAligner, and report the '
            "clock offset and drift, dropped/duplicated frames, lost audio, and what concatenating the audio that "
            "arrived (or slicing k samples per frame, or slop-window pairing) would have produced."
        ),
    )
    p.add_argument("log", metavar="LOG.jsonl", help="the timestamp log")
    p.add_argument("--audio-rate", type=float, help="nominal audio rate in Hz (default: the log header, else 16000)")
    p.add_argument("--video-fps", type=float, help="nominal video frame rate (default: the log header, else 25)")
    p.add_argument(
        "--audio-per-frame", type=int, help="audio samples (or feature frames) per video frame the model needs"
    )
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from memwarden.align.replay import replay

    report = replay(
        args.log, audio_rate=args.audio_rate, video_fps=args.video_fps, audio_per_frame=args.audio_per_frame
    )
    if args.json:
        from memwarden.commands._common import print_json

        print_json(report.to_json())
        return 0
    est, c, n = report.estimate, report.counters, report.naive
    k = report.audio_per_frame
    print(f"{report.path}: {report.duration_s:.1f} s, {report.audio_chunks} audio chunks, {report.video_frames} frames")
    print(f"  nominal: {report.audio_rate:g} Hz audio, {report.video_fps:g} fps video, {k} samples per frame")
    print(
        f"  clocks: audio starts {est.offset_s * 1e3:+.1f} ms after video; drift {est.drift_ppm:+.1f} ppm "
        f"(audio {est.audio_rate_hz:.2f} Hz, video {est.video_fps:.4f} fps on the host clock)"
    )
    print(f"  frames: {c.frames_filled} dropped (filled), {c.frames_duplicate} duplicates discarded")
    print(f"  audio: {c.audio_gaps} gaps ({c.audio_gap_samples_filled} samples of silence inserted)")
    print(
        f"  aligner: {c.units_emitted} units, {report.contract_violations} contract violations, "
        f"largest pending correction {c.max_correction_s * 1e3:.2f} ms"
    )
    print(
        f"  naive concatenation: {n.units} units, {n.contract_violations} with other than {k} samples "
        f"({n.samples_min}-{n.samples_max})"
    )
    print(
        f"  naive {k} samples per frame: audio ends {n.fixed_k_offset_end_ms:+.0f} ms off its frame "
        f"(worst {n.fixed_k_offset_max_ms:.0f} ms)"
    )
    print(
        f"  slop-window pairing: {n.slop_frames_unmatched} frames unmatched, {n.slop_audio_chunks_dropped} audio chunks dropped"
    )
    return 0
