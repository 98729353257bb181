"""Library path: ``from_pretrained(path, dtype=torch.bfloat16)`` of a saved bf16 checkpoint.

Source: https://huggingface.co/docs/transformers/main_classes/model (``dtype``: "Override the
default torch.dtype and load the model under a specific dtype"). No planted bug.
"""

from __future__ import annotations

import torch
from _tiny import prompt, saved_tiny_llama
from transformers import LlamaForCausalLM

EXPECT = None


def main() -> None:
    path = saved_tiny_llama(torch.bfloat16, layers=4, hidden=512)
    model = LlamaForCausalLM.from_pretrained(path, dtype=torch.bfloat16).eval()
    with torch.no_grad():
        print(tuple(model(prompt(16)).logits.shape))


if __name__ == "__main__":
    main()
