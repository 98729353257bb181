"""Grounded captions for a batch of 16 street photos with Kosmos-2; only the generated ids (which
carry the <phrase>/<object> location tokens) are kept for the post-processing step."""

import torch

import _common as C

EXPECT = None


@torch.no_grad()
def main():
    torch.manual_seed(0)
    model = C.kosmos2(image_px=96, patch_px=8, vision_hidden=64, latents=64, vocab=16384, hidden=128, layers=4)
    words = C.tokenize("<grounding> An image of", 16000)
    photos = torch.stack([C.resize(C.normalize(C.fake_rgb(240, 320, seed=s)), 96, 96) for s in range(16)])
    inputs = C.kosmos2_inputs(model, words, batch=photos.shape[0])
    seqs = model.generate(pixel_values=photos, **inputs, max_new_tokens=24, min_new_tokens=24, do_sample=False)
    generated = seqs[:, inputs["input_ids"].shape[1] :].tolist()
    print(f"{len(generated)} captions, {len(generated[0])} tokens each")


if __name__ == "__main__":
    main()
