"""Dash-cam incident QA with an InternVL-style chat model: 8 frames are sampled from the clip and
sent as Frame1: <image> ... Frame8: <image> followed by the question (the InternVL video recipe).
Frames go through the same dynamic tiling as our single-image endpoint."""

import numpy as np
import torch

import _common as C

EXPECT = "vision-token-dominance"
FIX_WORDS = ["max_num=1", "tiles", "per frame", "video", "thumbnail"]

TILE = 64
NUM_SEGMENTS = 8
IMAGE_MAX_NUM = 12  # single-image endpoint setting


def sample_indices(n_frames, num_segments):
    seg = n_frames / num_segments
    return [int(seg / 2 + seg * i) for i in range(num_segments)]


def load_clip_frames(n_frames=300, h=360, w=640):
    idx = sample_indices(n_frames, NUM_SEGMENTS)
    return [C.fake_rgb(h, w, seed=int(i)) for i in idx]


@torch.no_grad()
def ask_video(model, frames, question):
    vocab_top = model.config.text_config.vocab_size - 1
    per_tile = C.internvl_tokens_per_tile(model)
    pix, ids = [], [C.BOS_ID]
    for k, rgb in enumerate(frames):
        tiles = C.internvl_tiles(C.normalize(rgb), TILE, max_num=IMAGE_MAX_NUM)  # MISTAKE
        pix.append(tiles)
        ids += C.tokenize(f"Frame{k + 1}:", vocab_top) + [model.config.image_token_id] * (tiles.shape[0] * per_tile)
    ids += C.tokenize(question, vocab_top)
    ids = torch.tensor([ids])
    out = model.generate(
        input_ids=ids,
        attention_mask=torch.ones_like(ids),
        pixel_values=torch.cat(pix),
        max_new_tokens=24,
        do_sample=False,
    )
    return out[0, ids.shape[1] :], int(sum(p.shape[0] for p in pix))


def main():
    torch.manual_seed(0)
    model = C.internvl(image_px=TILE, patch_px=4, vision_hidden=64, hidden=128, layers=4, vocab=8192)
    frames = load_clip_frames()
    answer, n_tiles = ask_video(model, frames, "Did the white van run the red light ? Explain briefly .")
    print(f"{len(frames)} frames -> {n_tiles} tiles, answer {answer.shape[0]} tokens")


if __name__ == "__main__":
    main()
