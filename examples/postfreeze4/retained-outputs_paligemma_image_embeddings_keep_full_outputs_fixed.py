"""Building an image-retrieval index from a PaliGemma model: for each batch of catalogue photos the
script wants one pooled vector per image (mean of the last hidden state over the image tokens).

It pools each batch right after the forward and keeps only the (batch, hidden) vectors; the
output object with its logits and hidden states is dropped before the next batch.
"""

import sys

sys.path.insert(0, __import__("os").path.dirname(__file__))

import _common as C
import torch

from memwarden.models import zoo

EXPECT = None
FIX_WORDS = ["pool", "keep only", "detach"]

N_BATCHES = 4
BATCH = 8


def catalogue(model):
    for b in range(N_BATCHES):
        yield zoo.make_inputs(model, image_size=(64, 64), prompt_tokens=8, batch=BATCH, seed=b)


def pooled(model, out, inputs):
    img_mask = (inputs["input_ids"] == model.config.image_token_id).unsqueeze(-1)
    h = out.hidden_states[-1]
    return (h * img_mask).sum(1) / img_mask.sum(1)


@torch.no_grad()
def build_index(model):
    vectors = []
    for inputs in catalogue(model):
        out = model(**inputs, output_hidden_states=True)
        vectors.append(pooled(model, out, inputs))  # keep only the pooled vectors
        del out
    return torch.nn.functional.normalize(torch.cat(vectors), dim=-1)


def main():
    model = C.paligemma(image_px=64, patch_px=4, vision_hidden=64, hidden=256, layers=4, vocab=8192)
    index = build_index(model)
    print(index.shape)


if __name__ == "__main__":
    main()
