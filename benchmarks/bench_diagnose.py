"""diagnose on a 1M-event trace (target < 5 s).

The trace is a real capture of the built-in deployment (tiny llava, multi-turn chat that
resends the image), tiled end to end with fresh block ids until it has --events events.

    python benchmarks/bench_diagnose.py [--events 1000000] [--json]
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np

from memwarden.analyze.diagnose import PATTERNS, diagnose
from memwarden.analyze.finding import Context
from memwarden.analyze.patterns import DETECTORS
from memwarden.trace.model import Action, Trace


def captured() -> Trace:
    from memwarden.models.chat import DemoConfig, build_deployment, run_chat
    from memwarden.record.live.capture import Capture

    config = DemoConfig(size="tiny", turns=4, new_tokens=16)
    model, turn_inputs, gen_kwargs = build_deployment(config)
    with Capture() as cap:
        run_chat(model, turn_inputs, gen_kwargs, config)
    assert cap.trace is not None
    return cap.trace


def tiled(base: Trace, n_events: int) -> Trace:
    e = base.events
    body = e["action"] != Action.PREEXISTING  # preexisting rows once, at the start
    copies = -(-n_events // max(1, int(body.sum())))
    span_us = int(e["time_us"].max()) + 1
    id_span = int(np.abs(e["tensor"]).max()) + 1
    parts = {k: [v[~body]] for k, v in e.items()}
    for c in range(copies):
        for k, v in e.items():
            col = v[body]
            if k == "time_us":
                col = col + c * span_us
            elif k == "tensor":
                col = col + c * id_span
            parts[k].append(col)
    events = {k: np.concatenate(v)[:n_events] for k, v in parts.items()}
    meta = dict(base.metadata)
    steps = meta.get("steps", [])
    meta["steps"] = [
        dict(s, start_us=s["start_us"] + c * span_us, end_us=s["end_us"] + c * span_us)
        for c in range(copies)
        for s in steps
    ][: 10 * len(steps)]
    return Trace(
        events=events,
        spans=dict(base.spans),
        strings=base.strings,
        shapes=base.shapes,
        devices=base.devices,
        metadata=meta,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    trace = tiled(captured(), args.events)
    per_pattern = {}
    ctx = Context(trace=trace)
    _ = ctx.summary
    for pattern in PATTERNS:
        start = time.perf_counter()
        DETECTORS[pattern](ctx)
        per_pattern[pattern] = round(time.perf_counter() - start, 3)
    start = time.perf_counter()
    findings = diagnose(trace)
    total = time.perf_counter() - start
    result = {
        "events": trace.num_events,
        "diagnose_s": round(total, 3),
        "per_pattern_s": per_pattern,
        "findings": [f.pattern for f in findings],
    }
    if args.json:
        print(json.dumps(result, indent=2))
        return
    print(f"diagnose on {trace.num_events:,} events: {total:.2f} s (target < 5 s); findings: {result['findings']}")
    for pattern, seconds in per_pattern.items():
        print(f"  {pattern:24s} {seconds:.3f} s")


if __name__ == "__main__":
    main()
