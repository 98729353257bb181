"""Fixed twin of ``reprefill_generate_one_token.py``: one ``generate()`` for all new tokens.

Source: https://github.com/huggingface/transformers/issues/28707 -- use generate's own cache
(``use_cache`` on, the default) instead of calling the model again on an ever longer input.
This is also the library's default path: ``generate`` with the default ``DynamicCache``.
"""

from __future__ import annotations

import torch
from _tiny import GREEDY, prompt, tiny_llama

EXPECT = None
NEW_TOKENS = 16


def main() -> None:
    model = tiny_llama()
    ids = prompt(40, seed=5)
    with torch.no_grad():
        ids = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=NEW_TOKENS, **GREEDY)
    print(ids[0, -NEW_TOKENS:].tolist())


if __name__ == "__main__":
    main()
