"""Video frame embedding with large chunks, keeping only pooled CLS vectors (correct, memory-heavy).

What the user does: a long video is embedded with a ViT image tower in chunks of 128 frames for
throughput, under ``inference_mode``; only each chunk's pooled CLS embeddings (``pooler_output``)
are kept, as the maintainers recommend. The large chunk makes each forward's activations big, which
is a deliberate throughput trade-off, not a leak.
Sources: https://github.com/paninski-lab/beast/issues/15 ; https://github.com/huggingface/transformers/issues/18629
Reproduction: a tiny random-weight CLIP vision tower (96 px, 145 tokens, 3 layers); 384 frames in 3
chunks of 128.
"""

import _common as c
import torch

EXPECT = None

N_FRAMES, CHUNK = 384, 128


def main() -> None:
    tower = c.clip(image_px=96, patch_px=8, hidden=128, layers=3).vision_model
    kept = []
    with torch.inference_mode():
        for start in range(0, N_FRAMES, CHUNK):
            g = torch.Generator().manual_seed(start)
            frames = torch.rand(CHUNK, 3, 96, 96, generator=g).sub_(0.5).div_(0.25)
            kept.append(tower(pixel_values=frames).pooler_output)
    emb = torch.cat(kept)
    print("embeddings", tuple(emb.shape))


if __name__ == "__main__":
    main()
