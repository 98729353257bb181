"""Synthetic caption generation for a LLaVA fine-tuning set: for every image the script samples
several candidate captions and later keeps the best one by CLIP score.

All candidates are requested in one generate call with num_return_sequences=8: generate repeats
the whole request 8 times (pixel_values included), so the vision tower encodes the same image 8
times and the prompt - mostly image tokens - is prefilled and cached 8 times.
"""

import sys

sys.path.insert(0, __import__("os").path.dirname(__file__))

import _common as C
import torch

EXPECT = "request-multiplier"
FIX_WORDS = ["num_return_sequences", "one candidate at a time", "loop"]

N_CANDIDATES = 8
GEN_KW = dict(max_new_tokens=12, do_sample=True, top_p=0.9, temperature=1.0, eos_token_id=None, pad_token_id=C.PAD_ID)


def build_inputs(model, seed):
    input_ids = C.llava_prompt(model, n_images=1, prompt_tokens=24, seed=seed)
    img = C.normalize(C.fake_rgb(224, 224, seed=seed))
    return {"input_ids": input_ids, "attention_mask": torch.ones_like(input_ids), "pixel_values": img.unsqueeze(0)}


@torch.no_grad()
def candidates_for(model, inputs):
    out = model.generate(**inputs, num_return_sequences=N_CANDIDATES, **GEN_KW)  # MISTAKE
    return [row for row in out[:, inputs["input_ids"].shape[1] :]]


def main():
    torch.manual_seed(0)
    model = C.llava(image_px=224, patch_px=8, vision_hidden=128, vision_layers=4, hidden=128, layers=4, vocab=4096)
    for image_id in range(2):
        caps = candidates_for(model, build_inputs(model, image_id))
        print(f"image {image_id}: {len(caps)} candidates")


if __name__ == "__main__":
    main()
