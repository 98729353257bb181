"""GovernedSession vs the transformers peers on a multi-turn chat about one image.

Measured side by side in one process, turn by turn interleaved (the machine may be shared and
noisy: the ratios, taken within one run, are the result; absolute times move with the load):

- time to first token (TTFT) of every turn for three peers on the same model and tokens:
  (a) naive ``model.generate()`` resending the conversation and the image each turn;
  (b) the careful user: ``model.generate()`` with the previous turn's ``DynamicCache`` passed back
      (transformers' "re-use cache" recipe; ``past_key_values``, named ``cache`` since transformers 5):
      the image is not resent after turn 1;
  (c) ``GovernedSession.chat`` (prefix reuse: only the new message is prefilled);
  outputs of the three must be equal token for token;
- per-request overhead: the session's own time per request (admission, hashing, bookkeeping:
  ``RequestRecord.overhead_s``, and ``overhead_cpu_s`` in CPU time) and governed minus careful total
  time per turn at equal work;
- each TTFT also in CPU time of the one thread that runs everything (``time.thread_time()``, torch
  at 1 thread): on a shared machine wall times stretch with other processes' load, CPU times do not,
  so the governed / careful ratio in CPU time is the one that says what the session costs;
- transformers' continuous batching (``generate_batch``) takes token ids only (no ``pixel_values``):
  it does not apply to a chat about an image; ``--cb`` times it on the text turns alone;
- KV memory waste, reserved-but-unused KV bytes / KV bytes in use:
  * GovernedSession: blocks held by the sequence × block bytes vs tokens × bytes per token,
    at the end of every request (the vLLM paper's measure);
  * transformers' default DynamicCache: peak of live KV-cache bytes in a memwarden capture
    (concatenation keeps the old and the new tensor alive at once) vs KV bytes in use then.

    .venv/bin/python benchmarks/bench_session.py [--model llava --size small --image-px 224 --turns 4 --repeats 3]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import numpy as np
import torch

from memwarden.models import zoo
from memwarden.runtime.kvcache import KVSpec
from memwarden.runtime.session import GovernedSession


class FirstToken:
    """Notes when the first new token arrives: wall clock and this thread's CPU time."""

    def __init__(self) -> None:
        self.calls = 0
        self.at: float | None = None
        self.cpu_at: float | None = None

    def put(self, value) -> None:
        self.calls += 1
        if self.calls == 2:
            self.at, self.cpu_at = time.perf_counter(), time.thread_time()

    def end(self) -> None:
        pass


def turns_for(model, turns: int, prompt_tokens: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    first = zoo.make_inputs(model, prompt_tokens=prompt_tokens, seed=seed)
    return [first] + [{"input_ids": torch.randint(3, 200, (1, 12), generator=g)} for _ in range(turns - 1)]


def media_of(inputs):
    return {k: v for k, v in inputs.items() if k not in ("input_ids", "attention_mask")}


def timed(call):
    """``call(streamer)``'s result and (TTFT, total) in wall time then in this thread's CPU time, in s."""
    streamer = FirstToken()
    t0, c0 = time.perf_counter(), time.thread_time()
    out = call(streamer)
    t1, c1 = time.perf_counter(), time.thread_time()
    return out, (streamer.at - t0, t1 - t0, streamer.cpu_at - c0, c1 - c0)


def run_chat(model, name, turns, new_tokens, session, conversation):
    """One conversation served by the three peers, turn by turn interleaved; per turn and peer:
    (TTFT s, total s, TTFT CPU s, total CPU s); and whether their outputs are equal."""
    from transformers import DynamicCache

    gk = zoo.generate_kwargs(name)
    media = media_of(turns[0])
    history = None
    cache = DynamicCache()  # the careful user's: passed back every turn
    rows, equal = [], True
    for i, t in enumerate(turns):
        history = t["input_ids"] if history is None else torch.cat([history, t["input_ids"]], 1)
        row = {}
        out, row["naive"] = timed(
            lambda s, h=history: model.generate(
                input_ids=h, attention_mask=torch.ones_like(h), max_new_tokens=new_tokens, streamer=s, **media, **gk
            )
        )
        careful, row["careful"] = timed(
            lambda s, h=history, i=i: model.generate(
                input_ids=h,
                attention_mask=torch.ones_like(h),
                cache=cache,
                max_new_tokens=new_tokens,
                streamer=s,
                **(media if i == 0 else {}),
                **gk,
            )
        )
        reply, row["governed"] = timed(
            lambda s, t=t: session.chat(
                t["input_ids"], conversation=conversation, max_new_tokens=new_tokens, streamer=s, **media_of(t), **gk
            )
        )
        record = session.records[-1]
        row["overhead"] = (record.overhead_s, record.overhead_s, record.overhead_cpu_s, record.overhead_cpu_s)
        reference = out[:, history.shape[1] :]
        equal &= torch.equal(reply, reference) and torch.equal(careful[:, history.shape[1] :], reference)
        history = torch.cat([history, reply], 1)
        rows.append(row)
    return rows, equal


def continuous_batching(model, turns, new_tokens) -> dict:
    """transformers' generate_batch on the text turns (token ids only: no image)."""
    prompts = [t["input_ids"][0].tolist() for t in turns[1:]]
    t0 = time.perf_counter()
    model.generate_batch(prompts, max_new_tokens=new_tokens, progress_bar=False, warmup=False)
    return {"requests": len(prompts), "new_tokens": new_tokens, "wall_s": time.perf_counter() - t0}


def paged_waste(session) -> float:
    """max over requests of (blocks held × block bytes − tokens × bytes/token) / (tokens × bytes/token)."""
    bs = session.spec.block_size
    worst = 0.0
    for rec in session.records:
        tokens = rec.prompt_tokens + rec.new_tokens - 1  # KV is written for all but the last token
        held = -(-tokens // bs) * bs
        worst = max(worst, (held - tokens) / tokens)
    return worst


def dynamic_waste(model, name, inputs, new_tokens, cache_factory=None) -> tuple[float, int, int]:
    """(waste, peak live KV bytes, KV bytes in use at that peak) of one plain generate, captured."""
    from memwarden.record.live.capture import Capture
    from memwarden.trace.model import Action, Category

    gk = zoo.generate_kwargs(name)
    kwargs = {} if cache_factory is None else {"cache": cache_factory()}
    with Capture() as cap:
        model.generate(**inputs, max_new_tokens=new_tokens, **kwargs, **gk)
    ev = cap.trace.events
    kv = ev["category"] == int(Category.KV_CACHE)
    sign = np.where(ev["action"] == int(Action.ALLOC), 1, np.where(ev["action"] == int(Action.FREE), -1, 0))
    live = np.cumsum(np.where(kv, sign * ev["nbytes"].astype(np.int64), 0))
    peak = int(live.max())
    spec = KVSpec.from_config(model.config)
    tokens = inputs["input_ids"].shape[1] + new_tokens - 1
    in_use = tokens * spec.bytes_per_token
    return (peak - in_use) / in_use, peak, in_use


def gather_vs_cat(spec: KVSpec, tokens: int, repeats: int = 300) -> tuple[float, float]:
    """CPU µs of one layer's keys for one decode step at ``tokens`` of context: the paged cache's gather
    (``index_select`` of the sequence's slots from the pool) vs ``DynamicCache``'s ``cat`` of the old
    keys and the new token."""
    pool = torch.randn(spec.num_kv_heads, 8 * tokens, spec.head_dim)  # (kv_heads, slots, head_dim)
    slots = torch.randperm(8 * tokens)[:tokens]  # a scattered block table: the slow case for a gather
    old, new = (
        torch.randn(1, spec.num_kv_heads, tokens - 1, spec.head_dim),
        torch.randn(1, spec.num_kv_heads, 1, spec.head_dim),
    )

    def cpu_us(fn) -> float:
        fn()
        c0 = time.thread_time()
        for _ in range(repeats):
            fn()
        return (time.thread_time() - c0) / repeats * 1e6

    return cpu_us(lambda: pool.index_select(1, slots).unsqueeze(0)), cpu_us(lambda: torch.cat([old, new], -2))


def build(name: str, size: str, image_px: int):
    """A zoo model; for llava, its vision tower at ``image_px`` (LLaVA-1.5 sees 336 px: 576 tokens)."""
    if name != "llava" or image_px is None:
        return zoo.build_model(name, size)
    cfg = zoo.build_config(name, size)
    cfg.vision_config.image_size = image_px
    cfg.image_seq_length = (image_px // cfg.vision_config.patch_size) ** 2
    return zoo.build_from_config(name, cfg)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="llava")
    ap.add_argument("--size", default="small")
    ap.add_argument("--turns", type=int, default=4)
    ap.add_argument("--prompt-tokens", type=int, default=32)
    ap.add_argument("--new-tokens", type=int, default=16)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--image-px", type=int, default=336, help="llava image side (336 = LLaVA-1.5: 576 image tokens)")
    ap.add_argument("--budget", default="2GiB")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--cb", action="store_true", help="also time generate_batch on the text turns")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    model = build(args.model, args.size, args.image_px)
    peers = ("naive", "careful", "governed", "overhead")
    runs, equal = [], True
    # Inputs are made outside inference mode, as a processor makes them (inference tensors have no
    # version counter, so the session could not keep their fingerprints between turns).
    warm = turns_for(model, 2, args.prompt_tokens, seed=10_000)
    # a new image each conversation: turn 1 is cold for every peer, turns 2+ are the chat
    conversations = [turns_for(model, args.turns, args.prompt_tokens, seed=r) for r in range(args.repeats)]
    with torch.inference_mode():
        session = GovernedSession(model, budget=args.budget)
        run_chat(model, args.model, warm, 2, session, "warm-up")  # calibrates the predictor before timing
        for r, turns in enumerate(conversations):
            rows, eq = run_chat(model, args.model, turns, args.new_tokens, session, f"c{r}")
            runs.append(rows)
            equal &= eq
        dyn, dyn_peak, dyn_use = dynamic_waste(model, args.model, dict(turns[0]), args.new_tokens)
        cb = continuous_batching(model, turns, args.new_tokens) if args.cb else None
    per_turn = []
    for i in range(args.turns):
        med = {p: [statistics.median(run[i][p][k] for run in runs) for k in range(4)] for p in peers}
        diffs = [run[i]["governed"][1] - run[i]["careful"][1] for run in runs]
        cpu_diffs = [run[i]["governed"][3] - run[i]["careful"][3] for run in runs]
        per_turn.append(
            {
                "turn": i + 1,
                **{f"{p}_ttft_s": med[p][0] for p in peers[:3]},
                **{f"{p}_ttft_cpu_s": med[p][2] for p in peers[:3]},
                "naive_over_governed": med["naive"][0] / med["governed"][0],
                "governed_over_careful": med["governed"][0] / med["careful"][0],
                "naive_over_governed_cpu": med["naive"][2] / med["governed"][2],
                "governed_over_careful_cpu": med["governed"][2] / med["careful"][2],
                "session_overhead_s": med["overhead"][0],
                "session_overhead_cpu_s": med["overhead"][2],
                "governed_minus_careful_total_s": statistics.median(diffs),
                "governed_minus_careful_total_cpu_s": statistics.median(cpu_diffs),
            }
        )
    later = per_turn[1:]
    image_tokens = int(getattr(model.config, "image_seq_length", 0) or 0)
    result = {
        "model": f"{args.model} ({args.size}, {args.image_px} px, {image_tokens} image tokens)",
        "prompt_tokens_turn_1": int(turns[0]["input_ids"].shape[1]),
        "outputs_equal": bool(equal),
        "turns": per_turn,
        "min_naive_over_governed_turns_2plus": min(t["naive_over_governed"] for t in later),
        "max_governed_over_careful_turns_2plus": max(t["governed_over_careful"] for t in later),
        "max_governed_over_careful_cpu_turns_2plus": max(t["governed_over_careful_cpu"] for t in later),
        "max_session_overhead_s": max(t["session_overhead_s"] for t in per_turn),
        "max_session_overhead_cpu_s_turns_2plus": max(t["session_overhead_cpu_s"] for t in later),
        "kv_waste_governed": paged_waste(session),
        "kv_waste_dynamic_cache": dyn,
        "dynamic_cache_peak_kv_bytes": dyn_peak,
        "dynamic_cache_kv_in_use_bytes": dyn_use,
        "continuous_batching": cb,
        "decode_gather_vs_cat_us": gather_vs_cat(
            KVSpec.from_config(model.config),
            sum(int(t["input_ids"].shape[1]) + args.new_tokens for t in turns),  # the last turn's context
        ),
    }
    if args.json:
        print(json.dumps(result, indent=2))
        return
    print(
        f"{result['model']}, {result['prompt_tokens_turn_1']} prompt tokens in turn 1, {args.turns}-turn chat, "
        f"{args.repeats} conversations, outputs equal (naive = careful = governed): {equal}"
    )
    print(
        "| turn | naive TTFT | careful TTFT | governed TTFT | naive / governed | governed / careful | "
        "session overhead | governed − careful (total) |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for t in per_turn:
        print(
            f"| {t['turn']} | {t['naive_ttft_s'] * 1e3:.1f} ms | {t['careful_ttft_s'] * 1e3:.1f} ms | "
            f"{t['governed_ttft_s'] * 1e3:.1f} ms | {t['naive_over_governed']:.1f}x | "
            f"{t['governed_over_careful']:.2f}x | {t['session_overhead_s'] * 1e3:.2f} ms | "
            f"{t['governed_minus_careful_total_s'] * 1e3:+.1f} ms |"
        )
    print("The same in CPU time of the serving thread (what load on a shared machine does not stretch):")
    print(
        "| turn | naive TTFT | careful TTFT | governed TTFT | naive / governed | governed / careful | "
        "session overhead | governed − careful (total) |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for t in per_turn:
        print(
            f"| {t['turn']} | {t['naive_ttft_cpu_s'] * 1e3:.1f} ms | {t['careful_ttft_cpu_s'] * 1e3:.1f} ms | "
            f"{t['governed_ttft_cpu_s'] * 1e3:.1f} ms | {t['naive_over_governed_cpu']:.1f}x | "
            f"{t['governed_over_careful_cpu']:.2f}x | {t['session_overhead_cpu_s'] * 1e3:.2f} ms | "
            f"{t['governed_minus_careful_total_cpu_s'] * 1e3:+.1f} ms |"
        )
    print(
        f"KV waste: GovernedSession {result['kv_waste_governed']:.2%}, DynamicCache {dyn:.2%} "
        f"(peak live KV {dyn_peak} B vs {dyn_use} B in use)"
    )
    gather_us, cat_us = result["decode_gather_vs_cat_us"]
    print(
        f"one layer's keys per decode step at the last turn's context: paged gather {gather_us:.0f} µs CPU, "
        f"DynamicCache cat {cat_us:.0f} µs CPU"
    )
    if cb is not None:
        print(
            f"generate_batch (text turns only, no image): {cb['requests']} requests x {cb['new_tokens']} tokens "
            f"in {cb['wall_s']:.2f} s"
        )


if __name__ == "__main__":
    main()
