"""Capture overhead on the default workload (the demo deployment's chat turns).

Measures, interleaved in one process so machine noise hits all modes alike:
  untraced              plain run
  memwarden             under memwarden.capture() (source lines on: the default)
  memwarden(lines=False) the same without source lines (what line attribution costs)
  torch.profiler        under torch.profiler.profile(profile_memory=True) alone (the reference)
and reports median wall times and the ratios to the untraced run.

    python benchmarks/bench_capture.py [--repeats 7] [--json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch
from torch.profiler import ProfilerActivity, profile

import memwarden
from memwarden.models.chat import DemoConfig, build_deployment, run_chat


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    config = DemoConfig()
    model, turn_inputs, gen_kwargs = build_deployment(config)

    def workload() -> None:
        run_chat(model, turn_inputs, gen_kwargs, config)

    def untraced() -> None:
        workload()

    def traced() -> None:
        with memwarden.capture():
            workload()

    def traced_no_lines() -> None:
        with memwarden.capture(lines=False):
            workload()

    def profiled() -> None:
        with profile(activities=[ProfilerActivity.CPU], profile_memory=True):
            workload()

    modes = {"untraced": untraced, "memwarden": traced, "memwarden(lines=False)": traced_no_lines,
             "torch.profiler(profile_memory)": profiled}  # fmt: skip
    for fn in modes.values():  # warm up kernels, the native build and the profiler
        fn()
    times: dict[str, list[float]] = {name: [] for name in modes}
    cpu: dict[str, list[float]] = {name: [] for name in modes}
    for _ in range(args.repeats):
        for name, fn in modes.items():
            start, start_cpu = time.perf_counter(), time.process_time()
            fn()
            times[name].append(time.perf_counter() - start)
            cpu[name].append(time.process_time() - start_cpu)
    base = statistics.median(times["untraced"])
    base_cpu = statistics.median(cpu["untraced"])
    result = {
        "workload": f"{config.model} ({config.size}), {config.turns}-turn chat, {config.new_tokens} new tokens/turn",
        "repeats": args.repeats,
        "torch_threads": torch.get_num_threads(),
        "median_s": {k: round(statistics.median(v), 4) for k, v in times.items()},
        "ratio_to_untraced": {k: round(statistics.median(v) / base, 3) for k, v in times.items()},
        "cpu_s": {k: round(statistics.median(v), 4) for k, v in cpu.items()},
        "cpu_ratio_to_untraced": {k: round(statistics.median(v) / base_cpu, 3) for k, v in cpu.items()},
    }
    if args.json:
        print(json.dumps(result, indent=2))
        return
    print(result["workload"], f"({args.repeats} interleaved repeats, {result['torch_threads']} threads)")
    for name in modes:
        print(
            f"  {name:32s} wall median {result['median_s'][name]:.3f} s ratio {result['ratio_to_untraced'][name]:.3f}"
            f"   cpu median {result['cpu_s'][name]:.3f} s ratio {result['cpu_ratio_to_untraced'][name]:.3f}"
        )


if __name__ == "__main__":
    main()
