"""Batch captioning of catalogue photos with a PaliGemma-style model: 16 images per generate call,
under no_grad, greedy, keeping only the generated ids. The batch makes the run heavy (16 x 256
image tokens prefilled and cached), which is the throughput/memory trade-off the user chose."""

import sys

sys.path.insert(0, __import__("os").path.dirname(__file__))

import _common as C
import torch

from memwarden.models import zoo

EXPECT = None

BATCH = 16


@torch.no_grad()
def main():
    model = C.paligemma(image_px=64, patch_px=4, vision_hidden=64, hidden=128, layers=2, vocab=4096)
    inputs = zoo.make_inputs(model, image_size=(64, 64), prompt_tokens=8, batch=BATCH)
    out = model.generate(**inputs, max_new_tokens=10, **zoo.generate_kwargs("paligemma"))
    captions = out[:, inputs["input_ids"].shape[1] :].tolist()
    print(len(captions), len(captions[0]))


if __name__ == "__main__":
    main()
