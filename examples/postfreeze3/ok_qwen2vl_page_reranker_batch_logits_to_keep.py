"""Qwen2-VL page reranker scoring a batch of 8 pages with ``logits_to_keep=1`` (correct, memory-heavy).

What the user does: a generative multimodal reranker scores 8 (page image, query) pairs per batch
from the "yes"/"no" logits at the last position. The forward runs under ``inference_mode`` with
``logits_to_keep=1``, so only the last position reaches the LM head; the batch of page images
(8 x 324 image tokens) is the legitimate cost of reranking.
Sources: https://github.com/xorbitsai/inference/issues/5542 ; https://github.com/modelscope/ms-swift/pull/7816
Reproduction: a tiny random-weight Qwen2-VL with a 32k vocabulary; 2 batches of 8 decoded 504x504
pages scored with ``logits_to_keep=1``.
"""

import _common as c
import torch

EXPECT = None

YES_ID, NO_ID = 1000, 1001


def main() -> None:
    model = c.qwen_vl("qwen2-vl", hidden=128, layers=2, vocab=32000, vision_hidden=32)
    scores = []
    with torch.inference_mode():
        for b in range(2):
            rows = [
                c.qwen_inputs(
                    model, images=[c.normalize(c.fake_rgb(504, 504, seed=10 * b + i))], prompt_tokens=40, seed=i
                )
                for i in range(8)
            ]
            batch = {k: torch.cat([r[k] for r in rows]) for k in rows[0]}
            logits = model(**batch, logits_to_keep=1).logits[:, -1, :]
            scores += (logits[:, YES_ID] - logits[:, NO_ID]).tolist()
    print("best pages:", sorted(range(len(scores)), key=lambda i: -scores[i])[:4])


if __name__ == "__main__":
    main()
