"""Peer: transformers' own paged continuous batching (``generate_batch``) on a text chat.

transformers' continuous-batching manager has its own paged KV cache (one tensor, blocks,
prefix sharing) but serves text-only language models, so the peer comparison is the language
model of the built-in deployment (zoo llava ``small``'s Llama) on a multi-turn text chat with a
long system prompt: per turn, the whole conversation is sent again, as a chat loop does.

Side by side in one process, per turn: plain ``generate()``, ``GovernedSession.chat`` and
``model.generate_batch`` with a persistent manager (its prefix sharing on), wall time per turn,
and greedy tokens compared.

    .venv/bin/python benchmarks/bench_peer_cb.py [--turns 4 --system-tokens 512]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import transformers

from memwarden.models import zoo
from memwarden.runtime.session import GovernedSession


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--turns", type=int, default=4)
    ap.add_argument("--system-tokens", type=int, default=512)
    ap.add_argument("--new-tokens", type=int, default=16)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    cfg = zoo.build_config("llava", "small").text_config
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM._from_config(cfg, attn_implementation="sdpa").eval()
    gen = transformers.GenerationConfig(
        max_new_tokens=args.new_tokens, do_sample=False, eos_token_id=None, pad_token_id=0
    )
    g = torch.Generator().manual_seed(1)
    turns = [torch.randint(3, 200, (1, args.system_tokens), generator=g)]
    turns += [torch.randint(3, 200, (1, 12), generator=g) for _ in range(args.turns - 1)]
    session = GovernedSession(model, budget="2GiB")
    rows = []
    history: torch.Tensor | None = None
    with torch.inference_mode():
        model.generate_batch(
            inputs=[turns[0][0, :32].tolist()], generation_config=gen, progress_bar=False, persistent_manager=True
        )  # warm-up: the manager and its cache are built once
        for t in turns:
            history = t if history is None else torch.cat([history, t], 1)
            t0 = time.perf_counter()
            plain = model.generate(input_ids=history, attention_mask=torch.ones_like(history), generation_config=gen)
            t1 = time.perf_counter()
            reply = session.chat(t, max_new_tokens=args.new_tokens, do_sample=False, eos_token_id=None, pad_token_id=0)
            t2 = time.perf_counter()
            out = model.generate_batch(
                inputs=[history[0].tolist()], generation_config=gen, progress_bar=False, persistent_manager=True
            )
            t3 = time.perf_counter()
            cb_tokens = list(out.values())[0].generated_tokens
            want = plain[0, history.shape[1] :].tolist()
            rows.append(
                {
                    "plain_s": t1 - t0,
                    "governed_s": t2 - t1,
                    "cb_s": t3 - t2,
                    "governed_equal": reply[0].tolist() == want,
                    "cb_equal": list(cb_tokens) == want,
                }
            )
            history = torch.cat([history, plain[:, history.shape[1] :]], 1)
    model.destroy_cached_continuous_batching_manager()
    print(
        f"Llama ({cfg.num_hidden_layers} layers, hidden {cfg.hidden_size}), {args.system_tokens}-token system prompt, "
        f"{args.turns} turns, {args.new_tokens} new tokens, {args.threads} thread(s)"
    )
    print(
        "| turn | plain generate | GovernedSession.chat | transformers generate_batch (paged, prefix sharing) | same tokens (governed / CB) |"
    )
    print("|---|---|---|---|---|")
    for i, r in enumerate(rows, 1):
        print(
            f"| {i} | {r['plain_s'] * 1e3:.0f} ms | {r['governed_s'] * 1e3:.0f} ms | {r['cb_s'] * 1e3:.0f} ms | "
            f"{r['governed_equal']} / {r['cb_equal']} |"
        )
    later = rows[1:]
    print(
        f"turns 2+: median plain {statistics.median(r['plain_s'] for r in later) * 1e3:.0f} ms, governed "
        f"{statistics.median(r['governed_s'] for r in later) * 1e3:.0f} ms, generate_batch "
        f"{statistics.median(r['cb_s'] for r in later) * 1e3:.0f} ms"
    )


if __name__ == "__main__":
    main()
