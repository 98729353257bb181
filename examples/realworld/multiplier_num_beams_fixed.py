"""Fixed twin of ``multiplier_num_beams.py``: greedy decoding, one row.

Source: https://github.com/docling-project/docling/issues/871 (the beams multiply the request).
"""

from __future__ import annotations

import torch
from _tiny import GREEDY, prompt, tiny_llama

EXPECT = None


def main() -> None:
    model = tiny_llama()
    with torch.no_grad():
        out = model.generate(prompt(256), max_new_tokens=16, **GREEDY)
    print(out[0, -16:].tolist())


if __name__ == "__main__":
    main()
