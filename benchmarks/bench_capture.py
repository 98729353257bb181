"""Capture overhead on the three workloads of the capture-cost table (issue 14):

  tiny16   a tiny llava ``generate`` of 16 new tokens (~150 ms plain)
  tiny64   the same with 64 new tokens
  demo     the default workload: the demo deployment's chat turns (llava small, 4 turns)
  train    (not in the table; opt in) 4 training steps of the tiny llava with AdamW: what reading
           the autograd graph for saved-for-backward tensors (record/live/saved.py) costs

On each workload, interleaved in one process so machine noise hits all modes alike:
  untraced              plain run
  memwarden             under memwarden.capture() (source lines on: the default)
  memwarden(lines=False) the same without source lines (what line attribution costs)
  torch.profiler        under torch.profiler.profile(profile_memory=True) alone (the reference)
and reports median wall, process CPU and main-thread CPU times and the ratios to the untraced run
(on a loaded machine the CPU times are the steadier figures; the process's includes torch's
intra-op threads, which spin while they wait).

    python benchmarks/bench_capture.py [--repeats 7] [--workloads tiny16,tiny64,demo] [--threads N] [--json]
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch
from torch.profiler import ProfilerActivity, profile

import memwarden
from memwarden.models import zoo
from memwarden.models.chat import DemoConfig, build_deployment, run_chat


def _tiny(new_tokens: int) -> tuple[str, Callable[[], None]]:
    model = zoo.build_model("llava", size="tiny")
    inputs = zoo.make_inputs(model, prompt_tokens=16)
    kwargs = zoo.generate_kwargs("llava")

    def run() -> None:
        with torch.inference_mode():
            model.generate(**inputs, max_new_tokens=new_tokens, **kwargs)

    return f"llava (tiny) generate, {new_tokens} new tokens", run


def _train() -> tuple[str, Callable[[], None]]:
    model = zoo.build_model("llava", size="tiny").train()
    inputs = zoo.make_inputs(model, prompt_tokens=16)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)

    def run() -> None:
        for _ in range(4):
            out = model(**inputs, labels=inputs["input_ids"])
            out.loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)

    return "llava (tiny) training, 4 steps of forward, backward, AdamW", run


def _demo() -> tuple[str, Callable[[], None]]:
    config = DemoConfig()
    model, turn_inputs, gen_kwargs = build_deployment(config)

    def run() -> None:
        run_chat(model, turn_inputs, gen_kwargs, config)

    return f"{config.model} ({config.size}), {config.turns}-turn chat, {config.new_tokens} new tokens/turn", run


WORKLOADS: dict[str, Callable[[], tuple[str, Callable[[], None]]]] = {
    "tiny16": lambda: _tiny(16),
    "tiny64": lambda: _tiny(64),
    "demo": _demo,
    "train": _train,
}


def measure(workload: Callable[[], None], repeats: int) -> dict[str, Any]:
    def traced() -> None:
        with memwarden.capture():
            workload()

    def traced_no_lines() -> None:
        with memwarden.capture(lines=False):
            workload()

    def profiled() -> None:
        with profile(activities=[ProfilerActivity.CPU], profile_memory=True):
            workload()

    modes = {
        "untraced": workload,
        "memwarden": traced,
        "memwarden(lines=False)": traced_no_lines,
        "torch.profiler(profile_memory)": profiled,
    }
    for fn in modes.values():  # warm up kernels, the native build and the profiler
        fn()
    times: dict[str, list[float]] = {name: [] for name in modes}
    cpu: dict[str, list[float]] = {name: [] for name in modes}
    thread: dict[str, list[float]] = {name: [] for name in modes}
    for _ in range(repeats):
        for name, fn in modes.items():
            # Each mode starts from a collected heap: the garbage one mode leaves (the profiler's
            # event objects, a trace) would otherwise be collected, at full cost, inside the next.
            gc.collect()
            start, start_cpu, start_thread = time.perf_counter(), time.process_time(), time.thread_time()
            fn()
            times[name].append(time.perf_counter() - start)
            cpu[name].append(time.process_time() - start_cpu)
            thread[name].append(time.thread_time() - start_thread)
    base = statistics.median(times["untraced"])
    base_cpu = statistics.median(cpu["untraced"])
    base_thread = statistics.median(thread["untraced"])
    return {
        "thread_cpu_s": {k: round(statistics.median(v), 4) for k, v in thread.items()},
        "thread_cpu_ratio_to_untraced": {k: round(statistics.median(v) / base_thread, 3) for k, v in thread.items()},
        "median_s": {k: round(statistics.median(v), 4) for k, v in times.items()},
        "ratio_to_untraced": {k: round(statistics.median(v) / base, 3) for k, v in times.items()},
        "cpu_s": {k: round(statistics.median(v), 4) for k, v in cpu.items()},
        "cpu_ratio_to_untraced": {k: round(statistics.median(v) / base_cpu, 3) for k, v in cpu.items()},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--workloads", default="tiny16,tiny64,demo", help="comma-separated: " + ",".join(WORKLOADS))
    parser.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    results = {}
    for key in args.workloads.split(","):
        label, workload = WORKLOADS[key]()
        results[key] = {"workload": label, **measure(workload, args.repeats)}
    header = {"repeats": args.repeats, "torch_threads": torch.get_num_threads()}
    if args.json:
        print(json.dumps({**header, "workloads": results}, indent=2))
        return
    print(f"{args.repeats} interleaved repeats, {header['torch_threads']} threads")
    for result in results.values():
        print(result["workload"])
        for name in result["median_s"]:
            print(
                f"  {name:32s} wall median {result['median_s'][name]:.3f} s ratio {result['ratio_to_untraced'][name]:.3f}"
                f"   cpu median {result['cpu_s'][name]:.3f} s ratio {result['cpu_ratio_to_untraced'][name]:.3f}"
                f"   thread cpu {result['thread_cpu_s'][name]:.3f} s ratio"
                f" {result['thread_cpu_ratio_to_untraced'][name]:.3f}"
            )


if __name__ == "__main__":
    main()
