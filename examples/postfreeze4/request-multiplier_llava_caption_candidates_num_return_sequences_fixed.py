"""Synthetic caption generation for a LLaVA fine-tuning set: for every image the script samples
several candidate captions and later keeps the best one by CLIP score.

The candidates are sampled one at a time (num_return_sequences=1 in a loop), so only one copy of
the image features, prefill and cache exists at any moment.
"""

import sys

sys.path.insert(0, __import__("os").path.dirname(__file__))

import _common as C
import torch

EXPECT = None
FIX_WORDS = ["num_return_sequences", "one candidate at a time", "loop"]

N_CANDIDATES = 8
GEN_KW = dict(max_new_tokens=12, do_sample=True, top_p=0.9, temperature=1.0, eos_token_id=None, pad_token_id=C.PAD_ID)


def build_inputs(model, seed):
    input_ids = C.llava_prompt(model, n_images=1, prompt_tokens=24, seed=seed)
    img = C.normalize(C.fake_rgb(224, 224, seed=seed))
    return {"input_ids": input_ids, "attention_mask": torch.ones_like(input_ids), "pixel_values": img.unsqueeze(0)}


@torch.no_grad()
def candidates_for(model, inputs):
    caps = []
    for _ in range(N_CANDIDATES):  # one candidate at a time
        out = model.generate(**inputs, num_return_sequences=1, **GEN_KW)
        caps.append(out[0, inputs["input_ids"].shape[1] :])
    return caps


def main():
    torch.manual_seed(0)
    model = C.llava(image_px=224, patch_px=8, vision_hidden=128, vision_layers=4, hidden=128, layers=4, vocab=4096)
    for image_id in range(2):
        caps = candidates_for(model, build_inputs(model, image_id))
        print(f"image {image_id}: {len(caps)} candidates")


if __name__ == "__main__":
    main()
