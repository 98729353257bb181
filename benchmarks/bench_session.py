"""GovernedSession vs plain transformers on a multi-turn chat about one image.

Measured side by side in one process, turn by turn interleaved:

- time to first token of turns 2+: plain ``model.generate()`` resending the conversation and
  the image each turn vs ``GovernedSession.chat`` (prefix reuse: only the new message is
  prefilled, the image is neither re-encoded nor re-prefilled);
- KV memory waste, reserved-but-unused KV bytes / KV bytes in use:
  * GovernedSession: blocks held by the sequence × block bytes vs tokens × bytes per token,
    at the end of every request (the vLLM paper's measure; free pool blocks are capacity
    that holds cached prefixes, not reservation);
  * transformers' default DynamicCache: peak of live KV-cache bytes in a memwarden capture
    (concatenation keeps the old and the new tensor alive at once) vs KV bytes in use then;
  * transformers' StaticCache sized for the model's context, for reference.

    .venv/bin/python benchmarks/bench_session.py [--model llava --size small --turns 4 --repeats 3]
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
    def __init__(self) -> None:
        self.calls = 0
        self.at: float | None = None

    def put(self, value) -> None:
        self.calls += 1
        if self.calls == 2:
            self.at = time.perf_counter()

    def end(self) -> None:
        pass


def turns_for(model, turns: int, prompt_tokens: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    first = zoo.make_inputs(model, prompt_tokens=prompt_tokens, seed=seed)
    return [first] + [{"input_ids": torch.randint(3, 200, (1, 12), generator=g)} for _ in range(turns - 1)]


def media_of(inputs):
    return {k: v for k, v in inputs.items() if k not in ("input_ids", "attention_mask")}


def run_chat_pair(model, name, turns, new_tokens, budget):
    """One conversation served both ways, turn by turn; TTFT per turn for each."""
    gk = zoo.generate_kwargs(name)
    session = GovernedSession(model, budget=budget)
    session.predict(**turns[0], max_new_tokens=new_tokens)  # calibrate the predictor before timing
    media = media_of(turns[0])
    history = None
    plain_ttft, gov_ttft, equal = [], [], True
    for t in turns:
        history = t["input_ids"] if history is None else torch.cat([history, t["input_ids"]], 1)
        streamer = FirstToken()
        t0 = time.perf_counter()
        out = model.generate(input_ids=history, attention_mask=torch.ones_like(history), max_new_tokens=new_tokens,
                             streamer=streamer, **media, **gk)  # fmt: skip
        plain_ttft.append(streamer.at - t0)
        reply = session.chat(t["input_ids"], max_new_tokens=new_tokens, **media_of(t), **gk)
        gov_ttft.append(session.records[-1].prefill_s)
        equal &= torch.equal(reply, out[:, history.shape[1] :])
        history = torch.cat([history, reply], 1)
    return plain_ttft, gov_ttft, equal, session


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
    from memwarden.capture.live.capture import Capture
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
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    model = build(args.model, args.size, args.image_px)
    turns = turns_for(model, args.turns, args.prompt_tokens)
    plain, gov, equal, last = [], [], True, None
    with torch.inference_mode():
        run_chat_pair(model, args.model, turns[:2], 2, args.budget)  # warm-up
        for _ in range(args.repeats):
            p, g, eq, last = run_chat_pair(model, args.model, turns, args.new_tokens, args.budget)
            plain.append(p)
            gov.append(g)
            equal &= eq
        # KV waste: a long single request, as the chat's last turn
        long_inputs = dict(turns[0])
        dyn, dyn_peak, dyn_use = dynamic_waste(model, args.model, long_inputs, args.new_tokens)
    per_turn = []
    for i in range(args.turns):
        p = statistics.median(r[i] for r in plain)
        g = statistics.median(r[i] for r in gov)
        per_turn.append({"turn": i + 1, "plain_ttft_s": p, "governed_ttft_s": g, "speedup": p / g})
    later = [t["speedup"] for t in per_turn[1:]]
    result = {
        "model": f"{args.model} ({args.size})",
        "prompt_tokens_turn_1": int(turns[0]["input_ids"].shape[1]),
        "outputs_equal": bool(equal),
        "turns": per_turn,
        "min_speedup_turns_2plus": min(later),
        "kv_waste_governed": paged_waste(last),
        "kv_waste_dynamic_cache": dyn,
        "dynamic_cache_peak_kv_bytes": dyn_peak,
        "dynamic_cache_kv_in_use_bytes": dyn_use,
    }
    if args.json:
        print(json.dumps(result, indent=2))
        return
    print(f"{result['model']}, {result['prompt_tokens_turn_1']} prompt tokens in turn 1, {args.turns}-turn chat "
          f"about one image, outputs equal: {equal}")  # fmt: skip
    print("| turn | plain generate TTFT | GovernedSession TTFT | speed-up |")
    print("|---|---|---|---|")
    for t in per_turn:
        print(
            f"| {t['turn']} | {t['plain_ttft_s'] * 1e3:.1f} ms | {t['governed_ttft_s'] * 1e3:.1f} ms | {t['speedup']:.1f}x |"
        )
    print(f"KV waste: GovernedSession {result['kv_waste_governed']:.2%}, DynamicCache {dyn:.2%} "
          f"(peak live KV {dyn_peak} B vs {dyn_use} B in use)")  # fmt: skip


if __name__ == "__main__":
    main()
