"""Library path: ``generate`` with the default cache (transformers 5's ``DynamicCache``), batched.

Source: https://huggingface.co/docs/transformers/main/en/llm_tutorial
    "generated_ids = model.generate(**model_inputs, max_new_tokens=...)"
The default cache grows one token per decode step, as designed. No planted bug.
"""

from __future__ import annotations

import torch
from _tiny import GREEDY, prompt, tiny_llama

EXPECT = None


def main() -> None:
    model = tiny_llama(layers=4)
    ids = prompt(64, batch=4)
    with torch.no_grad():
        out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=48, **GREEDY)
    print(out.shape)


if __name__ == "__main__":
    main()
