"""Fixed twin of full-logits_llava_yes_no_filter: ``logits_to_keep=1`` makes the LM head run on
the last position only, so the logits are (batch, 1, vocab).

Source: https://github.com/Blaizzy/mlx-vlm/issues/1732 — "materialises logits for every prompt
position ... and the caller then keeps only the last row".
"""

import _common as c
import torch

from memwarden.models import zoo

EXPECT = None

YES, NO = 100, 101


def main() -> None:
    torch.manual_seed(0)
    model = c.llava(image_px=336, patch_px=14, hidden=128, layers=2, vocab=16384)
    keep = []
    with torch.no_grad():
        for batch in range(3):
            inputs = zoo.make_inputs(model, prompt_tokens=24, batch=1, seed=batch)
            out = model(**inputs, logits_to_keep=1)
            p_yes = out.logits[:, -1, [YES, NO]].softmax(-1)[:, 0]
            keep += [batch + i for i, p in enumerate(p_yes.tolist()) if p > 0.5]
    print("kept photos:", keep)


if __name__ == "__main__":
    main()
