"""Streaming by hand: ``model.generate(ids, max_new_tokens=1)`` in a loop, ids passed positionally.

Source: https://github.com/huggingface/transformers/issues/28707 (maintainer's reply)
    "in the case of generation, you're making autoregressive calls to the model i.e. the model is
     being repeatedly called with an increasing input length."
and https://github.com/huggingface/transformers/issues/3141 ("after each iteration about 440MB
of memory is allocated").

Each call to generate() starts with an empty cache, so the whole prompt plus every token so far is
prefilled again for one new token. Fix (``_fixed``): one ``generate(max_new_tokens=N)`` call (with
a ``TextStreamer`` to print as it goes), or pass ``past_key_values`` back.
"""

from __future__ import annotations

import torch
from _tiny import GREEDY, prompt, tiny_llama

EXPECT = "kv-reprefill"
FIX_WORDS = ("cache",)
NEW_TOKENS = 16


def main() -> None:
    model = tiny_llama()
    ids = prompt(40, seed=5)
    with torch.no_grad():
        for _ in range(NEW_TOKENS):
            ids = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=1, **GREEDY)  # MISTAKE
    print(ids[0, -NEW_TOKENS:].tolist())


if __name__ == "__main__":
    main()
