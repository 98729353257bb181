"""Index a folder of site-inspection photos with Kosmos-2: one forward pass per photo with a
grounding prompt; the image embeddings are pooled later for near-duplicate search."""

import torch
import torch.nn.functional as F

import _common as C

EXPECT = "retained-outputs"
FIX_WORDS = ["image_embeds", "keep only", "pool", "logits", "past_key_values"]

N_PHOTOS = 24


def main():
    torch.manual_seed(0)
    model = C.kosmos2(image_px=96, patch_px=8, vision_hidden=64, latents=64, vocab=16384, hidden=128, layers=4)
    words = C.tokenize("<grounding> An image of", 16000)
    inputs = C.kosmos2_inputs(model, words)

    index = {}
    for i in range(N_PHOTOS):
        pixel_values = C.resize(C.normalize(C.fake_rgb(240, 320, seed=i)), 96, 96).unsqueeze(0)
        with torch.no_grad():
            out = model(pixel_values=pixel_values, **inputs, use_cache=True)
        index[f"photo_{i:03d}.jpg"] = out  # MISTAKE

    names = list(index)
    emb = torch.stack([F.normalize(index[n].image_embeds.mean(dim=1)[0], dim=-1) for n in names])
    sims = emb @ emb.T - torch.eye(len(names)) * 2
    best = sims.max(dim=1)
    for n, j, s in list(zip(names, best.indices.tolist(), best.values.tolist()))[:3]:
        print(f"{n}: nearest {names[j]} ({s:.3f})")


if __name__ == "__main__":
    main()
