"""Extract fields from scanned forms with a Pixtral-style (Mistral-Small-3.1 architecture) VLM.

Our scanner writes 1600x1200 pages. The processor would resize to its longest_edge; we do our own
preprocessing (round to the 32-px merge unit) so that the fine print stays readable.
"""

import math

import torch

import _common as C

EXPECT = None

LONGEST_EDGE = 1024  # processor default (preprocessor_config.json: size.longest_edge)
UNIT = 32  # patch_size 16 x spatial_merge_size 2


def preprocess(rgb, longest_edge):
    h, w = rgb.shape[:2]
    scale = min(1.0, longest_edge / max(h, w))
    nh = max(UNIT, math.floor(h * scale / UNIT) * UNIT)
    nw = max(UNIT, math.floor(w * scale / UNIT) * UNIT)
    return C.resize(C.normalize(rgb), nh, nw)


@torch.no_grad()
def extract(model, page, question):
    vocab_top = model.config.text_config.vocab_size - 3
    prompt = C.tokenize("[INST] " + question + " Answer as JSON . [/INST]", vocab_top)
    inputs = C.mistral3_inputs(model, page, prompt)
    out = model.generate(**inputs, max_new_tokens=12, do_sample=False)
    return out[0, inputs["input_ids"].shape[1] :], int((inputs["input_ids"] == model.config.image_token_id).sum())


def main():
    torch.manual_seed(0)
    model = C.mistral3(
        patch_px=16, merge=2, vision_hidden=64, vision_layers=2, max_image_px=2048, hidden=128, layers=2, vocab=4096
    )
    pages = [C.fake_rgb(1200, 1600, seed=s) for s in range(3)]
    for i, rgb in enumerate(pages):
        page = preprocess(rgb, longest_edge=LONGEST_EDGE)
        fields, n_img = extract(model, page, "What are the invoice number , date and total ?")
        print(f"page {i}: {tuple(page.shape[-2:])} -> {n_img} image tokens, {len(fields)} answer tokens")


if __name__ == "__main__":
    main()
