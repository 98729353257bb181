"""Streaming overhead: the same loop of small model steps under ``memwarden.capture()`` in memory
and with ``stream_to=`` (a flush every 100 ms and at step boundaries, at most one per 10 ms).

The worst case for streaming: 2,000 steps of an 8-layer 256-wide MLP, one thread, ~0.4 ms and 16
allocations a step. Modes run interleaved, ``--repeats`` rounds, medians of wall and process CPU
time (CPU time counts the streamer's thread too):

  untraced              the loop alone
  in-memory             ``capture()``, the trace left in memory
  in-memory + save      ``capture()`` then ``memwarden.save(trace, path)``: the same file the streamed run leaves
  streamed              ``capture(stream_to=path)``: the stream, replaced by the complete trace at stop

"Streaming adds" compares ``streamed`` with ``in-memory + save`` (both end with the same file on
disk; ``memwarden trace`` saves either way) and, for reference, with ``in-memory``.

``--reference-streamer FILE`` adds a mode that streams through another version of
``record/live/stream.py`` (a before/after in one run), e.g.
``git show REV:src/memwarden/record/live/stream.py > /tmp/stream_rev.py``.

    .venv/bin/python benchmarks/bench_stream.py [--steps 2000] [--repeats 7] [--reference-streamer FILE]
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import statistics
import tempfile
import time
from collections.abc import Callable

import torch

import memwarden
from memwarden.record.live import capture as live_capture


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(*[torch.nn.Linear(256, 256) for _ in range(8)])


def workload(model: torch.nn.Module, steps: int) -> None:
    x = torch.randn(8, 256)  # (batch, features)
    with torch.no_grad():
        for _ in range(steps):
            model(x)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--reference-streamer", default=None, help="another stream.py to measure beside this one")
    args = parser.parse_args()
    torch.set_num_threads(1)
    model = _model()
    flushes: list[int] = []
    with tempfile.TemporaryDirectory() as tmp:
        saved, streamed_path = os.path.join(tmp, "saved.mwtrace"), os.path.join(tmp, "streamed.mwtrace")

        def untraced() -> None:
            workload(model, args.steps)

        def in_memory() -> None:
            with memwarden.capture():
                workload(model, args.steps)

        def in_memory_save() -> None:
            with memwarden.capture() as cap:
                workload(model, args.steps)
            assert cap.trace is not None
            memwarden.save(cap.trace, saved)

        def streamed() -> None:
            with memwarden.capture(stream_to=streamed_path) as cap:
                workload(model, args.steps)
            assert cap.trace is not None
            flushes.append(int(cap.trace.metadata["streamed"]["flushes"]))

        modes: dict[str, Callable[[], None]] = {
            "untraced": untraced,
            "in-memory": in_memory,
            "in-memory + save": in_memory_save,
            "streamed": streamed,
        }
        if args.reference_streamer:
            spec = importlib.util.spec_from_file_location("reference_stream", args.reference_streamer)
            assert spec is not None and spec.loader is not None
            reference = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(reference)
            current = live_capture.Streamer

            def streamed_reference() -> None:
                live_capture.Streamer = reference.Streamer
                try:
                    with memwarden.capture(stream_to=streamed_path):
                        workload(model, args.steps)
                finally:
                    live_capture.Streamer = current

            modes["streamed (reference)"] = streamed_reference
        for fn in modes.values():  # warm up: the native build, kernels, first-call caches
            fn()
        wall: dict[str, list[float]] = {k: [] for k in modes}
        cpu: dict[str, list[float]] = {k: [] for k in modes}
        for _ in range(args.repeats):
            for name, fn in modes.items():
                t, c = time.perf_counter(), time.process_time()
                fn()
                wall[name].append(time.perf_counter() - t)
                cpu[name].append(time.process_time() - c)
        events = memwarden.load(saved).num_events
    w = {k: statistics.median(v) for k, v in wall.items()}
    c = {k: statistics.median(v) for k, v in cpu.items()}
    print(
        f"steps {args.steps}, events {events}, {args.repeats} interleaved repeats, medians; "
        f"flushes per streamed run {statistics.median(flushes):.0f}"
    )
    for name in modes:
        print(f"  {name:18s} wall {w[name]:.3f} s   cpu {c[name]:.3f} s")
    for streamer in [m for m in modes if m.startswith("streamed")]:
        for base in ("in-memory + save", "in-memory"):
            print(
                f"{streamer} adds over {base}: wall {100 * (w[streamer] / w[base] - 1):+.1f}%, "
                f"cpu {100 * (c[streamer] / c[base] - 1):+.1f}%"
            )


if __name__ == "__main__":
    main()
