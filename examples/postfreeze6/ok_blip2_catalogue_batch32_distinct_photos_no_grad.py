"""Nightly catalogue captioning with BLIP-2 (OPT): 32 distinct product photos per batch (one
caption each), greedy, no_grad."""

import torch

import _common as C

EXPECT = None
BATCH = 32


@torch.no_grad()
def main():
    torch.manual_seed(0)
    model = C.blip2(image_px=224, patch_px=14, vision_hidden=128, queries=32, hidden=128, layers=2, vocab=2048)
    prompt = C.blip2_prompt(model, C.tokenize("a product photo of", 2000))
    captions = []
    for start in range(0, 64, BATCH):
        pix = torch.stack([C.resize(C.normalize(C.fake_rgb(300, 300, seed=start + i)), 224, 224) for i in range(BATCH)])
        ids = torch.tensor([prompt] * BATCH)
        out = model.generate(
            input_ids=ids, attention_mask=torch.ones_like(ids), pixel_values=pix, max_new_tokens=12, do_sample=False
        )
        captions += out[:, ids.shape[1] :].tolist()
    print(f"{len(captions)} captions")


if __name__ == "__main__":
    main()
