"""Video frame embedding job that keeps every chunk's full ViT output to read the CLS vectors later.

What the user did: a long behaviour video is embedded frame by frame with a ViT image tower in
chunks of 32 frames. The prediction step appends each chunk's whole model output (patch embeddings
of every layer, ``output_hidden_states=True``, and the last hidden state) to a list, and only at the
end pulls out the pooled CLS vectors the downstream model uses.
Answer in the source: do not store the patch embeddings / reconstructions in the predict step; save
only the CLS tokens (and the rest only when explicitly requested), otherwise long videos OOM.
Sources: https://github.com/paninski-lab/beast/issues/15 ; https://github.com/huggingface/transformers/issues/18629
Reproduction: a tiny random-weight CLIP vision tower (96 px, 145 tokens, 3 layers); 320 decoded frames
in chunks of 32 under ``torch.inference_mode``; every chunk's output object is appended and the
pooled embeddings are stacked at the end.
"""

import _common as c
import torch

EXPECT = "retained-outputs"
FIX_WORDS = ("pooler_output", "CLS", "hidden_states", "only the pooled")

N_FRAMES = 320
CHUNK = 32


def frames(start: int, stop: int) -> torch.Tensor:
    """Decoded, resized, normalised frames [start, stop) as (N, 3, 96, 96)."""
    g = torch.Generator().manual_seed(start)
    return torch.rand(stop - start, 3, 96, 96, generator=g).sub_(0.5).div_(0.25)


def main() -> None:
    clip = c.clip(image_px=96, patch_px=8, hidden=128, layers=3)
    tower = clip.vision_model
    kept = []
    with torch.inference_mode():
        for start in range(0, N_FRAMES, CHUNK):
            out = tower(pixel_values=frames(start, min(start + CHUNK, N_FRAMES)), output_hidden_states=True)
            kept.append(out)  # MISTAKE
    embeddings = torch.cat([o.pooler_output for o in kept])
    print("embeddings", tuple(embeddings.shape), "mean norm", float(embeddings.norm(dim=-1).mean()))


if __name__ == "__main__":
    main()
