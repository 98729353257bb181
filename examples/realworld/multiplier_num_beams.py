"""Beam search with eight beams where one greedy answer is used.

Source: https://github.com/docling-project/docling/issues/871 ("GPU RAM Requirements for Formula
Detection"): the reporter traces the memory to ``_beam_search``, whose ``input_ids`` have shape
``(batch_size*num_beams, sequence_length)``: every beam carries its own copy of the prompt's KV.

Fix (``_fixed``): ``num_beams=1`` (greedy), a prefill and cache of one row.
"""

from __future__ import annotations

import torch
from _tiny import GREEDY, prompt, tiny_llama

EXPECT = "request-multiplier"
FIX_WORDS = ("num_beams=1",)


def main() -> None:
    model = tiny_llama()
    with torch.no_grad():
        out = model.generate(prompt(256), max_new_tokens=16, num_beams=8, **GREEDY)  # MISTAKE
    print(out[0, -16:].tolist())


if __name__ == "__main__":
    main()
