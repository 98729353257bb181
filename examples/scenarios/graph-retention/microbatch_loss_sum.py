"""Gradient accumulation done by summing micro-batch losses before one backward.

What is wrong: a small image-captioning VLM (patch encoder, projector, text
decoder) is fine-tuned with 4 micro-batches per optimizer step. The loop
collects each micro-batch's loss in a list and calls ``backward()`` once, on
their mean. Until that backward runs, every micro-batch's autograd graph --
all the activations saved for backward in the vision tower, the projector and
the decoder -- stays alive: the peak holds 4 graphs where 1 would do.

The fix (``microbatch_loss_sum_fixed.py``): call ``(loss / ACCUM).backward()``
right after each micro-batch's forward. Gradients accumulate in ``.grad``
exactly as before (the gradient of a sum is the sum of the gradients), but
each graph is freed before the next micro-batch runs. Log with ``loss.item()``.

Run: ``python microbatch_loss_sum.py`` or ``memwarden trace microbatch_loss_sum.py``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

ACCUM = 4  # micro-batches per optimizer step
MICRO_BATCH = 8  # image-caption pairs per micro-batch
PATCHES, TOKENS = 64, 64  # image patches and caption tokens per sample
STEPS = 2


class TinyCaptioner(nn.Module):
    def __init__(self, patch_dim: int = 768, width: int = 256, vocab: int = 2048) -> None:
        super().__init__()
        self.vision_tower = nn.Sequential(nn.Linear(patch_dim, width), nn.ReLU(), nn.Linear(width, width))
        self.projector = nn.Linear(width, width)
        self.embed_tokens = nn.Embedding(vocab, width)
        self.decoder = nn.Sequential(nn.Linear(width, 4 * width), nn.ReLU(), nn.Linear(4 * width, width))
        self.lm_head = nn.Linear(width, vocab)

    def forward(self, patches: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        image = self.projector(self.vision_tower(patches))  # (B, P, W)
        text = self.embed_tokens(tokens)  # (B, T, W)
        hidden = self.decoder(torch.cat([image, text], dim=1))  # (B, P+T, W)
        logits = self.lm_head(hidden[:, image.shape[1] :])  # (B, T, V)
        return F.cross_entropy(logits.flatten(0, 1), tokens.flatten())


def batch(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    patches = torch.randn(MICRO_BATCH, PATCHES, 768, generator=gen)  # (B, P, patch_dim)
    tokens = torch.randint(0, 2048, (MICRO_BATCH, TOKENS), generator=gen)  # (B, T)
    return patches, tokens


def main() -> None:
    torch.manual_seed(0)
    model = TinyCaptioner()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    for step in range(STEPS):
        losses = []
        for micro in range(ACCUM):
            patches, tokens = batch(step * ACCUM + micro)
            losses.append(model(patches, tokens))  # keeps this micro-batch's whole graph alive
        loss = torch.stack(losses).mean()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        print(f"step {step}: loss {loss.item():.4f}")


if __name__ == "__main__":
    main()
