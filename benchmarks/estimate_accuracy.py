"""Accuracy of ``memwarden.estimate`` against PyTorch's own memory profiler, and accelerate's estimate.

For every zoo model (tiny, float32) and three requests each:

- **profiler peak**: a REAL greedy ``model.generate(**inputs, max_new_tokens=N)`` on CPU under
  ``torch.profiler.profile(profile_memory=True, record_shapes=True, with_stack=True)``; the peak of
  ``prof._memory_profile().timeline`` (preexisting tensors + creates - destroys). One generate is
  run first outside the measurement (lazy kernels and caches), then ``gc.collect()``.
- **weights**: parameters + buffers of the real model, distinct storages.
- **memwarden**: ``memwarden.estimate(name, images=..., audio_seconds=..., prompt_tokens=...,
  new_tokens=..., batch=...)``: the model built from its config on the meta device, nothing real.
- **accelerate**: what ``accelerate estimate-memory`` does: the model built on meta
  (``init_empty_weights``) from the same config, then ``accelerate.utils.calculate_maximum_sizes``
  -> total size (weights only); accelerate's docs add "up to 20%" for inference, so total x 1.2 too.

Errors are signed, relative to the profiler peak: (predicted - measured) / measured. "Above the
weights" compares memwarden's peak minus its weights with the profiler peak minus the real weights.

    python benchmarks/estimate_accuracy.py [--output docs/estimate-accuracy.md] [--models llava,gemma3]
"""

from __future__ import annotations

import argparse
import gc
import os
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import transformers
from torch.profiler import ProfilerActivity, profile

import memwarden
from memwarden.models import zoo
from memwarden.record.live.reference import profiler_peak_bytes
from memwarden.record.live.reference import state_bytes as weights_bytes

COMMAND = "python benchmarks/estimate_accuracy.py --output docs/estimate-accuracy.md"


@dataclass(frozen=True)
class Req:
    image: tuple[int, int] | None = None  # (W, H); None: the model's native size / an audio model
    audio_seconds: float | None = None
    prompt_tokens: int = 12
    new_tokens: int = 3
    batch: int = 1

    def label(self) -> str:
        parts = []
        if self.image is not None:
            parts.append(f"{self.image[0]}x{self.image[1]}")
        if self.audio_seconds is not None:
            parts.append(f"{self.audio_seconds:g} s audio")
        parts.append(f"prompt {self.prompt_tokens}")
        parts.append(f"new {self.new_tokens}")
        if self.batch != 1:
            parts.append(f"batch {self.batch}")
        return ", ".join(parts)


def requests_for(name: str) -> list[Req]:
    """Three requests per zoo model."""
    sp = zoo.spec(name)
    if sp.modality == "audio":
        return [Req(audio_seconds=1.0), Req(audio_seconds=0.5), Req(audio_seconds=1.0, prompt_tokens=64, new_tokens=8)]
    if sp.dynamic_resolution:
        return [Req(image=(112, 112)), Req(image=(224, 168)), Req(image=(56, 280))]
    native = sp.native_image_size
    return [
        Req(native, prompt_tokens=12, new_tokens=3),
        Req(native, prompt_tokens=64, new_tokens=3),
        Req(native, prompt_tokens=64, new_tokens=8),
    ]


def accelerate_total_bytes(name: str) -> int:
    """``accelerate estimate-memory``'s total: meta model of the same config, calculate_maximum_sizes."""
    from accelerate import init_empty_weights
    from accelerate.utils import calculate_maximum_sizes

    config = zoo.build_config(name)
    cls = getattr(transformers, zoo.spec(name).model_class)
    with init_empty_weights():
        model = cls._from_config(config, dtype=torch.float32)
    total_size, _largest_layer = calculate_maximum_sizes(model)
    return int(total_size)


def measure(model: torch.nn.Module, name: str, req: Req) -> int:
    """Profiler peak of one real generate() (warmed up first)."""
    inputs = zoo.make_inputs(
        model, image_size=req.image, audio_seconds=req.audio_seconds, prompt_tokens=req.prompt_tokens, batch=req.batch
    )
    kwargs = zoo.generate_kwargs(name)
    with torch.inference_mode():
        model.generate(**inputs, max_new_tokens=req.new_tokens, **kwargs)  # warm lazy kernels outside
    gc.collect()
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True, record_shapes=True, with_stack=True) as prof:
        with torch.inference_mode():
            model.generate(**inputs, max_new_tokens=req.new_tokens, **kwargs)
    return profiler_peak_bytes(prof)


def estimate(name: str, req: Req) -> Any:
    return memwarden.estimate(
        name,
        images=[req.image] if req.image is not None else [],
        audio_seconds=req.audio_seconds,
        prompt_tokens=req.prompt_tokens,
        new_tokens=req.new_tokens,
        batch=req.batch,
        dtype="float32",
    )


def pct(predicted: float, measured: float) -> str:
    return f"{100.0 * (predicted - measured) / measured:+.2f}%"


def kib(n: float) -> str:
    return f"{n / 1024:,.1f} KiB"


def run(names: list[str]) -> tuple[list[dict[str, Any]], float]:
    rows = []
    start = time.perf_counter()
    for name in names:
        acc_total = accelerate_total_bytes(name)
        model = zoo.build_model(name)
        weights = weights_bytes(model)
        for req in requests_for(name):
            peak = measure(model, name, req)
            card = estimate(name, req)
            rows.append(
                {
                    "model": name,
                    "request": req.label(),
                    "peak": peak,
                    "weights": weights,
                    "est": card.peak_bytes,
                    "est_weights": card.weights_bytes,
                    "acc": acc_total,
                }
            )
            print(
                f"  {name:12s} {req.label():32s} profiler {peak:>9,d}  memwarden {card.peak_bytes:>9,d}",
                file=sys.stderr,
                flush=True,
            )
        del model
        gc.collect()
    return rows, time.perf_counter() - start


def table(rows: list[dict[str, Any]]) -> str:
    head = (
        "| model | request | weights | profiler peak | memwarden estimate | error | error above weights "
        "| accelerate (weights only) | accelerate +20% | its error |"
    )
    lines = [head, "|---|---|--:|--:|--:|--:|--:|--:|--:|--:|"]
    for r in rows:
        lines.append(
            f"| {r['model']} | {r['request']} | {kib(r['weights'])} | {kib(r['peak'])} | {kib(r['est'])} | {pct(r['est'], r['peak'])} "
            f"| {pct(r['est'] - r['est_weights'], r['peak'] - r['weights'])} | {kib(r['acc'])} "
            f"| {kib(1.2 * r['acc'])} | {pct(1.2 * r['acc'], r['peak'])} |"
        )
    errs = [abs(r["est"] - r["peak"]) / r["peak"] for r in rows]
    above = [abs((r["est"] - r["est_weights"]) - (r["peak"] - r["weights"])) / (r["peak"] - r["weights"]) for r in rows]
    acc = [abs(1.2 * r["acc"] - r["peak"]) / r["peak"] for r in rows]
    lines.append("")
    lines.append(
        f"Largest |error| over {len(rows)} requests: memwarden {100 * max(errs):.2f}% of the peak, "
        f"{100 * max(above):.2f}% above the weights; accelerate +20% {100 * max(acc):.1f}%."
    )
    off = [r for r, e, a in zip(rows, errs, above, strict=True) if e > 0.02 or a > 0.10]
    if off:
        lines.append("")
        lines.append("Beyond 2% of the peak or 10% above the weights (left out of tests/test_estimate_profiler.py):")
        lines.extend(
            f"- {r['model']}, {r['request']}: profiler {r['peak']:,d} B, memwarden {r['est']:,d} B" for r in off
        )
    return "\n".join(lines)


def header(seconds: float) -> str:
    doc = (__doc__ or "").split("\n\n    python")[0].strip()
    return (
        "# memwarden.estimate accuracy\n\n"
        f"Produced by `{COMMAND}` (torch {torch.__version__}, transformers {transformers.__version__}, "
        f"CPU, {seconds:.0f} s).\n\n" + doc.split("\n", 1)[1].strip() + "\n\n"
        "The zoo models are tiny (a few hundred thousand parameters), so the weights are a small part of "
        "the peak and activations, KV cache and temporaries dominate: the regime where a weights-only "
        "estimate says least.\n"
    )


def write_atomic(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--output", type=Path, default=None, help="write the Markdown report here (atomically)")
    parser.add_argument("--models", default=",".join(zoo.NAMES), help="comma-separated zoo names (default: all)")
    args = parser.parse_args()
    names = [n.strip() for n in args.models.split(",") if n.strip()]
    rows, seconds = run(names)
    md = table(rows)
    print(md)
    if args.output is not None:
        write_atomic(args.output, header(seconds) + "\n" + md + "\n")
        print(f"wrote {args.output}", file=sys.stderr)


if __name__ == "__main__":
    main()
