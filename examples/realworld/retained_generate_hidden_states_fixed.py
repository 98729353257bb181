"""Fixed twin of ``retained_generate_hidden_states.py``: only the generated ids are kept.

Source: https://github.com/huggingface/transformers/issues/24315 (the reporter keeps what the next
step reads instead of every hidden state).
"""

from __future__ import annotations

import torch
from _tiny import GREEDY, prompt, tiny_llama

EXPECT = None
REQUESTS = 6


def main() -> None:
    model = tiny_llama()
    results = []
    with torch.no_grad():
        for i in range(REQUESTS):
            out = model.generate(prompt(64, seed=i), max_new_tokens=16, return_dict_in_generate=True,
                                 output_hidden_states=True, **GREEDY)  # fmt: skip
            results.append(out.sequences)
    print([tuple(r.shape) for r in results])


if __name__ == "__main__":
    main()
