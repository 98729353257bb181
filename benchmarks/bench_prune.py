"""Visual-token pruning: pruning ratio vs peak memory, time to first token and output agreement.

For each built-in vision model the pruner supports (random weights, size ``small`` by default):

- **peak**: one memwarden capture of the whole request — pruning (scoring) included — and a
  one-token ``generate()`` (encode + prefill): peak bytes above the weights, overall and in the
  prefill phase;
- **TTFT**: wall time of the same (prune + ``generate(max_new_tokens=1)``), median of interleaved
  repeats (every configuration once per round, rounds repeated), so that load from other processes
  hits all configurations alike;
- **agreement**: fraction of the first ``--new-tokens`` greedy tokens equal to the unpruned model's,
  position by position, averaged over ``--requests`` seeded requests; plus first-token agreement and
  KL(unpruned || pruned) of the first token's distribution, divided by the KL the model shows when
  the image is *replaced* by another request's image (``KL / swap``: 0 = pruning changed nothing,
  1 = as different as a different picture). The swapped-image agreement row is the control:
  random-weight models can ignore the image or collapse to one repeated token, and then token
  agreement is high for any pruning and means nothing.

``diverse`` and ``random`` cost what ``summary`` costs (same scoring path: one encode, no LM
layers), so peak and TTFT are measured for ``summary`` and ``fastv`` only.

    .venv/bin/python benchmarks/bench_prune.py [--models llava,paligemma,gemma3,idefics3] [--size small]
        [--requests 8] [--new-tokens 8] [--repeats 5] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from typing import Any

import torch

from memwarden.analyze.timeline import summary
from memwarden.models import zoo
from memwarden.record.live.capture import Capture
from memwarden.runtime.encoders import EncoderCache, LRUStore
from memwarden.runtime.prune import METHODS, VisualTokenPruner

PRUNED = (0.25, 0.5, 0.75)  # fraction of visual tokens removed
COST_METHODS = ("summary", "fastv")
MIB = 1 << 20


def _run(
    model: Any,
    pruner: VisualTokenPruner,
    name: str,
    inputs: dict,
    method: str | None,
    pruned: float,
    new_tokens: int,
    **extra: Any,
) -> Any:
    """Prune (unless ``method`` is None) and generate; what ``generate`` returns."""
    gk = zoo.generate_kwargs(name)
    if method is None or pruned == 0:
        return model.generate(**inputs, max_new_tokens=new_tokens, **gk, **extra)
    request = pruner.prune(inputs, 1.0 - pruned, method=method)
    with pruner.applied(request):
        return model.generate(**request.inputs, max_new_tokens=new_tokens, **gk, **extra)


def _tokens_and_first_logprobs(out: Any, prompt_len: int) -> tuple[torch.Tensor, torch.Tensor]:
    return out.sequences[0, prompt_len:], out.logits[0][0].float().log_softmax(-1)


def agreement(model: Any, name: str, requests: list[dict], new_tokens: int) -> dict[str, Any]:
    pruner = VisualTokenPruner(model)
    # The same picture is scored and encoded 14 times per request here; the session's encoder cache
    # serves the repeats (bit-identical outputs), so this phase times nothing and only saves CPU.
    cache = EncoderCache(model, LRUStore(1 << 30))
    extra = {"return_dict_in_generate": True, "output_logits": True}
    try:
        base = []
        for inputs in requests:
            out = _run(model, pruner, name, inputs, None, 0, new_tokens, **extra)
            base.append(_tokens_and_first_logprobs(out, inputs["input_ids"].shape[1]))

        def score(outs: list[tuple[torch.Tensor, torch.Tensor]]) -> dict[str, float]:
            match = [float((t == bt).float().mean()) for (t, _), (bt, _) in zip(outs, base, strict=True)]
            first = [float(t[0] == bt[0]) for (t, _), (bt, _) in zip(outs, base, strict=True)]
            kl = [float(torch.sum(bl.exp() * (bl - lp))) for (_, lp), (_, bl) in zip(outs, base, strict=True)]
            return {
                "agreement": statistics.mean(match),
                "first_token": statistics.mean(first),
                "kl": statistics.mean(kl),
            }

        swapped = []
        for i, inputs in enumerate(requests):
            other = requests[(i + 1) % len(requests)]
            mixed = dict(inputs, **{k: v for k, v in other.items() if k in ("pixel_values", "pixel_attention_mask")})
            out = _run(model, pruner, name, mixed, None, 0, new_tokens, **extra)
            swapped.append(_tokens_and_first_logprobs(out, inputs["input_ids"].shape[1]))
        result: dict[str, Any] = {"swap": score(swapped), "pruned": {}}
        for method in METHODS:
            for pruned in PRUNED:
                outs = []
                for inputs in requests:
                    request = pruner.prune(inputs, 1.0 - pruned, method=method)
                    with pruner.applied(request):
                        out = model.generate(
                            **request.inputs, max_new_tokens=new_tokens, **zoo.generate_kwargs(name), **extra
                        )
                    outs.append(_tokens_and_first_logprobs(out, request.inputs["input_ids"].shape[1]))
                result["pruned"][f"{method}@{pruned}"] = score(outs)
        return result
    finally:
        cache.remove()


def cost(model: Any, name: str, inputs: dict, repeats: int) -> dict[str, Any]:
    pruner = VisualTokenPruner(model)
    configs = [(None, 0.0)] + [(m, p) for m in COST_METHODS for p in PRUNED]
    result: dict[str, Any] = {}
    for method, pruned in configs:
        _run(model, pruner, name, inputs, method, pruned, 1)  # warm-up
        with Capture() as cap:
            _run(model, pruner, name, inputs, method, pruned, 1)
        s = summary(cap.trace)
        result[f"{method}@{pruned}"] = {
            "peak_bytes": s.peak_bytes,
            "weights_bytes": s.weights_bytes,
            "peak_above_weights_bytes": s.peak_bytes - s.weights_bytes,
            "prefill_above_weights_bytes": s.by_phase_peak.get("prefill", 0) - s.weights_bytes,
            "ttft_s": [],
        }
    for _ in range(repeats):
        for method, pruned in configs:
            t0 = time.perf_counter()
            _run(model, pruner, name, inputs, method, pruned, 1)
            result[f"{method}@{pruned}"]["ttft_s"].append(time.perf_counter() - t0)
    for entry in result.values():
        entry["ttft_median_s"] = statistics.median(entry["ttft_s"])
    return result


def table(name: str, n_visual: int, c: dict[str, Any], a: dict[str, Any]) -> str:
    base = c["None@0.0"]
    swap = a["swap"]
    rows = [
        f"**{name}** ({n_visual} visual tokens; weights {base['weights_bytes'] / MIB:.1f} MiB)",
        "",
        "| method | pruned | peak above weights MiB (× unpruned) | prefill-phase peak above weights MiB | "
        "TTFT ms (× unpruned) | agreement (8 tok) | first token | KL / swap |",
        "|---|---|---|---|---|---|---|---|",
        f"| — | 0% | {base['peak_above_weights_bytes'] / MIB:.2f} (1.00) | "
        f"{base['prefill_above_weights_bytes'] / MIB:.2f} | {base['ttft_median_s'] * 1e3:.0f} (1.00) | 1.00 | 1.00 | 0 |",
    ]
    for method in METHODS:
        for pruned in PRUNED:
            ag = a["pruned"][f"{method}@{pruned}"]
            key = f"{method}@{pruned}"
            if key in c:
                e = c[key]
                peak = (
                    f"{e['peak_above_weights_bytes'] / MIB:.2f} "
                    f"({e['peak_above_weights_bytes'] / base['peak_above_weights_bytes']:.2f})"
                )
                prefill = f"{e['prefill_above_weights_bytes'] / MIB:.2f}"
                ttft = f"{e['ttft_median_s'] * 1e3:.0f} ({e['ttft_median_s'] / base['ttft_median_s']:.2f})"
            else:
                peak = prefill = ttft = "as summary"
            kl_ratio = ag["kl"] / swap["kl"] if swap["kl"] > 0 else float("nan")
            rows.append(
                f"| {method} | {pruned:.0%} | {peak} | {prefill} | {ttft} | {ag['agreement']:.2f} | "
                f"{ag['first_token']:.2f} | {kl_ratio:.2f} |"
            )
    rows.append(f"| *control: other image* | — | | | | {swap['agreement']:.2f} | {swap['first_token']:.2f} | 1 |")
    return "\n".join(rows)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="llava,paligemma,gemma3,idefics3")
    ap.add_argument("--size", default="small", choices=zoo.SIZES)
    ap.add_argument("--requests", type=int, default=8)
    ap.add_argument("--new-tokens", type=int, default=8)
    ap.add_argument("--prompt-tokens", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--cost-only", action="store_true", help="peak and TTFT only (no agreement runs)")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    torch.set_grad_enabled(False)
    report: dict[str, Any] = {"args": vars(args), "models": {}}
    for name in args.models.split(","):
        model = zoo.build_model(name, size=args.size)
        requests = [zoo.make_inputs(model, prompt_tokens=args.prompt_tokens, seed=s) for s in range(args.requests)]
        n_visual = zoo.placeholder_tokens(name, size=args.size)
        c = cost(model, name, requests[0], args.repeats)
        if args.cost_only:
            report["models"][name] = {"visual_tokens": n_visual, "cost": c}
            for key, entry in c.items():
                print(
                    name,
                    key,
                    f"peak+{entry['peak_above_weights_bytes'] / MIB:.2f} MiB",
                    f"ttft {entry['ttft_median_s'] * 1e3:.0f} ms",
                    flush=True,
                )
            continue
        a = agreement(model, name, requests, args.new_tokens)
        report["models"][name] = {"visual_tokens": n_visual, "cost": c, "agreement": a}
        print(table(name, n_visual, c, a), flush=True)
        print(flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
