"""Fixed twin of ``reprefill_greedy_positional.py``: the loop passes the cache back.

Source: https://github.com/huggingface/transformers/issues/15426
    "model_outputs = model(input_ids=last_token, past_key_values=past)
     past = model_outputs['past_key_values']"

The prompt is prefilled once; each step feeds one token and the cache the previous step returned.
The loop keeps the cache (a KV tuple/DynamicCache) between steps under ``torch.no_grad()``: that
is no retained autograd graph.
"""

from __future__ import annotations

import torch
from _tiny import prompt, tiny_llama

EXPECT = None
NEW_TOKENS = 24


def main() -> None:
    model = tiny_llama()
    ids = prompt(48)
    past = None
    step_ids = ids
    with torch.no_grad():
        for _ in range(NEW_TOKENS):
            out = model(input_ids=step_ids, past_key_values=past, use_cache=True)
            past = out.past_key_values
            step_ids = out.logits[:, -1].argmax(-1, keepdim=True)  # (1, 1)
            ids = torch.cat([ids, step_ids], dim=1)
    print(ids[0, -NEW_TOKENS:].tolist())


if __name__ == "__main__":
    main()
