"""Token-by-token generation with ``use_cache=False``, the whole sequence fed each step by keyword.

Source: https://github.com/huggingface/transformers/issues/15426
    "Only save and use the past_key_values from the context text and put in the generated text so
     far as input_ids, instead of just the last token!
     model_outputs = model(input_ids=generated_tokens, past_key_values=past, use_cache=False)
     But now the memory allocation per generated token is even higher."

Fix: keep ``use_cache=True`` and feed only the new token with the returned cache
(``reprefill_greedy_positional_fixed.py`` is the same loop done right).
"""

from __future__ import annotations

import torch
from _tiny import prompt, tiny_llama

EXPECT = "kv-reprefill"
FIX_WORDS = ("cache",)
NEW_TOKENS = 20


def main() -> None:
    model = tiny_llama()
    generated = prompt(64, seed=3)
    with torch.no_grad():
        for _ in range(NEW_TOKENS):
            out = model(input_ids=generated, attention_mask=torch.ones_like(generated), use_cache=False)  # MISTAKE
            generated = torch.cat([generated, out.logits[:, -1:].argmax(-1)], dim=1)
    print(generated.shape)


if __name__ == "__main__":
    main()
