"""Weight streaming vs accelerate's disk offload at the same memory budget (target: ours ≥ 1.5×).

Model: the zoo's ``small`` LLaVA config (CLIP ViT 224 px, 256 image tokens, 512-wide Llama) with
more language-model layers (``--text-layers``, default 24), so that decoder layers, not the
embedding and LM head, dominate the weights. Budget: half the weight bytes. Greedy ``generate``
of ``--new-tokens`` tokens after one image and a short prompt; fp32, CPU.

Modes, each on its own copy of the same weights, interleaved repeat by repeat so that machine
noise hits all alike:

  resident            no budget: every weight in memory (the ceiling)
  memwarden           ``stream_weights(model, budget, dir)`` (two staging slots, prefetch)
  memwarden-noprefetch  the same without the prefetch thread
  memwarden-layers    the same with whole decoder layers as groups (``split_layers=False``): bigger
                      staging slots, so fewer layers fit resident, and copies that miss the cache
  accelerate-samemap  ``accelerate.dispatch_model`` with the device_map of memwarden's placement
                      (``Placement.to_device_map("cpu")``): the same layers resident, the rest
                      offloaded to disk (``offload_dir``); main device CPU
  accelerate-auto     ``infer_auto_device_map(max_memory={"cpu": budget})`` then the same dispatch

Every mode must produce the same tokens as ``resident``; tokens/s counts new tokens over the
whole ``generate`` (prefill included).

    python benchmarks/bench_offload.py [--repeats 5] [--text-layers 24] [--new-tokens 16] [--json]
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from accelerate import dispatch_model, infer_auto_device_map

from memwarden.models import zoo
from memwarden.record.live.reference import state_bytes
from memwarden.runtime.offload import stream_weights
from memwarden.runtime.offload_plan import plan_streaming


def build(text_layers: int) -> torch.nn.Module:
    """The zoo's small LLaVA with ``text_layers`` decoder layers; same seed, same weights every call."""
    cfg = zoo.build_config("llava", "small")
    cfg.text_config.num_hidden_layers = text_layers
    return zoo.build_from_config("llava", cfg)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--text-layers", type=int, default=24)
    parser.add_argument("--new-tokens", type=int, default=16)
    parser.add_argument("--prompt-tokens", type=int, default=16)
    parser.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's)")
    parser.add_argument("--work-dir", default=None, help="where offloaded files go (default: a new temp dir)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    work = Path(tempfile.mkdtemp(prefix="mw_bench_offload_", dir=args.work_dir))
    try:
        result = run(args, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print_table(result)


def run(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    reference = build(args.text_layers)
    weight_bytes = state_bytes(reference)
    budget_bytes = weight_bytes // 2
    inputs = zoo.make_inputs(reference, prompt_tokens=args.prompt_tokens)
    gen = {**zoo.generate_kwargs("llava"), "max_new_tokens": args.new_tokens}
    placement = plan_streaming(reference, budget_bytes, offload_dir=work)

    ours = build(args.text_layers)
    streamer = stream_weights(ours, budget_bytes, work / "memwarden", placement=placement)
    ours_noprefetch = build(args.text_layers)
    streamer_noprefetch = stream_weights(
        ours_noprefetch, budget_bytes, work / "memwarden-np", placement=placement, prefetch=False
    )

    ours_layers = build(args.text_layers)
    placement_layers = plan_streaming(ours_layers, budget_bytes, offload_dir=work, split_layers=False)
    streamer_layers = stream_weights(ours_layers, budget_bytes, work / "memwarden-layers", placement=placement_layers)

    same_map = placement.to_device_map("cpu")
    acc_same = dispatch_model(build(args.text_layers), same_map, main_device="cpu", offload_dir=str(work / "acc-same"))
    acc_auto_model = build(args.text_layers)
    auto_map = infer_auto_device_map(acc_auto_model, max_memory={"cpu": budget_bytes})
    acc_auto = dispatch_model(acc_auto_model, auto_map, main_device="cpu", offload_dir=str(work / "acc-auto"))

    modes = {
        "resident": reference,
        "memwarden": ours,
        "memwarden-noprefetch": ours_noprefetch,
        "memwarden-layers": ours_layers,
        "accelerate-samemap": acc_same,
        "accelerate-auto": acc_auto,
    }

    def generate(model: torch.nn.Module) -> torch.Tensor:
        with torch.no_grad():
            return model.generate(**inputs, **gen)

    expected = generate(reference)
    for name, model in modes.items():  # warm-up, and every mode must agree token for token
        out = generate(model)
        if not torch.equal(out, expected):
            raise SystemExit(f"{name}: tokens differ from the resident model")
    streamer.stats.reset()
    seconds: dict[str, list[float]] = {name: [] for name in modes}
    for _ in range(args.repeats):
        for name, model in modes.items():
            start = time.perf_counter()
            generate(model)
            seconds[name].append(time.perf_counter() - start)

    def streamed(device_map: dict[str, Any]) -> int:
        return sum(i.nbytes for i in placement.weights if device_map.get(i.name) == "disk")

    stats = {k: v / args.repeats for k, v in vars(streamer.stats).items()}
    streamer.detach()
    streamer_noprefetch.detach()
    streamer_layers.detach()

    rows = []
    for name, times in seconds.items():
        median_s = statistics.median(times)
        rows.append({"mode": name, "median_s": median_s, "tokens_per_s": args.new_tokens / median_s})
    by_mode = {r["mode"]: r["tokens_per_s"] for r in rows}
    return {
        "text_layers": args.text_layers,
        "weight_bytes": weight_bytes,
        "budget_bytes": budget_bytes,
        "predicted_peak_bytes": placement.predicted_peak_bytes,
        "streamed_weight_bytes": placement.streamed_weight_bytes,
        "streamed_per_token_bytes": placement.streamed_per_token_bytes,
        "groups": len(placement.weights),
        "layers_streamed_per_token_bytes": placement_layers.streamed_per_token_bytes,
        "accelerate_auto_disk_modules": sum(1 for v in auto_map.values() if v == "disk"),
        "new_tokens": args.new_tokens,
        "input_tokens": int(inputs["input_ids"].shape[1]),
        "repeats": args.repeats,
        "threads": torch.get_num_threads(),
        "rows": rows,
        "speedup_vs_accelerate_samemap": by_mode["memwarden"] / by_mode["accelerate-samemap"],
        "speedup_vs_accelerate_auto": by_mode["memwarden"] / by_mode["accelerate-auto"],
        "stream_stats_per_generate": stats,
        "same_map_streamed_bytes": streamed(same_map),
    }


def print_table(r: dict[str, Any]) -> None:
    mib = 1 << 20
    print(
        f"weights {r['weight_bytes'] / mib:.1f} MiB, budget {r['budget_bytes'] / mib:.1f} MiB, "
        f"streamed {r['streamed_weight_bytes'] / mib:.1f} MiB ({r['streamed_per_token_bytes'] / mib:.1f} MiB per token), "
        f"{r['input_tokens']} input + {r['new_tokens']} new tokens, {r['threads']} threads, {r['repeats']} repeats"
    )
    print(
        f"{r['groups']} weight groups; with whole layers as groups "
        f"{r['layers_streamed_per_token_bytes'] / mib:.1f} MiB per token"
    )
    print("| mode | median generate | tokens/s | vs memwarden |")
    print("|---|---|---|---|")
    ours = next(row["tokens_per_s"] for row in r["rows"] if row["mode"] == "memwarden")
    for row in r["rows"]:
        print(
            f"| {row['mode']} | {row['median_s']:.3f} s | {row['tokens_per_s']:.2f} | {row['tokens_per_s'] / ours:.2f} |"
        )
    print(f"memwarden / accelerate (same map): {r['speedup_vs_accelerate_samemap']:.2f}x")
    print(f"memwarden / accelerate (auto map): {r['speedup_vs_accelerate_auto']:.2f}x")
    print("stream stats per generate:", {k: round(v, 4) for k, v in r["stream_stats_per_generate"].items()})


if __name__ == "__main__":
    main()
