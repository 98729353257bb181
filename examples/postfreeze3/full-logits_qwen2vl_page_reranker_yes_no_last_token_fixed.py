"""Fixed twin: the reranker forward passes `logits_to_keep=1`.

What the user did: a multimodal retrieval pipeline reranks candidate document pages with a
generative (Qwen2-VL based) reranker: each (page image, query) pair is scored by the "yes" vs "no"
logits at the last position. The scorer calls ``model(**inputs).logits[:, -1, :]``, so the LM head
produces full-vocabulary logits for every image and text position of every pair in the batch, and
only the last row is read.
Answer in the source: pass ``logits_to_keep=1`` to the forward (the model supports it) so that only
the last position's logits are computed; the reported multi-GB spikes and OOMs go away.
Sources: https://github.com/xorbitsai/inference/issues/5542 ; https://github.com/modelscope/ms-swift/pull/7816
Reproduction: a tiny random-weight Qwen2-VL with a 32k vocabulary; 4 batches of 4 decoded 336x336
pages (144 image tokens each, prompts of 186 tokens) scored under ``inference_mode``.
"""

import _common as c
import torch

EXPECT = None

YES_ID, NO_ID = 1000, 1001


def batch_inputs(model, pages: list[torch.Tensor], seed: int) -> dict:
    """Pairs of (page, query) as one batch; all prompts have the same length here."""
    rows = [c.qwen_inputs(model, images=[p], prompt_tokens=40, seed=seed + i) for i, p in enumerate(pages)]
    return {
        "input_ids": torch.cat([r["input_ids"] for r in rows]),
        "attention_mask": torch.cat([r["attention_mask"] for r in rows]),
        "mm_token_type_ids": torch.cat([r["mm_token_type_ids"] for r in rows]),
        "pixel_values": torch.cat([r["pixel_values"] for r in rows]),
        "image_grid_thw": torch.cat([r["image_grid_thw"] for r in rows]),
    }


def main() -> None:
    model = c.qwen_vl("qwen2-vl", hidden=128, layers=2, vocab=32000, vision_hidden=32)
    scores = []
    with torch.inference_mode():
        for b in range(4):
            pages = [c.normalize(c.fake_rgb(336, 336, seed=10 * b + i)) for i in range(4)]
            inputs = batch_inputs(model, pages, seed=10 * b)
            logits = model(**inputs, logits_to_keep=1).logits[:, -1, :]
            scores += (logits[:, YES_ID] - logits[:, NO_ID]).tolist()
    order = sorted(range(len(scores)), key=lambda i: -scores[i])
    print("top pages:", order[:5])


if __name__ == "__main__":
    main()
