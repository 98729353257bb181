"""Audio/video alignment on simulated hour-long streams: StreamAligner vs what people do instead.

python benchmarks/bench_align.py [--minutes 60] [--seeds 20] [--json]

One stream per row (±1000 ppm audio clock drift, 5 ms timestamp jitter, 1% dropped frames,
16 kHz audio in chunks of one frame period, 25 fps video), then four methods on the same events:
``StreamAligner``; the naive baseline (each frame gets the audio that arrived since the last
frame); naive fixed-k slicing (each frame takes the next k samples); and a slop-window matcher
(ROS ``ApproximateTimeSynchronizer`` for two topics, slop = half a frame). Speed is CPU time of
the aligner alone on one core, as a multiple of the stream's duration. ``--seeds N`` adds the
spread of the drift estimate at 30 s over N seeds x ±1000 ppm, per jitter model (delivery
latency in [0, 5 ms], uniform in ±5 ms, Gaussian N(0, 5 ms)) and audio chunk size (10, 20, 40 ms),
with the Cramer-Rao bound for the Gaussian rows. ``--rows 0`` runs only that spread.
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")  # one core: numpy's BLAS must not spread out
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import argparse  # noqa: E402
import json  # noqa: E402
import time  # noqa: E402
from typing import Any  # noqa: E402

from memwarden.align import StreamAligner  # noqa: E402
from memwarden.align.baselines import Placement, naive_concat, naive_fixed, score, slop_match  # noqa: E402
from memwarden.align.simulate import StreamSpec, events  # noqa: E402

K = 640  # 16 kHz / 25 fps


def run_aligner(spec: StreamSpec) -> dict[str, object]:
    aligner = StreamAligner(audio_rate=spec.audio_rate, video_fps=spec.video_fps)
    placements: list[Placement] = []
    seen: list[tuple[int, Any, float, int]] = []
    drift_at_30s = None
    frames = audio_total = 0
    cpu_s = 0.0
    for event in events(spec):
        start = time.process_time()  # the simulator's cost is not the aligner's
        if event.kind == "audio":
            assert event.samples is not None
            units = aligner.push_audio(event.t_s, event.samples)
            audio_total = event.index + event.samples.shape[0]
        else:
            frames += 1
            units = aligner.push_frame(event.t_s, event.index)
        cpu_s += time.process_time() - start
        if drift_at_30s is None and event.t_s >= 30.0:
            drift_at_30s = aligner.estimate.drift_ppm
        # keep positions, not audio: an hour of units would be 230 MB
        seen += [(u.frame_index, u.frame, u.audio_start_sample, len(u.audio)) for u in units]
    # Score on the grid: slot i is true frame (first payload + i); each unit's audio spans up to
    # the next unit's start (the aligner resamples, so device samples per unit are not k).
    shift = seen[0][1] - seen[0][0]
    for (index, _, start, length), nxt in zip(seen, seen[1:], strict=False):
        placements.append(Placement(index + shift, start, length, nxt[2] - start))
    s = score(placements, spec, K, frames, audio_total)
    return {
        "score": s.to_json(),
        "drift_error_at_30s_ppm": abs((drift_at_30s or 0.0) - spec.true_drift_ppm),
        "drift_error_final_ppm": abs(aligner.estimate.drift_ppm - spec.true_drift_ppm),
        "realtime_x": spec.duration_s / cpu_s,
        "counters": aligner.counters.__dict__,
    }


def run_baselines(spec: StreamSpec) -> dict[str, dict[str, float | int]]:
    stream = list(events(spec, with_samples=False))
    frames = sum(e.kind == "video" for e in stream)
    audio_total = max(e.index for e in stream if e.kind == "audio") + spec.audio_chunk_samples
    methods = {
        "naive_concat": naive_concat(stream),
        "naive_fixed_k": naive_fixed(stream, K),
        "slop_match": slop_match(stream, 0.5 / spec.video_fps, spec.audio_chunk_samples),
    }
    return {name: score(p, spec, K, frames, audio_total).to_json() for name, p in methods.items()}


CHUNKS = (160, 320, 640)  # 10 ms (WebRTC, ALSA's usual period), 20 ms, 40 ms (one frame) at 16 kHz
JITTERS = ("latency", "uniform", "gaussian")


def gaussian_bound_ppm(spec: StreamSpec, horizon_s: float = 30.0) -> float:
    """Cramer-Rao bound (1 sigma) on the drift at ``horizon_s`` for N(0, jitter_s) stamps.

    Each clock's period is a straight-line slope; for Gaussian stamps least squares is efficient
    and its relative error is sigma * sqrt(12 / n) / span. Audio and video errors add in
    quadrature: the drift is their ratio, and no parameter is shared (the offset is unknown).
    """
    frames = horizon_s * spec.video_fps * (1 - spec.drop_frame_rate)
    chunks = horizon_s * spec.audio_rate / spec.audio_chunk_samples
    video = spec.jitter_s * (12 / frames) ** 0.5 / horizon_s
    audio = spec.jitter_s * (12 / chunks) ** 0.5 / horizon_s
    return float((video**2 + audio**2) ** 0.5 * 1e6)


def drift_spread(seeds: int, jitters: tuple[str, ...] = JITTERS, chunks: tuple[int, ...] = CHUNKS) -> list[dict]:
    """|drift error| at 30 s over seeds x ±1000 ppm, per jitter model and audio chunk size."""
    import numpy as np

    out = []
    for jitter in jitters:
        for chunk in chunks:
            errors, floor_used = [], 0
            for seed in range(seeds):
                for drift_ppm in (1000.0, -1000.0):
                    spec = StreamSpec(
                        duration_s=30.5, audio_drift_ppm=drift_ppm, jitter=jitter, audio_chunk_samples=chunk, seed=seed
                    )
                    aligner = StreamAligner()
                    at_30 = None
                    for event in events(spec, with_samples=False):
                        if event.kind == "audio":
                            aligner.push_audio(event.t_s, np.zeros(event.count, np.float32))
                        else:
                            aligner.push_frame(event.t_s, event.index)
                        if event.t_s >= 30.0:
                            at_30 = aligner.estimate.drift_ppm
                            floor_used += aligner.estimate.video_floor and aligner.estimate.audio_floor
                            break
                    errors.append(abs((at_30 or 0.0) - spec.true_drift_ppm))
            e = np.array(errors)
            spec = StreamSpec(jitter=jitter, audio_chunk_samples=chunk)
            out.append(
                {
                    "jitter": jitter,
                    "chunk_samples": chunk,
                    "runs": int(e.size),
                    "p50": float(np.percentile(e, 50)),
                    "p95": float(np.percentile(e, 95)),
                    "p99": float(np.percentile(e, 99)),
                    "max": float(e.max()),
                    "over_20ppm": int((e > 20).sum()),
                    "floor_fits": int(floor_used),
                    "gaussian_bound_1sigma": gaussian_bound_ppm(spec) if jitter == "gaussian" else None,
                }
            )
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--minutes", type=float, default=60.0)
    parser.add_argument("--seeds", type=int, default=0, help="also measure the drift spread at 30 s over N seeds")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--rows", type=int, default=3, help="hour-long rows to run (0: only the drift spread)")
    args = parser.parse_args(argv)
    rows = []
    for drift_ppm, jitter in ((1000.0, "latency"), (-1000.0, "latency"), (1000.0, "gaussian"))[: args.rows]:
        spec = StreamSpec(
            duration_s=args.minutes * 60, audio_drift_ppm=drift_ppm, jitter=jitter, audio_chunk_samples=K, seed=7
        )
        rows.append({"drift_ppm": drift_ppm, "jitter": jitter, "aligner": run_aligner(spec), **run_baselines(spec)})
    spread = drift_spread(args.seeds) if args.seeds else []
    if args.json:
        print(json.dumps({"rows": rows, "drift_spread_30s_ppm": spread}, indent=2))
        return 0
    for row in rows:
        a = row["aligner"]
        print(
            f"\n{args.minutes:g} min, audio drift {row['drift_ppm']:+g} ppm, 5 ms {row['jitter']} jitter, 1% frames dropped"
        )
        print(
            f"  aligner: {a['realtime_x']:.0f}x real time, drift error {a['drift_error_at_30s_ppm']:.1f} ppm at 30 s, "
            f"{a['drift_error_final_ppm']:.2f} ppm at the end"
        )
        print(
            f"  {'method':<14} {'units':>7} {'violations':>10} {'frames lost':>11} {'audio lost':>10} "
            f"{'|offset| p50':>12} {'p99':>9} {'max':>9}"
        )
        for name in ("aligner", "naive_concat", "naive_fixed_k", "slop_match"):
            s = a["score"] if name == "aligner" else row[name]
            print(
                f"  {name:<14} {s['units']:>7} {s['contract_violations']:>10} {s['frames_without_unit']:>11} "
                f"{s['audio_samples_lost'] / 16000:>9.1f}s {s['offset_p50_ms']:>10.1f}ms "
                f"{s['offset_p99_ms']:>7.1f}ms {s['offset_max_ms']:>7.0f}ms"
            )
    if spread:
        print("\n|drift error| at 30 s, ppm")
        print(
            f"  {'jitter':<9} {'chunk':>5} {'runs':>5} {'p50':>6} {'p95':>6} {'p99':>6} {'max':>6} {'>20':>4} floor  bound"
        )
    for st in spread:
        bound = st["gaussian_bound_1sigma"]
        print(
            f"  {st['jitter']:<9} {st['chunk_samples']:>5} {st['runs']:>5} {st['p50']:>6.1f} {st['p95']:>6.1f} "
            f"{st['p99']:>6.1f} {st['max']:>6.1f} {st['over_20ppm']:>4} {st['floor_fits']:>5}  "
            + (f"{bound:.1f} (1 sigma)" if bound else "-")
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
