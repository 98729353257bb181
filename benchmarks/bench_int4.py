"""Int4 weight-only linear: peak temporary and latency vs dequantising the whole weight.

For a 7B-class MLP projection (11008 x 4096, group 128), side by side in one process:

- baseline: ``F.linear(x, dequantize(W))`` — the full float weight materialised per call
  (what the ``dequant-temporaries`` detector flags);
- memwarden fused: ``Int4Linear`` on PyTorch's ``_weight_int4pack_mm_for_cpu``;
- memwarden tiled: ``Int4Linear(fused=False)``, one ``tile_rows`` x K float tile at a time.

Also printed: the bytes each layer holds (the fused layer keeps one copy of the codes, in the
kernel's packed layout, which its tiled path unpacks).

Peak temporary = the highest live bytes during the call above what was live before it, minus
the output, measured by memwarden's allocator capture. Latency = median of interleaved repeats.

    .venv/bin/python benchmarks/bench_int4.py [--out-features 11008 --in-features 4096 --tokens 1 16 128]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import numpy as np
import torch
from torch import nn

from memwarden.runtime.quant import Int4Linear, dequantize_int4


def peak_temporary_bytes(fn, out_bytes: int) -> int:
    from memwarden.record.live.capture import Capture
    from memwarden.trace.model import Action

    with Capture() as cap:
        fn()
    ev = cap.trace.events
    sign = np.where(ev["action"] == int(Action.ALLOC), 1, np.where(ev["action"] == int(Action.FREE), -1, 0))
    live = np.cumsum(sign * ev["nbytes"].astype(np.int64))
    return int(live.max()) - out_bytes if len(live) else 0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out-features", type=int, default=11008)
    ap.add_argument("--in-features", type=int, default=4096)
    ap.add_argument("--group-size", type=int, default=128)
    ap.add_argument("--tokens", type=int, nargs="+", default=[1, 16, 128])
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    linear = nn.Linear(args.in_features, args.out_features, bias=False)
    fused = Int4Linear(linear, args.group_size)
    tiled = Int4Linear(linear, args.group_size, fused=False)
    codes, scales, zeros = tiled.unpacked_codes(), tiled.scales, tiled.zeros

    def baseline(x):
        return torch.nn.functional.linear(x, dequantize_int4(codes, scales, zeros, args.group_size))

    rows = []
    with torch.inference_mode():
        for m in args.tokens:
            x = torch.randn(m, args.in_features)
            out_bytes = m * args.out_features * 4
            ways = {"dequantize whole weight": baseline, "fused int4": fused, "tiled int4": tiled}
            ref = baseline(x)
            err = {k: float((f(x) - ref).abs().max() / ref.abs().max()) for k, f in ways.items()}
            peaks = {k: peak_temporary_bytes(lambda f=f, x=x: f(x), out_bytes) for k, f in ways.items()}
            times: dict[str, list[float]] = {k: [] for k in ways}
            for _ in range(args.repeats):
                for k, f in ways.items():  # interleaved: the machine's noise hits all three alike
                    t0 = time.perf_counter()
                    f(x)
                    times[k].append(time.perf_counter() - t0)
            med = {k: statistics.median(v) for k, v in times.items()}
            base = "dequantize whole weight"
            for k in ways:
                rows.append(
                    {
                        "tokens": m,
                        "method": k,
                        "peak_temporary_bytes": peaks[k],
                        "latency_ms": med[k] * 1e3,
                        "temporary_vs_dequant": peaks[k] / peaks[base],
                        "latency_vs_dequant": med[k] / med[base],
                        "max_rel_error_vs_dequant": err[k],
                    }
                )
    held = {
        name: sum(b.numel() * b.element_size() for b in layer.buffers())
        for name, layer in (("fused int4", fused), ("tiled int4", tiled))
    }
    held["float32 weight"] = linear.weight.numel() * 4
    if args.json:
        print(json.dumps({"rows": rows, "held_bytes": held}, indent=2))
        return
    print(f"Linear {args.out_features} x {args.in_features}, group {args.group_size}, {args.threads} thread(s)")
    print("held: " + ", ".join(f"{k} {v / 2**20:.2f} MiB" for k, v in held.items()))
    print("| tokens | method | peak temporary | vs dequant | latency | vs dequant | max rel. error |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['tokens']} | {r['method']} | {r['peak_temporary_bytes'] / 2**20:.2f} MiB | "
            f"{r['temporary_vs_dequant']:.4f} | {r['latency_ms']:.2f} ms | {r['latency_vs_dequant']:.2f} | "
            f"{r['max_rel_error_vs_dequant']:.1e} |"
        )


if __name__ == "__main__":
    main()
