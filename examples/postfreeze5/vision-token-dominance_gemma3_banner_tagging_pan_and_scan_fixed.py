import sys

sys.path.insert(0, __import__("os").path.dirname(__file__))
import _common as C

"""An ad-ops script tags wide web banners (about 3:1) with a product category using a Gemma 3 style
VLM. Pan-and-scan stays off (the processor default): one global 256-token view per banner is enough
to answer "which product category is this"."""

import torch

EXPECT = None

SIDE = 128  # the model's square input (896 px in the real model)


def preprocess(banner, do_pan_and_scan, max_num_crops=4):
    """Gemma3Processor in short: the resized original, then (optionally) resized pan-and-scan crops."""
    views = [banner]
    if do_pan_and_scan:
        views += C.gemma3_pan_and_scan(banner, SIDE, max_num_crops=max_num_crops, min_crop_size=SIDE)
    return torch.stack([C.normalize_float(C.resize(v, SIDE, SIDE)) for v in views])


def build_prompt(model, n_views, seed):
    cfg = model.config
    vocab = cfg.text_config.vocab_size
    block = [cfg.boi_token_id] + [cfg.image_token_id] * cfg.mm_tokens_per_image + [cfg.eoi_token_id]
    words = C.text_ids(20, vocab - 3, seed=seed)[0].tolist()
    rows = [C.BOS_ID] + words[:6] + block
    for _ in range(n_views - 1):  # "and here are some crops to help you see better"
        rows += words[6:8] + block
    rows += words[8:]
    ids = torch.tensor([rows])
    return {
        "input_ids": ids,
        "attention_mask": torch.ones_like(ids),
        "token_type_ids": (ids == cfg.image_token_id).long(),
    }


@torch.no_grad()
def tag_banner(model, banner, seed):
    pixel_values = preprocess(banner, do_pan_and_scan=False)
    batch = build_prompt(model, pixel_values.shape[0], seed)
    out = model.generate(**batch, pixel_values=pixel_values, max_new_tokens=4, do_sample=False)
    return out[0, batch["input_ids"].shape[1] :].tolist()


def main():
    torch.manual_seed(0)
    model = C.gemma3(image_px=SIDE, patch_px=8, mm_tokens=256, vision_hidden=64, hidden=64, layers=2, vocab=2048)
    banners = [torch.rand(3, 240, 720) for _ in range(6)]  # decoded 720x240 banners, values in [0, 1]
    tags = [tag_banner(model, b, seed=i) for i, b in enumerate(banners)]
    print("tagged banners:", len(tags))


if __name__ == "__main__":
    main()
