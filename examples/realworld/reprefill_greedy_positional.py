"""A hand-written greedy loop that calls ``model(ids)`` positionally and re-feeds the whole sequence.

Source: https://github.com/huggingface/transformers/issues/28707 (maintainer's reply)
    "the model is being repeatedly called with an increasing input length. If options such as
    `use_cache` aren't selected, then you would expect a memory increase"
and https://github.com/huggingface/transformers/issues/15426
    "model_outputs = model(input_ids=generated_tokens, past_key_values=past, use_cache=False)
     ... But now the memory allocation per generated token is even higher."

Every step feeds all ids so far (prompt + generated) and keeps no cache: the prompt is prefilled
once per new token. Fix (``_fixed``): feed the last token with the cache the previous call returned.
"""

from __future__ import annotations

import torch
from _tiny import prompt, tiny_llama

EXPECT = "kv-reprefill"
FIX_WORDS = ("cache",)
NEW_TOKENS = 24


def main() -> None:
    model = tiny_llama()
    ids = prompt(48)  # (1, T)
    with torch.no_grad():
        for _ in range(NEW_TOKENS):
            logits = model(ids).logits  # MISTAKE
            ids = torch.cat([ids, logits[:, -1].argmax(-1, keepdim=True)], dim=1)
    print(ids[0, -NEW_TOKENS:].tolist())


if __name__ == "__main__":
    main()
