"""Where a capture's cost goes, part by part (issue 14's capture-cost work):

per module call   a module calling 1000 ``nn.Identity`` in turn, 20 times: untraced, with empty
                  Python global forward hooks (PyTorch's hooked call path alone), and under
                  ``capture(lines=False, record_ops=False, fingerprints=False)`` (the native hooks)
start-up scan     the collector walk of ``capture.__enter__`` (native ``gc_instances``) in a fresh
                  process: its first walk (two chains, no anchors yet), then later walks (anchored)
start and stop    ``capture()`` around a tiny llava generate of 64 new tokens: ``__enter__``,
                  the run, ``stop()`` (attribution), beside the untraced run

  .venv/bin/python benchmarks/bench_capture_parts.py [--repeats 7]
"""

from __future__ import annotations

import argparse
import gc
import statistics
import time

import torch
from torch import nn

import memwarden
from memwarden.record import native
from memwarden.record.live.capture import _gc_objects


class _Chain(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inner = nn.ModuleList([nn.Identity() for _ in range(1000)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for m in self.inner:
            x = m(x)
        return x


def per_call(repeats: int) -> dict[str, float]:
    model, x = _Chain(), torch.zeros(1)

    def run() -> float:
        start = time.perf_counter()
        for _ in range(20):
            model(x)
        return (time.perf_counter() - start) / 20_000 * 1e6

    out: dict[str, list[float]] = {"untraced": [], "empty Python hooks": [], "native hooks (capture)": []}
    run()
    for _ in range(repeats):
        out["untraced"].append(run())
        hooks = [
            nn.modules.module.register_module_forward_pre_hook(lambda m, a: None),
            nn.modules.module.register_module_forward_hook(lambda m, a, o: None, always_call=True),
        ]
        out["empty Python hooks"].append(run())
        for h in hooks:
            h.remove()
        with memwarden.capture(lines=False, record_ops=False, fingerprints=False):
            out["native hooks (capture)"].append(run())
    return {k: statistics.median(v) for k, v in out.items()}


def scan(repeats: int) -> dict[str, float]:
    from memwarden.models import zoo

    model = zoo.build_model("llava", size="tiny")  # a transformers process: ~4x10^5 objects
    recorder = native.load()
    start = time.perf_counter()
    objects = _gc_objects(recorder)
    first = time.perf_counter() - start
    later = []
    for _ in range(repeats):
        start = time.perf_counter()
        _gc_objects(recorder)
        later.append(time.perf_counter() - start)
    del model
    return {
        "objects tracked": float(len(gc.get_objects())),
        "found": float(len(objects)),
        "first walk ms": first * 1e3,
        "later walks ms": statistics.median(later) * 1e3,
    }


def start_stop(repeats: int) -> dict[str, float]:
    from memwarden.models import zoo

    model = zoo.build_model("llava", size="tiny")
    inputs = zoo.make_inputs(model, prompt_tokens=16)
    kwargs = zoo.generate_kwargs("llava")

    def run() -> None:
        with torch.inference_mode():
            model.generate(**inputs, max_new_tokens=64, **kwargs)

    run()
    parts: dict[str, list[float]] = {"untraced run ms": [], "enter ms": [], "run ms": [], "stop ms": []}
    for _ in range(repeats):
        gc.collect()
        t0 = time.perf_counter()
        run()
        parts["untraced run ms"].append((time.perf_counter() - t0) * 1e3)
        gc.collect()
        cap = memwarden.capture()
        t0 = time.perf_counter()
        cap.__enter__()
        t1 = time.perf_counter()
        run()
        t2 = time.perf_counter()
        cap.stop()
        t3 = time.perf_counter()
        parts["enter ms"].append((t1 - t0) * 1e3)
        parts["run ms"].append((t2 - t1) * 1e3)
        parts["stop ms"].append((t3 - t2) * 1e3)
    return {k: statistics.median(v) for k, v in parts.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    for title, part in (("start-up scan", scan), ("per module call, us", per_call), ("start and stop", start_stop)):
        print(title)
        for name, value in part(args.repeats).items():
            print(f"  {name:28s} {value:10.2f}")


if __name__ == "__main__":
    main()
