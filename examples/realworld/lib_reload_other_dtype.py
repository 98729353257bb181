"""Library path: an fp32 model evaluated, deleted, then the checkpoint reloaded in bf16.

Source: memwarden issue 14 ("load-spike calls an fp32 model that existed alone, was deleted, then
reloaded in bf16 'loaded twice'"); the pattern of comparing precisions, e.g.
https://huggingface.co/docs/transformers/main/en/llm_optims
No planted bug: the two models never coexist.
"""

from __future__ import annotations

import gc

import torch
from _tiny import prompt, saved_tiny_llama
from transformers import LlamaForCausalLM

EXPECT = None


def main() -> None:
    path = saved_tiny_llama(layers=4, hidden=512)
    ids = prompt(16)
    model = LlamaForCausalLM.from_pretrained(path).eval()
    with torch.no_grad():
        ref = model(ids).logits
    del model
    gc.collect()
    model = LlamaForCausalLM.from_pretrained(path, dtype=torch.bfloat16).eval()
    with torch.no_grad():
        print(float((model(ids).logits.float() - ref).abs().max()))


if __name__ == "__main__":
    main()
