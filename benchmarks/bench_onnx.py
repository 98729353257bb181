"""PyTorch eager vs ONNX Runtime on the zoo's exported VLM parts, and the capture's check.

    .venv/bin/python benchmarks/bench_onnx.py [--size tiny|small] [--memray]

Per part (vision + projector, prefill, decode) of LLaVA and Qwen2-VL: the PyTorch eager capture's
peak (``memwarden.capture`` around the same wrapper module ``torch.onnx.export`` traced) and the
ORT captures' peaks under three settings; then the ORT capture's run peak (bytes ORT allocates
above the weights) against ORT's own allocator counters and, with ``--memray``, a malloc-level
measurement of the same run with the arena off (``memwarden.capture.onnx.measure``).
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import torch

from memwarden.analyze.analysis import Analysis
from memwarden.capture.api import capture
from memwarden.capture.onnx.capture import capture_onnx
from memwarden.capture.onnx.export import export_parts, export_zoo
from memwarden.capture.onnx.measure import measure_run, ort_counter_peak, ort_high_water, run_peak_bytes
from memwarden.capture.onnx.session import OrtSettings
from memwarden.units import format_bytes

SETTINGS = {
    "arena on, pattern on": OrtSettings(arena=True, mem_pattern=True),
    "arena on, pattern off": OrtSettings(arena=True, mem_pattern=False),
    "arena off, pattern off": OrtSettings(arena=False, mem_pattern=False),
}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--size", default="tiny")
    ap.add_argument("--memray", action="store_true")
    args = ap.parse_args()
    out = Path(tempfile.mkdtemp(prefix="bench-onnx-"))
    print(
        "| part | PyTorch eager peak | "
        + " | ".join(f"ORT {k}" for k in SETTINGS)
        + " | weights (PT / ORT) | above weights (PT / ORT pattern off) |"
    )
    print("|---|---:|" + "---:|" * len(SETTINGS) + "---:|---:|")
    checks = []
    for name in ("llava", "qwen2-vl"):
        paths = export_zoo(name, out, size=args.size)
        for part, (module, inputs, names, _) in export_parts(name, args.size).items():
            with torch.no_grad(), capture() as cap:
                module(*inputs)
            torch_summary = Analysis(cap.trace).summary
            feeds = {n: t.detach().numpy() for n, t in zip(names, inputs, strict=True)}
            cells = []
            ort_weights = ort_above = 0
            for label, settings in SETTINGS.items():
                trace = capture_onnx(paths[part], feeds, settings=settings)
                s = Analysis(trace).summary
                ort_weights = s.weights_bytes
                cells.append(format_bytes(s.peak_bytes))
                if label == "arena on, pattern off":
                    ort_above = s.peak_bytes - s.weights_bytes
                if "pattern off" in label:
                    memray = (
                        measure_run(paths[part], feeds, settings).memray_peak_bytes
                        if args.memray and "arena off" in label
                        else None
                    )
                    checks.append(
                        (
                            f"{name}-{part}",
                            label,
                            run_peak_bytes(trace),
                            ort_counter_peak(trace),
                            ort_high_water(trace),
                            memray,
                        )
                    )
            print(
                f"| {name} {part} | {format_bytes(torch_summary.peak_bytes)} | "
                + " | ".join(cells)
                + f" | {format_bytes(torch_summary.weights_bytes)} / {format_bytes(ort_weights)}"
                + f" | {format_bytes(torch_summary.peak_bytes - torch_summary.weights_bytes)} / {format_bytes(ort_above)} |"
            )
    print()
    print(
        "| part | setting | capture run peak (B) | ORT requested peak | diff | ORT arena high-water | memray, arena off | diff |"
    )
    print("|---|---|---:|---:|---:|---:|---:|---:|")
    for part, label, ours, ort, high, memray in checks:
        d1 = f"{(ours - ort) / ort:+.1%}" if ort else "-"
        d2 = f"{(ours - memray) / memray:+.1%}" if memray else "-"
        print(f"| {part} | {label} | {ours:,} | {ort or 0:,} | {d1} | {high or 0:,} | {memray or '-'} | {d2} |")


if __name__ == "__main__":
    main()
