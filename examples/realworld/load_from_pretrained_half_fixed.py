"""Fixed twin of ``load_from_pretrained_half.py``: loaded directly in float16.

Source: https://github.com/OpenNMT/CTranslate2/pull/1110 ("immediately create the model with FP16
weights"). Also the library path ``from_pretrained`` in a half dtype of a saved fp32 checkpoint.
"""

from __future__ import annotations

import torch
from _tiny import prompt, saved_tiny_llama
from transformers import LlamaForCausalLM

EXPECT = None


def main() -> None:
    path = saved_tiny_llama(layers=4, hidden=512)
    model = LlamaForCausalLM.from_pretrained(path, dtype=torch.float16).eval()
    with torch.no_grad():
        print(tuple(model(prompt(8)).logits.shape))


if __name__ == "__main__":
    main()
