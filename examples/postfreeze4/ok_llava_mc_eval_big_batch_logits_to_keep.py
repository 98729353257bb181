"""Multiple-choice VQA evaluation of a LLaVA model with a large batch (32 image+question rows per
forward). Heavy because of the batch, but done right: only the last position's logits are
computed (logits_to_keep=1), under no_grad, and only the predicted letters are kept."""

import sys

sys.path.insert(0, __import__("os").path.dirname(__file__))

import _common as C
import torch

EXPECT = None

BATCH = 32
VOCAB = 32000
LETTER_IDS = [VOCAB - 10, VOCAB - 9, VOCAB - 8, VOCAB - 7]


@torch.no_grad()
def main():
    model = C.llava(image_px=112, patch_px=8, vision_hidden=64, vision_layers=2, hidden=128, layers=2, vocab=VOCAB)
    ids = torch.cat([C.llava_prompt(model, n_images=1, prompt_tokens=40, seed=i) for i in range(BATCH)])
    pix = C.normalize(torch.stack([torch.as_tensor(C.fake_rgb(112, 112, seed=i)) for i in range(BATCH)]).numpy())
    logits = model(input_ids=ids, attention_mask=torch.ones_like(ids), pixel_values=pix, logits_to_keep=1).logits
    pred = logits[:, -1, LETTER_IDS].argmax(-1)
    print(pred.tolist())


if __name__ == "__main__":
    main()
