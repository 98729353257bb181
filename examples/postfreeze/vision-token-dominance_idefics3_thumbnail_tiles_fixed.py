"""Fixed twin of vision-token-dominance_idefics3_thumbnail_tiles: a thumbnail smaller than one tile
is encoded as a single tile (``longest_edge`` = the tile size, i.e. no splitting), 1 image of
tokens instead of 12 tiles + a global view.

Source: https://github.com/sgl-project/sglang/pull/11181 — "a 448*448 image was processed into 10
tiles, resulting in over 2,000 tokens" where one tile (256 tokens) was expected.
"""

import _common as c
import torch

from memwarden.models import zoo

EXPECT = None

TILE = 64  # the vision tower's input size (SmolVLM: 512)


def split_image(img: torch.Tensor, longest_edge: int) -> torch.Tensor:
    """Idefics3-style: resize so the longest edge is ``longest_edge`` (multiple of TILE), cut into
    TILE x TILE tiles, append a TILE x TILE global view. img: (3, H, W) -> (n_tiles, 3, TILE, TILE)."""
    _, h, w = img.shape
    scale = longest_edge / max(h, w)
    rh, rw = max(TILE, round(h * scale / TILE) * TILE), max(TILE, round(w * scale / TILE) * TILE)
    big = c.resize(img, rh, rw)
    tiles = [big[:, r : r + TILE, q : q + TILE] for r in range(0, rh, TILE) for q in range(0, rw, TILE)]
    if len(tiles) > 1:
        tiles.append(c.resize(img, TILE, TILE))
    return torch.stack(tiles)


def request(model, tiles: torch.Tensor, seed: int) -> dict:
    cfg = model.config
    per_image = zoo.placeholder_tokens(model, image_size=(TILE, TILE))
    img, fake, glob = cfg.image_token_id, cfg.image_token_id - 2, cfg.image_token_id - 1
    words = c.text_ids(16, img - 2, seed=seed)[0].tolist()
    ids = [zoo.BOS_ID] + words[:4]
    for _ in range(len(tiles)):
        ids += [fake, glob] + [img] * per_image
    ids += [fake] + words[4:]
    input_ids = torch.tensor([ids])
    return {
        "input_ids": input_ids,
        "attention_mask": torch.ones_like(input_ids),
        "pixel_values": tiles[None],
        "pixel_attention_mask": torch.ones(1, len(tiles), TILE, TILE, dtype=torch.bool),
    }


def main() -> None:
    torch.manual_seed(0)
    model = c.idefics3(image_px=TILE, patch_px=4, scale=2, hidden=256, layers=4, vocab=4096)
    with torch.no_grad():
        for i in range(2):
            thumb = c.normalize(c.fake_rgb(72, 96, seed=i))
            tiles = split_image(thumb, longest_edge=TILE)  # no splitting: one tile
            inputs = request(model, tiles, seed=i)
            out = model.generate(**inputs, max_new_tokens=4, **zoo.generate_kwargs("idefics3"))
            print(
                f"thumbnail {i}: {len(tiles)} tiles, {inputs['input_ids'].shape[1]} tokens, tags", out[0, -4:].tolist()
            )


if __name__ == "__main__":
    main()
