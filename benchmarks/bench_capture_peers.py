"""Capture cost beside the peers a user would choose (issue 41): the same workload run plain,
under ``memwarden.capture()``, under ``torch.profiler.profile(profile_memory=True)`` and under
memray (``memray run``, default and ``--native``), side by side in one run.

Workloads (``bench_capture.WORKLOADS`` where it defines them):

  tiny   ``tiny16``: a tiny llava ``generate`` of 16 new tokens
  demo   the default workload: the demo deployment's chat turns
  7b     a 7B-shaped llava: the small vision tower and a language model of Llama-2-7B's widths
         (hidden 4096, MLP 11008, 32 heads, vocab 32000) with 2 of its 32 layers, bfloat16,
         ``generate`` of 8 new tokens after a 32-token prompt (the full 32 layers do not fit the
         benchmark machines; per-layer work and tensor sizes are the 7B model's)

Every mode runs in its own process (memray traces a whole process): the process builds the
workload, runs it once to warm up, then ``--repeats`` timed runs; the timed section is the
workload with the in-process tool's start and stop inside it (``memwarden.capture()``'s
attribution at stop, the profiler's enter and exit); memray's tracking is on for the whole
process, its file written as it runs. Modes run round-robin per workload, ``--rounds`` times, so
machine noise hits all alike; reported are medians of wall and of the main thread's CPU time, and
their ratios to plain. Prints a markdown table (``--json`` for the raw figures).

    python benchmarks/bench_capture_peers.py [--workloads tiny,demo,7b] [--repeats 5] [--rounds 1] [--json]

``--callgrind``: instructions instead of seconds, which a loaded machine does not change. Each
mode runs once per workload under ``valgrind --tool=callgrind --instr-atstart=no`` (memray's
``run`` inside valgrind): building and the warm-up run go uninstrumented, and counting covers one
run of the timed section exactly (every thread: memray's writer, the streamer, the profiler),
torch on one thread (OpenMP workers spin while they wait, which would count as work).

    python benchmarks/bench_capture_peers.py --callgrind [--workloads tiny,train] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

MODES = ("plain", "memwarden.capture()", "torch.profiler(profile_memory)", "memray run", "memray run --native")
_HERE = Path(__file__).resolve()


def _seven_b() -> tuple[str, Callable[[], None]]:
    import torch

    from memwarden.models import zoo

    cfg = zoo.build_config("llava", "small")
    text = cfg.text_config
    text.hidden_size, text.intermediate_size, text.vocab_size = 4096, 11008, 32000
    text.num_attention_heads = text.num_key_value_heads = 32
    text.head_dim, text.num_hidden_layers = 128, 2
    cfg.vocab_size = 32000
    model = zoo.build_from_config("llava", cfg, dtype=torch.bfloat16)
    inputs = zoo.make_inputs(model, prompt_tokens=32)
    kwargs = zoo.generate_kwargs("llava")

    def run() -> None:
        with torch.inference_mode():
            model.generate(**inputs, max_new_tokens=8, **kwargs)

    return "llava, Llama-2-7B-shaped language model (2 of 32 layers, bf16), generate 8 new tokens", run


def _workload(key: str) -> tuple[str, Callable[[], None]]:
    if key == "7b":
        return _seven_b()
    sys.path.insert(0, str(_HERE.parent))
    from bench_capture import WORKLOADS  # type: ignore[import-not-found]

    return WORKLOADS[{"tiny": "tiny16"}.get(key, key)]()  # type: ignore[no-any-return]


def child(mode: str, key: str, repeats: int, out: str) -> None:
    """One process: build, warm up, time ``repeats`` runs of the workload under ``mode``."""
    import gc

    import torch
    from torch.profiler import ProfilerActivity, profile

    import memwarden

    if os.environ.get("MW_CALLGRIND_LIB"):
        torch.set_num_threads(1)
    label, workload = _workload(key)

    def run() -> None:
        if mode == "memwarden.capture()":
            with memwarden.capture():
                workload()
        elif mode == "torch.profiler(profile_memory)":
            with profile(activities=[ProfilerActivity.CPU], profile_memory=True):
                workload()
        else:  # plain, or memray around the whole process
            workload()

    run()  # warm up: kernels, the native recorder's build, the profiler
    lib = os.environ.get("MW_CALLGRIND_LIB")
    if lib:  # --callgrind: count one run exactly
        import ctypes

        toggle = ctypes.CDLL(lib)
        gc.collect()
        toggle.mw_start()
        if mode == "memwarden.capture()":  # its start, the workload under it, its stop: three dumps
            cap = memwarden.capture()
            cap.__enter__()
            toggle.mw_dump()
            workload()
            toggle.mw_dump()
            cap.__exit__(None, None, None)
        else:
            run()
        toggle.mw_stop()
        Path(out).write_text(json.dumps({"label": label}))
        return
    wall, cpu = [], []
    for _ in range(repeats):
        gc.collect()
        start, start_cpu = time.perf_counter(), time.thread_time()
        run()
        wall.append(time.perf_counter() - start)
        cpu.append(time.thread_time() - start_cpu)
    Path(out).write_text(
        json.dumps({"label": label, "wall": wall, "cpu": cpu, "torch_threads": torch.get_num_threads()})
    )


def _command(mode: str, key: str, repeats: int, out: str, tmp: str) -> list[str]:
    me = [str(_HERE), "--child", mode, key, str(repeats), out]
    if mode.startswith("memray"):
        native = ["--native"] if mode.endswith("--native") else []
        capture = os.path.join(tmp, f"memray-{key}-{len(os.listdir(tmp))}.bin")
        return [sys.executable, "-m", "memray", "run", "--quiet", *native, "-f", "-o", capture, *me]
    return [sys.executable, *me]


def measure(key: str, repeats: int, rounds: int) -> dict[str, Any]:
    wall: dict[str, list[float]] = {m: [] for m in MODES}
    cpu: dict[str, list[float]] = {m: [] for m in MODES}
    label = key
    with tempfile.TemporaryDirectory() as tmp:
        for _ in range(rounds):
            for mode in MODES:
                out = os.path.join(tmp, "result.json")
                proc = subprocess.run(_command(mode, key, repeats, out, tmp), capture_output=True, text=True)
                if proc.returncode != 0:
                    raise RuntimeError(f"{mode} on {key} failed:\n{proc.stderr[-3000:]}")
                got = json.loads(Path(out).read_text())
                label = got["label"]
                wall[mode] += got["wall"]
                cpu[mode] += got["cpu"]
                for name in os.listdir(tmp):  # memray's capture files: GBs on the 7B workload
                    if name.endswith(".bin"):
                        os.remove(os.path.join(tmp, name))
    base_wall, base_cpu = statistics.median(wall["plain"]), statistics.median(cpu["plain"])
    return {
        "workload": label,
        "median_wall_s": {m: round(statistics.median(v), 4) for m, v in wall.items()},
        "wall_ratio": {m: round(statistics.median(v) / base_wall, 3) for m, v in wall.items()},
        "median_thread_cpu_s": {m: round(statistics.median(v), 4) for m, v in cpu.items()},
        "thread_cpu_ratio": {m: round(statistics.median(v) / base_cpu, 3) for m, v in cpu.items()},
    }


def measure_instructions(key: str) -> dict[str, Any]:
    """Instructions of one run of the workload under each mode (callgrind), and ratios to plain."""
    sys.path.insert(0, str(_HERE.parent))
    from bench_ring import callgrind_command, callgrind_parts, toggle_library  # type: ignore[import-not-found]

    counts: dict[str, int] = {}
    memwarden_parts: list[int] = []
    label = key
    with tempfile.TemporaryDirectory() as tmp:
        env = {**os.environ, "MW_CALLGRIND_LIB": toggle_library(tmp), "PYTHONHASHSEED": "0", "OMP_NUM_THREADS": "1"}
        for index, mode in enumerate(MODES):
            out, counted = os.path.join(tmp, "result.json"), os.path.join(tmp, f"cg.{index}")
            cmd = [*callgrind_command(counted), *_command(mode, key, 0, out, tmp)]
            proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
            if proc.returncode != 0:
                raise RuntimeError(f"{mode} on {key} under callgrind failed:\n{proc.stderr[-3000:]}")
            label = json.loads(Path(out).read_text())["label"]
            parts = callgrind_parts(counted)
            counts[mode] = sum(parts)
            if mode == "memwarden.capture()":
                memwarden_parts = parts
            print(json.dumps({key: {mode: counts[mode]}}), file=sys.stderr, flush=True)
            for name in os.listdir(tmp):
                if name.endswith(".bin"):
                    os.remove(os.path.join(tmp, name))
    return {
        "workload": label,
        "instructions": counts,
        "instruction_ratio": {m: round(v / counts["plain"], 3) for m, v in counts.items()},
        "memwarden_start_run_stop": memwarden_parts,
    }


def instruction_table(results: dict[str, dict[str, Any]]) -> str:
    keys = list(results)
    lines = [
        "| mode | " + " | ".join(f"{k}: instructions (x plain)" for k in keys) + " |",
        "|---|" + "--:|" * len(keys),
    ]
    for mode in MODES:
        cells = [
            f"{results[k]['instructions'][mode] / 1e9:.3f} G ({results[k]['instruction_ratio'][mode]:.2f}x)"
            for k in keys
        ]
        lines.append(f"| {mode} | " + " | ".join(cells) + " |")
    lines += ["", *[f"- {k}: {results[k]['workload']}" for k in keys]]
    for k in keys:
        start, during, stop = (results[k]["memwarden_start_run_stop"] + [0, 0, 0])[:3]
        lines.append(
            f"- {k}, memwarden.capture() split: start {start / 1e6:.1f} M, workload under capture "
            f"{during / 1e6:.1f} M, stop (attribution) {stop / 1e6:.1f} M instructions"
        )
    return "\n".join(lines)


def table(results: dict[str, dict[str, Any]]) -> str:
    keys = list(results)
    head = "| mode | " + " | ".join(f"{k}: wall s (x plain) | {k}: thread CPU (x plain)" for k in keys) + " |"
    rule = "|---|" + "---|---|" * len(keys)
    lines = [head, rule]
    for mode in MODES:
        cells = []
        for k in keys:
            r = results[k]
            cells.append(f"{r['median_wall_s'][mode]:.3f} ({r['wall_ratio'][mode]:.2f}x)")
            cells.append(f"{r['thread_cpu_ratio'][mode]:.2f}x")
        lines.append(f"| {mode} | " + " | ".join(cells) + " |")
    lines += ["", *[f"- {k}: {results[k]['workload']}" for k in keys]]
    return "\n".join(lines)


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        mode, key, repeats, out = sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5]
        child(mode, key, repeats, out)
        return
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workloads", default="tiny,demo,7b")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--callgrind", action="store_true", help="count instructions of one run per mode instead")
    args = parser.parse_args()
    if args.callgrind:
        counted = {key: measure_instructions(key) for key in args.workloads.split(",")}
        print(json.dumps(counted, indent=2) if args.json else instruction_table(counted))
        return
    results = {}
    for key in args.workloads.split(","):
        results[key] = measure(key, args.repeats, args.rounds)
        print(json.dumps({key: results[key]}), file=sys.stderr, flush=True)  # each as it is done
    if args.json:
        print(json.dumps(results, indent=2))
        return
    print(f"medians of {args.repeats} runs x {args.rounds} rounds per mode, each mode in its own process")
    print(table(results))


if __name__ == "__main__":
    main()
