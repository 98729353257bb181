"""Library path: ``from_pretrained`` of a saved fp32 checkpoint in fp32, then one forward.

Source: https://huggingface.co/docs/transformers/main_classes/model#transformers.PreTrainedModel.from_pretrained
    "model = BertModel.from_pretrained('./test/saved_model/')"
No planted bug: the weights are materialised once, in the dtype they are used in.
"""

from __future__ import annotations

import torch
from _tiny import prompt, saved_tiny_llama
from transformers import LlamaForCausalLM

EXPECT = None


def main() -> None:
    path = saved_tiny_llama(layers=4, hidden=512)
    model = LlamaForCausalLM.from_pretrained(path).eval()
    with torch.no_grad():
        print(tuple(model(prompt(16)).logits.shape))


if __name__ == "__main__":
    main()
