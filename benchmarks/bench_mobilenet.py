"""Static memory planning of MobileNetV2 inference, beside the TFLite team's published figures.

transformers' MobileNetV2 (default config: depth multiplier 1.0, 224x224), random weights,
fp32, batch 1, captured on CPU with memwarden. Only the intermediate tensors count (the
weights and the input are excluded, as in the TFLite write-up): naive = every intermediate
its own buffer; greedy-by-size / greedy-by-breadth / best = memwarden's arena planner;
lower bound = the most bytes alive at once.

Published (TFLite GPU delegate write-up, Pisarchyk & Lee 2020): ~26 MB naive, ~7 MB shared.

    python benchmarks/bench_mobilenet.py [--json]
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np
import torch
from transformers import MobileNetV2Config, MobileNetV2Model

import memwarden
from memwarden.plan.arena.plan import plan_arena
from memwarden.trace.model import Action, Category, Trace

MB = 1e6


def intermediates_only(trace: Trace, drop: tuple[Category, ...] = ()) -> Trace:
    e = trace.events
    dropped = [Category.WEIGHT, Category.BUFFER, Category.INPUT, *drop]
    keep = np.isin(e["action"], [Action.ALLOC, Action.FREE]) & ~np.isin(e["category"], dropped)
    events = {k: v[keep] for k, v in e.items()}
    return Trace(events=events, spans={}, strings=trace.strings, shapes=trace.shapes, devices=trace.devices)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    torch.manual_seed(0)
    model = MobileNetV2Model(MobileNetV2Config(image_size=224)).eval()
    pixels = torch.randn(1, 3, 224, 224)
    with torch.inference_mode():
        model(pixel_values=pixels)  # warm-up
        with memwarden.capture() as cap:
            model(pixel_values=pixels)
    # Layer outputs as a fused graph has them: one tensor per conv (conv+bn+relu6 fused).
    e = cap.trace.events
    conv_out = (e["action"] == Action.ALLOC) & (e["category"] == Category.ACTIVATION)
    conv_out &= np.array([cap.trace.string(int(o)) == "aten::conv2d" for o in e["op"]])
    layer_outputs_mb = float(e["nbytes"][conv_out].sum()) / MB
    no_temps = plan_arena(intermediates_only(cap.trace, (Category.TEMPORARY,)), "best", alignment=64)
    trace = intermediates_only(cap.trace)
    rows: dict[str, dict[str, float]] = {}
    for strategy in ("greedy-by-size", "greedy-by-breadth", "best"):
        start = time.perf_counter()
        plan = plan_arena(trace, strategy, alignment=64)
        rows[strategy] = {"arena_mb": plan.arena_bytes / MB, "seconds": time.perf_counter() - start}
    result = {
        "tensors": int(np.count_nonzero(trace.events["action"] == Action.ALLOC)),
        "naive_mb": plan.naive_bytes / MB,
        "lower_bound_mb": plan.lower_bound_bytes / MB,
        "plans": rows,
        "layer_outputs_naive_mb": layer_outputs_mb,
        "without_kernel_temporaries": {
            "naive_mb": no_temps.naive_bytes / MB,
            "best_mb": no_temps.arena_bytes / MB,
            "lower_bound_mb": no_temps.lower_bound_bytes / MB,
        },
        "published": {"naive_mb": 26, "shared_mb": 7},
    }
    if args.json:
        print(json.dumps(result, indent=2))
        return
    print(f"MobileNetV2 224x224 fp32 batch 1: {result['tensors']} intermediate tensors")
    print(f"  naive (no sharing)      {result['naive_mb']:7.2f} MB   (TFLite write-up: ~26 MB)")
    for name, row in rows.items():
        print(f"  {name:22s}  {row['arena_mb']:7.2f} MB   ({row['seconds'] * 1000:.0f} ms)")
    print(f"  lower bound             {result['lower_bound_mb']:7.2f} MB   (TFLite write-up, shared: ~7 MB)")
    print(f"  layer outputs only (one tensor per conv, as a fused graph has them): naive {layer_outputs_mb:.2f} MB")
    w = result["without_kernel_temporaries"]
    print(
        f"  without kernel temporaries (im2col, pad copies): naive {w['naive_mb']:.2f} MB, best {w['best_mb']:.2f} MB, "
        f"lower bound {w['lower_bound_mb']:.2f} MB"
    )


if __name__ == "__main__":
    main()
