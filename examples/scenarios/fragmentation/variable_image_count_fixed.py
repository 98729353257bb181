"""Fixed twin of ``variable_image_count.py``: the image count bucketed to 4 or 8.

Each request's images are padded with blank images up to 4 or 8; the padding
images are masked out of attention (in the vision tower and the language
model), so the answer does not change. Only two shapes ever reach the model,
so a CUDA caching allocator sees the same block sizes again and reuses them:
reserved memory stays at what the 8-image bucket needs.

Run: ``python variable_image_count_fixed.py`` or ``memwarden trace variable_image_count_fixed.py``.
"""

from __future__ import annotations

import random

import torch
from torch import nn

PATCH_DIM, PATCHES = 3 * 14 * 14, 144  # 168 px images, 14 px patches
DIM, HEADS, VOCAB = 64, 8, 2048
PROMPT = 32
REQUESTS = 16
IMAGE_BUCKETS = (4, 8)


class Attention(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.qkv, self.out = nn.Linear(DIM, 3 * DIM), nn.Linear(DIM, DIM)

    def forward(self, h: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        b, t, _ = h.shape
        q, k, v = self.qkv(h).view(b, t, 3, HEADS, DIM // HEADS).permute(2, 0, 3, 1, 4)  # 3 x (B, H, T, hd)
        scores = (q @ k.transpose(-1, -2)).masked_fill(~mask[:, None, None, :], float("-inf"))  # (B, H, T, T)
        return h + self.out((scores.softmax(-1) @ v).transpose(1, 2).reshape(b, t, DIM))


class TinyVlm(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.patch_embed = nn.Linear(PATCH_DIM, DIM)
        self.vision_tower = Attention()
        self.multi_modal_projector = nn.Linear(DIM, DIM)
        self.embed_tokens = nn.Embedding(VOCAB, DIM)
        self.language_model = Attention()
        self.lm_head = nn.Linear(DIM, VOCAB)

    def forward(self, patches: torch.Tensor, image_mask: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        n_img = patches.shape[0]
        every_patch = torch.ones(n_img, PATCHES, dtype=torch.bool)  # each image attends within itself
        image = self.vision_tower(self.patch_embed(patches), every_patch)  # (N, P, DIM)
        tokens = self.multi_modal_projector(image).reshape(1, n_img * PATCHES, DIM)  # (1, N*P, DIM)
        h = torch.cat([tokens, self.embed_tokens(ids)], dim=1)  # (1, N*P + T, DIM)
        real = image_mask[:, None].expand(n_img, PATCHES).reshape(1, -1)  # padding images' tokens: False
        mask = torch.cat([real, torch.ones_like(ids, dtype=torch.bool)], dim=1)  # (1, N*P + T)
        return self.lm_head(self.language_model(h, mask)[:, -1])  # (1, VOCAB) next-token logits


def main() -> None:
    torch.manual_seed(0)
    model = TinyVlm().eval()
    rng = random.Random(0)
    with torch.inference_mode():
        for _ in range(REQUESTS):
            n_img = rng.randint(1, 8)  # images in this request
            slots = next(b for b in IMAGE_BUCKETS if b >= n_img)
            patches = torch.zeros(slots, PATCHES, PATCH_DIM)  # blank padding images
            patches[:n_img] = torch.randn(n_img, PATCHES, PATCH_DIM)  # (N, P, patch_dim) from the processor
            image_mask = torch.arange(slots) < n_img  # which slots hold a real image
            ids = torch.randint(0, VOCAB, (1, PROMPT))
            logits = model(patches, image_mask, ids)
    print("last logits", tuple(logits.shape))


if __name__ == "__main__":
    main()
