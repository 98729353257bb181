"""Fixed twin of ``microbatch_loss_sum.py``: backward per micro-batch.

Each micro-batch's loss is scaled by ``1 / ACCUM`` and back-propagated right
away, so its graph (the activations saved for backward) is freed before the
next micro-batch's forward. The accumulated gradients equal those of the
mean loss; only one graph is ever alive. The loss is logged with ``.item()``,
which keeps a Python float, not the graph.

Run: ``python microbatch_loss_sum_fixed.py`` or ``memwarden trace microbatch_loss_sum_fixed.py``.
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
        running = 0.0
        for micro in range(ACCUM):
            patches, tokens = batch(step * ACCUM + micro)
            loss = model(patches, tokens)
            (loss / ACCUM).backward()  # frees this micro-batch's graph now; grads accumulate
            running += loss.item() / ACCUM
        opt.step()
        opt.zero_grad(set_to_none=True)
        print(f"step {step}: loss {running:.4f}")


if __name__ == "__main__":
    main()
