"""GovernedSession vs the careful user on a multi-turn chat about one image, for M-RoPE models
(Qwen2-VL, Qwen2.5-VL): time to first token of every turn, outputs compared token for token.

The careful user is transformers' "re-use cache" recipe: ``model.generate()`` with the previous
turn's ``DynamicCache`` passed back (``cache=``), the image sent with turn 1 only. Plain
``generate()`` resending the conversation and the image each turn is timed too (the speed-up prefix
reuse buys). Each turn is served by the three peers interleaved, in one process, one torch thread;
TTFT is taken in wall time and in CPU time of the one thread that runs everything (on a shared
machine wall times stretch with other processes' load, CPU times much less): the governed / careful
ratio in CPU time is the figure that says what the session costs. Medians over ``--repeats``
conversations, a new image each.

    .venv/bin/python benchmarks/bench_session_mrope.py [--models qwen2-vl qwen2.5-vl --size small --turns 4 --repeats 3]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch
from transformers import DynamicCache

from memwarden.models import zoo
from memwarden.runtime.session import GovernedSession


class FirstToken:
    """Notes when the first new token arrives: wall clock and this thread's CPU time."""

    def __init__(self) -> None:
        self.calls = 0
        self.at = self.cpu_at = 0.0

    def put(self, value) -> None:
        self.calls += 1
        if self.calls == 2:
            self.at, self.cpu_at = time.perf_counter(), time.thread_time()

    def end(self) -> None:
        pass


def timed(call):
    """``call(streamer)``'s result and (TTFT s, TTFT CPU s)."""
    streamer = FirstToken()
    t0, c0 = time.perf_counter(), time.thread_time()
    out = call(streamer)
    return out, (streamer.at - t0, streamer.cpu_at - c0)


def turns_for(model, turns: int, prompt_tokens: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    first = zoo.make_inputs(model, prompt_tokens=prompt_tokens, seed=seed)
    return [first] + [{"input_ids": torch.randint(3, 200, (1, 12), generator=g)} for _ in range(turns - 1)]


def media_of(inputs):
    return {k: v for k, v in inputs.items() if k not in ("input_ids", "attention_mask")}


def run_chat(model, name, turns, new_tokens, session, conversation):
    """Per turn and peer (TTFT s, TTFT CPU s); whether the three peers' replies are equal; reused tokens."""
    gk = zoo.generate_kwargs(name)
    media = media_of(turns[0])
    types = media.pop("mm_token_type_ids")  # (1, T1): the naive peer pads it to the conversation's length
    cache = DynamicCache(config=model.config)
    history = None
    rows, equal, reused = [], True, []
    for i, t in enumerate(turns):
        history = t["input_ids"] if history is None else torch.cat([history, t["input_ids"]], 1)
        padded = torch.nn.functional.pad(types, (0, history.shape[1] - types.shape[1]))
        row = {}
        out, row["naive"] = timed(
            lambda s, h=history, p=padded: model.generate(
                input_ids=h,
                attention_mask=torch.ones_like(h),
                max_new_tokens=new_tokens,
                streamer=s,
                mm_token_type_ids=p,
                **media,
                **gk,
            )
        )
        careful, row["careful"] = timed(
            lambda s, h=history, i=i, p=padded: model.generate(
                input_ids=h,
                attention_mask=torch.ones_like(h),
                cache=cache,
                max_new_tokens=new_tokens,
                streamer=s,
                **({**media, "mm_token_type_ids": p} if i == 0 else {}),
                **gk,
            )
        )
        reply, row["governed"] = timed(
            lambda s, t=t: session.chat(
                t["input_ids"], conversation=conversation, max_new_tokens=new_tokens, streamer=s, **media_of(t), **gk
            )
        )
        reused.append(session.records[-1].reused_tokens)
        reference = out[:, history.shape[1] :]
        equal &= torch.equal(reply, reference) and torch.equal(careful[:, history.shape[1] :], reference)
        history = torch.cat([history, reply], 1)
        rows.append(row)
    return rows, equal, reused


def bench(name: str, args) -> dict:
    model = zoo.build_model(name, args.size)
    warm = turns_for(model, 2, args.prompt_tokens, seed=10_000)
    conversations = [turns_for(model, args.turns, args.prompt_tokens, seed=r) for r in range(args.repeats)]
    runs, equal, reused = [], True, []
    with torch.inference_mode():
        session = GovernedSession(model, budget=args.budget)
        run_chat(model, name, warm, 2, session, "warm-up")  # calibrates the admission predictor before timing
        for r, turns in enumerate(conversations):
            rows, eq, used = run_chat(model, name, turns, args.new_tokens, session, f"c{r}")
            runs.append(rows)
            equal &= eq
            reused.append(used)
        encoder_misses = session.stats()["encoder_misses"]
        served = session.records[2:]  # after the warm-up's two turns, args.turns per conversation
        reencoded = [r.media_reencoded for k, r in enumerate(served) if k % args.turns != 0]
    per_turn = []
    for i in range(args.turns):
        med = {p: [statistics.median(run[i][p][k] for run in runs) for k in range(2)] for p in runs[0][i]}
        per_turn.append(
            {
                "turn": i + 1,
                **{f"{p}_ttft_s": med[p][0] for p in med},
                **{f"{p}_ttft_cpu_s": med[p][1] for p in med},
                "reused_tokens": [used[i] for used in reused],
                "governed_over_careful": med["governed"][0] / med["careful"][0],
                "governed_over_careful_cpu": med["governed"][1] / med["careful"][1],
                "naive_over_governed": med["naive"][0] / med["governed"][0],
            }
        )
    first = conversations[0][0]
    return {
        "model": f"{name} ({args.size}), {int((first['input_ids'] == model.config.image_token_id).sum())} image "
        f"tokens, {first['input_ids'].shape[1]} prompt tokens in turn 1",
        "outputs_equal": bool(equal),
        "media_reencoded_turns_2plus": any(reencoded),
        "turns": per_turn,
        "turn2_governed_over_careful": per_turn[1]["governed_over_careful"],
        "turn2_governed_over_careful_cpu": per_turn[1]["governed_over_careful_cpu"],
        "encoder_misses": encoder_misses,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", nargs="+", default=["qwen2-vl", "qwen2.5-vl"])
    ap.add_argument("--size", default="small")
    ap.add_argument("--turns", type=int, default=4)
    ap.add_argument("--prompt-tokens", type=int, default=32)
    ap.add_argument("--new-tokens", type=int, default=16)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--budget", default="2GiB")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    results = [bench(name, args) for name in args.models]
    if args.json:
        print(json.dumps(results, indent=2))
        return
    for res in results:
        print(
            f"{res['model']}: outputs equal (naive = careful = governed): {res['outputs_equal']}, media re-encoded "
            f"in turns 2+: {res['media_reencoded_turns_2plus']}, encoder runs: {res['encoder_misses']}"
        )
        print(
            "| turn | reused tokens | naive TTFT | careful TTFT | governed TTFT | governed / careful (wall) | "
            "governed / careful (CPU) | naive / governed |"
        )
        print("|---|---|---|---|---|---|---|---|")
        for t in res["turns"]:
            print(
                f"| {t['turn']} | {'/'.join(map(str, t['reused_tokens']))} | {t['naive_ttft_s'] * 1e3:.1f} ms | "
                f"{t['careful_ttft_s'] * 1e3:.1f} ms | {t['governed_ttft_s'] * 1e3:.1f} ms | "
                f"{t['governed_over_careful']:.2f}x | {t['governed_over_careful_cpu']:.2f}x | "
                f"{t['naive_over_governed']:.1f}x |"
            )
        print()


if __name__ == "__main__":
    main()
