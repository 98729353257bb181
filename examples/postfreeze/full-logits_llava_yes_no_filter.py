"""Filtering a photo set with a LLaVA-1.5-style model by asking a yes/no question and reading
P("yes") at the last prompt position, with a plain forward pass.

Source: https://github.com/Blaizzy/mlx-vlm/issues/1732
  "the model materialises logits for every prompt position — [1, N, vocab] in float32 — and the
   caller then keeps only the last row" ... "every turn with an image takes this path".
Fix upstream: https://github.com/Blaizzy/mlx-vlm/pull/1750 (opt-in ``logits_to_keep``), and
https://github.com/huggingface/trl/pull/2683 ("Use `num_logits_to_keep` to reduce memory usage").

The forward computes (1, ~600, 16384) float32 logits (39 MiB) (the image alone is 576 positions) to
read one row per image.
"""

import _common as c
import torch

from memwarden.models import zoo

EXPECT = "full-logits"
FIX_WORDS = ("logits_to_keep", "num_logits_to_keep", "[:, -1]", "last position")

YES, NO = 100, 101


def main() -> None:
    torch.manual_seed(0)
    model = c.llava(image_px=336, patch_px=14, hidden=128, layers=2, vocab=16384)
    keep = []
    with torch.no_grad():
        for batch in range(3):
            inputs = zoo.make_inputs(model, prompt_tokens=24, batch=1, seed=batch)
            out = model(**inputs)  # MISTAKE
            p_yes = out.logits[:, -1, [YES, NO]].softmax(-1)[:, 0]
            keep += [batch + i for i, p in enumerate(p_yes.tolist()) if p > 0.5]
    print("kept photos:", keep)


if __name__ == "__main__":
    main()
