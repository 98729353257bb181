"""A scoring loop that runs the model over each prompt and reads the last position's logits.

Source: https://github.com/Blaizzy/mlx-vlm/issues/1732
    "the model materialises logits for every prompt position — [1, N, vocab] in float32 — and the
     caller then keeps only the last row."
and https://github.com/huggingface/trl/pull/2683 ("Don't compute the logits of the prompt, to save
memory": ``num_logits_to_keep``).

Fix (``_fixed``): ``model(ids, logits_to_keep=1)``: one position of logits instead of every one.
"""

from __future__ import annotations

import torch
from _tiny import prompt, tiny_llama

EXPECT = "full-logits"
FIX_WORDS = ("logits_to_keep",)
BATCHES = 4


def main() -> None:
    model = tiny_llama()
    choices = []
    with torch.no_grad():
        for i in range(BATCHES):
            logits = model(prompt(512, batch=4, seed=i)).logits  # MISTAKE
            choices.append(logits[:, -1].argmax(-1))
    print(torch.stack(choices).tolist())


if __name__ == "__main__":
    main()
