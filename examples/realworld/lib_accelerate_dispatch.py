"""Library path: accelerate's ``init_empty_weights`` + ``load_checkpoint_and_dispatch``.

Source: https://huggingface.co/docs/accelerate/usage_guides/big_modeling
    "with init_empty_weights():
         model = AutoModelForCausalLM.from_config(config)
     model = load_checkpoint_and_dispatch(model, checkpoint=checkpoint_file, device_map="auto")"
No planted bug: the model is built on the meta device and the weights are loaded once.
"""

from __future__ import annotations

import torch
from _tiny import llama_config, prompt, saved_tiny_llama
from accelerate import init_empty_weights, load_checkpoint_and_dispatch
from transformers import LlamaForCausalLM

EXPECT = None


def main() -> None:
    path = saved_tiny_llama(layers=4, hidden=512)
    with init_empty_weights():
        model = LlamaForCausalLM(llama_config(layers=4, hidden=512))
    model = load_checkpoint_and_dispatch(model, checkpoint=str(path), device_map={"": "cpu"}).eval()
    with torch.no_grad():
        print(tuple(model(prompt(16)).logits.shape))


if __name__ == "__main__":
    main()
