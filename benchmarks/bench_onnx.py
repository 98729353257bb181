"""PyTorch eager vs ONNX Runtime on the zoo's exported VLM parts, and the capture's check.

    .venv/bin/python benchmarks/bench_onnx.py [--size tiny|small] [--check-only]

Per part (vision + projector, prefill, decode) of LLaVA and Qwen2-VL: the PyTorch eager capture's
peak (``memwarden.capture`` around the same wrapper module ``torch.onnx.export`` traced) and the
ORT captures' peaks under three settings; then the capture's check: two runs in one session with
the arena off, memory pattern off and on, the second run's capture peak (bytes ORT allocates
above the weights) against a malloc-level count of the same run in a fresh process
(``memwarden.record.onnx.measure``: the preloaded counter, and memray where installed), with
ORT's own requested-bytes counter (arena-on twin) beside them.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import torch

from memwarden.analyze.analysis import Analysis
from memwarden.record.api import capture
from memwarden.record.onnx.capture import capture_onnx
from memwarden.record.onnx.export import export_parts, export_zoo
from memwarden.record.onnx.measure import measure_run, ort_runs, run_peaks
from memwarden.record.onnx.session import OrtSettings
from memwarden.units import format_bytes

SETTINGS = {
    "arena on, pattern on": OrtSettings(arena=True, mem_pattern=True),
    "arena on, pattern off": OrtSettings(arena=True, mem_pattern=False),
    "arena off, pattern off": OrtSettings(arena=False, mem_pattern=False),
}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--size", default="tiny")
    ap.add_argument("--check-only", action="store_true", help="only the capture's check, not the PyTorch table")
    args = ap.parse_args()
    out = Path(tempfile.mkdtemp(prefix="bench-onnx-"))
    if args.check_only:
        check(out, args.size)
        return
    print(
        "| part | PyTorch eager peak | "
        + " | ".join(f"ORT {k}" for k in SETTINGS)
        + " | weights (PT / ORT) | above weights (PT / ORT pattern off) |"
    )
    print("|---|---:|" + "---:|" * len(SETTINGS) + "---:|---:|")
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
            print(
                f"| {name} {part} | {format_bytes(torch_summary.peak_bytes)} | "
                + " | ".join(cells)
                + f" | {format_bytes(torch_summary.weights_bytes)} / {format_bytes(ort_weights)}"
                + f" | {format_bytes(torch_summary.peak_bytes - torch_summary.weights_bytes)} / {format_bytes(ort_above)} |"
            )
    print()
    check(out, args.size)


CHECKS = {
    "arena off, pattern off": OrtSettings(arena=False, mem_pattern=False),
    "arena off, pattern on": OrtSettings(arena=False, mem_pattern=True),
}


def check(out: Path, size: str) -> None:
    """Second run of a session: the capture's peak against the malloc counter (and memray)."""
    print(
        "| part | setting | capture, run 2 (B) | malloc counter, run 2 | diff | within 5% | memray | "
        "ORT requested, run 2 | pattern buffer: replayed / ORT counters |"
    )
    print("|---|---|---:|---:|---:|---|---:|---:|---:|")
    for name in ("llava", "qwen2-vl"):
        paths = export_zoo(name, out / "check", size=size)
        for part, (_, inputs, names, _) in export_parts(name, size).items():
            feeds = {n: t.detach().numpy() for n, t in zip(names, inputs, strict=True)}
            for label, settings in CHECKS.items():
                trace = capture_onnx(paths[part], [feeds, feeds], settings=settings)
                ours = run_peaks(trace)[1]
                first, second = ort_runs(trace)
                ort = int(second["arena_in_use_peak_bytes"]) - int(first["arena_in_use_before_bytes"])
                measured = measure_run(paths[part], feeds, settings, runs=2)
                malloc = measured.malloc_peak_bytes or 0
                diff = (ours - malloc) / malloc if malloc else float("nan")
                buffer = (
                    f"{second['mem_pattern_replayed_bytes']:,} / {second['mem_pattern_ort_bytes']:,}"
                    if "mem_pattern_bytes" in second
                    else "-"
                )
                print(
                    f"| {name}-{part} | {label} | {ours:,} | {malloc:,} | {diff:+.1%} | "
                    f"{'yes' if abs(diff) <= 0.05 else 'no'} | {measured.memray_peak_bytes or '-'} | {ort:,} | {buffer} |",
                    flush=True,
                )


if __name__ == "__main__":
    main()
