"""Building an image-retrieval index from a PaliGemma model: for each batch of catalogue photos the
script wants one pooled vector per image (mean of the last hidden state over the image tokens).

It runs the model with output_hidden_states=True and appends the whole output object to a list,
pooling "later": every batch keeps the full-vocabulary logits and the hidden states of every layer
for every position alive until the end of the loop, although one vector per image is used.
"""

import sys

sys.path.insert(0, __import__("os").path.dirname(__file__))

import _common as C
import torch

from memwarden.models import zoo

EXPECT = "retained-outputs"
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
    outputs, batches = [], []
    for inputs in catalogue(model):
        out = model(**inputs, output_hidden_states=True)
        outputs.append(out)  # MISTAKE
        batches.append(inputs)
    vectors = [pooled(model, o, i) for o, i in zip(outputs, batches, strict=False)]
    return torch.nn.functional.normalize(torch.cat(vectors), dim=-1)


def main():
    model = C.paligemma(image_px=64, patch_px=4, vision_hidden=64, hidden=256, layers=4, vocab=8192)
    index = build_index(model)
    print(index.shape)


if __name__ == "__main__":
    main()
