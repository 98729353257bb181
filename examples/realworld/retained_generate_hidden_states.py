"""Every ``generate`` result kept, with its hidden states, for a later look.

Source: https://github.com/huggingface/transformers/issues/24315
    "I ... found the issue happened with `hidden_states_list.append(hidden_states)` even I used batch
     size =1, the GPU memory accumulates for each batch to cause the out of memory problem after
     several batches."
and https://github.com/huggingface/transformers/issues/31229 (``generate(..., output_hidden_states=True,
return_dict_in_generate=True)`` whose ``outputs.hidden_states`` are then read).

Each result carries every decoding step's hidden states for every layer (and the KV cache): the list
keeps all of them alive under ``torch.no_grad()``, so this is no graph. Fix (``_fixed``): keep what
is read (``out.sequences``), not the whole output.
"""

from __future__ import annotations

import torch
from _tiny import GREEDY, prompt, tiny_llama

EXPECT = "retained-outputs"
FIX_WORDS = ("sequences", "hidden_states")
REQUESTS = 6


def main() -> None:
    model = tiny_llama()
    results = []
    with torch.no_grad():
        for i in range(REQUESTS):
            out = model.generate(prompt(64, seed=i), max_new_tokens=16, return_dict_in_generate=True,
                                 output_hidden_states=True, **GREEDY)  # fmt: skip
            results.append(out)  # MISTAKE
    print([tuple(r.sequences.shape) for r in results])


if __name__ == "__main__":
    main()
