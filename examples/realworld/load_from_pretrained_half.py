"""``from_pretrained(path).half()``: the fp32 model is materialised first, then cast.

Source: https://github.com/OpenNMT/CTranslate2/pull/1110
    "Calling `from_pretrained` requires 2x the model size in memory (the loaded checkpoint and the
     created model). To reduce the memory usage, we can immediately create the model with FP16
     weights"
and https://github.com/huggingface/transformers/issues/24280 ("it instead has a model size ~23GB
which is the full 32 bit weights").

Fix (``_fixed``): ``from_pretrained(path, dtype=torch.float16)`` (``torch_dtype=`` in transformers 4).
"""

from __future__ import annotations

import torch
from _tiny import prompt, saved_tiny_llama
from transformers import LlamaForCausalLM

EXPECT = "load-spike"
FIX_WORDS = ("dtype",)


def main() -> None:
    path = saved_tiny_llama(layers=4, hidden=512)
    model = LlamaForCausalLM.from_pretrained(path).half().eval()  # MISTAKE
    with torch.no_grad():
        print(tuple(model(prompt(8)).logits.shape))


if __name__ == "__main__":
    main()
