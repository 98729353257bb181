"""Multi-image product comparison with InternVL-style dynamic tiling at the single-image max_num.

FIXED TWIN: the per-image tile count comes from a 12-tile budget shared by the images (lmms-eval / VLMEvalKit rule), 3 tiles + thumbnail each.

What the user did: fine-tuned / evaluated an InternVL2 model on samples with several high-resolution
images each. ``dynamic_preprocess`` cuts every image into up to ``max_num=12`` tiles (plus a thumbnail),
so a 4-image sample is ~50 tiles of 256 tokens and runs out of memory. The maintainers' advice for
multi-image inputs is to lower max_num; lmms-eval and VLMEvalKit divide a total tile budget between
the images (``max(1, min(max_num, total_max_num // image_num))``).

Sources:
- https://github.com/OpenGVLab/InternVL/issues/832 ("多图训练时候容易爆显存 ... 多图的话，建议调小max_num" --
  multi-image training OOMs; for multiple images, reduce max_num)
- https://github.com/EvolvingLMMs-Lab/lmms-eval/pull/1069 ("the tile count per image is now dynamically
  calculated based on the number of images ... This prevents OOM issues with multiple images")
- https://github.com/OpenGVLab/InternVL/pull/1256 (OOM in dynamic_preprocess from runaway patch counts)

Reproduction: a tiny random-weight LLaVA whose vision tower takes 64x64 tiles (64 tokens per tile),
four 256x192 "product photos", the InternVL tiling re-implemented. With max_num=12 per image the prompt
carries 4x13 tiles; with a 12-tile budget shared by the four images it carries 4x4.
"""

import _common as c
import torch

EXPECT = None

TILE = 64
MAX_NUM = 12
TOTAL_MAX_NUM = 12


def find_closest_aspect_ratio(aspect, ratios, w, h, tile):
    best, best_diff = (1, 1), float("inf")
    area = w * h
    for r in ratios:
        diff = abs(aspect - r[0] / r[1])
        if diff < best_diff or (diff == best_diff and area > 0.5 * tile * tile * r[0] * r[1]):
            best_diff, best = diff, r
    return best


def dynamic_preprocess(img, min_num=1, max_num=12, tile=TILE, use_thumbnail=True):
    """InternVL's tiling: resize to the best (cols, rows) grid with cols*rows <= max_num, cut tiles."""
    _, h, w = img.shape
    ratios = sorted(
        {
            (i, j)
            for n in range(min_num, max_num + 1)
            for i in range(1, n + 1)
            for j in range(1, n + 1)
            if min_num <= i * j <= max_num
        },
        key=lambda r: r[0] * r[1],
    )
    cols, rows = find_closest_aspect_ratio(w / h, ratios, w, h, tile)
    big = c.resize(img, rows * tile, cols * tile)
    tiles = [big[:, r * tile : (r + 1) * tile, q * tile : (q + 1) * tile] for r in range(rows) for q in range(cols)]
    if use_thumbnail and len(tiles) != 1:
        tiles.append(c.resize(img, tile, tile))
    return torch.stack(tiles)


def build_request(model, photos, tiles_per_image):
    pix = torch.cat([dynamic_preprocess(p, max_num=tiles_per_image) for p in photos])
    ids = c.llava_prompt(model, n_images=pix.shape[0], prompt_tokens=40, seed=3)
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "pixel_values": pix}


def main():
    torch.manual_seed(0)
    model = c.llava(image_px=TILE, patch_px=8, vision_hidden=64, hidden=128, layers=2, vocab=4096)
    photos = [c.normalize(c.fake_rgb(192, 256, seed=i)) for i in range(4)]
    tiles_per_image = max(1, min(MAX_NUM, TOTAL_MAX_NUM // len(photos)))
    req = build_request(model, photos, tiles_per_image)
    with torch.no_grad():
        out = model.generate(**req, max_new_tokens=24, do_sample=False, pad_token_id=c.PAD_ID, eos_token_id=None)
    print(
        f"{req['pixel_values'].shape[0]} tiles, prompt {req['input_ids'].shape[1]} tokens, "
        f"answer {out.shape[1] - req['input_ids'].shape[1]} tokens"
    )


if __name__ == "__main__":
    main()
